// Counting overhead of `kvlab simulate`: the same run with cost counting on and off, alternated,
// best of N repeats per mode. Not a test: run `build/release/bench/kvlab_bench_counting`.
#include <algorithm>
#include <iostream>
#include <limits>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "kvlab/error.hpp"
#include "kvlab/presets.hpp"
#include "kvlab/printer.hpp"
#include "kvlab/random_weights.hpp"
#include "kvlab/simulation_report.hpp"
#include "kvlab/simulator.hpp"

int main(int argc, char** argv) {
    using namespace kvlab;
    std::string model = "stories15m", format = "table";
    std::int64_t prompt_len = 32, steps = 128;
    int repeats = 5;
    CLI::App app{"kvlab counting-overhead benchmark"};
    app.add_option("-m,--model", model, "Preset or config.json")->capture_default_str();
    app.add_option("-p,--prompt-len", prompt_len)->capture_default_str();
    app.add_option("-n,--steps", steps)->capture_default_str();
    app.add_option("-r,--repeats", repeats, "Runs per setting; the fastest counts")->capture_default_str();
    app.add_option("-f,--format", format, "table, csv, json or markdown")->capture_default_str();
    CLI11_PARSE(app, argc, argv);
    try {
        const ModelConfig cfg = simulation_config(load_model(model), std::nullopt);
        const Weights weights = random_weights(cfg, 42);
        SimulateOptions o;
        o.n_prompt = prompt_len;
        o.n_steps = steps;
        // best wall time per mode, counting on [1] and off [0]
        std::int64_t best[2][2] = {{std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::max()},
                                   {std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::max()}};
        for (int r = 0; r < repeats; ++r)
            for (const bool count : {true, false}) {
                o.count = count;
                const auto result = run_simulation(cfg, weights, o);
                for (const StepMode m : {StepMode::cached, StepMode::uncached}) {
                    auto& b = best[count ? 1 : 0][m == StepMode::cached ? 0 : 1];
                    b = std::min(b, mode_totals(result.records, m).wall_ns);
                }
            }
        Report report;
        report.inputs = {{"model", cfg.name}, {"prompt_len", prompt_len}, {"steps", steps}, {"repeats", repeats}};
        Table t;
        t.title = fmt::format("cost-counting overhead, {} (best of {})", cfg.display_name, repeats);
        t.columns = {{"mode", "mode", false}, {"wall_ms_counting", "counting on (ms)"}, {"wall_ms_no_counting", "off (ms)"},
                     {"overhead_percent", "overhead (%)"}};
        for (const StepMode m : {StepMode::cached, StepMode::uncached}) {
            const int i = m == StepMode::cached ? 0 : 1;
            const double on = static_cast<double>(best[1][i]) * 1e-6, off = static_cast<double>(best[0][i]) * 1e-6;
            t.rows.push_back({text_cell(std::string(step_mode_name(m))), real_cell(on, 2), real_cell(off, 2),
                              real_cell(100.0 * (on - off) / off, 2)});
        }
        t.notes.push_back("target: overhead <= 3%; differences within run-to-run noise can be negative");
        report.tables.push_back(std::move(t));
        print_report(std::cout, report, parse_format(format, "--format"));
    } catch (const kvlab::Error& e) {
        std::cerr << "kvlab_bench_counting: error: " << e.what() << "\n";
        return e.exit_code();
    }
    return 0;
}
