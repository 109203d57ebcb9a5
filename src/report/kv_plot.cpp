#include "report/kv_plot.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "calc/param_count.hpp"
#include "core/checked.hpp"
#include "core/error.hpp"
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

}  // namespace

void plot_kv_memory(const KvcalcRequest& r, const std::filesystem::path& output) {
    gnuplot_terminal(output, 1, 1, "--plot");  // the extension, checked before any work

    // the x range: the largest --context, else the largest model maximum, else 4096
    std::uint64_t t_max = 0;
    for (const auto t : r.contexts) t_max = std::max(t_max, t);
    if (t_max == 0)
        for (const auto& m : r.models) t_max = std::max<std::uint64_t>(t_max, static_cast<std::uint64_t>(std::max<std::int64_t>(m.n_ctx_max, 0)));
    if (t_max == 0) t_max = 4096;
    constexpr std::uint64_t n_points = 256;
    std::vector<std::uint64_t> xs;
    for (std::uint64_t i = 0; i <= n_points; ++i) xs.push_back(t_max * i / n_points);
    for (const auto t : r.contexts) xs.push_back(t);  // the asked-for contexts exactly
    std::sort(xs.begin(), xs.end());
    xs.erase(std::unique(xs.begin(), xs.end()), xs.end());

    struct Series {
        std::string label;
        std::vector<double> y;
        bool budget = false;  // a horizontal line: the KV budget of a model on the GPU
        std::size_t colour = 0;
    };
    std::vector<Series> series;
    double y_max = 0;
    std::size_t n_lines = 0;
    for (const ModelConfig& base : r.models) {
        const std::size_t model_colour = n_lines;  // a model's budget line takes the colour of its first line
        for (const auto& variant : r.variants) {
            const ModelConfig cfg = apply_variant(base, variant);
            const ModelConfig gpu_cfg = per_gpu_config(cfg, r.tp);
            for (const DType dtype : r.dtypes)
                for (const auto b : r.batches) {
                    Series s;
                    s.colour = n_lines++;
                    s.label = fmt::format("{} {} {}{}{}", cfg.name, cfg.attention_kind(), dtype_name(dtype), b > 1 ? fmt::format(" x{}", b) : "",
                                          r.tp > 1 ? fmt::format(" /GPU of TP {}", r.tp) : "");
                    for (const auto t : xs) {
                        const double y = static_cast<double>(checked_mul(sequence_bytes(gpu_cfg, dtype, t, r), b, "KV bytes per batch"));
                        s.y.push_back(y);
                        y_max = std::max(y_max, y);
                    }
                    series.push_back(std::move(s));
                }
            if (r.gpu && (base.d_ff > 0 || base.stored_weight_bytes) && variant.label == r.variants.front().label) {
                // what the KV cache may use next to this model's native weights on the GPU (the fit table's figure)
                const auto weights = ceil_div(model_weight_bytes(base, true, r), r.tp);
                const auto usable = usable_bytes(usable_gpu_bytes(*r.gpu), r.mem_util);
                if (usable > weights) {
                    Series s;
                    s.budget = true;
                    s.colour = model_colour;
                    s.label = fmt::format("{}: KV budget on {}", base.name, r.gpu->name);
                    s.y.assign(xs.size(), static_cast<double>(usable - weights));
                    y_max = std::max(y_max, s.y.front());
                    series.push_back(std::move(s));
                }
            }
        }
    }
    if (series.size() > max_kv_plot_series)
        throw UsageError(fmt::format("--plot: {} lines (models x attention layouts x dtypes x batches{}); at most {} on one chart",
                                     series.size(), r.gpu ? ", and budgets" : "", max_kv_plot_series));

    const ByteAxis axis = byte_axis(y_max);  // one binary unit for the axis, from the largest value
    const double scale = axis.scale;

    std::ostringstream data;
    for (std::size_t i = 0; i < series.size(); ++i) {
        data << (i ? "\n\n" : "") << "\"context\" " << data_label(series[i].label) << "\n";
        for (std::size_t j = 0; j < xs.size(); ++j) data << xs[j] << ' ' << fmt::format("{:.17g}", series[i].y[j] / scale) << '\n';
    }
    static const char* colours[] = {"#1b6ca8", "#d1495b", "#2e933c", "#8e44ad", "#e67e22", "#555555"};
    std::ostringstream gp;
    gp << gnuplot_terminal(output, 1000, 640, "--plot") << "set output\n"
       << "set grid\nset key top left opaque noenhanced\n"
       << "set xlabel 'context (tokens)'\nset format x '%.0f'\nset format y '%g'\n"
       << fmt::format("set xrange [0:{}]\nset yrange [0:*]\n", t_max)
       << "set ylabel " << gp_quote(axis.label) << "\n"
       << "set title ARG2 noenhanced\n"
       << "plot ";
    for (std::size_t i = 0; i < series.size(); ++i) {
        const char* colour = colours[series[i].colour % std::size(colours)];
        gp << (i ? ", " : "") << fmt::format("ARG1 index {} using 1:2 with lines lw 2 lc rgb '{}'{} title columnheader(2)", i, colour,
                                               series[i].budget ? " dt 2" : "");
    }
    gp << "\nset output\n";
    const std::string title = fmt::format("KV cache against context{}{}{}", r.tp > 1 ? ", per GPU" : "",
                                          r.gpu ? fmt::format(", and what fits next to the weights on {} (dashed)", r.gpu->display_name) : "",
                                          r.window_mode == WindowMode::cap ? "" : " (windows ignored)");
    draw_with_gnuplot(output, data.str(), gp.str(), {title}, "--plot");
}

}  // namespace kvlab
