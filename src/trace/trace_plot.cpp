#include "trace/trace_plot.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
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

// The data file's columns (gnuplot counts from 1): step, per-step FLOPs, bytes and ms (cached, uncached),
// KV resident, running sums of FLOPs, bytes and ms, running speed-up (uncached / cached) in wall time and
// in modelled GPU time.
constexpr int plot_n_columns = 16;
constexpr const char* plot_columns =
    "step flops_c flops_u bytes_c bytes_u ms_c ms_u kv_c sum_flops_c sum_flops_u sum_bytes_c sum_bytes_u sum_ms_c sum_ms_u speedup_wall speedup_gpu";

std::int64_t modelled_step_ns(const StepRecord& r) {
    std::int64_t ns = 0;
    for (const auto& op : r.cost.ops) ns += modelled_op_ns(op);
    return ns;
}

// The data file gnuplot reads: a block per trace, a row per step (both modes, running sums and the
// running speed-up); `stats` gets each column's largest value over every trace, which picks each panel's
// unit, and every per-step time, which sets the time panel's clip.
std::string plot_data_text(const std::vector<PlotInput>& traces, PlotStats& stats) {
    std::ostringstream out;
    for (std::size_t i = 0; i < traces.size(); ++i) {
        const StepTrace& trace = *traces[i].trace;
        const bool wall = trace.run.has_wall_time;
        const std::optional<GpuSpec> gpu = modelled_gpu(trace.inputs);
        out << (i ? "\n\n" : "") << "# " << plot_columns << "\n";
        double sum[8] = {};  // flops c/u, bytes c/u, ms c/u, gpu s c/u: doubles, as gnuplot reads them
        const StepIndex index(trace);
        for (std::int64_t s = 0; s < trace.run.n_steps_done; ++s) {
            const StepRecord* rec[2] = {index.find(StepMode::cached, s), index.find(StepMode::uncached, s)};
            double v[plot_n_columns] = {static_cast<double>(s)};
            bool have[plot_n_columns] = {true};
            for (int m = 0; m < 2; ++m) {
                const StepRecord* r = rec[m];
                if (!r) continue;
                const double ms = static_cast<double>(wall ? r->wall_ns : modelled_step_ns(*r)) * 1e-6;
                sum[m] += static_cast<double>(r->cost.total().flops);
                sum[2 + m] += static_cast<double>(r->cost.total().bytes_total());
                sum[4 + m] += ms;
                if (gpu) sum[6 + m] += modelled_step_seconds(*gpu, *r);
                const int cols[] = {1, 3, 5, 8, 10, 12};  // 0-based: flops, bytes, ms, sum flops, sum bytes, sum ms (+ m)
                const double vals[] = {static_cast<double>(r->cost.total().flops), static_cast<double>(r->cost.total().bytes_total()), ms,
                                       sum[m], sum[2 + m], sum[4 + m]};
                for (int k = 0; k < 6; ++k) v[cols[k] + m] = vals[k], have[cols[k] + m] = true;
                stats.step_ms.push_back(ms);
            }
            if (rec[0]) v[7] = static_cast<double>(rec[0]->kv_bytes_resident), have[7] = true;
            if (rec[0] && rec[1] && sum[4] > 0) v[14] = sum[5] / sum[4], have[14] = true;  // running uncached / cached, wall
            if (rec[0] && rec[1] && gpu && sum[6] > 0) v[15] = sum[7] / sum[6], have[15] = true;  // and modelled on the GPU
            for (int k = 0; k < plot_n_columns; ++k) {
                if (have[k]) stats.col_max[k] = std::max(stats.col_max[k], v[k]);
                out << (k ? " " : "") << (have[k] ? fmt::format("{:.17g}", v[k]) : std::string("?"));
            }
            out << '\n';
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
           << fmt::format("set style line {} lc rgb '{}' lw 2 dt 2 pt 5 ps 0.4\n", 20 + i, uncached)
           << fmt::format("set style line {} lc rgb '{}' lw 2 dt 3\n", 30 + i, labelled ? colours[i] : "#2e933c");  // modelled GPU
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

// The chart's panels as gnuplot commands: series of data columns (1-based, as gnuplot counts), each
// panel's unit picked from its largest value.
class PanelWriter {
public:
    PanelWriter(std::ostream& gp, const std::vector<PlotInput>& traces, const PlotStats& stats, PlotScale scale)
        : gp_(gp), traces_(traces), stats_(stats), scale_(scale), labelled_(traces.size() > 1) {}

    struct Axis {
        double scale;
        std::string ylabel;
    };
    Axis flops(int col_c, int col_u) const {
        const double m = std::max(max_of(col_c), max_of(col_u));
        static const char* names[] = {"FLOP", "kFLOP (10^3 FLOP)", "MFLOP (10^6 FLOP)", "GFLOP (10^9 FLOP)", "TFLOP (10^{12} FLOP)"};
        int k = 0;
        while (k < 4 && m >= std::pow(1000.0, k + 1)) ++k;
        return Axis{std::pow(1000.0, k), names[k]};
    }
    Axis bytes(int col_c, int col_u) const {
        const ByteAxis a = byte_axis(std::max(max_of(col_c), max_of(col_u)));
        return Axis{a.scale, a.label};
    }
    // trace i's cached series (style 10 + i) from col_c, its uncached one (20 + i) from col_u; `y` maps
    // "$N" to the value drawn (a clip); ARG3.. (labels, text from the command line) reach gnuplot as strings
    std::string series(int col_c, int col_u, const Axis& axis, bool cached_only = false, const std::string& y_fmt = "${}") const {
        const std::string div = axis.scale == 1.0 ? "" : fmt::format("/{:.17g}", axis.scale);
        std::vector<std::string> parts;
        for (std::size_t i = 0; i < traces_.size(); ++i) {
            const SimMode mode = traces_[i].trace->run.mode;
            const std::string label = labelled_ ? fmt::format("ARG{}.' '.", i + 3) : std::string();
            auto one = [&](int col, int style, const char* name) {
                const std::string y = fmt::format(fmt::runtime(y_fmt), col);
                return fmt::format("ARG1 index {} using 1:(({}){}) with linespoints ls {} title {}'{}'", i, y, div, style, label, name);
            };
            if (mode != SimMode::uncached) parts.push_back(one(col_c, 10 + static_cast<int>(i), "cached"));
            if (mode != SimMode::cached && !cached_only) parts.push_back(one(col_u, 20 + static_cast<int>(i), "uncached"));
        }
        return join(parts);
    }
    void panel(const std::string& title, const Axis& axis, const std::string& plots, bool log = true) {
        gp_ << (scale_ == PlotScale::log && log ? "set logscale y\n" : "unset logscale y\n") << "set format y '%g'\nset ylabel "
            << gp_quote(axis.ylabel) << "\nset title " << gp_quote(title) << "\nplot " << (plots.empty() ? "NaN notitle" : plots) << "\n";
    }
    // per-step time, clipped at `clip` ms (0: none): the steps above it drawn on the clip line as open
    // triangles, and a label saying how many and the largest
    void time_panel(const std::string& title, double clip) {
        const Axis ms{1.0, "ms"};
        if (clip <= 0) return panel(title, ms, series(6, 7, ms));
        std::size_t n_above = 0;
        double top = 0;
        for (const double v : stats_.step_ms) n_above += v > clip ? 1 : 0, top = std::max(top, v);
        const std::string c = fmt::format("{:.17g}", clip);
        std::string plots = series(6, 7, ms, false, "${0} > " + c + " ? " + c + " : ${0}");
        for (std::size_t i = 0; i < traces_.size(); ++i)
            for (const int col : {6, 7})
                plots += fmt::format(", ARG1 index {} using 1:(${} > {} ? {} : NaN) with points pt 8 ps 1.2 lc rgb '#000000' {}", i, col, c, c,
                                     i == 0 && col == 6 ? "title 'clipped'" : "notitle");
        gp_ << fmt::format("set yrange [*:{:.17g}]\n", clip * 1.05);
        panel(fmt::format("{}; {} above the 99th percentile ({:.3g} ms, up to {:.3g}) drawn at it", title, counted(static_cast<std::int64_t>(n_above), "step"),
                          clip, top),
              ms, plots);
        gp_ << "set yrange [*:*]\n";
    }
    // the running speed-up, uncached / cached: wall (or the model CPU of --deterministic traces) and GPU
    void speedup_panel(const std::string& wall_name) {
        std::vector<std::string> parts;
        for (std::size_t i = 0; i < traces_.size(); ++i) {
            if (traces_[i].trace->run.mode != SimMode::both) continue;
            const std::string label = labelled_ ? fmt::format("ARG{}.' '.", i + 3) : std::string();
            parts.push_back(fmt::format("ARG1 index {} using 1:15 with lines ls {} title {}'{}'", i, 10 + i, label, wall_name));
            if (max_of(16) > 0)
                parts.push_back(fmt::format("ARG1 index {} using 1:16 with lines ls {} title {}'modelled GPU'", i, 30 + i, label));
        }
        if (parts.empty()) {  // one mode: nothing to divide (gnuplot refuses a panel with no defined point)
            gp_ << "unset logscale y\nset yrange [0:1]\nset ylabel ''\nset title 'speed-up so far: needs both modes (--mode both)'\n"
                << "plot ARG1 index 0 using 1:(2) with lines notitle\nset yrange [*:*]\n";
            return;
        }
        panel("speed-up so far: uncached time / cached time", Axis{1.0, "x (uncached / cached)"}, join(parts), false);
    }
    double max_of(int col) const { return stats_.col_max[col - 1]; }

private:
    static std::string join(const std::vector<std::string>& parts) {
        std::string s;
        for (std::size_t i = 0; i < parts.size(); ++i) s += (i ? ", " : "") + parts[i];
        return s;
    }
    std::ostream& gp_;
    const std::vector<PlotInput>& traces_;
    const PlotStats& stats_;
    PlotScale scale_;
    bool labelled_;
};

}  // namespace

std::string trace_plot_data(const std::vector<PlotInput>& traces, PlotStats& stats) { return plot_data_text(traces, stats); }

double time_clip_ms(std::vector<double> v) {
    if (v.size() < 2) return 0;
    std::sort(v.begin(), v.end());
    const auto rank = static_cast<std::size_t>(std::ceil(0.99 * static_cast<double>(v.size())));  // nearest rank, 1-based
    const double p99 = v[std::max<std::size_t>(rank, 1) - 1];
    return v.back() > 1.5 * p99 ? p99 : 0.0;
}

void plot_traces(const std::vector<PlotInput>& traces, const fs::path& output, PlotScale scale) {
    if (traces.empty() || traces.size() > max_plot_traces)
        throw UsageError(fmt::format("trace plot: {} traces; expected 1 to {} on one chart", traces.size(), max_plot_traces));
    gnuplot_terminal(output, 1, 1);  // the extension, checked before any work
    PlotStats stats;
    const std::string data = plot_data_text(traces, stats);
    const bool labelled = traces.size() > 1;
    std::ostringstream gp;
    gp << gnuplot_terminal(output, 1200, 1500) << "set output\n"  // stdout: the chart file kvlab opened
       << "set datafile missing '?'\n";
    line_styles(gp, traces.size(), labelled);
    gp << "set grid\nset xlabel 'step (0 = prefill)'\n"
       << (labelled ? "set key top left opaque font ',9' spacing 0.9 samplen 3\n" : "set key top left opaque\n");
    PanelWriter w(gp, traces, stats, scale);
    const std::string title = plot_title(traces, scale);
    gp << "set multiplot layout 4,2 title ARG2 font ',14' noenhanced\n";
    const PanelWriter::Axis ms{1.0, "ms"};
    w.panel("FLOPs per step: uncached grows with the context, cached stays flat", w.flops(2, 3), w.series(2, 3, w.flops(2, 3)));
    w.panel("bytes moved per step (weights + activations + KV)", w.bytes(4, 5), w.series(4, 5, w.bytes(4, 5)));
    w.time_panel(time_title(traces), time_clip_ms(stats.step_ms));
    const bool any_cached = std::any_of(traces.begin(), traces.end(), [](const auto& t) { return t.trace->run.mode != SimMode::uncached; });
    if (any_cached) {
        w.panel("KV-cache bytes resident (cached mode): one token more per step, up to any window", w.bytes(8, 8), w.series(8, 8, w.bytes(8, 8), true));
    } else {  // uncached runs keep no cache: a zero line over their steps (a log axis has no 0)
        gp << "unset logscale y\nset yrange [0:1]\nset ylabel 'bytes'\nset title 'KV-cache bytes resident: the uncached mode keeps no cache'\n"
           << "plot ARG1 index 0 using 1:(0) with lines ls 20 title 'uncached: 0 B'\nset yrange [*:*]\n";
    }
    w.panel("FLOPs so far: cached grows linearly, uncached quadratically", w.flops(9, 10), w.series(9, 10, w.flops(9, 10)));
    w.panel("bytes moved so far", w.bytes(11, 12), w.series(11, 12, w.bytes(11, 12)));
    const bool all_wall = std::all_of(traces.begin(), traces.end(), [](const auto& t) { return t.trace->run.has_wall_time; });
    w.panel(all_wall ? "wall time so far (measured)" : "time so far (modelled CPU for --deterministic traces)", ms, w.series(13, 14, ms));
    w.speedup_panel(all_wall ? "wall" : "modelled CPU");
    gp << "unset multiplot\nset output\n";
    std::vector<std::string> args{title};
    for (const auto& t : traces) args.push_back(t.label);  // ARG3..: the series labels
    draw_with_gnuplot(output, data, gp.str(), args);
}

}  // namespace kvlab
