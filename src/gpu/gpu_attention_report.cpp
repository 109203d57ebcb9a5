#include "gpu/gpu_attention_report.hpp"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "calc/attention_variant.hpp"
#include "calc/presets.hpp"
#include "core/checked.hpp"
#include "core/error.hpp"
#include "core/units.hpp"
#include "gpu/gpu_attention.hpp"

namespace kvlab {

namespace {

struct Setting {
    DType dtype;
    std::int64_t n_batch;
    std::int64_t n_tokens;
};

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
    AttentionShape native;
    std::int64_t d_model = 0;
    std::string shape_source;
    if (!o.model.empty()) {
        const ModelConfig m = load_model(o.model);
        if (m.mla)
            throw UsageError(fmt::format("--model {}: multi-head latent attention caches a latent vector; the GPU "
                                         "kernel times MHA/GQA/MQA caches only (use --heads/--kv-heads/--head-dim)",
                                         o.model));
        native = AttentionShape{m.n_head, m.n_head_kv, m.d_head};
        d_model = m.d_model;
        shape_source = m.name;
    } else {
        if (o.n_head < 1 || o.d_head < 1)
            throw UsageError("gpu attention: give --model PRESET, or --heads and --head-dim (with --kv-heads, --hidden)");
        native = AttentionShape{o.n_head, o.n_head_kv > 0 ? o.n_head_kv : o.n_head, o.d_head};
        d_model = o.d_model > 0 ? o.d_model
                                : static_cast<std::int64_t>(checked_mul(static_cast<std::uint64_t>(o.n_head),
                                                                        static_cast<std::uint64_t>(o.d_head), "--heads x --head-dim"));
        shape_source = "explicit sizes";
    }

    // 2. Every list item parsed and every problem validated before the device is touched.
    std::vector<DType> dtypes;
    for (const std::string& name : split_list(o.dtype)) dtypes.push_back(parse_dtype(name, "--dtype"));
    std::vector<std::string> variant_names;
    std::vector<AttentionShape> variants;
    for (const AttentionVariant& v : parse_attention_variants(o.attention)) {
        variant_names.push_back(v.label);
        variants.push_back(attention_variant(native, v.label, "--attention"));
    }
    std::vector<GpuAttentionKernel> kernels;
    for (const std::string& name : split_list(o.kernel)) kernels.push_back(parse_gpu_attention_kernel(name, "--kernel"));
    const std::vector<std::uint64_t> batches = parse_count_list(o.batch, "--batch");
    const std::vector<std::uint64_t> contexts = parse_count_list(o.context, "--context");
    std::vector<Setting> settings;
    for (const DType dtype : dtypes)
        for (const std::uint64_t b : batches)
            for (const std::uint64_t t : contexts) {
                if (b > 65535 || t > (1ull << 40))
                    throw UsageError(fmt::format("--batch {} / --context {}: too large for the GPU path", b, t));
                settings.push_back(Setting{dtype, static_cast<std::int64_t>(b), static_cast<std::int64_t>(t)});
            }
    auto problem_for = [&](const Setting& s, const AttentionShape& shape, GpuAttentionKernel kernel) {
        GpuAttentionProblem p;
        p.kernel = kernel;
        p.shape = shape;
        p.d_model = d_model;
        p.n_batch = s.n_batch;
        p.n_tokens = s.n_tokens;
        p.dtype = s.dtype;
        return p;
    };
    // Each part checked under the flag that sets it: the shape, then the dtypes, then the grid.
    const std::string shape_flag = o.model.empty() ? "--heads/--kv-heads/--head-dim" : "--model " + o.model;
    const Setting one{DType::fp16, 1, 1};
    validate_gpu_attention_problem(problem_for(one, native, GpuAttentionKernel::automatic), shape_flag);
    for (const DType dtype : dtypes)
        validate_gpu_attention_problem(problem_for(Setting{dtype, 1, 1}, native, GpuAttentionKernel::automatic), "--dtype");
    for (const GpuAttentionKernel kernel : kernels)
        validate_gpu_attention_problem(problem_for(one, native, kernel),
                                       "--kernel " + std::string(gpu_attention_kernel_name(kernel)));
    // every kernel with every variant, kernel-major: the rows of the check and timing tables in order
    std::vector<std::pair<GpuAttentionKernel, std::size_t>> runs;
    for (const GpuAttentionKernel kernel : kernels)
        for (std::size_t i = 0; i < variants.size(); ++i) runs.emplace_back(kernel, i);
    for (const Setting& s : settings)
        for (const AttentionShape& shape : variants) {
            const GpuAttentionProblem p = problem_for(s, shape, GpuAttentionKernel::automatic);
            validate_gpu_attention_problem(p, "--batch/--context");
            (void)gpu_attention_cost(p);  // throws on 64-bit overflow
        }

