#include "trace/trace_plot.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "kvlab/core/error.hpp"
#include "kvlab/core/text.hpp"
#include "report/gnuplot.hpp"
#include "trace/perfetto_trace.hpp"

namespace kvlab {

namespace fs = std::filesystem;

namespace {

std::int64_t modelled_step_ns(const StepRecord& r) {
    std::int64_t ns = 0;
    for (const auto& op : r.cost.ops) ns += modelled_op_ns(op);
    return ns;
}

// The data file gnuplot reads: a block per trace, a row per step (both modes, and running sums); `col_max`
// gets each column's largest value over every trace, which picks each panel's unit.
std::string plot_data(const std::vector<PlotInput>& traces, double (&col_max)[13]) {
    std::ostringstream out;
    for (std::size_t i = 0; i < traces.size(); ++i) {
        const StepTrace& trace = *traces[i].trace;
        const bool wall = trace.run.has_wall_time;
        out << (i ? "\n\n" : "") << "# step flops_c flops_u bytes_c bytes_u ms_c ms_u kv_c sum_flops_c sum_flops_u sum_bytes_c sum_bytes_u\n";
        double sum[4] = {0, 0, 0, 0};  // running sums as doubles: gnuplot reads numbers as doubles anyway
        const StepIndex index(trace);
        for (std::int64_t s = 0; s < trace.run.n_steps_done; ++s) {
            const StepRecord* c = index.find(StepMode::cached, s);
            const StepRecord* u = index.find(StepMode::uncached, s);
            auto col = [](const StepRecord* r, auto value) { return r ? fmt::format("{}", value(*r)) : std::string("?"); };
            auto flops = [](const StepRecord& r) { return r.cost.total().flops; };
            auto bytes = [](const StepRecord& r) { return r.cost.total().bytes_total(); };
            auto ms = [&](const StepRecord& r) { return static_cast<double>(wall ? r.wall_ns : modelled_step_ns(r)) * 1e-6; };
            auto kv = [](const StepRecord& r) { return r.kv_bytes_resident; };
            if (c) sum[0] += static_cast<double>(flops(*c)), sum[2] += static_cast<double>(bytes(*c));
            if (u) sum[1] += static_cast<double>(flops(*u)), sum[3] += static_cast<double>(bytes(*u));
            auto total = [&](const StepRecord* r, int k) { return r ? fmt::format("{:.17g}", sum[k]) : std::string("?"); };
            const double values[13] = {0, 0, c ? static_cast<double>(flops(*c)) : 0, u ? static_cast<double>(flops(*u)) : 0,
                                       c ? static_cast<double>(bytes(*c)) : 0, u ? static_cast<double>(bytes(*u)) : 0, 0, 0,
                                       c ? static_cast<double>(kv(*c)) : 0, sum[0], sum[1], sum[2], sum[3]};
            for (int k = 2; k < 13; ++k) col_max[k] = std::max(col_max[k], values[k]);
            out << s << ' ' << col(c, flops) << ' ' << col(u, flops) << ' ' << col(c, bytes) << ' ' << col(u, bytes) << ' '
                << col(c, ms) << ' ' << col(u, ms) << ' ' << col(c, kv) << ' ' << total(c, 0) << ' ' << total(u, 1) << ' '
                << total(c, 2) << ' ' << total(u, 3) << '\n';
        }
    }
    return out.str();
}

// The chart's title. It holds the traces' display names, text from the files: it reaches gnuplot as ARG2, a
// string value never read as script (a name with a newline and system("...") in it is only printed), and is
// drawn noenhanced so ^ _ { } @ print as themselves. One trace: its model, prompt and steps; several: their
// labels (the models are in `trace compare`).
std::string plot_title(const std::vector<PlotInput>& traces, PlotScale scale) {
    const bool labelled = traces.size() > 1;
    const StepTrace& first = *traces.front().trace;
    std::string title = fmt::format("kvlab trace: {}, prompt {}, {}", first.run.display_name, counted(first.run.n_prompt, "token"),
                                    counted(first.run.n_steps_done, "step"));
    if (labelled) {
        title = "kvlab trace: ";
        for (std::size_t i = 0; i < traces.size(); ++i) title += (i ? " vs " : "") + traces[i].label;
        bool same_run = true;
        for (const auto& t : traces)
            same_run = same_run && t.trace->run.n_prompt == first.run.n_prompt && t.trace->run.n_steps_done == first.run.n_steps_done;
        if (same_run) title += fmt::format(" (prompt {} tokens, {} steps each)", first.run.n_prompt, first.run.n_steps_done);
    }
    if (scale == PlotScale::log) title += " (log y)";
    return title;
}

// Line styles 10 + i (cached, solid) and 20 + i (uncached, dashed) for trace i. One trace: cached blue,
// uncached red (the colours say the mode); several: the colour says the trace.
void line_styles(std::ostream& gp, std::size_t n_traces, bool labelled) {
    static const char* colours[max_plot_traces] = {"#1b6ca8", "#d1495b", "#2e933c", "#8e44ad", "#e67e22", "#555555"};
    for (std::size_t i = 0; i < n_traces; ++i) {
        const char* cached = labelled ? colours[i] : colours[0];
        const char* uncached = labelled ? colours[i] : colours[1];
        gp << fmt::format("set style line {} lc rgb '{}' lw 2 pt 7 ps 0.4\n", 10 + i, cached)
           << fmt::format("set style line {} lc rgb '{}' lw 2 dt 2 pt 5 ps 0.4\n", 20 + i, uncached);
    }
}

// The time panel's title: measured wall time, modelled time (--deterministic traces), or both.
std::string time_title(const std::vector<PlotInput>& traces) {
    bool any_wall = false, all_wall = true;
    for (const auto& t : traces) any_wall = any_wall || t.trace->run.has_wall_time, all_wall = all_wall && t.trace->run.has_wall_time;
    return all_wall ? "wall time per step (measured)"
           : any_wall ? "time per step (measured; modelled for --deterministic traces)"
                      : "modelled time per step (roofline; --deterministic trace)";
}

}  // namespace

void plot_traces(const std::vector<PlotInput>& traces, const fs::path& output, PlotScale scale) {
    if (traces.empty() || traces.size() > max_plot_traces)
        throw UsageError(fmt::format("trace plot: {} traces; expected 1 to {} on one chart", traces.size(), max_plot_traces));
    gnuplot_terminal(output, 1, 1);  // the extension, checked before any work

    double col_max[13] = {};  // per data column, over every trace: picks each panel's unit
    const std::string data = plot_data(traces, col_max);

    // Series: trace i in colour i; cached solid with points, uncached dashed. A trace's label (ARG3..,
    // text from the command line) reaches gnuplot as a string value, never as script.
    const std::string d = "ARG1";  // the data file's name, passed on gnuplot's command line (gnuplot -c)
    const bool labelled = traces.size() > 1;
    // Units on the axes: each panel scales its data to one unit chosen from its largest value, so the
    // ticks are round numbers of that unit: FLOPs in decimal prefixes (as the tables: MFLOP, GFLOP),
    // bytes in binary ones (KiB, MiB, GiB, as the tables with --units iec), time in ms.
    struct Axis {
        double scale;
        std::string ylabel;
    };
    auto flop_axis = [&](int col_c, int col_u) {
        const double m = std::max(col_max[col_c], col_max[col_u]);
        static const char* names[] = {"FLOP", "kFLOP (10^3 FLOP)", "MFLOP (10^6 FLOP)", "GFLOP (10^9 FLOP)", "TFLOP (10^{12} FLOP)"};
        int k = 0;
        while (k < 4 && m >= std::pow(1000.0, k + 1)) ++k;
        return Axis{std::pow(1000.0, k), names[k]};
    };
    auto bytes_axis = [&](int col_c, int col_u) {
        const ByteAxis a = byte_axis(std::max(col_max[col_c], col_max[col_u]));
        return Axis{a.scale, a.label};
    };
    auto series = [&](int col_c, int col_u, const Axis& axis, bool cached_only = false) {
        const std::string y = axis.scale == 1.0 ? "" : fmt::format("/{:.17g}", axis.scale);
        std::vector<std::string> parts;
        for (std::size_t i = 0; i < traces.size(); ++i) {
            const SimMode mode = traces[i].trace->run.mode;
            const std::string label = labelled ? fmt::format("ARG{}.' '.", i + 3) : std::string();
            if (mode != SimMode::uncached)
                parts.push_back(fmt::format("{} index {} using 1:(${}{}) with linespoints ls {} title {}'cached'", d, i, col_c, y, 10 + i, label));
            if (mode != SimMode::cached && !cached_only)
                parts.push_back(fmt::format("{} index {} using 1:(${}{}) with linespoints ls {} title {}'uncached'", d, i, col_u, y, 20 + i, label));
        }
        if (parts.empty()) return std::string("NaN notitle");
        std::string s;
        for (std::size_t i = 0; i < parts.size(); ++i) s += (i ? ", " : "") + parts[i];
        return s;
    };
    std::ostringstream gp;
    gp << gnuplot_terminal(output, 1200, 1200) << "set output\n"  // stdout: the chart file kvlab opened
       << "set datafile missing '?'\n";
    line_styles(gp, traces.size(), labelled);
    gp << "set style line 3 lc rgb '#2e933c' lw 2\n"
       << "set grid\nset xlabel 'step (0 = prefill)'\n"
       << (labelled ? "set key top left opaque font ',9' spacing 0.9 samplen 3\n" : "set key top left opaque\n");
    auto panel = [&](const std::string& title, const Axis& axis, const std::string& plots) {
        gp << (scale == PlotScale::log ? "set logscale y\n" : "unset logscale y\n") << "set format y '%g'\nset ylabel "
           << gp_quote(axis.ylabel) << "\nset title " << gp_quote(title) << "\nplot " << plots << "\n";
    };
    const std::string title = plot_title(traces, scale);
    gp << "set multiplot layout 3,2 title ARG2 font ',14' noenhanced\n";
    const Axis ms{1.0, "ms"};
    panel("FLOPs per step: uncached grows with the context, cached stays flat", flop_axis(2, 3), series(2, 3, flop_axis(2, 3)));
    panel("bytes moved per step (weights + activations + KV)", bytes_axis(4, 5), series(4, 5, bytes_axis(4, 5)));
    panel(time_title(traces), ms, series(6, 7, ms));
    const bool any_cached = std::any_of(traces.begin(), traces.end(), [](const auto& t) { return t.trace->run.mode != SimMode::uncached; });
    if (any_cached) {
        panel("KV-cache bytes resident (cached mode): one token more per step, up to any window", bytes_axis(8, 8), series(8, 8, bytes_axis(8, 8), true));
    } else {  // uncached runs keep no cache: a zero line over their steps (a log axis has no 0)
        gp << "unset logscale y\nset yrange [0:1]\nset ylabel 'bytes'\nset title 'KV-cache bytes resident: the uncached mode keeps no cache'\n"
           << "plot " << d << " index 0 using 1:(0) with lines ls 20 title 'uncached: 0 B'\nset yrange [*:*]\n";
    }
    panel("FLOPs so far: cached grows linearly, uncached quadratically", flop_axis(9, 10), series(9, 10, flop_axis(9, 10)));
    panel("bytes moved so far", bytes_axis(11, 12), series(11, 12, bytes_axis(11, 12)));
    gp << "unset multiplot\nset output\n";
    std::vector<std::string> args{title};
    for (const auto& t : traces) args.push_back(t.label);  // ARG3..: the series labels
    draw_with_gnuplot(output, data, gp.str(), args);
}

}  // namespace kvlab
