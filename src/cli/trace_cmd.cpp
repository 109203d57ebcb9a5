// `kvlab trace`: read step traces written by `kvlab simulate --trace` (CSV, JSON Lines, Perfetto JSON):
// summary (simulate's table again), steps (per step and per op), compare (two traces), plot (gnuplot).
#include <iostream>
#include <filesystem>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "commands.hpp"
#include "options.hpp"
#include "kvlab/core/error.hpp"
#include "trace/serve_trace.hpp"
#include "trace/trace_plot.hpp"
#include "trace/trace_reader.hpp"
#include "trace/trace_report.hpp"
#include "kvlab/core/units.hpp"

namespace kvlab::cli {

struct TraceSummaryOptions {
    std::string file;
    UnitSystem units = UnitSystem::iec;
    Format format = Format::table;
};

struct TraceStepsOptions {
    std::string file;
    std::int64_t every = 1;
    bool ops = false;
    UnitSystem units = UnitSystem::iec;
    Format format = Format::table;
};

struct TraceCompareOptions {
    std::string file_a;
    std::string file_b;
    std::int64_t every = 1;
    UnitSystem units = UnitSystem::iec;
    Format format = Format::table;
};

struct TracePlotOptions {
    std::vector<std::string> files;
    std::string output;
    bool log = false;
    bool linear = false;
};

namespace {

void print(const Report& report, Format format) {
    print_report(std::cout, report, format);
    std::cout.flush();
}

// steps and compare read simulate's traces; a serve trace gets one line saying what reads it
void refuse_serve_trace(const std::string& file, const char* sub) {
    if (is_serve_trace_file(file))
        throw UsageError(fmt::format("trace {}: {} is a kvlab serve trace; serve traces are read by `kvlab trace summary` and "
                                     "`kvlab trace plot` (one file), or opened in Perfetto as .json", sub, file));
}

}  // namespace

void setup_trace(CLI::App& app) {
    auto* trace = app.add_subcommand("trace", "Read traces: kvlab simulate --trace (summary, steps, compare, plot) and kvlab serve --trace (summary, plot)");
    trace->require_subcommand(1);

    auto so = std::make_shared<TraceSummaryOptions>();
    auto* summary = trace->add_subcommand("summary", "The cached-vs-uncached table simulate printed, rebuilt from a trace");
    input_file(summary->add_option("file", so->file, "Trace file (.csv, .jsonl or Perfetto .json)"))->required();
    add_units_option(summary, so->units);
    add_format_option(summary, so->format);
    summary->footer("Example:\n  kvlab trace summary run.json --format markdown");
    summary->callback([so] {
        if (is_serve_trace_file(so->file)) print(serve_trace_summary(read_serve_trace(so->file), so->units, so->format), so->format);
        else print(trace_summary_report(read_step_trace(so->file), so->units), so->format);
    });

    auto st = std::make_shared<TraceStepsOptions>();
    auto* steps = trace->add_subcommand("steps", "One row per step per mode; --ops adds one row per op");
    input_file(steps->add_option("file", st->file, "Trace file (.csv, .jsonl or Perfetto .json)"))->required();
    steps->add_option("--every", st->every, "Show every K-th step (and the last)")->capture_default_str();
    steps->add_flag("--ops", st->ops, "Add the per-op breakdown of each shown step");
    add_units_option(steps, st->units);
    add_format_option(steps, st->format);
    steps->footer("Example:\n  kvlab trace steps run.csv --every 32 --ops");
    steps->callback([st] {
        steps_shown(1, st->every);  // --every checked before the file is read
        refuse_serve_trace(st->file, "steps");
        print(trace_steps_report(read_step_trace(st->file), st->every, st->ops, st->units), st->format);
    });

    auto co = std::make_shared<TraceCompareOptions>();
    auto* compare = trace->add_subcommand("compare", "Compare trace B against trace A: totals and per-step deltas and ratios");
    input_file(compare->add_option("a", co->file_a, "Trace A (the reference)"))->required();
    input_file(compare->add_option("b", co->file_b, "Trace B"))->required();
    compare->add_option("--every", co->every, "Show every K-th step (and the last)")->capture_default_str();
    add_units_option(compare, co->units);
    add_format_option(compare, co->format);
    compare->footer("Example:\n  kvlab trace compare mha.jsonl gqa.jsonl --every 16");
    compare->callback([co] {
        steps_shown(1, co->every);
        refuse_serve_trace(co->file_a, "compare");
        refuse_serve_trace(co->file_b, "compare");
        const StepTrace a = read_step_trace(co->file_a);
        const StepTrace b = read_step_trace(co->file_b);
        print(trace_compare_report(a, b, co->file_a, co->file_b, co->every, co->units), co->format);
    });

    auto po = std::make_shared<TracePlotOptions>();
    auto* plot = trace->add_subcommand(
        "plot", "Chart per-step and cumulative FLOPs and bytes, time and KV bytes with gnuplot (.svg or .png); several traces overlaid");
    input_file(plot->add_option("files", po->files, "Trace files (.csv, .jsonl or Perfetto .json), 1 to 6, overlaid and labelled by file name"))
        ->required()
        ->expected(1, static_cast<int>(max_plot_traces));
    output_file(plot->add_option("-o,--output", po->output, "Chart file: .svg or .png"))->required();
    auto* log = plot->add_flag("--log", po->log, "Logarithmic y axes (for traces whose sizes differ by orders of magnitude)");
    plot->add_flag("--linear", po->linear, "Linear y axes (the default: linear growth looks linear)")->excludes(log);
    plot->footer("Examples:\n  kvlab trace plot run.json -o run.svg\n  kvlab trace plot mha.jsonl gqa.jsonl mqa.jsonl -o attention.svg");
    plot->callback([po] {
        if (po->files.size() == 1 && is_serve_trace_file(po->files[0])) {
            if (po->log) throw UsageError("trace plot --log: serve traces are drawn on linear axes; expected no --log");
            plot_serve_trace(read_serve_trace(po->files[0]), po->output);
            std::cout << fmt::format("wrote {}\n", po->output);
            return;
        }
        for (const auto& f : po->files) refuse_serve_trace(f, "plot (several files)");
        std::vector<StepTrace> traces;
        for (const auto& f : po->files) traces.push_back(read_step_trace(f));
        std::vector<PlotInput> inputs;
        for (std::size_t i = 0; i < traces.size(); ++i) {
            // the file's stem names its series; the whole path when two stems are the same
            std::string label = std::filesystem::path(po->files[i]).stem().string();
            for (std::size_t j = 0; j < traces.size(); ++j)
                if (j != i && std::filesystem::path(po->files[j]).stem() == std::filesystem::path(po->files[i]).stem()) label = po->files[i];
            inputs.push_back({&traces[i], label});
        }
        plot_traces(inputs, po->output, po->log ? PlotScale::log : PlotScale::linear);
        std::cout << fmt::format("wrote {}\n", po->output);
    });
}

}  // namespace kvlab::cli
