// kvlab_bench_trace: are the trace tools linear in steps? Writes a long step trace (a 1-layer, 8-wide
// model decoding N steps with a 16-position window: cheap per step), then times `kvlab trace summary`,
// `steps`, `compare` (the trace with itself) and `plot` as whole processes at N/10 and N steps. Each
// figure is the median of the repeats with its fastest and slowest; the ratios compare each tool with
// summary (one pass over the records) at the same N, and each tool at N with itself at N/10 (10 for a
// linear tool, 100 for a quadratic one). Method and results: docs/performance.md, "Trace tools".
#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "bench_common.hpp"
#include "child_process.hpp"
#include "core/atomic_write.hpp"

using namespace kvlab;
using namespace kvlab::bench;
namespace fs = std::filesystem;

namespace {

struct Tool {
    std::string name;
    std::vector<std::string> args;  // after the kvlab path; {} stands for the trace
    bool needs_gnuplot = false;
};

// the trace of an N-step cached run on the smallest model, written by kvlab simulate
fs::path write_trace(const std::string& kvlab, const fs::path& dir, std::int64_t n_steps) {
    const fs::path config = dir / "tiny.json";
    write_atomically(config, "config", [&](std::ostream& out) {
        out << fmt::format(R"({{"model_type":"llama","hidden_size":8,"num_attention_heads":1,"num_hidden_layers":1,)"
                           R"("intermediate_size":16,"vocab_size":32,"max_position_embeddings":{}}})",
                           n_steps + 8);
    });
    const fs::path trace = dir / fmt::format("t{}.csv", n_steps);
    run_child({kvlab, "simulate", "-c", config.string(), "-p", "1", "-n", std::to_string(n_steps), "--mode", "cached", "--window", "16",
               "--no-quality", "--deterministic", "--threads", "1", "-q", "-f", "csv", "--trace", trace.string()});
    return trace;
}

Stat time_tool(const std::string& kvlab, const Tool& tool, const fs::path& trace, const fs::path& dir, int repeats) {
    std::vector<double> walls;
    for (int r = 0; r < repeats; ++r) {
        std::vector<std::string> args{kvlab};
        for (const std::string& a : tool.args) args.push_back(a == "{}" ? trace.string() : a == "{out}" ? (dir / "chart.svg").string() : a);
        walls.push_back(run_child(args).wall_s);
    }
    return stat_of(walls);
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"kvlab_bench_trace: trace summary, steps, compare and plot timed at N/10 and N steps (linear in steps?)"};
    std::int64_t n_steps = 100000;
    int repeats = 3, threads = 1;
    std::string json, format = "table", kvlab = KVLAB_CLI_PATH;
    app.add_option("-n,--steps", n_steps, "Steps in the long trace (the short one has a tenth)")->capture_default_str();
    app.add_option("-r,--repeats", repeats, "Timed runs of each tool; the median is reported")->capture_default_str();
    app.add_option("--kvlab", kvlab, "The kvlab binary to time")->capture_default_str();
    add_common_options(app, threads, json, format);
    CLI11_PARSE(app, argc, argv);
    try {
        const TempDir dir;
        const bool gnuplot = std::system("gnuplot --version > /dev/null 2>&1") == 0;
        const std::vector<Tool> tools{{"summary", {"trace", "summary", "{}", "-f", "csv"}},
                                      {"steps", {"trace", "steps", "{}", "-f", "csv"}},
                                      {"steps --ops", {"trace", "steps", "{}", "--ops", "-f", "csv"}},
                                      {"compare", {"trace", "compare", "{}", "{}", "-f", "csv"}},
                                      {"plot", {"trace", "plot", "{}", "-o", "{out}"}, true}};
        const std::int64_t sizes[2] = {n_steps / 10, n_steps};
        fs::path traces[2];
        for (int i = 0; i < 2; ++i) traces[i] = write_trace(kvlab, dir.path(), sizes[i]);
        Table t;
        t.title = fmt::format("trace tools at {} and {} steps (whole processes, median of {}; the trace is read and checked each run)",
                              sizes[0], sizes[1], repeats);
        t.columns = {{"tool", "tool", false}, {"short_s", fmt::format("{} steps (s)", sizes[0])}, {"long_s", fmt::format("{} steps (s)", sizes[1])},
                     {"long_min_s", "fastest (s)"}, {"long_max_s", "slowest (s)"}, {"growth", "long / short"}, {"vs_summary", "vs summary"}};
        double summary_long = 0;
        for (const Tool& tool : tools) {
            if (tool.needs_gnuplot && !gnuplot) {
                t.notes.push_back(tool.name + " skipped: no gnuplot");
                continue;
            }
            const Stat short_run = time_tool(kvlab, tool, traces[0], dir.path(), repeats);
            const Stat long_run = time_tool(kvlab, tool, traces[1], dir.path(), repeats);
            if (tool.name == "summary") summary_long = long_run.median;
            t.rows.push_back({text_cell(tool.name), real_cell(short_run.median, 3), real_cell(long_run.median, 3), real_cell(long_run.min, 3),
                              real_cell(long_run.max, 3), real_cell(long_run.median / short_run.median, 1),
                              real_cell(long_run.median / summary_long, 2)});
        }
        t.notes.push_back("long / short: 10 for a tool linear in steps, 100 for a quadratic one (fixed start-up costs pull it below 10)");
        t.notes.push_back("timed figures: wall time of whole processes on this machine; fastest and slowest show their spread");
        Report report;
        report.tables.push_back(std::move(t));
        emit_report(report, parse_choice(format_choices, format, "--format"), json);
    } catch (const Error& e) {
        std::cerr << "kvlab_bench_trace: " << e.what() << "\n";
        return e.exit_code();
    }
    return 0;
}