    // 3. The device (throws "no CUDA device present" / "built without CUDA").
    const CudaDevice dev = cuda_device();

    Report report;
    report.inputs = {{"shape_source", shape_source}, {"n_head", native.n_head},     {"n_head_kv", native.n_head_kv},
                     {"d_head", native.d_head},      {"d_model", d_model},          {"batch", batches},
                     {"context", contexts},          {"dtype", o.dtype},            {"attention", variant_names},
                     {"kernel", o.kernel},
                     {"warmup", o.n_warmup},         {"repeats", o.n_repeat},       {"seed", o.seed}};

    // 4. Correctness first, for every variant and dtype.
    Table checks;
    checks.title = "Correctness against the CPU reference (attention_decode_ref)";
    checks.columns = {{"attention", "attention", false}, {"n_head_kv", "KV heads"}, {"kernel", "kernel", false},
                      {"dtype", "dtype", false},
                      {"path", "path", false},           {"batch", "batch"},        {"context", "context"},
                      {"hidden", "hidden"},              {"splits", "splits"},      {"max_abs_error", "max abs error"},
                      {"tolerance", "tolerance"},        {"passed", "passed", false}};
    std::vector<std::string> failures;
    for (const DType dtype : dtypes)
        for (const auto& [kernel, i] : runs) {
            const GpuAttentionProblem p = problem_for(Setting{dtype, 1, 1}, variants[i], kernel);
            for (const GpuAttentionCheck& c : gpu_attention_check(p, o.seed)) {
                checks.rows.push_back({text_cell(variant_names[i]), int_cell(variants[i].n_head_kv),
                                       text_cell(std::string(gpu_attention_kernel_name(c.kernel))),
                                       text_cell(std::string(dtype_name(dtype))),
                                       text_cell(std::string(gpu_attention_path_name(c.path))), int_cell(c.n_batch),
                                       int_cell(c.n_tokens), int_cell(c.d_model), int_cell(c.n_split),
                                       Cell{fmt::format("{:.3g}", c.max_abs_error), c.max_abs_error},
                                       Cell{fmt::format("{:.3g}", c.tolerance), c.tolerance},
                                       text_cell(c.passed ? "yes" : "NO")});
                if (!c.passed)
                    failures.push_back(fmt::format("{} {} {} {} B={} T={} splits={}: max abs error {:.3g} > {:.3g}",
                                                   variant_names[i], gpu_attention_kernel_name(c.kernel),
                                                   dtype_name(dtype), gpu_attention_path_name(c.path),
                                                   c.n_batch, c.n_tokens, c.n_split, c.max_abs_error, c.tolerance));
            }
        }
    checks.notes.push_back("tolerance: 2 units in the last place of the dtype at max(1, max |ref|) "
                           "(fp16 2^-10, bf16 2^-7); inputs are random and exactly representable in the dtype");
    if (!failures.empty()) {
        report.tables.push_back(checks);
        return {report, fmt::format("gpu attention: {} of {} correctness checks failed (first: {}); no timings printed",
                                    failures.size(), checks.rows.size(), failures.front())};
    }

    // 5. The bandwidth references: a device-to-device copy, read + write counted, and a kernel that only
    //    reads (the fastest of three load patterns), as the cached step nearly does.
    // 4 GiB where memory allows: the 1 GiB first used left a read 0.6 % short of the largest cached step
    // (32 GiB), the launch and the last wave weighing more in a shorter run.
    const std::uint64_t copy_bytes = std::min<std::uint64_t>(4ull << 30, dev.memory_free_bytes / 8) & ~std::uint64_t{255};
    const GpuTiming copy = cuda_copy_time(copy_bytes, o.n_warmup, o.n_repeat);
    const double copy_gb_s = 2.0 * static_cast<double>(copy_bytes) / copy.median_ns;  // bytes per ns = GB/s
    const GpuTiming read = cuda_read_time(copy_bytes, o.n_warmup, o.n_repeat);
    const double read_gb_s = static_cast<double>(copy_bytes) / read.median_ns;

