// kvlab_bench_kv_dtype: decode speed per KV storage format, as ratios to the fp32 cache measured in the
// same run. Two measurements (docs/kv-precision.md, "Speed"):
//  1. The decode attention op of the forward pass over a cache larger than twice the last-level CPU
//     cache, so its bytes come from DRAM every step: the cache's bytes read per second at the stored
//     width. The target (issue "KV-cache precision"): fp16, bf16, fp8 and int8 each >= 0.7 x fp32's.
//  2. The whole model decoding with 2048 positions held (random weights): tokens/s, and the KV bytes
//     read per second of its attention ops.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <vector>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <omp.h>

#include "bench_common.hpp"
#include "kvlab/calc/presets.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/core/printer.hpp"
#include "kvlab/core/units.hpp"
#include "kvlab/kv/kv_cache.hpp"
#include "kvlab/model/ops.hpp"
#include "kvlab/weights/random_weights.hpp"
#include "kvlab/sim/simulator.hpp"

using namespace kvlab;
using kvlab::bench::median;

namespace {

struct Rates {
    double tokens_per_s = 0.0;
    double kv_bytes_per_s = 0.0;  // counted KV bytes read / the attention ops' wall time
    double kv_bytes_per_step = 0.0;
};

// Decode steps (1..) of one run: tokens/s, and the counted KV bytes read per second of attention.
Rates decode_rates(const SimulationResult& r) {
    std::int64_t ns = 0, attention_ns = 0, n = 0;
    std::uint64_t kv = 0;
    for (const StepRecord& rec : r.records)
        if (rec.step > 0) {
            ns += rec.wall_ns;
            for (const Op op : {Op::kv_store, Op::qk, Op::softmax, Op::av}) attention_ns += rec.cost.wall_ns_of(op);
            kv += rec.cost.total().bytes_kv_read;
            ++n;
        }
    const auto k = static_cast<double>(kv);
    return {static_cast<double>(n) / (static_cast<double>(ns) * 1e-9), k / (static_cast<double>(attention_ns) * 1e-9), k / static_cast<double>(n)};
}

// The last-level cache's bytes as the kernel reports cpu0's (what lscpu prints), else sysconf's
// (glibc's may count every core complex's L3 of the socket); 0 if neither says.
std::uint64_t last_level_cache_bytes() {
    for (const char* level : {"index3", "index2"}) {
        std::ifstream in(fmt::format("/sys/devices/system/cpu/cpu0/cache/{}/size", level));
        std::uint64_t kib = 0;
        if (in >> kib) return kib * 1024;  // "32768K"
    }
    for (const int name : {_SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE})
        if (const long b = sysconf(name); b > 0) return static_cast<std::uint64_t>(b);
    return 0;
}

// One decode step's attention, every layer, over a cache holding `n_pos` positions of random K and V
// (normal, as the model's are roughly): the forward pass's attention op, as the forward pass calls it.
class AttentionRun {
public:
    AttentionRun(const ModelConfig& cfg, const KvStorage& storage, std::int64_t n_pos)
        : cfg_(cfg), shape_{cfg.n_head, cfg.n_head_kv, cfg.d_head}, n_pos_(n_pos), cache_(cfg, n_pos, storage) {
        std::mt19937 rng(11);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        MatrixRM rows(64, cfg.d_kv());
        for (std::int64_t l = 0; l < cfg.n_layer; ++l)
            for (std::int64_t r0 = 0; r0 < n_pos - 1; r0 += 64) {  // positions 0..n_pos-2; each step writes n_pos-1
                const std::int64_t n = std::min<std::int64_t>(64, n_pos - 1 - r0);
                for (const bool is_k : {true, false}) {
                    rows = rows.unaryExpr([&](float) { return normal(rng); });
                    if (KvRowStore* st = is_k ? cache_.k_store(l) : cache_.v_store(l)) {
                        if (!st->calibrated()) st->calibrate(rows, n);
                        for (std::int64_t i = 0; i < n; ++i) st->write(r0 + i, rows.row(i).data());
                    } else {
                        (is_k ? cache_.k(l) : cache_.v(l))->middleRows(r0, n) = rows.topRows(n);
                    }
                }
            }
        q_ = MatrixRM::Random(1, cfg.d_q());
        k_new_ = MatrixRM::Random(1, cfg.d_kv());
        v_new_ = MatrixRM::Random(1, cfg.d_kv());
        out_.resize(1, cfg.d_q());
        scores_.resize(omp_get_max_threads(), (attention_scratch_floats(shape_, n_pos) + 15) / 16 * 16);
    }
    // Seconds per step over `steps` steps; the counted KV bytes read per step into kv_read.
    double seconds_per_step(int steps, std::uint64_t& kv_read) {
        StepCost cost;
        OpRecorder rec(&cost);
        const OpScratch scratch{nullptr, &scores_};
        const auto t0 = std::chrono::steady_clock::now();
        for (int s = 0; s < steps; ++s)
            for (std::int64_t l = 0; l < cfg_.n_layer; ++l) {
                const KvView kv = cache_.view(l);
                attention(out_, q_, k_new_, v_new_, 1, n_pos_ - 1, kv, shape_, 0, scratch, rec);
            }
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
        kv_read = cost.total().bytes_kv_read / static_cast<std::uint64_t>(steps);
        return sec;
    }

private:
    ModelConfig cfg_;
    AttentionShape shape_;
    std::int64_t n_pos_;
    KvCache cache_;
    MatrixRM q_, k_new_, v_new_, out_, scores_;
};

}  // namespace

