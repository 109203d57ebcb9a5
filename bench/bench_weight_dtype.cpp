// kvlab_bench_weight_dtype: cached decode speed with the weights read narrow (simulate --weight-dtype),
// as ratios to fp32 measured in the same run. A decode step of a model whose weights do not fit the
// CPU's caches streams every weight from DRAM once, so its speed should follow the bytes: the target
// (issue "Performance that holds on any host") is bf16 >= 1.7x fp32's tokens/s on stories110M's shape.
// The formats run in turn within each repeat (forwards, then backwards), medians reported.
// docs/performance.md, "Weight precision".
#include <algorithm>
#include <fstream>
#include <iostream>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <omp.h>

#include "bench_common.hpp"
#include "calc/presets.hpp"
#include "core/error.hpp"
#include "core/printer.hpp"
#include "core/units.hpp"
#include "model/narrow_weights.hpp"
#include "model/random_weights.hpp"
#include "model/simulator.hpp"

using namespace kvlab;
using kvlab::bench::median;

namespace {

struct DecodeRate {
    double tokens_per_s = 0.0;
    double weight_bytes_per_step = 0.0;  // counted, at the stored width
};

// Decode steps (1..) of one run.
DecodeRate decode_rate(const SimulationResult& r) {
    std::int64_t ns = 0, n = 0;
    std::uint64_t bytes = 0;
    for (const StepRecord& rec : r.records)
        if (rec.step > 0) {
            ns += rec.wall_ns;
            bytes += rec.cost.total().bytes_weights_read;
            ++n;
        }
    return {static_cast<double>(n) / (static_cast<double>(ns) * 1e-9), static_cast<double>(bytes) / static_cast<double>(n)};
}

}  // namespace

int main(int argc, char** argv) {
    std::string model = "stories110m", dtypes = "fp32,bf16,fp16,q8_0", format = "table", json;
    std::int64_t prompt = 16, steps = 16;
    int repeats = 5, threads = 0;
    CLI::App app{"kvlab weight storage speed benchmark: cached decode per --weight-dtype, as ratios to fp32"};
    app.add_option("-m,--model", model, "Preset whose shape runs (random weights)")->capture_default_str();
    app.add_option("--weight-dtype", dtypes, "Formats; fp32 is added first if missing")->capture_default_str();
    app.add_option("-p,--prompt-len", prompt, "Prompt tokens")->check(CLI::Range(1, 4096))->capture_default_str();
    app.add_option("-n,--steps", steps, "Decode steps measured per run")->check(CLI::Range(2, 4096))->capture_default_str();
    app.add_option("-r,--repeats", repeats, "Runs per format; medians are reported")->check(CLI::PositiveNumber)->capture_default_str();
    app.add_option("--threads", threads, "Threads (0 = every core)")->capture_default_str();
    app.add_option("--json", json, "Also write the report as JSON to this file");
    app.add_option("-f,--format", format, "table, csv, json or markdown")->capture_default_str();
    CLI11_PARSE(app, argc, argv);
    try {
        const Format fmt_out = parse_choice(format_choices, format, "--format");
        if (!json.empty()) check_output_path(json, "--json");
        const int n_threads = threads > 0 ? threads : omp_get_num_procs();
        omp_set_dynamic(0);
        omp_set_num_threads(n_threads);
        const ModelConfig cfg = load_preset(model);
        std::vector<DType> list{DType::fp32};
        for (const auto& d : split_list(dtypes))
            if (const DType t = parse_dtype(d, "--weight-dtype"); t != DType::fp32) {
                check_weight_dtype(t);
                check_weight_shapes(cfg, t);
                list.push_back(t);
            }
        const Weights w = random_weights(cfg, 7);
        std::vector<std::vector<double>> rates(list.size());
        std::vector<double> bytes(list.size());
        for (int r = 0; r < repeats; ++r)
            for (std::size_t j = 0; j < list.size(); ++j) {
                const std::size_t i = r % 2 ? list.size() - 1 - j : j;  // forwards, then backwards: no format always first
                SimulateOptions o;
                o.mode = SimMode::cached;
                o.n_prompt = prompt;
                o.n_steps = steps + 1;  // step 0 is the prefill
                o.weight_dtype = list[i];
                o.prompt_ids = simulation_prompt(cfg, o);
                const DecodeRate d = decode_rate(run_simulation(cfg, w, o));
                rates[i].push_back(d.tokens_per_s);
                bytes[i] = d.weight_bytes_per_step;
            }
        Report report;
        report.inputs = {{"model", cfg.name}, {"prompt_len", prompt}, {"steps", steps}, {"repeats", repeats}, {"threads", n_threads}};
        Table t;
        t.title = fmt::format("Cached decode per weight storage: {} (random weights), {} prompt tokens, {} steps, {} runs each, {} thread{}",
                              cfg.display_name, prompt, steps, repeats, n_threads, n_threads == 1 ? "" : "s");
        t.columns = {{"weight_dtype", "weights", false}, {"weight_bytes_per_step", "weights read/step"}, {"bytes_vs_fp32", "bytes vs fp32"},
                     {"tokens_per_s", "decode tok/s"},   {"speed_vs_fp32", "tok/s vs fp32"},          {"weight_bytes_per_s", "weights read/s"},
                     {"met", "bf16 >= 1.7x fp32", false}};
        const double fp32_rate = median(rates[0]);
        for (std::size_t i = 0; i < list.size(); ++i) {
            const double rate = median(rates[i]), speed = rate / fp32_rate;
            t.rows.push_back({text_cell(std::string(dtype_name(list[i]))), bytes_cell(static_cast<std::uint64_t>(bytes[i]), UnitSystem::iec),
                              ratio_cell(bytes[i] / bytes[0]), real_cell(rate, 1), ratio_cell(speed),
                              bytes_cell(static_cast<std::uint64_t>(bytes[i] * rate), UnitSystem::si),
                              text_cell(list[i] != DType::bf16 ? "-" : speed >= 1.7 ? "met" : "not met")});
        }
        t.notes.push_back("weights read/step: the counted bytes of a decode step's weights at the stored width (block scales included; the "
                          "embedding row and norms stay fp32); weights read/s = that x decode tok/s");
        t.notes.push_back("a narrow run also decodes the same tokens with the fp32 weights for its quality figures, outside the timed forward");
        report.tables.push_back(std::move(t));
        bench::emit_report(report, fmt_out, json);
    } catch (const kvlab::Error& e) {
        std::cerr << "kvlab_bench_weight_dtype: error: " << e.what() << "\n";
        return e.exit_code();
    }
    return 0;
}