    Table device;
    device.title = "Device";
    device.columns = {{"name", "GPU", false}, {"compute_capability", "CC", false}, {"n_sm", "SMs"},
                      {"l2_bytes", "L2"},      {"memory_bytes", "memory"},         {"copy_bytes", "copy size"},
                      {"copy_gb_per_s", "D2D copy GB/s"}, {"read_gb_per_s", "read GB/s"},
                      {"read_unroll", "read unroll"}};
    device.rows.push_back({text_cell(dev.name), text_cell(fmt::format("{}.{}", dev.cc_major, dev.cc_minor)),
                           int_cell(dev.n_sm), bytes_cell(dev.l2_bytes, UnitSystem::iec),
                           bytes_cell(dev.memory_bytes, UnitSystem::iec), bytes_cell(copy_bytes, UnitSystem::iec),
                           real_cell(copy_gb_s, 1), real_cell(read_gb_s, 1), int_cell(read.unroll)});
    device.notes.push_back("copy GB/s = 2 x copy size / median time of cudaMemcpyAsync device-to-device "
                           "(bytes read + bytes written)");
    device.notes.push_back("read GB/s = copy size / median time of a kernel that only reads it (16-byte loads, "
                           "a grid of 8 blocks of 256 threads per SM, the loop unrolled 4, 8 or 16 times, the fastest kept, "
                           "checked to read every byte): a measured reference for the cached step, which reads K and V "
                           "and writes almost nothing (the timing table says when a step beat it)");

