// kvlab_bench_kv_dtype: cached decode speed per KV storage format at a long context, where reading the
// cache dominates a step. For each format: decode tokens/s and the cache's bytes read per second (at
// the stored width), each as a ratio to the fp32 cache measured in the same run. The target (issue
// "KV-cache precision"): every format's KV read bandwidth >= 70% of fp32's. docs/kv-precision.md.
#include <algorithm>
#include <fstream>
#include <iostream>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <omp.h>

#include "calc/presets.hpp"
#include "core/error.hpp"
#include "core/printer.hpp"
#include "core/units.hpp"
#include "model/random_weights.hpp"
#include "model/simulator.hpp"

using namespace kvlab;

namespace {

struct Rates {
    double tokens_per_s = 0.0;
    double kv_bytes_per_s = 0.0;  // counted KV bytes read / decode wall time
    double kv_bytes_per_step = 0.0;
};

// Decode steps (1..) of one run: tokens/s and the counted KV bytes read per second.
Rates decode_rates(const SimulationResult& r) {
    std::int64_t ns = 0, n = 0;
    std::uint64_t kv = 0;
    for (const StepRecord& rec : r.records)
        if (rec.step > 0) {
            ns += rec.wall_ns;
            kv += rec.cost.total().bytes_kv_read;
            ++n;
        }
    const double s = static_cast<double>(ns) * 1e-9;
    return {static_cast<double>(n) / s, static_cast<double>(kv) / s, static_cast<double>(kv) / static_cast<double>(n)};
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    std::string model = "tiny-llama", dtypes = "fp32,fp16,bf16,fp8_e4m3,fp8_e5m2,int8,q8_0,q4_0", format = "table", json;
    std::int64_t context = 2048, steps = 32;
    int repeats = 3, threads = 0;
    CLI::App app{"kvlab KV storage speed benchmark: cached decode per --kv-dtype at a long context, as ratios to fp32"};
    app.add_option("-m,--model", model, "Preset whose shape runs (random weights; its context raised to --context)")->capture_default_str();
    app.add_option("--kv-dtype", dtypes, "Formats, the first fp32 or fp32 is added")->capture_default_str();
    app.add_option("--context", context, "Positions held when decoding: prompt = context - steps")->check(CLI::Range(64, 1 << 20))->capture_default_str();
    app.add_option("-n,--steps", steps, "Decode steps measured")->check(CLI::Range(2, 4096))->capture_default_str();
    app.add_option("-r,--repeats", repeats, "Repeats; medians are reported")->check(CLI::PositiveNumber)->capture_default_str();
    app.add_option("--threads", threads, "Threads (0 = every core)")->capture_default_str();
    app.add_option("--json", json, "Also write the report as JSON to this file");
    app.add_option("-f,--format", format, "table, csv, json or markdown")->capture_default_str();
    CLI11_PARSE(app, argc, argv);
    try {
        const Format fmt_out = parse_choice(format_choices, format, "--format");
        const int n_threads = threads > 0 ? threads : omp_get_num_procs();
        omp_set_dynamic(0);
        omp_set_num_threads(n_threads);
        ModelConfig cfg = load_preset(model);
        cfg.n_ctx_max = std::max<std::int64_t>(cfg.n_ctx_max, context);
        cfg.sliding_window.reset();
        cfg.layer_windowed.assign(static_cast<std::size_t>(cfg.n_layer), false);
        const Weights w = random_weights(cfg, 7);
        std::vector<DType> list{DType::fp32};
        for (const auto& d : split_list(dtypes))
            if (const DType t = parse_dtype(d, "--kv-dtype"); t != DType::fp32) list.push_back(t);

        Report report;
        report.inputs = {{"model", cfg.name}, {"context", context}, {"steps", steps}, {"repeats", repeats}, {"threads", n_threads}};
        Table t;
        t.title = fmt::format("Cached decode per KV storage: {} (random weights), {} positions held, {} steps, {} thread{}", cfg.display_name,
                              context, steps, n_threads, n_threads == 1 ? "" : "s");
        t.columns = {{"kv_dtype", "KV storage", false},  {"kv_bytes_per_step", "KV read/step"}, {"tokens_per_s", "decode tok/s"},
                     {"kv_bytes_per_s", "KV read/s"},     {"speed_vs_fp32", "tok/s vs fp32"},  {"kv_bandwidth_vs_fp32", "KV B/s vs fp32"},
                     {"met", "KV B/s >= 0.7 fp32", false}};
        double fp32_tps = 0.0, fp32_bps = 0.0;
        for (const DType d : list) {
            std::vector<double> tps, bps;
            double per_step = 0.0;
            for (int r = 0; r < repeats; ++r) {
                SimulateOptions o;
                o.mode = SimMode::cached;
                o.n_prompt = context - steps;
                o.n_steps = steps + 1;  // step 0 is the prefill
                o.kv_storage = {d, KvScale::tensor};
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
            const double bw_ratio = bw / fp32_bps;
            t.rows.push_back({text_cell(std::string(dtype_name(d))), bytes_cell(static_cast<std::uint64_t>(per_step), UnitSystem::iec),
                              real_cell(tok, 1), bytes_cell(static_cast<std::uint64_t>(bw), UnitSystem::si), ratio_cell(tok / fp32_tps),
                              ratio_cell(bw_ratio), text_cell(d == DType::fp32 ? "-" : bw_ratio >= 0.7 ? "met" : "not met")});
        }
        t.notes.push_back("KV read/s: the cache's bytes read per step at the stored width (counted) / the step's wall time; a narrow run "
                          "also runs an fp32 cache beside it for its quality figures, outside the timed forward");
        report.tables.push_back(std::move(t));
        print_report(std::cout, report, fmt_out);
        if (!json.empty()) {
            std::ofstream out(json);
            if (!out) throw IoError(fmt::format("--json: cannot write '{}'", json));
            print_report(out, report, Format::json);
        }
    } catch (const kvlab::Error& e) {
        std::cerr << "kvlab_bench_kv_dtype: error: " << e.what() << "\n";
        return e.exit_code();
    }
    return 0;
}