// The formats the target names (issue "KV-cache precision"); q8_0 and q4_0 are measured and reported.
bool is_target(DType d) {
    return d == DType::fp16 || d == DType::bf16 || d == DType::fp8_e4m3 || d == DType::fp8_e5m2 || d == DType::int8;
}

std::string verdict(DType d, double ratio, bool judged) {
    if (d == DType::fp32) return "-";
    if (!judged) return "not judged: the cache fits the CPU's";
    if (!is_target(d)) return ratio >= 0.7 ? "at or above (not a target)" : "below (not a target)";
    return ratio >= 0.7 ? "met" : "not met";
}

int main(int argc, char** argv) {
    std::string model = "tiny-llama", dtypes = "fp32,fp16,bf16,fp8_e4m3,fp8_e5m2,int8,q8_0,q4_0", format = "table", json, scale_name = "tensor";
    std::int64_t context = 2048, steps = 32, long_context = 0;
    int repeats = 3, threads = 0;
    CLI::App app{"kvlab KV storage speed benchmark: decode attention past the last-level cache, and the whole model's decode, per --kv-dtype, as ratios to fp32"};
    app.add_option("-m,--model", model, "Preset whose shape runs (random weights; its context raised to what runs)")->capture_default_str();
    app.add_option("--kv-dtype", dtypes, "Formats; fp32 is added first if missing")->capture_default_str();
    app.add_option("--context", context, "Whole-model run: positions held when decoding (prompt = context - steps)")->check(CLI::Range(64, 1 << 20))->capture_default_str();
    app.add_option("--long-context", long_context,
                   "Attention run: positions held (0: the smallest power of two from 4096 whose fp32 cache is at least twice the last-level cache)")
        ->check(CLI::Range(0, 1 << 24))->capture_default_str();
    app.add_option("-n,--steps", steps, "Decode steps measured")->check(CLI::Range(2, 4096))->capture_default_str();
    app.add_option("-r,--repeats", repeats, "Repeats; medians are reported")->check(CLI::PositiveNumber)->capture_default_str();
    app.add_option("--kv-scale", scale_name, "fp8 and int8 scales: tensor or token-head")->capture_default_str();
    bench::add_common_options(app, threads, json, format);
    CLI11_PARSE(app, argc, argv);
    try {
        const Format fmt_out = parse_choice(format_choices, format, "--format");
        if (!json.empty()) check_output_path(json, "--json");
        const KvScale scale = parse_choice(kv_scale_choices, scale_name, "--kv-scale");
        const int n_threads = bench::fix_threads(threads);
        ModelConfig cfg = load_preset(model);
        cfg.sliding_window.reset();
        cfg.layer_windowed.assign(static_cast<std::size_t>(cfg.n_layer), false);
        std::vector<DType> list{DType::fp32};
        for (const auto& d : split_list(dtypes))
            if (const DType t = parse_dtype(d, "--kv-dtype"); t != DType::fp32) list.push_back(t);
        for (const DType d : list) check_kv_storage({d, KvScale::tensor}, cfg.d_kv());

        // 1. decode attention over a cache past the last-level cache
        const std::uint64_t llc = last_level_cache_bytes();
        const std::uint64_t fp32_token = kv_stored_token_bytes({DType::fp32, KvScale::tensor}, cfg);
        if (long_context == 0) {
            long_context = 4096;
            while (fp32_token * static_cast<std::uint64_t>(long_context) < 2 * std::max<std::uint64_t>(llc, 32u << 20)) long_context *= 2;
        }
        // the target is judged only where the fp32 cache streams from DRAM: twice the last-level cache
        const bool judged = fp32_token * static_cast<std::uint64_t>(long_context) >= 2 * std::max<std::uint64_t>(llc, 32u << 20);
        ModelConfig long_cfg = cfg;
        long_cfg.n_ctx_max = std::max<std::int64_t>(cfg.n_ctx_max, long_context);
        Report report;
        report.inputs = {{"model", cfg.name},   {"long_context", long_context}, {"context", context},   {"steps", steps},
                         {"repeats", repeats},  {"threads", n_threads},         {"last_level_cache_bytes", llc},
                         {"kv_scale", scale_name}};
        Table a;
        a.title = fmt::format("Decode attention per KV storage: {}, {} positions held (fp32 cache {} = {:.1f}x the {} last-level cache), {} repeats of 4 steps, {} thread{}",
                              cfg.display_name, long_context, format_bytes(fp32_token * static_cast<std::uint64_t>(long_context), UnitSystem::iec),
                              static_cast<double>(fp32_token * static_cast<std::uint64_t>(long_context)) / static_cast<double>(std::max<std::uint64_t>(llc, 1)),
                              llc ? format_bytes(llc, UnitSystem::iec) : std::string("(unknown: 32 MiB assumed)"), std::max(3 * repeats, 9), n_threads, n_threads == 1 ? "" : "s");
        a.columns = {{"kv_dtype", "KV storage", false}, {"kv_bytes_per_step", "KV read/step"}, {"attention_ms", "attention ms/step"},
                     {"kv_bytes_per_s", "KV read/s"},    {"kv_bandwidth_vs_fp32", "KV B/s vs fp32"}, {"speed_vs_fp32", "step speed vs fp32"},
                     {"met", "KV B/s >= 0.7 fp32", false}};
        // every cache built first, then the formats timed in turn within each repeat, so a slow moment
        // of the machine lands on all of them alike; medians over the repeats
        std::vector<std::unique_ptr<AttentionRun>> runs;
        for (const DType d : list) runs.push_back(std::make_unique<AttentionRun>(long_cfg, KvStorage{d, scale}, long_context));
        const int long_repeats = std::max(3 * repeats, 9);  // ~30 ms each: many, so the median is steady
        std::vector<std::vector<double>> seconds(list.size());
        std::vector<std::uint64_t> kv_read(list.size());
        for (int r = 0; r < long_repeats; ++r)
            for (std::size_t j = 0; j < list.size(); ++j) {
                const std::size_t i = r % 2 ? list.size() - 1 - j : j;  // forwards, then backwards: no format always first
                seconds[i].push_back(runs[i]->seconds_per_step(4, kv_read[i]));
            }
        runs.clear();
        const double fp32_seconds = median(seconds[0]);
        const double fp32_long_bps = static_cast<double>(kv_read[0]) / fp32_seconds;
        for (std::size_t i = 0; i < list.size(); ++i) {
            const double sec = median(seconds[i]), bps = static_cast<double>(kv_read[i]) / sec;
            a.rows.push_back({text_cell(std::string(dtype_name(list[i]))), bytes_cell(kv_read[i], UnitSystem::iec), real_cell(sec * 1e3, 3),
                              bytes_cell(static_cast<std::uint64_t>(bps), UnitSystem::si), ratio_cell(bps / fp32_long_bps),
                              ratio_cell(fp32_seconds / sec), text_cell(verdict(list[i], bps / fp32_long_bps, judged))});
        }
        a.notes.push_back("the forward pass's attention op (store, QK, softmax, AV) on every layer for one new token, over random normal K and V; "
                          "KV read/s = the counted KV bytes read per step (at the stored width, scales included) / the step's attention time");
        a.notes.push_back("target (fp16, bf16, fp8, int8): KV read bandwidth >= 0.7 x fp32's, i.e. a narrow cache reads its bytes about as fast as fp32 "
                          "reads its own; q8_0 and q4_0 are measured too");
        report.tables.push_back(std::move(a));

        // 2. the whole model decoding at --context
        cfg.n_ctx_max = std::max<std::int64_t>(cfg.n_ctx_max, context);
        const Weights w = random_weights(cfg, 7);
        Table t;
        t.title = fmt::format("Cached decode per KV storage: {} (random weights), {} positions held, {} steps, {} thread{}", cfg.display_name,
                              context, steps, n_threads, n_threads == 1 ? "" : "s");
        t.columns = {{"kv_dtype", "KV storage", false},  {"kv_bytes_per_step", "KV read/step"}, {"tokens_per_s", "decode tok/s"},
                     {"speed_vs_fp32", "tok/s vs fp32"},  {"kv_bytes_per_s", "attention KV read/s"}, {"kv_bandwidth_vs_fp32", "KV B/s vs fp32"}};
        double fp32_tps = 0.0, fp32_bps = 0.0;
        for (const DType d : list) {
            std::vector<double> tps, bps;
            double per_step = 0.0;
            for (int r = 0; r < repeats; ++r) {
                SimulateOptions o;
                o.mode = SimMode::cached;
                o.n_prompt = context - steps;
                o.n_steps = steps + 1;  // step 0 is the prefill
                o.kv_storage = {d, scale};
                o.prompt_ids = simulation_prompt(cfg, o);
                const Rates rates = decode_rates(run_simulation(cfg, w, o));
                tps.push_back(rates.tokens_per_s);
                bps.push_back(rates.kv_bytes_per_s);
                per_step = rates.kv_bytes_per_step;
            }
            const double tok = median(tps), bw = median(bps);
            if (d == DType::fp32) {
                fp32_tps = tok;
                fp32_bps = bw;
            }
            t.rows.push_back({text_cell(std::string(dtype_name(d))), bytes_cell(static_cast<std::uint64_t>(per_step), UnitSystem::iec),
                              real_cell(tok, 1), ratio_cell(tok / fp32_tps), bytes_cell(static_cast<std::uint64_t>(bw), UnitSystem::si),
                              ratio_cell(bw / fp32_bps)});
        }
        t.notes.push_back("attention KV read/s: the counted KV bytes read per step / the time of the step's attention ops; a narrow run also runs "
                          "an fp32 cache beside it for its quality figures, outside the timed forward");
        report.tables.push_back(std::move(t));
        bench::emit_report(report, fmt_out, json);
    } catch (const kvlab::Error& e) {
        std::cerr << "kvlab_bench_kv_dtype: error: " << e.what() << "\n";
        return e.exit_code();
    }
    return 0;
}
