#include "report/kv_plot.hpp"

#include <algorithm>
#include <optional>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kvlab/calc/engine.hpp"
#include "kvlab/calc/param_count.hpp"
#include "kvlab/core/checked.hpp"
#include "kvlab/core/error.hpp"
#include "report/gnuplot.hpp"

namespace kvlab {

namespace {

// A series label as a gnuplot data-file string: its text comes from config files, so it is only ever
// data (read by `title columnheader`), never script; a double quote would end it and becomes a single one.
std::string data_label(std::string text) {
    for (char& c : text)
        if (c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20) c = c == '"' ? '\'' : '?';
    return '"' + text + '"';
}

// One line of the chart: a KV line, or with budget a horizontal one.
struct Series {
    std::string label;
    std::vector<double> y;
    bool budget = false;  // a horizontal line: the KV budget of a model on the GPU
    std::size_t colour = 0;
};

// Where a KV line crosses its model's budget: the longest context that fits at its batch, marked and labelled.
struct Marker {
    double x = 0, y = 0;
    std::string label;  // "fits up to 30,275 tokens"
    std::size_t colour = 0;
};

// The lines of the chart as they are added, and the largest y among them.
struct Lines {
    std::vector<Series> series;
    std::vector<Marker> markers;
    double y_max = 0;
    std::size_t n_lines = 0;  // KV lines so far: the next one's colour
};

// The x range: the largest --context, else the largest model maximum, else 4096.
std::uint64_t context_max(const KvcalcRequest& r) {
    std::uint64_t t_max = 0;
    for (const auto t : r.contexts) t_max = std::max(t_max, t);
    if (t_max == 0)
        for (const auto& m : r.models) t_max = std::max<std::uint64_t>(t_max, static_cast<std::uint64_t>(std::max<std::int64_t>(m.n_ctx_max, 0)));
    if (t_max == 0) t_max = 4096;
    return t_max;
}

// The x values: 257 evenly spaced from 0 to t_max, and the asked-for contexts exactly, sorted and unique.
std::vector<std::uint64_t> context_points(const KvcalcRequest& r, std::uint64_t t_max) {
    constexpr std::uint64_t n_points = 256;
    std::vector<std::uint64_t> xs;
    for (std::uint64_t i = 0; i <= n_points; ++i) xs.push_back(t_max * i / n_points);
    for (const auto t : r.contexts) xs.push_back(t);  // the asked-for contexts exactly
    std::sort(xs.begin(), xs.end());
    xs.erase(std::unique(xs.begin(), xs.end()), xs.end());
    return xs;
}

// One KV line: a model variant at one dtype and batch, per GPU, at every x.
void add_kv_line(Lines& lines, const KvcalcRequest& r, const ModelConfig& cfg, const ModelConfig& gpu_cfg, DType dtype,
                 std::uint64_t b, const std::vector<std::uint64_t>& xs) {
    Series s;
    s.colour = lines.n_lines++;
    s.label = fmt::format("{} {} {}{}{}", cfg.name, cfg.attention_kind(), dtype_name(dtype), b > 1 ? fmt::format(" x{}", b) : "",
                          r.tp > 1 ? fmt::format(" /GPU of TP {}", r.tp) : "");
    for (const auto t : xs) {
        const double y = static_cast<double>(checked_mul(sequence_bytes(gpu_cfg, dtype, t, r), b, "KV bytes per batch"));
        s.y.push_back(y);
        lines.y_max = std::max(lines.y_max, y);
    }
    lines.series.push_back(std::move(s));
}

// What the KV cache may use next to this model's native weights on one GPU (the fit table's KV budget), when
// the --gpu is given, the weights are known and they leave any room.
std::optional<std::uint64_t> kv_budget(const KvcalcRequest& r, const ModelConfig& base) {
    if (!r.gpu || !(base.d_ff > 0 || base.stored_weight_bytes)) return std::nullopt;
    const auto weights = ceil_div(model_weight_bytes(base, true, r), r.tp);
    const auto usable = usable_bytes(usable_gpu_bytes(*r.gpu), r.mem_util);
    if (usable <= weights) return std::nullopt;
    return usable - weights;
}

// The budget line, labelled with its size: the fit limit every line of the model is read against.
void add_budget_line(Lines& lines, const KvcalcRequest& r, const ModelConfig& base, std::uint64_t budget, std::size_t colour,
                     const std::vector<std::uint64_t>& xs) {
    Series s;
    s.budget = true;
    s.colour = colour;
    s.label = fmt::format("{}: KV budget {} per GPU on {}", base.name, format_bytes(budget, r.units), r.gpu->name);
    s.y.assign(xs.size(), static_cast<double>(budget));
    lines.y_max = std::max(lines.y_max, s.y.front());
    lines.series.push_back(std::move(s));
}

// Marks where the last KV line added crosses the budget: the longest context that fits at its batch (as the
// "Longest context at each batch" table computes it), when that is inside the chart.
void mark_fit_limit(Lines& lines, const KvcalcRequest& r, const ModelConfig& gpu_cfg, DType dtype, std::uint64_t b, std::uint64_t budget,
                    std::uint64_t t_max) {
    const std::uint64_t t_fit = max_context(gpu_cfg, dtype, b, budget, t_max, r);
    if (t_fit >= t_max) return;  // fits all the way
    lines.markers.push_back({static_cast<double>(t_fit), static_cast<double>(budget),
                             fmt::format("fits up to {} tokens", with_thousands(t_fit)), lines.series.back().colour});
}

// Every line of the request: per model, attention layout, dtype and batch, and with --gpu each model's budget.
Lines kv_lines(const KvcalcRequest& r, const std::vector<std::uint64_t>& xs) {
    Lines lines;
    for (const ModelConfig& base : r.models) {
        const std::size_t model_colour = lines.n_lines;  // a model's budget line takes the colour of its first line
        const auto budget = kv_budget(r, base);
        for (const auto& variant : r.variants) {
            const ModelConfig cfg = apply_variant(base, variant);
            const ModelConfig gpu_cfg = per_gpu_config(cfg, r.tp);
            for (const DType dtype : r.dtypes)
                for (const auto b : r.batches) {
                    add_kv_line(lines, r, cfg, gpu_cfg, dtype, b, xs);
                    if (budget) mark_fit_limit(lines, r, gpu_cfg, dtype, b, *budget, xs.back());
                }
            if (budget && variant.label == r.variants.front().label) add_budget_line(lines, r, base, *budget, model_colour, xs);
        }
    }
    if (lines.series.size() > max_kv_plot_series)
        throw UsageError(fmt::format("--plot: {} lines (models x attention layouts x dtypes x batches{}); at most {} on one chart",
                                     lines.series.size(), r.gpu ? ", and budgets" : "", max_kv_plot_series));
    return lines;
}

// The data file: a block per line, its column names then x and y in the axis unit.
// then a block per fit-limit marker: its x, y and label.
std::string plot_data(const Lines& lines, const std::vector<std::uint64_t>& xs, double scale) {
    std::ostringstream data;
    const auto& series = lines.series;
    for (std::size_t i = 0; i < series.size(); ++i) {
        data << (i ? "\n\n" : "") << "\"context\" " << data_label(series[i].label) << "\n";
        for (std::size_t j = 0; j < xs.size(); ++j) data << xs[j] << ' ' << fmt::format("{:.17g}", series[i].y[j] / scale) << '\n';
    }
    for (const auto& m : lines.markers)
        data << "\n\n\"context\" \"KV\" \"limit\"\n" << fmt::format("{:.17g} {:.17g} ", m.x, m.y / scale) << data_label(m.label) << "\n";
    return data.str();
}

// The gnuplot script: a line per series, budgets dashed; the data file is ARG1, the title ARG2.
std::string plot_script(const std::filesystem::path& output, const Lines& lines, std::uint64_t t_max, const ByteAxis& axis) {
    const auto& series = lines.series;
    static const char* colours[] = {"#1b6ca8", "#d1495b", "#2e933c", "#8e44ad", "#e67e22", "#555555"};
    std::ostringstream gp;
    gp << gnuplot_terminal(output, 1000, 640, "--plot") << "set output\n"
       << "set grid\nset key top left opaque noenhanced\n"
       << "set xlabel 'context (tokens)'\nset format x '%.0f'\nset format y '%g'\n"
       // room above the lines for the key (a line per series), so it hides no budget line or marker
       << fmt::format("set xrange [0:{}]\nset yrange [0:{}]\n", t_max,
                      lines.y_max > 0 ? fmt::format("{:.6g}", lines.y_max / axis.scale * (1.1 + 0.045 * static_cast<double>(series.size()))) : "*")
       << "set ylabel " << gp_quote(axis.label) << "\n"
       << "set title ARG2 noenhanced\n"
       << "plot ";
    for (std::size_t i = 0; i < series.size(); ++i) {
        const char* colour = colours[series[i].colour % std::size(colours)];
        gp << (i ? ", " : "") << fmt::format("ARG1 index {} using 1:2 with lines lw 2 lc rgb '{}'{} title columnheader(2)", i, colour,
                                               series[i].budget ? " dt 2" : "");
    }
    // each fit limit: a dot on the budget line, a dotted drop to the context axis, and its token count
    for (std::size_t i = 0; i < lines.markers.size(); ++i) {
        const std::size_t index = series.size() + i;
        const auto& m = lines.markers[i];
        const bool right_half = m.x > 0.5 * static_cast<double>(t_max);  // the label reads leftwards there, inside the chart
        // labels alternate above and below the line in order of context, so neighbours do not overlap
        const auto rank = std::count_if(lines.markers.begin(), lines.markers.end(), [&](const Marker& o) { return o.x < m.x; });
        const char* colour = colours[m.colour % std::size(colours)];
        gp << fmt::format(", ARG1 index {0} using 1:2:(0):(-$2) with vectors nohead dt 3 lw 1 lc rgb '{1}' notitle"
                          ", ARG1 index {0} using 1:2 with points pt 7 ps 1.2 lc rgb '{1}' notitle"
                          ", ARG1 index {0} using 1:2:3 with labels {2} offset {3},{4} tc rgb '{1}' notitle",
                          index, colour, right_half ? "right" : "left", right_half ? "-0.8" : "0.8", rank % 2 ? "-0.9" : "0.9");
    }
    gp << "\nset output\n";
    return gp.str();
}

// The chart's title: per GPU under TP, the GPU with --gpu, and whether windows were ignored.
std::string plot_title(const KvcalcRequest& r) {
    return fmt::format("KV cache against context{}{}{}", r.tp > 1 ? ", per GPU" : "",
                       r.gpu ? fmt::format(", and what fits next to the weights on {} (dashed; a dot marks the longest context that fits)",
                                           r.gpu->display_name) : "",
                       r.window_mode == WindowMode::cap ? "" : " (windows ignored)");
}

}  // namespace

void plot_kv_memory(const KvcalcRequest& r, const std::filesystem::path& output) {
    gnuplot_terminal(output, 1, 1, "--plot");  // the extension, checked before any work
    const std::uint64_t t_max = context_max(r);
    const std::vector<std::uint64_t> xs = context_points(r, t_max);
    const Lines lines = kv_lines(r, xs);
    const ByteAxis axis = byte_axis(lines.y_max);  // one binary unit for the axis, from the largest value
    const std::string data = plot_data(lines, xs, axis.scale);
    const std::string script = plot_script(output, lines, t_max, axis);
    draw_with_gnuplot(output, data, script, {plot_title(r)}, "--plot");
}

}  // namespace kvlab