    // 6. The timing grid.
    Table timing;
    timing.title = "Decode attention step, cached vs uncached (median of repeats, L2 flushed before each)";
    timing.columns = {{"attention", "attention", false},   {"n_head_kv", "KV heads"},
                      {"kernel", "kernel", false},
                      {"dtype", "dtype", false},           {"batch", "batch"},
                      {"context", "context"},              {"splits", "splits"},
                      {"cached_us", "cached us"},          {"cached_bytes", "cached bytes"},
                      {"cached_gb_per_s", "GB/s"},         {"copy_percent", "% of copy"},
                      {"read_percent", "% of read"},
                      {"cached_gflop_per_s", "GFLOP/s"},   {"uncached_us", "uncached us"},
                      {"uncached_gflop_per_s", "unc. GFLOP/s"}, {"uncached_over_cached", "uncached/cached"},
                      {"time_vs_first", "t / t(first)"},   {"kv_bytes_vs_first", "KV bytes / first"}};
    const std::uint64_t flush_bytes = 2 * dev.l2_bytes;
    std::vector<double> read_percent;  // every timed row's % of read, for the note below
    for (const Setting& s : settings) {
        double first_ns = 0;
        std::uint64_t first_kv = 0;
        for (const auto& [kernel, i] : runs) {
            const GpuAttentionProblem p = problem_for(s, variants[i], kernel);
            const GpuAttentionCost cost = gpu_attention_cost(p);
            std::vector<Cell> row = {text_cell(variant_names[i]), int_cell(p.shape.n_head_kv), Cell{},
                                     text_cell(std::string(dtype_name(s.dtype))), int_cell(s.n_batch),
                                     int_cell(s.n_tokens)};
            if (cost.cached_device_bytes + flush_bytes > dev.memory_free_bytes) {
                timing.notes.push_back(fmt::format("{} {} {} B={} T={}: skipped, the cached step needs {} of device "
                                                   "memory and {} are free",
                                                   variant_names[i], gpu_attention_kernel_name(kernel), dtype_name(s.dtype),
                                                   s.n_batch, s.n_tokens,
                                                   format_bytes(cost.cached_device_bytes + flush_bytes, UnitSystem::iec),
                                                   format_bytes(dev.memory_free_bytes, UnitSystem::iec)));
                continue;
            }
            const GpuTiming cached = gpu_attention_time(p, GpuAttentionPath::cached, o.n_warmup, o.n_repeat);
            row[2] = text_cell(std::string(gpu_attention_kernel_name(cached.kernel)));
            // bytes per ns = GB/s, FLOPs per ns = GFLOP/s
            const double gb_s = static_cast<double>(cost.cached_bytes) / cached.median_ns;
            row.push_back(int_cell(cached.n_split));
            row.push_back(real_cell(cached.median_ns / 1e3, 1));
            row.push_back(bytes_cell(cost.cached_bytes, UnitSystem::iec));
            row.push_back(real_cell(gb_s, 1));
            row.push_back(real_cell(100.0 * gb_s / copy_gb_s, 1));
            row.push_back(real_cell(100.0 * gb_s / read_gb_s, 1));
            read_percent.push_back(100.0 * gb_s / read_gb_s);
            row.push_back(real_cell(cost.cached_flops / cached.median_ns, 1));
            if (cost.uncached_device_bytes + flush_bytes <= dev.memory_free_bytes) {
                const GpuTiming uncached = gpu_attention_time(p, GpuAttentionPath::uncached, o.n_warmup, o.n_repeat);
                row.push_back(real_cell(uncached.median_ns / 1e3, 1));
                row.push_back(real_cell(cost.uncached_flops / uncached.median_ns, 1));
                row.push_back(ratio_cell(uncached.median_ns / cached.median_ns));
            } else {
                row.push_back(Cell{"n/a", nullptr});
                row.push_back(Cell{"n/a", nullptr});
                row.push_back(Cell{"n/a", nullptr});
                timing.notes.push_back(fmt::format("{} {} {} B={} T={}: uncached not timed, it needs {} of device memory "
                                                   "and {} are free",
                                                   variant_names[i], gpu_attention_kernel_name(kernel), dtype_name(s.dtype),
                                                   s.n_batch, s.n_tokens,
                                                   format_bytes(cost.uncached_device_bytes + flush_bytes, UnitSystem::iec),
                                                   format_bytes(dev.memory_free_bytes, UnitSystem::iec)));
            }
            if (first_ns == 0) {
                first_ns = cached.median_ns;
                first_kv = cost.kv_bytes;
            }
            row.push_back(ratio_cell(cached.median_ns / first_ns));
            row.push_back(ratio_cell(static_cast<double>(cost.kv_bytes) / static_cast<double>(first_kv)));
            timing.rows.push_back(std::move(row));
        }
    }
    timing.notes.push_back(fmt::format("median of {} repeats after {} warm-up runs, CUDA events around the step only; "
                                       "L2 ({}) flushed by a {} memset before every repeat",
                                       o.n_repeat, o.n_warmup, format_bytes(dev.l2_bytes, UnitSystem::iec),
                                       format_bytes(flush_bytes, UnitSystem::iec)));
    timing.notes.push_back("cached bytes = K,V B*T*Hkv*D*2*b + q B*H*D*b + out B*H*D*b (the fewest the step must move); "
                           "GB/s = cached bytes / time; % of copy = GB/s / D2D copy GB/s; % of read = GB/s / read GB/s");
    timing.notes.push_back("FLOPs: attention 4*B*H*D*T; uncached adds the K,V GEMM 2*(B*T)*d*(2*Hkv*D); "
                           "uncached/cached = uncached time / cached time");
    if (const std::string note = read_reference_note(read_percent); !note.empty()) timing.notes.push_back(note);
    timing.notes.push_back("t / t(first) and KV bytes / first compare each row with the first one timed at the same "
                           "dtype, batch and context (the first --kernel's first --attention variant)");
    timing.notes.push_back("kernel: cuda-cores does q.k and p.v as fp32 multiply-adds; tensor-cores as mma.sync on "
                           "16-head tiles (fp16/bf16 inputs, fp32 sums, P rounded to the dtype); auto picks tensor cores "
                           "for groups of 4 or more query heads per KV head, head dim 64 or 128, compute capability 8.0+");
    report.tables.push_back(device);
    report.tables.push_back(checks);
    report.tables.push_back(timing);
    return {report, ""};
}

}  // namespace kvlab
