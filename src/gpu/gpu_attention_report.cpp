#include "gpu/gpu_attention_report.hpp"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "calc/attention_variant.hpp"
#include "kvlab/calc/presets.hpp"
#include "kvlab/core/checked.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/core/text.hpp"
#include "kvlab/core/units.hpp"
#include "gpu/gpu_attention.hpp"

namespace kvlab {

namespace {

struct Setting {
    DType dtype;
    std::int64_t n_batch;
    std::int64_t n_tokens;
};

// One row of the check and timing tables at a setting: a kernel, a variant (index into Plan::variants),
// the KV storage (fp8 or the dtype) and the layout (0 contiguous, else tokens per block).
struct Run {
    GpuAttentionKernel kernel;
    std::size_t variant;
    bool kv_fp8;
    std::int64_t block_size;
};

// What the request asks for: the native shape, every list parsed, and the runs in table order.
struct Plan {
    AttentionShape native;
    std::int64_t d_model = 0;
    std::string shape_source;
    std::vector<DType> dtypes;
    std::vector<std::string> variant_names;
    std::vector<AttentionShape> variants;
    std::vector<GpuAttentionKernel> kernels;
    std::vector<std::uint64_t> batches;
    std::vector<std::uint64_t> contexts;
    std::vector<Setting> settings;
    std::vector<std::uint64_t> block_sizes;  // --block-size, each validated
    std::vector<std::int64_t> layouts;       // --kv-layout: 0 contiguous, N paged with N tokens per block
    std::vector<bool> kv_fp8;                // --kv-dtype: false the dtype, true fp8 e4m3
    bool shuffled_blocks = true;             // --block-order: shuffled or in-order block tables
    // kernel x variant x KV dtype x layout, in that order: the rows of the check and timing tables
    std::vector<Run> runs;
};

// The bandwidth references the timing table is measured against.
struct Bandwidth {
    std::uint64_t copy_bytes = 0;
    double copy_gb_s = 0;
    double read_gb_s = 0;
    int read_unroll = 0;
};

// The timing table as it fills, and what each row needs to fill it.
struct TimingGrid {
    const GpuAttentionRequest& o;
    const Plan& plan;
    const CudaDevice& dev;
    const Bandwidth& bw;
    std::uint64_t flush_bytes;
    Table timing;
    std::vector<double> read_percent;  // every timed row's % of read, for the note below the table
    bool no_uncached = false;          // a timed row had no uncached step (paged or fp8)
};

// The native shape, from a model or from the explicit sizes.
Plan native_shape(const GpuAttentionRequest& o) {
    Plan plan;
    if (!o.model.empty()) {
        const ModelConfig m = load_model(o.model);
        if (m.mla)
            throw UsageError(fmt::format("--model {}: multi-head latent attention caches a latent vector; the GPU "
                                         "kernel times MHA/GQA/MQA caches only (use --heads/--kv-heads/--head-dim)",
                                         o.model));
        plan.native = AttentionShape{m.n_head, m.n_head_kv, m.d_head};
        plan.d_model = m.d_model;
        plan.shape_source = m.name;
    } else {
        if (o.n_head < 1 || o.d_head < 1)
            throw UsageError("gpu attention: give --model PRESET, or --heads and --head-dim (with --kv-heads, --hidden)");
        plan.native = AttentionShape{o.n_head, o.n_head_kv > 0 ? o.n_head_kv : o.n_head, o.d_head};
        plan.d_model = o.d_model > 0 ? o.d_model
                                     : static_cast<std::int64_t>(checked_mul(static_cast<std::uint64_t>(o.n_head),
                                                                             static_cast<std::uint64_t>(o.d_head), "--heads x --head-dim"));
        plan.shape_source = "explicit sizes";
    }
    return plan;
}

// Parses --dtype, --attention, --kernel, --batch and --context, and crosses them into settings.
void parse_lists(const GpuAttentionRequest& o, Plan& plan) {
    for (const std::string& name : split_list(o.dtype)) plan.dtypes.push_back(parse_dtype(name, "--dtype"));
    for (const AttentionVariant& v : parse_attention_variants(o.attention)) {
        plan.variant_names.push_back(v.label);
        plan.variants.push_back(attention_variant(plan.native, v.label, "--attention"));
    }
    for (const std::string& name : split_list(o.kernel)) plan.kernels.push_back(parse_gpu_attention_kernel(name, "--kernel"));
    plan.batches = parse_count_list(o.batch, "--batch");
    plan.contexts = parse_count_list(o.context, "--context");
    for (const DType dtype : plan.dtypes)
        for (const std::uint64_t b : plan.batches)
            for (const std::uint64_t t : plan.contexts) {
                if (b > 65535 || t > (1ull << 40))
                    throw UsageError(fmt::format("--batch {} / --context {}: too large for the GPU path", b, t));
                plan.settings.push_back(Setting{dtype, static_cast<std::int64_t>(b), static_cast<std::int64_t>(t)});
            }
}

// One problem of the grid: a setting, a shape and a kernel, at the plan's hidden size.
GpuAttentionProblem problem_for(const Plan& plan, const Setting& s, const AttentionShape& shape, GpuAttentionKernel kernel) {
    GpuAttentionProblem p;
    p.kernel = kernel;
    p.shape = shape;
    p.d_model = plan.d_model;
    p.n_batch = s.n_batch;
    p.n_tokens = s.n_tokens;
    p.dtype = s.dtype;
    return p;
}

// The problem of one run at a setting.
GpuAttentionProblem problem_for(const Plan& plan, const Setting& s, const Run& run) {
    GpuAttentionProblem p = problem_for(plan, s, plan.variants[run.variant], run.kernel);
    p.kv_fp8 = run.kv_fp8;
    p.block_size = run.block_size;
    p.shuffled_blocks = plan.shuffled_blocks;
    return p;
}

// "fp8_e4m3", or the dtype's name for K and V stored as the query is.
std::string kv_dtype_name(bool kv_fp8, DType dtype) {
    return kv_fp8 ? "fp8_e4m3" : std::string(dtype_name(dtype));
}

// A run as notes and failures name it, e.g. "gqa:8 cuda-cores fp16 KV fp8_e4m3 paged 16".
std::string run_label(const Plan& plan, const Run& run, GpuAttentionKernel kernel, DType dtype) {
    return fmt::format("{} {} {} KV {} {}", plan.variant_names[run.variant], gpu_attention_kernel_name(kernel),
                       dtype_name(dtype), kv_dtype_name(run.kv_fp8, dtype), gpu_attention_layout_name(run.block_size));
}

// --block-size (each a block size the paged layout takes, listed or not), --block-order, --kv-layout and
// --kv-dtype.
void parse_kv_lists(const GpuAttentionRequest& o, Plan& plan) {
    if (o.block_order != "shuffled" && o.block_order != "in-order")
        throw UsageError(fmt::format("--block-order {}: expected shuffled or in-order", quote(o.block_order)));
    plan.shuffled_blocks = o.block_order == "shuffled";
    plan.block_sizes = parse_count_list(o.block_size, "--block-size");
    for (const std::uint64_t b : plan.block_sizes) {
        GpuAttentionProblem probe = problem_for(plan, Setting{DType::fp16, 1, 1}, plan.native, GpuAttentionKernel::automatic);
        probe.block_size = static_cast<std::int64_t>(std::min<std::uint64_t>(b, INT64_MAX));
        validate_gpu_attention_problem(probe, "--block-size");
    }
    auto add_layout = [&](std::int64_t block) {
        if (std::find(plan.layouts.begin(), plan.layouts.end(), block) == plan.layouts.end()) plan.layouts.push_back(block);
    };
    for (const std::string& name : split_list(o.kv_layout)) {
        if (name == "contiguous")
            add_layout(0);
        else if (name == "paged")
            for (const std::uint64_t b : plan.block_sizes) add_layout(static_cast<std::int64_t>(b));
        else
            throw UsageError(fmt::format("--kv-layout {}: expected contiguous or paged", quote(name)));
    }
    for (const std::string& name : split_list(o.kv_dtype)) {
        const bool fp8 = name == "fp8_e4m3" || name == "fp8";
        if (!fp8 && name != "dtype" && name != "fp16" && name != "bf16")
            throw UsageError(fmt::format("--kv-dtype {}: expected dtype (the --dtype), fp16, bf16, fp8_e4m3 or fp8", quote(name)));
        for (const DType dtype : plan.dtypes)
            if ((name == "fp16" || name == "bf16") && name != dtype_name(dtype))
                throw UsageError(fmt::format("--kv-dtype {}: K and V are stored in the --dtype or in fp8_e4m3, and --dtype {} "
                                             "is not {} (use --kv-dtype dtype or fp8)", name, dtype_name(dtype), name));
        if (std::find(plan.kv_fp8.begin(), plan.kv_fp8.end(), fp8) == plan.kv_fp8.end()) plan.kv_fp8.push_back(fp8);
    }
    if (plan.layouts.empty() || plan.kv_fp8.empty())
        throw UsageError("--kv-layout and --kv-dtype: give at least one layout (contiguous, paged) and one KV dtype");
}

// Each part checked under the flag that sets it: the shape, then the dtypes, then the kernels.
void validate_flags(const GpuAttentionRequest& o, const Plan& plan) {
    const std::string shape_flag = o.model.empty() ? "--heads/--kv-heads/--head-dim" : "--model " + o.model;
    const Setting one{DType::fp16, 1, 1};
    validate_gpu_attention_problem(problem_for(plan, one, plan.native, GpuAttentionKernel::automatic), shape_flag);
    for (const DType dtype : plan.dtypes)
        validate_gpu_attention_problem(problem_for(plan, Setting{dtype, 1, 1}, plan.native, GpuAttentionKernel::automatic),
                                       "--dtype");
    for (const GpuAttentionKernel kernel : plan.kernels)
        validate_gpu_attention_problem(problem_for(plan, one, plan.native, kernel),
                                       "--kernel " + std::string(gpu_attention_kernel_name(kernel)));
}

// Every kernel with every variant, KV dtype and layout, in that order.
std::vector<Run> kernel_major_runs(const Plan& plan) {
    std::vector<Run> runs;
    for (const GpuAttentionKernel kernel : plan.kernels)
        for (std::size_t i = 0; i < plan.variants.size(); ++i)
            for (const bool fp8 : plan.kv_fp8)
                for (const std::int64_t block : plan.layouts) runs.push_back(Run{kernel, i, fp8, block});
    return runs;
}

// Every setting with every run checked as the grid, its cost too (throws on 64-bit overflow).
void validate_grid(const Plan& plan) {
    for (const Setting& s : plan.settings)
        for (const Run& run : plan.runs) {
            const GpuAttentionProblem p = problem_for(plan, s, run);
            validate_gpu_attention_problem(p, "--batch/--context");
            (void)gpu_attention_cost(p);  // throws on 64-bit overflow
        }
}

// The report with the request's inputs and no tables yet.
Report report_with_inputs(const GpuAttentionRequest& o, const Plan& plan) {
    Report report;
    report.inputs = {{"shape_source", plan.shape_source}, {"n_head", plan.native.n_head},
                     {"n_head_kv", plan.native.n_head_kv}, {"d_head", plan.native.d_head},
                     {"d_model", plan.d_model},           {"batch", plan.batches},
                     {"context", plan.contexts},          {"dtype", o.dtype},
                     {"attention", plan.variant_names},   {"kernel", o.kernel},
                     {"kv_layout", o.kv_layout},          {"block_size", plan.block_sizes},
                     {"block_order", o.block_order},
                     {"kv_dtype", o.kv_dtype},
                     {"warmup", o.n_warmup},              {"repeats", o.n_repeat},   {"seed", o.seed}};
    return report;
}

// A cell that is "-" where the column does not apply to the row.
Cell dash_cell() { return Cell{"-", nullptr}; }

// One row of the check table.
std::vector<Cell> check_row(const Plan& plan, const Run& run, DType dtype, const GpuAttentionCheck& c) {
    return {text_cell(plan.variant_names[run.variant]), int_cell(plan.variants[run.variant].n_head_kv),
            text_cell(std::string(gpu_attention_kernel_name(c.kernel))), text_cell(std::string(dtype_name(dtype))),
            text_cell(kv_dtype_name(run.kv_fp8, dtype)), text_cell(gpu_attention_layout_name(run.block_size)),
            text_cell(std::string(gpu_attention_path_name(c.path))), int_cell(c.n_batch), int_cell(c.n_tokens),
            int_cell(c.d_model), int_cell(c.n_split), Cell{fmt::format("{:.3g}", c.max_abs_error), c.max_abs_error},
            Cell{fmt::format("{:.3g}", c.tolerance), c.tolerance},
            run.kv_fp8 ? Cell{fmt::format("{:.3g}", c.fp8_error), c.fp8_error} : dash_cell(),
            text_cell(c.passed ? "yes" : "NO")};
}

// The check table's notes on the layouts and KV dtypes it holds.
void add_check_notes(const Plan& plan, Table& checks) {
    checks.notes.push_back("tolerance: 2 units in the last place of the dtype at max(1, max |ref|) "
                           "(fp16 2^-10, bf16 2^-7); inputs are random and exactly representable in the dtype");
    const bool any_fp8 = std::find(plan.kv_fp8.begin(), plan.kv_fp8.end(), true) != plan.kv_fp8.end();
    const bool any_paged = std::any_of(plan.layouts.begin(), plan.layouts.end(), [](std::int64_t b) { return b > 0; });
    if (any_fp8)
        checks.notes.push_back("KV dtype fp8_e4m3: K and V quantized on the host as the CPU KV cache does, one scale per "
                               "tensor: scale = amax / 448, code = e4m3(x * (1 / scale)); the kernel dequantizes code x scale "
                               "and the reference reads the same decoded values. fp8 error = max |out - reference over the "
                               "unquantized (dtype-rounded) K, V|: what fp8 storage costs the output, reported, not checked; "
                               "\"-\" for 16-bit caches");
    if (any_paged)
        checks.notes.push_back("layout paged N: K and V in a pool of blocks of N tokens, each sequence's blocks named by a "
                               "block table that is a shuffled permutation of the pool (as a pool fragments; --block-order "
                               "in-order: each sequence's blocks in order); the reference reads the same logical (B, T) cache");
    if (any_fp8 || any_paged) checks.notes.push_back("the uncached path is checked for contiguous 16-bit caches only");
}

// Correctness against the CPU reference for every dtype and run; what failed goes to `failures`.
Table correctness_checks(const GpuAttentionRequest& o, const Plan& plan, std::vector<std::string>& failures) {
    Table checks;
    checks.title = "Correctness against the CPU reference (attention_decode_ref)";
    checks.columns = {{"attention", "attention", false}, {"n_head_kv", "KV heads"}, {"kernel", "kernel", false},
                      {"dtype", "dtype", false},         {"kv_dtype", "KV dtype", false},
                      {"layout", "layout", false},
                      {"path", "path", false},           {"batch", "batch"},        {"context", "context"},
                      {"hidden", "hidden"},              {"splits", "splits"},      {"max_abs_error", "max abs error"},
                      {"tolerance", "tolerance"},        {"fp8_error", "fp8 error"}, {"passed", "passed", false}};
    for (const DType dtype : plan.dtypes)
        for (const Run& run : plan.runs) {
            const GpuAttentionProblem p = problem_for(plan, Setting{dtype, 1, 1}, run);
            for (const GpuAttentionCheck& c : gpu_attention_check(p, o.seed)) {
                checks.rows.push_back(check_row(plan, run, dtype, c));
                if (!c.passed)
                    failures.push_back(fmt::format("{} {} B={} T={} splits={}: max abs error {:.3g} > {:.3g}",
                                                   run_label(plan, run, c.kernel, dtype), gpu_attention_path_name(c.path),
                                                   c.n_batch, c.n_tokens, c.n_split, c.max_abs_error, c.tolerance));
            }
        }
    add_check_notes(plan, checks);
    return checks;
}

// The bandwidth references: a device-to-device copy, read + write counted, and a kernel that only
// reads (the fastest of three load patterns), as the cached step nearly does.
Bandwidth measure_bandwidth(const GpuAttentionRequest& o, const CudaDevice& dev) {
    Bandwidth bw;
    // 4 GiB where memory allows: the 1 GiB first used left a read 0.6 % short of the largest cached step
    // (32 GiB), the launch and the last wave weighing more in a shorter run.
    bw.copy_bytes = std::min<std::uint64_t>(4ull << 30, dev.memory_free_bytes / 8) & ~std::uint64_t{255};
    const GpuTiming copy = cuda_copy_time(bw.copy_bytes, o.n_warmup, o.n_repeat);
    bw.copy_gb_s = 2.0 * static_cast<double>(bw.copy_bytes) / copy.median_ns;  // bytes per ns = GB/s
    const GpuTiming read = cuda_read_time(bw.copy_bytes, o.n_warmup, o.n_repeat);
    bw.read_gb_s = static_cast<double>(bw.copy_bytes) / read.median_ns;
    bw.read_unroll = read.unroll;
    return bw;
}

// The device table: the GPU, its memory and the two bandwidth references.
Table device_table(const CudaDevice& dev, const Bandwidth& bw) {
    Table device;
    device.title = "Device";
    device.columns = {{"name", "GPU", false}, {"compute_capability", "CC", false}, {"n_sm", "SMs"},
                      {"l2_bytes", "L2"},      {"memory_bytes", "memory"},         {"copy_bytes", "copy size"},
                      {"copy_gb_per_s", "D2D copy GB/s"}, {"read_gb_per_s", "read GB/s"},
                      {"read_unroll", "read unroll"}};
    device.rows.push_back({text_cell(dev.name), text_cell(fmt::format("{}.{}", dev.cc_major, dev.cc_minor)),
                           int_cell(dev.n_sm), bytes_cell(dev.l2_bytes, UnitSystem::iec),
                           bytes_cell(dev.memory_bytes, UnitSystem::iec), bytes_cell(bw.copy_bytes, UnitSystem::iec),
                           real_cell(bw.copy_gb_s, 1), real_cell(bw.read_gb_s, 1), int_cell(bw.read_unroll)});
    device.notes.push_back("copy GB/s = 2 x copy size / median time of cudaMemcpyAsync device-to-device "
                           "(bytes read + bytes written)");
    device.notes.push_back("read GB/s = copy size / median time of a kernel that only reads it (16-byte loads, "
                           "a grid of 8 blocks of 256 threads per SM, the loop unrolled 4, 8 or 16 times, the fastest kept, "
                           "checked to read every byte): a measured reference for the cached step, which reads K and V "
                           "and writes almost nothing (the timing table says when a step beat it)");
    return device;
}

// The timing table's title and columns, no rows yet.
Table timing_table_header() {
    Table timing;
    timing.title = "Decode attention step, cached vs uncached (median of repeats, L2 flushed before each)";
    timing.columns = {{"attention", "attention", false},   {"n_head_kv", "KV heads"},
                      {"kernel", "kernel", false},
                      {"dtype", "dtype", false},           {"kv_dtype", "KV dtype", false},
                      {"layout", "layout", false},         {"batch", "batch"},
                      {"context", "context"},              {"splits", "splits"},
                      {"cached_us", "cached us"},          {"cached_bytes", "cached bytes"},
                      {"cached_gb_per_s", "GB/s"},         {"copy_percent", "% of copy"},
                      {"read_percent", "% of read"},
                      {"cached_gflop_per_s", "GFLOP/s"},   {"uncached_us", "uncached us"},
                      {"uncached_gflop_per_s", "unc. GFLOP/s"}, {"uncached_over_cached", "uncached/cached"},
                      {"time_vs_first", "t / t(first)"},   {"kv_bytes_vs_first", "KV bytes / first"},
                      {"time_vs_contiguous", "vs contiguous"}, {"time_vs_16bit_kv", "vs 16-bit KV"}};
    return timing;
}

// A note that a step needs more device memory than is free: `what` says what was left out.
std::string memory_note(const TimingGrid& g, const Setting& s, const Run& run, const char* what, std::uint64_t needed) {
    return fmt::format("{} B={} T={}: {} {} of device memory and {} are free", run_label(g.plan, run, run.kernel, s.dtype),
                       s.n_batch, s.n_tokens, what, format_bytes(needed, UnitSystem::iec),
                       format_bytes(g.dev.memory_free_bytes, UnitSystem::iec));
}

// The cached step's cells: the kernel that ran, splits, time, bytes, GB/s against both references, GFLOP/s.
void add_cached_cells(TimingGrid& g, const GpuAttentionCost& cost, const GpuTiming& cached, std::vector<Cell>& row) {
    row[2] = text_cell(std::string(gpu_attention_kernel_name(cached.kernel)));
    // bytes per ns = GB/s, FLOPs per ns = GFLOP/s
    const double gb_s = static_cast<double>(cost.cached_bytes) / cached.median_ns;
    row.push_back(int_cell(cached.n_split));
    row.push_back(real_cell(cached.median_ns / 1e3, 1));
    row.push_back(bytes_cell(cost.cached_bytes, UnitSystem::iec));
    row.push_back(real_cell(gb_s, 1));
    row.push_back(real_cell(100.0 * gb_s / g.bw.copy_gb_s, 1));
    row.push_back(real_cell(100.0 * gb_s / g.bw.read_gb_s, 1));
    g.read_percent.push_back(100.0 * gb_s / g.bw.read_gb_s);
    row.push_back(real_cell(cost.cached_flops / cached.median_ns, 1));
}

// What was timed of one run at one setting.
struct Measured {
    bool fits = false;            // the cached step fit in device memory and was timed
    GpuTiming cached;
    bool uncached_timed = false;  // the run has an uncached step, it fit, and was timed
    GpuTiming uncached;
};

// Times one path of every run at a setting into m: the cached steps that fit, or the uncached steps of the runs
// that have one (contiguous 16-bit caches) where they fit.
void measure_setting(TimingGrid& g, const Setting& s, GpuAttentionPath path, std::vector<Measured>& m) {
    for (std::size_t r = 0; r < g.plan.runs.size(); ++r) {
        const GpuAttentionProblem p = problem_for(g.plan, s, g.plan.runs[r]);
        const GpuAttentionCost cost = gpu_attention_cost(p);
        if (path == GpuAttentionPath::cached) {
            if (cost.cached_device_bytes + g.flush_bytes > g.dev.memory_free_bytes) continue;
            m[r].fits = true;
            m[r].cached = gpu_attention_time(p, path, g.o.n_warmup, g.o.n_repeat);
        } else if (m[r].fits && gpu_attention_has_uncached(p) &&
                   cost.uncached_device_bytes + g.flush_bytes <= g.dev.memory_free_bytes) {
            m[r].uncached_timed = true;
            m[r].uncached = gpu_attention_time(p, path, g.o.n_warmup, g.o.n_repeat);
        }
    }
}

// The uncached step's cells where it was timed, else n/a and a note saying why; "-" for caches without an
// uncached step (paged or fp8).
void add_uncached_cells(TimingGrid& g, const Setting& s, const Run& run, const GpuAttentionProblem& p,
                        const GpuAttentionCost& cost, const Measured& m, std::vector<Cell>& row) {
    if (!gpu_attention_has_uncached(p)) {
        for (int i = 0; i < 3; ++i) row.push_back(dash_cell());
        g.no_uncached = true;
    } else if (m.uncached_timed) {
        row.push_back(real_cell(m.uncached.median_ns / 1e3, 1));
        row.push_back(real_cell(cost.uncached_flops / m.uncached.median_ns, 1));
        row.push_back(ratio_cell(m.uncached.median_ns / m.cached.median_ns));
    } else {
        row.push_back(Cell{"n/a", nullptr});
        row.push_back(Cell{"n/a", nullptr});
        row.push_back(Cell{"n/a", nullptr});
        g.timing.notes.push_back(memory_note(g, s, run, "uncached not timed, it needs",
                                             cost.uncached_device_bytes + g.flush_bytes));
    }
}

// The cached time of the run with runs[r]'s kernel and variant and the given KV dtype and layout at the
// same setting; 0 when that run is not asked for or was not timed.
double twin_ns(const Plan& plan, std::size_t r, bool kv_fp8, std::int64_t block_size, const std::vector<double>& ns) {
    const Run& a = plan.runs[r];
    for (std::size_t i = 0; i < plan.runs.size(); ++i) {
        const Run& b = plan.runs[i];
        if (b.kernel == a.kernel && b.variant == a.variant && b.kv_fp8 == kv_fp8 && b.block_size == block_size) return ns[i];
    }
    return 0;
}

// "vs contiguous" (paged rows) and "vs 16-bit KV" (fp8 rows): this row's time over its twin's, "-" elsewhere.
void add_twin_cells(const Plan& plan, std::size_t r, const std::vector<double>& ns, std::vector<Cell>& row) {
    const Run& run = plan.runs[r];
    const double contiguous = run.block_size > 0 ? twin_ns(plan, r, run.kv_fp8, 0, ns) : 0;
    row.push_back(contiguous > 0 ? ratio_cell(ns[r] / contiguous) : dash_cell());
    const double sixteen = run.kv_fp8 ? twin_ns(plan, r, false, run.block_size, ns) : 0;
    row.push_back(sixteen > 0 ? ratio_cell(ns[r] / sixteen) : dash_cell());
}

// The rows of one dtype, batch and context from what was timed: a row each, or a note when it did not fit.
void time_setting(TimingGrid& g, const Setting& s, const std::vector<Measured>& m) {
    double first_ns = 0;
    std::uint64_t first_kv = 0;
    std::vector<double> cached_ns(g.plan.runs.size(), 0.0);  // 0: not timed
    std::vector<std::pair<std::size_t, std::vector<Cell>>> rows;
    for (std::size_t r = 0; r < g.plan.runs.size(); ++r) {
        const Run& run = g.plan.runs[r];
        const GpuAttentionProblem p = problem_for(g.plan, s, run);
        const GpuAttentionCost cost = gpu_attention_cost(p);
        std::vector<Cell> row = {text_cell(g.plan.variant_names[run.variant]), int_cell(p.shape.n_head_kv), Cell{},
                                 text_cell(std::string(dtype_name(s.dtype))), text_cell(kv_dtype_name(run.kv_fp8, s.dtype)),
                                 text_cell(gpu_attention_layout_name(run.block_size)), int_cell(s.n_batch),
                                 int_cell(s.n_tokens)};
        if (!m[r].fits) {
            g.timing.notes.push_back(memory_note(g, s, run, "skipped, the cached step needs",
                                                 cost.cached_device_bytes + g.flush_bytes));
            continue;
        }
        const GpuTiming& cached = m[r].cached;
        add_cached_cells(g, cost, cached, row);
        add_uncached_cells(g, s, run, p, cost, m[r], row);
        if (first_ns == 0) {
            first_ns = cached.median_ns;
            first_kv = cost.kv_bytes;
        }
        row.push_back(ratio_cell(cached.median_ns / first_ns));
        row.push_back(ratio_cell(static_cast<double>(cost.kv_bytes) / static_cast<double>(first_kv)));
        cached_ns[r] = cached.median_ns;
        rows.emplace_back(r, std::move(row));
    }
    for (auto& [r, row] : rows) {  // the ratios once every run of the setting is timed, whatever the order
        add_twin_cells(g.plan, r, cached_ns, row);
        g.timing.rows.push_back(std::move(row));
    }
}

// The timing notes on paged and fp8 caches, where the table has them.
void add_layout_notes(TimingGrid& g) {
    const bool any_fp8 = std::find(g.plan.kv_fp8.begin(), g.plan.kv_fp8.end(), true) != g.plan.kv_fp8.end();
    const bool any_paged = std::any_of(g.plan.layouts.begin(), g.plan.layouts.end(), [](std::int64_t b) { return b > 0; });
    if (any_fp8 || any_paged)
        g.timing.notes.push_back("vs contiguous: a paged row's cached time / the contiguous row's with the same kernel, "
                             "variant and KV dtype; vs 16-bit KV: an fp8_e4m3 row's cached time / the row's with the same "
                             "kernel, variant and layout with K, V in the dtype; \"-\" for other rows or when that row "
                             "was not asked for or not timed");
    if (any_fp8)
        g.timing.notes.push_back("fp8_e4m3: K and V stored at 1 byte a value with one fp32 scale for K and one for V, "
                                 "dequantized in the kernel; q and out stay in the dtype");
    if (any_paged)
        g.timing.notes.push_back(g.plan.shuffled_blocks
                                     ? "paged N: K and V in a pool of B*ceil(T/N) blocks of N tokens (each sequence's last "
                                       "block padded), read through an int32 block table that is a shuffled permutation of "
                                       "the pool, as a pool that has been allocated from and freed for a while hands out blocks"
                                     : "paged N: K and V in a pool of B*ceil(T/N) blocks of N tokens (each sequence's last "
                                       "block padded), read through an int32 block table that names each sequence's blocks "
                                       "in order (--block-order in-order): the rows lie as a contiguous cache's do, so "
                                       "vs contiguous is what the lookups alone cost");
    if (g.no_uncached)
        g.timing.notes.push_back("uncached \"-\": the uncached step is timed for contiguous 16-bit caches only (it writes "
                                 "K, V in the dtype, contiguous); \"n/a\" means it did not fit in device memory");
}

// The notes under the timing table: how it was timed, what the columns mean, the kernels.
void add_timing_notes(TimingGrid& g) {
    g.timing.notes.push_back(fmt::format("median of {} repeats after {} warm-up runs, CUDA events around the step only; "
                                         "L2 ({}) flushed by a {} memset before every repeat; every cached step timed before any uncached one "
                                         "(right after the uncached step's GEMM a cached step ran up to 17 % slower)",
                                         g.o.n_repeat, g.o.n_warmup, format_bytes(g.dev.l2_bytes, UnitSystem::iec),
                                         format_bytes(g.flush_bytes, UnitSystem::iec)));
    g.timing.notes.push_back("cached bytes = K,V B*T*Hkv*D*2*bkv + block table B*ceil(T/block)*4 (paged only) + q B*H*D*b "
                             "+ out B*H*D*b (the fewest the step must move; b = 2 for fp16/bf16, bkv = b, or 1 for fp8_e4m3); "
                             "GB/s = cached bytes / time; % of copy = GB/s / D2D copy GB/s; % of read = GB/s / read GB/s");
    g.timing.notes.push_back("FLOPs: attention 4*B*H*D*T; uncached adds the K,V GEMM 2*(B*T)*d*(2*Hkv*D); "
                             "uncached/cached = uncached time / cached time");
    if (const std::string note = read_reference_note(g.read_percent); !note.empty()) g.timing.notes.push_back(note);
    g.timing.notes.push_back("t / t(first) and KV bytes / first compare each row with the first one timed at the same "
                             "dtype, batch and context (the first --kernel's first --attention variant, first KV dtype and "
                             "first layout)");
    add_layout_notes(g);
    g.timing.notes.push_back("kernel: cuda-cores does q.k and p.v as fp32 multiply-adds; tensor-cores as mma.sync on "
                             "16-head tiles (fp16/bf16 inputs, fp32 sums, P rounded to the dtype); auto picks tensor cores "
                             "for groups of 4 or more query heads per KV head, head dim 64 or 128, compute capability 8.0+");
}

// The timing grid: every setting timed, the L2 flushed before each repeat, then the notes.
Table timing_table(const GpuAttentionRequest& o, const Plan& plan, const CudaDevice& dev, const Bandwidth& bw) {
    TimingGrid g{o, plan, dev, bw, 2 * dev.l2_bytes, timing_table_header(), {}, false};
    // Every cached step of the grid first, then every uncached one: the uncached step's cuBLAS GEMM keeps the
    // tensor cores busy for 23 x 2-200 ms, and on an H200 the cached step timed right after it took up to
    // 17 % longer than the same step timed before any GEMM (docs/cuda-timing.md, "Timing order").
    std::vector<std::vector<Measured>> m(plan.settings.size(), std::vector<Measured>(plan.runs.size()));
    for (const GpuAttentionPath path : {GpuAttentionPath::cached, GpuAttentionPath::uncached})
        for (std::size_t i = 0; i < plan.settings.size(); ++i) measure_setting(g, plan.settings[i], path, m[i]);
    for (std::size_t i = 0; i < plan.settings.size(); ++i) time_setting(g, plan.settings[i], m[i]);
    add_timing_notes(g);
    return std::move(g.timing);
}

}  // namespace

std::string read_reference_note(const std::vector<double>& read_percent) {
    std::size_t n_over = 0;
    double highest = 0;
    for (const double r : read_percent) {
        if (r > 100.0) ++n_over;
        highest = std::max(highest, r);
    }
    if (n_over == 0) return "";
    return fmt::format("{} of {} cached steps moved more than the read reference (up to {:.1f} % of it): on this "
                       "device it is not a ceiling; % of copy is the figure the targets use",
                       n_over, read_percent.size(), highest);
}

GpuAttentionRun run_gpu_attention(const GpuAttentionRequest& o) {
    // 1. The native shape, from a model or from the explicit sizes.
    Plan plan = native_shape(o);

    // 2. Every list item parsed and every problem validated before the device is touched.
    parse_lists(o, plan);
    parse_kv_lists(o, plan);
    validate_flags(o, plan);
    plan.runs = kernel_major_runs(plan);
    validate_grid(plan);

    // 3. The device (throws "no CUDA device present" / "built without CUDA").
    const CudaDevice dev = cuda_device();
    Report report = report_with_inputs(o, plan);

    // 4. Correctness first, for every variant and dtype.
    std::vector<std::string> failures;
    const Table checks = correctness_checks(o, plan, failures);
    if (!failures.empty()) {
        report.tables.push_back(checks);
        return {report, fmt::format("gpu attention: {} of {} correctness checks failed (first: {}); no timings printed",
                                    failures.size(), checks.rows.size(), failures.front())};
    }

    // 5. The bandwidth references, then 6. the timing grid.
    const Bandwidth bw = measure_bandwidth(o, dev);
    const Table device = device_table(dev, bw);
    const Table timing = timing_table(o, plan, dev, bw);
    report.tables.push_back(device);
    report.tables.push_back(checks);
    report.tables.push_back(timing);
    return {report, ""};
}

}  // namespace kvlab
