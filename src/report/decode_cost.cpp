#include "report/decode_cost.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kvlab/calc/engine.hpp"
#include "kvlab/core/units.hpp"
#include "report/gnuplot.hpp"

namespace kvlab {

namespace {

// The ops of a layer's attention block, the part of a step that changes with the layout.
constexpr Op attention_ops[] = {Op::attn_norm, Op::q_proj, Op::k_proj, Op::v_proj, Op::rope,
                                Op::kv_store,  Op::qk,     Op::softmax, Op::av,    Op::o_proj};

double ratio(std::uint64_t a, std::uint64_t b) { return static_cast<double>(a) / static_cast<double>(std::max<std::uint64_t>(b, 1)); }

// "4.06x", "0.18x"; from 10 up, whole numbers ("483x")
std::string ratio_text(double r) { return r >= 10.0 ? fmt::format("{:.0f}x", r) : fmt::format("{:.2f}x", r); }

// "131,072" in text; "128K" on an axis when a whole number of 1024s
std::string context_tick(std::int64_t t) {
    return t >= 1024 && t % 1024 == 0 ? fmt::format("{}K", t / 1024) : fmt::format("{}", t);
}

// "7.16x fewer" (`fewer`) when a is the smaller, else "1.20x more"
std::string fewer_or_more(std::uint64_t a, std::uint64_t base, const char* fewer = "fewer") {
    return a <= base ? ratio_text(ratio(base, a)) + " " + fewer : ratio_text(ratio(a, base)) + " more";
}

std::string flops_text(std::uint64_t flops) { return count_cell(flops, "FLOP").text; }

// The lesson of an MLA pair at `context`, when the lines hold both paths of one latent and the first line
// is not MLA: the cache against the first line's, then each path's bytes and FLOPs against it.
std::vector<std::string> mla_lesson(const std::vector<DecodeCostLine>& lines, std::int64_t context, UnitSystem units) {
    const auto find = [&](MlaPath path) {
        return std::find_if(lines.begin(), lines.end(), [&](const DecodeCostLine& l) { return l.cfg.mla && l.path == path; });
    };
    const auto naive = find(MlaPath::naive), absorbed = find(MlaPath::absorbed);
    const DecodeCostLine& first = lines.front();
    if (naive == lines.end() || absorbed == lines.end() || first.cfg.mla) return {};
    const DecodeCost n = attention_decode_cost(*naive, context), a = attention_decode_cost(*absorbed, context);
    const DecodeCost base = attention_decode_cost(first, context);
    return {fmt::format("MLA caches {} than {}; absorbed reads {} bytes ({} vs {}) for {} the FLOPs;",
                        fewer_or_more(absorbed->kv_token_bytes, first.kv_token_bytes, "less"), first.label,
                        fewer_or_more(a.bytes_read, base.bytes_read), format_bytes(a.bytes_read, units),
                        format_bytes(base.bytes_read, units), ratio_text(ratio(a.flops, base.flops))),
            fmt::format("naive, rebuilding K and V from every latent each step, reads {} {}'s bytes and computes {} its FLOPs",
                        ratio_text(ratio(n.bytes_read, base.bytes_read)), first.label, ratio_text(ratio(n.flops, base.flops)))};
}

}  // namespace

DecodeCost attention_decode_cost(const DecodeCostLine& line, std::int64_t context) {
    const StepCost s = closed_form_step_cost(line.cfg, StepMode::cached, context - 1, 1, line.kv_row_bytes, line.path);
    DecodeCost c;
    for (const Op op : attention_ops) {
        c.flops += s.at(op).flops;
        c.kv_read += s.at(op).bytes_kv_read;
        c.bytes_read += s.at(op).bytes_kv_read + s.at(op).bytes_act_read;
    }
    return c;
}

std::vector<std::string> decode_cost_headline(const std::vector<DecodeCostLine>& lines, std::int64_t context, UnitSystem units) {
    if (lines.empty()) return {};
    const DecodeCostLine& first = lines.front();
    std::vector<std::string> h{fmt::format("{} ({} layers), one decoded token's attention at {} tokens of context{}:", first.cfg.name,
                                           first.cfg.n_layer, with_thousands(static_cast<std::uint64_t>(context)),
                                           lines.size() > 1 ? ", against " + first.label : "")};
    if (const std::vector<std::string> lesson = mla_lesson(lines, context, units); !lesson.empty()) {
        h.insert(h.end(), lesson.begin(), lesson.end());
        return h;
    }
    const DecodeCost base = attention_decode_cost(first, context);
    std::vector<std::string> parts;
    for (std::size_t i = 1; i < lines.size(); ++i) {
        const DecodeCost c = attention_decode_cost(lines[i], context);
        parts.push_back(fmt::format("{} {} the bytes, {} the FLOPs", lines[i].label, ratio_text(ratio(c.bytes_read, base.bytes_read)),
                                    ratio_text(ratio(c.flops, base.flops))));
    }
    h.push_back(parts.empty() ? fmt::format("{} bytes read, {}", format_bytes(base.bytes_read, units), flops_text(base.flops))
                              : fmt::format("{}", fmt::join(parts, "; ")));
    return h;
}

Report decode_cost_report(const std::vector<DecodeCostLine>& lines, const std::vector<std::int64_t>& contexts, UnitSystem units,
                          nlohmann::json inputs) {
    Report r;
    r.inputs = std::move(inputs);
    r.headline = decode_cost_headline(lines, contexts.back(), units);
    Table t;
    t.title = "Attention per decoded token, from the cost model's closed form (no run)";
    const std::string vs = fmt::format("vs {}", lines.front().label);
    t.columns = {{"context", "context"},          {"attention", "attention", false}, {"kv_bytes_per_token", "KV/token"},
                 {"kv_bytes_read", "KV read"},     {"bytes_read", "bytes read"},      {"bytes_vs_first", "bytes " + vs},
                 {"flops", "FLOPs"},               {"flops_vs_first", "FLOPs " + vs}};
    for (const std::int64_t T : contexts) {
        const DecodeCost base = attention_decode_cost(lines.front(), T);
        for (const DecodeCostLine& line : lines) {
            const DecodeCost c = attention_decode_cost(line, T);
            t.rows.push_back({int_cell(T), text_cell(line.label), bytes_cell(line.kv_token_bytes, units), bytes_cell(c.kv_read, units),
                              bytes_cell(c.bytes_read, units),
                              ratio_cell(ratio(c.bytes_read, base.bytes_read)), count_cell(c.flops, "FLOP"),
                              ratio_cell(ratio(c.flops, base.flops))});
        }
    }
    t.notes.push_back("attention: every layer's ops from attn_norm to o_proj (q/k/v projections, RoPE, the cache write, qk, softmax, av, "
                      "o_proj) when one token is decoded at position context - 1; the MLP, embeddings and lm_head are the same for every "
                      "layout and left out");
    t.notes.push_back("bytes read: from the KV cache (as stored) and activations (fp32); the weights are left out, since a batch of "
                      "sequences reads them once for all its tokens while each sequence reads its own cache. Exact, from the formulas "
                      "of docs/cost-model.md (closed_form_step_cost: the figures simulate counts when it runs the same step)");
    r.tables.push_back(std::move(t));
    return r;
}

namespace {

// A series label as a gnuplot data-file string (read by `title columnheader`), never script.
std::string data_label(std::string text) {
    for (char& c : text)
        if (c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20) c = c == '"' ? '\'' : '?';
    return '"' + text + '"';
}

// The x values: 64 log-spaced from the smallest to the largest context, and every asked-for one exactly.
std::vector<std::int64_t> plot_points(const std::vector<std::int64_t>& contexts) {
    const double lo = std::log(static_cast<double>(contexts.front())), hi = std::log(static_cast<double>(contexts.back()));
    std::vector<std::int64_t> xs(contexts);
    constexpr int n = 64;
    for (int i = 0; i <= n; ++i) xs.push_back(std::llround(std::exp(lo + (hi - lo) * i / n)));
    std::sort(xs.begin(), xs.end());
    xs.erase(std::unique(xs.begin(), xs.end()), xs.end());
    return xs;
}

std::string plot_script(const std::filesystem::path& output, const std::vector<DecodeCostLine>& lines,
                        const std::vector<std::int64_t>& contexts, const ByteAxis& axis, const std::string& flops_unit) {
    static const char* colours[] = {"#1b6ca8", "#2e933c", "#8e44ad", "#e67e22", "#d1495b", "#555555"};
    std::vector<std::int64_t> at(contexts);  // the asked-for contexts and every power of two between
    for (std::int64_t p = 1; p <= contexts.back(); p *= 2)
        if (p >= contexts.front()) at.push_back(p);
    std::sort(at.begin(), at.end());
    at.erase(std::unique(at.begin(), at.end()), at.end());
    std::vector<std::string> ticks;
    for (const std::int64_t t : at) ticks.push_back(fmt::format("'{}' {}", context_tick(t), t));
    // pngcairo draws its 10-point default larger than the svg terminal its 12: titles one step smaller there
    const bool png = output.extension() == ".png";
    const char *big = png ? "',11'" : "',14'", *medium = png ? "',10'" : "',13'";
    std::ostringstream gp;
    gp << gnuplot_terminal(output, 1000, 1100, "--plot") << "set output\n"
       << "set grid\nset logscale xy\nset key top left Left reverse opaque noenhanced box width 2\nset format y '%g'\n"
       << fmt::format("set xrange [{}:{}]\nset xtics ({})\n", contexts.front(), contexts.back(), fmt::join(ticks, ", "))
       << "set xlabel 'context (tokens the decoded token attends, log scale)'\n"
       << "set multiplot layout 2,1 title ARG2 noenhanced font " << big << "\n"
       << "set title 'Bytes attention reads per decoded token (KV cache and activations; weights left out)' font " << medium << "\n"
       << "set ylabel " << gp_quote(axis.label + " per decoded token (log scale)") << "\n";
    const auto plot = [&](int column) {
        gp << "plot ";
        for (std::size_t i = 0; i < lines.size(); ++i)
            gp << (i ? ", " : "") << fmt::format("ARG1 index {} using 1:{} with lines lw 3 dt {} lc rgb '{}' title columnheader(2)", i, column,
                                                 i + 1, colours[i % std::size(colours)]);
        gp << "\n";
    };
    plot(2);
    gp << "set title " << gp_quote("FLOPs of attention per decoded token (projections, RoPE, qk, softmax, av)") << " font " << medium << "\n"
       << "set ylabel " << gp_quote(flops_unit + " per decoded token (log scale)") << "\n";
    plot(3);
    gp << "unset multiplot\nset output\n";
    return gp.str();
}

}  // namespace

void plot_decode_cost(const std::vector<DecodeCostLine>& lines, const std::vector<std::int64_t>& contexts, const std::filesystem::path& output,
                      UnitSystem units) {
    gnuplot_terminal(output, 1, 1, "--plot");  // the extension, checked before any work
    const std::vector<std::int64_t> xs = plot_points(contexts);
    double max_bytes = 0, min_flops = INFINITY;
    for (const auto& l : lines) {
        max_bytes = std::max(max_bytes, static_cast<double>(attention_decode_cost(l, contexts.back()).bytes_read));
        min_flops = std::min(min_flops, static_cast<double>(attention_decode_cost(l, contexts.front()).flops));
    }
    const ByteAxis axis = byte_axis(max_bytes);
    static const char* prefixes[] = {"FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP"};
    int k = 0;  // the unit of the smallest line's start, so ticks read 1, 10, 100..
    while (k < 5 && min_flops >= std::pow(1000.0, k + 1)) ++k;
    const double flops_scale = std::pow(1000.0, k);
    std::ostringstream data;
    for (std::size_t i = 0; i < lines.size(); ++i) {
        data << (i ? "\n\n" : "") << "\"context\" " << data_label(lines[i].label) << ' ' << data_label(lines[i].label) << "\n";
        for (const std::int64_t t : xs) {
            const DecodeCost c = attention_decode_cost(lines[i], t);
            data << t << ' ' << fmt::format("{:.17g} {:.17g}", static_cast<double>(c.bytes_read) / axis.scale, static_cast<double>(c.flops) / flops_scale)
                 << '\n';
        }
    }
    const std::vector<std::string> title = decode_cost_headline(lines, contexts.back(), units);
    draw_with_gnuplot(output, data.str(), plot_script(output, lines, contexts, axis, prefixes[k]),
                      {fmt::format("{}", fmt::join(title, "\n"))}, "--plot");
}

}  // namespace kvlab
