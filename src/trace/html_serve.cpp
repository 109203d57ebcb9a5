// `kvlab report` of a serve trace: the layouts' charts, per-op totals, formulas, and the KV pool's block map.
#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "kvlab/core/text.hpp"
#include "kvlab/core/units.hpp"
#include "report/serve_report.hpp"
#include "trace/html_page.hpp"
#include "trace/html_sections.hpp"

namespace kvlab {

namespace {

std::string layout_name(KvLayout l) { return std::string(choice_name(kv_layout_choices, l)); }

// A chart of one value per step, a series per layout (`suffix` after the layout's name).
ChartSpec serve_chart(const ServeTrace& t, const std::string& id, const std::string& title, const std::string& y_label, ValueKind kind,
                      double (*value)(const ServeStep&, std::int64_t pool), const std::string& suffix = "") {
    ChartSpec c = make_chart(id, title, "step", y_label, kind);
    for (std::size_t k = 0; k < t.layouts.size(); ++k) {
        ChartSeries s = make_series(layout_name(t.layouts[k]) + suffix);
        for (const ServeStep& st : t.steps[k]) {
            s.x.push_back(static_cast<double>(st.step));
            s.y.push_back(value(st, t.pool_rows[k]));
        }
        c.series.push_back(std::move(s));
    }
    return c;
}

// The modelled GPU time so far, per layout: each step's roofline time summed (what serve's headline compares).
ChartSpec modelled_chart(const ServeTrace& t) {
    const GpuSpec gpu = trace_gpu(t);
    ChartSpec c = modelled_time_chart("serve-gpu-time", gpu.display_name, "Fewer, fuller steps read the weights fewer times.");
    for (std::size_t k = 0; k < t.layouts.size(); ++k) {
        ChartSeries s = make_series(layout_name(t.layouts[k]));
        for (const ServeStep& st : t.steps[k])
            add_running_total(s, static_cast<double>(st.step), modelled_serve_time(gpu, {st}, trace_host_bytes_per_s(t)).seconds * 1e3);  // serve's own rule, one step
        c.series.push_back(std::move(s));
    }
    return c;
}

// serve --n/--beam-width: the blocks the outputs held (a shared block once) against unshared copies, per step.
std::string outputs_chart(const ServeTrace& t) {
    const bool any = std::any_of(t.steps.begin(), t.steps.end(), [](const std::vector<ServeStep>& steps) {
        return std::any_of(steps.begin(), steps.end(), [](const ServeStep& st) { return st.out_blocks_unshared > 0; });
    });
    if (!any) return "";
    ChartSpec c = serve_chart(t, "serve-outputs", "outputs' KV blocks: held (shared once) and if unshared", "blocks", ValueKind::plain,
                              [](const ServeStep& st, std::int64_t) { return static_cast<double>(st.out_blocks); }, " held");
    const ChartSpec unshared = serve_chart(t, "serve-outputs", "", "", ValueKind::plain,
                                           [](const ServeStep& st, std::int64_t) { return static_cast<double>(st.out_blocks_unshared); }, " if unshared");
    c.series.insert(c.series.end(), unshared.series.begin(), unshared.series.end());
    c.note = "Counted, exact. The outputs share the prompt's full blocks; each copies the partial one when it first writes.";
    return svg_chart(c);
}

std::string serve_charts(const ServeTrace& t) {
    std::string s;
    ChartSpec util = serve_chart(t, "serve-util", "KV utilization: rows holding tokens / rows allocated", "%", ValueKind::percent,
                                 [](const ServeStep& st, std::int64_t) { return st.rows_in_use > 0 ? 100.0 * static_cast<double>(st.rows_tokens) / static_cast<double>(st.rows_in_use) : 0.0; });
    util.note = "Counted, exact. Contiguous reserves rows a request may never fill; paged wastes at most the last block's slack.";
    s += svg_chart(util);
    ChartSpec alloc = serve_chart(t, "serve-alloc", "pool reserved: rows allocated / pool (vLLM's \"KV cache usage\")", "%", ValueKind::percent,
                                  [](const ServeStep& st, std::int64_t pool) { return 100.0 * static_cast<double>(st.rows_in_use) / static_cast<double>(pool); });
    s += svg_chart(alloc);
    ChartSpec reqs = serve_chart(t, "serve-running", "requests running (solid) and waiting", "requests", ValueKind::plain,
                                 [](const ServeStep& st, std::int64_t) { return static_cast<double>(st.n_running); }, " running");
    const ChartSpec waiting = serve_chart(t, "serve-running", "", "", ValueKind::plain,
                                          [](const ServeStep& st, std::int64_t) { return static_cast<double>(st.n_waiting); }, " waiting");
    reqs.series.insert(reqs.series.end(), waiting.series.begin(), waiting.series.end());
    s += svg_chart(reqs);
    s += svg_chart(serve_chart(t, "serve-tokens", "tokens per step (the batch)", "tokens", ValueKind::plain,
                               [](const ServeStep& st, std::int64_t) { return static_cast<double>(st.n_tokens); }));
    s += svg_chart(modelled_chart(t));
    if (trace_host_bytes_per_s(t) > 0) {  // --preempt swap: the host link's traffic
        ChartSpec swap = serve_chart(t, "serve-swap", "KV swapped to host (out) and back (in), per step", "bytes", ValueKind::bytes,
                                     [](const ServeStep& st, std::int64_t) { return static_cast<double>(st.swap_out_bytes); }, " out");
        const ChartSpec in = serve_chart(t, "serve-swap", "", "", ValueKind::bytes,
                                         [](const ServeStep& st, std::int64_t) { return static_cast<double>(st.swap_in_bytes); }, " in");
        swap.series.insert(swap.series.end(), in.series.begin(), in.series.end());
        std::erase_if(swap.series, [](const ChartSeries& series) {  // a layout that never swapped (contiguous never preempts)
            return std::all_of(series.y.begin(), series.y.end(), [](double v) { return v == 0.0; });
        });
        swap.note = "Counted, exact: each swapped sequence's held rows x 2 (K and V) x one stored row. The modelled time above adds "
                    "these bytes / the host link's bandwidth.";
        s += svg_chart(swap);
    }
    s += outputs_chart(t);
    if (t.has_wall_time) {
        ChartSpec time = serve_chart(t, "serve-time", "time per step (measured)", "ms", ValueKind::ms,
                                     [](const ServeStep& st, std::int64_t) { return static_cast<double>(st.forward_ns + st.schedule_ns) * 1e-6; });
        time.note = "Measured on this machine in one run: timings vary.";
        clip_spikes(time);
        s += svg_chart(time);
    }
    return s;
}

// Per op, per layout: FLOPs and bytes over the run (counted, exact) and time (measured).
Table serve_op_table(const ServeTrace& t) {
    Table tab;
    tab.title = "per-op cost over the run, every step summed";
    tab.columns = {{"op", "op", false}};
    for (const KvLayout l : t.layouts) {
        tab.columns.push_back({layout_name(l) + "_flops", layout_name(l) + " FLOPs (exact)"});
        tab.columns.push_back({layout_name(l) + "_bytes", layout_name(l) + " bytes moved (exact)"});
        if (t.has_wall_time) tab.columns.push_back({layout_name(l) + "_ms", layout_name(l) + " time, ms (measured)"});
    }
    for (int i = 0; i < n_ops; ++i) {
        const Op op = static_cast<Op>(i);
        std::vector<Cell> row{text_cell(std::string(op_name(op)))};
        bool ran = false;
        for (std::size_t k = 0; k < t.layouts.size(); ++k) {
            OpCost sum;
            std::int64_t ns = 0;
            for (const ServeStep& st : t.steps[k]) {
                sum += st.cost.at(op);
                ns += st.cost.wall_ns_of(op);
            }
            ran = ran || sum.flops > 0 || sum.bytes_total() > 0;
            row.push_back(count_cell(sum.flops, "FLOP"));
            row.push_back(bytes_cell(sum.bytes_total(), UnitSystem::iec));
            if (t.has_wall_time) row.push_back(real_cell(static_cast<double>(ns) * 1e-6, 3));
        }
        if (ran) tab.rows.push_back(std::move(row));
    }
    tab.notes.push_back("FLOPs and bytes are counted from the shapes each op processed: exact. Times are one run's wall clock: they vary.");
    return tab;
}

// The step with the most requests holding rows: where the block map opens.
std::size_t busiest_step(const std::vector<ServeStep>& steps) {
    std::size_t best = 0;
    for (std::size_t i = 0; i < steps.size(); ++i)
        if (steps[i].n_running > steps[best].n_running) best = i;
    return best;
}

std::vector<std::string> serve_formulas(const ServeTrace& t) {
    std::vector<std::string> f;
    const std::uint64_t token_bytes = t.inputs.at("token_bytes").get<std::uint64_t>();
    f.push_back(fmt::format("pool = pool rows · one token's K and V (every layer) = {} · {} B = {}", t.pool_rows.front(), token_bytes,
                            format_bytes(static_cast<std::uint64_t>(t.pool_rows.front()) * token_bytes, UnitSystem::iec)));
    for (std::size_t k = 0; k < t.layouts.size(); ++k) {
        const std::string name = layout_name(t.layouts[k]);
        const ServeStep& s = t.steps[k][busiest_step(t.steps[k])];
        f.push_back(fmt::format("{} step {}: KV utilization = rows holding tokens / rows allocated = {} / {} = {:.1f}%", name, s.step, s.rows_tokens,
                                s.rows_in_use, 100.0 * static_cast<double>(s.rows_tokens) / static_cast<double>(std::max<std::int64_t>(1, s.rows_in_use))));
        f.push_back(fmt::format("{} step {}: KV allocated / pool = {} / {} = {:.1f}%", name, s.step, s.rows_in_use, t.pool_rows[k],
                                100.0 * static_cast<double>(s.rows_in_use) / static_cast<double>(t.pool_rows[k])));
        if (!s.pool_map.empty()) {
            const auto held = std::count_if(s.pool_map.begin(), s.pool_map.end(), [](const KvPoolCell& c) { return c.owner >= 0; });
            f.push_back(fmt::format("{} step {}: block map cells held · rows per cell = {} · {} = {} rows{}", name, s.step, held, t.map_cell_rows[k],
                                    held * t.map_cell_rows[k], t.layouts[k] == KvLayout::paged ? fmt::format(" = rows allocated ({})", s.rows_in_use)
                                                                                             : " (a cell counts when any row of it is reserved)"));
        }
        std::uint64_t weights = 0;
        std::int64_t generated = 0;
        for (const ServeStep& st : t.steps[k]) {
            weights += st.cost.total().bytes_weights_read;
            generated += st.n_generated;
        }
        f.push_back(fmt::format("{}: weight bytes per generated token = weight bytes read / tokens generated = {} / {} = {} (falls as the batch grows)",
                                name, weights, generated, format_bytes(weights / static_cast<std::uint64_t>(std::max<std::int64_t>(1, generated)), UnitSystem::iec)));
    }
    return f;
}

}  // namespace

}  // namespace kvlab

namespace kvlab {

namespace {

// A layout's block map for the page's script: each step's owners, fills and shared cells.
nlohmann::json block_map_json(const ServeTrace& t, std::size_t k) {
    nlohmann::json steps = nlohmann::json::array(), owner = nlohmann::json::array(), fill = nlohmann::json::array(), shared = nlohmann::json::array();
    for (const ServeStep& s : t.steps[k]) {
        nlohmann::json o = nlohmann::json::array(), f = nlohmann::json::array(), sh = nlohmann::json::array();
        for (std::size_t c = 0; c < s.pool_map.size(); ++c) {
            o.push_back(s.pool_map[c].owner);
            f.push_back(s.pool_map[c].fill);
            if (s.pool_map[c].shared) sh.push_back(c);
        }
        steps.push_back(s.step);
        owner.push_back(std::move(o));
        fill.push_back(std::move(f));
        shared.push_back(std::move(sh));
    }
    return {{"layout", layout_name(t.layouts[k])}, {"cell_rows", t.map_cell_rows[k]}, {"n_cells", t.steps[k].front().pool_map.size()},
            {"steps", std::move(steps)}, {"owner", std::move(owner)}, {"fill", std::move(fill)}, {"shared", std::move(shared)},
            {"start", busiest_step(t.steps[k])}};
}

// The block map section: a grid per layout that has one (the script fills it), or why there is none.
std::string block_map_html(const ServeTrace& t, nlohmann::json& maps) {
    std::string s = "<h2>The KV pool, block by block</h2>\n";
    if (std::find(t.map_cell_rows.begin(), t.map_cell_rows.end(), 0) != t.map_cell_rows.end())
        return s + "<p class=\"note\" id=\"no-block-map\">This trace has no block map: it needs a newer trace. Run <code>kvlab serve ... "
                   "--trace FILE.jsonl</code> again with this kvlab (CSV traces and traces from earlier versions do not record it).</p>\n";
    s += "<p class=\"note\">One cell per block (paged) or per 16 rows (contiguous), coloured by the request holding it; the dark part of a "
         "cell is the rows holding a token's K and V, the light part rows allocated but empty. Drag the slider to move through the steps.</p>\n"
         "<p class=\"legend\"><span><span class=\"cell free\"></span>free</span><span><span class=\"cell cached\"></span>idle, kept for the "
         "prefix cache</span><span><span class=\"cell shared\" style=\"background:#999\"></span>shared prefix block (held by 2 or more)</span></p>\n"
         "<div class=\"maps\">";
    for (std::size_t k = 0; k < t.layouts.size(); ++k) {
        const nlohmann::json m = block_map_json(t, k);
        const std::size_t n_cells = m.at("n_cells").get<std::size_t>();
        const int cols = n_cells <= 128 ? 16 : n_cells <= 1024 ? 32 : 64;
        s += fmt::format("<div class=\"map\" id=\"map-{0}\" data-cells=\"{1}\"><h3>{2}: {1} cells of {3} rows</h3><div class=\"controls\">"
                         "<button type=\"button\">play</button><input type=\"range\" min=\"0\" value=\"0\" aria-label=\"step\"></div>"
                         "<div class=\"caption\"></div><div class=\"grid\" style=\"grid-template-columns:repeat({4},20px)\"></div></div>",
                         maps.size(), n_cells, html_escape(layout_name(t.layouts[k])), t.map_cell_rows[k], cols);
        maps.push_back(m);
    }
    return s + "</div>\n";
}

// A serve trace's headline when its report has none: each layout's mean utilization and peak batch.
std::vector<std::string> serve_headline(const ServeTrace& t, const Report& summary) {
    if (!summary.headline.empty()) return summary.headline;
    std::string line;
    for (std::size_t k = 0; k < t.layouts.size(); ++k) {
        double util = 0;
        std::int64_t peak = 0;
        for (const ServeStep& s : t.steps[k]) {
            util += s.rows_in_use > 0 ? static_cast<double>(s.rows_tokens) / static_cast<double>(s.rows_in_use) : 0.0;
            peak = std::max(peak, s.n_seqs);
        }
        line += fmt::format("{}{} kept {:.0f}% of allocated KV holding tokens and ran up to {} at once", k ? "; " : "", layout_name(t.layouts[k]),
                            100.0 * util / static_cast<double>(t.steps[k].size()), counted(peak, "request"));
    }
    return {line};
}

}  // namespace

std::string serve_html(const ServeTrace& t, const std::string& file) {
    const Report summary = serve_trace_summary(t, UnitSystem::iec, Format::table);
    nlohmann::json maps = nlohmann::json::array();
    std::string body = "<h2>Charts</h2>\n<div class=\"charts\">\n" + serve_charts(t) + "</div>\n";
    body += block_map_html(t, maps);
    body += "<h2>Per-op cost</h2>\n" + table_html(serve_op_table(t));
    body += formulas_html(serve_formulas(t), "docs/serving.md defines each figure; the steps shown are each layout's busiest (most requests running).");
    body += "<h2>Summary</h2>\n";
    for (const Table& tab : summary.tables) body += table_html(tab);
    for (const std::string& n : summary.notes) body += fmt::format("<p class=\"note\">{}</p>", html_escape(n));
    const std::string model = t.inputs.contains("model") && t.inputs.at("model").is_string() ? t.inputs.at("model").get<std::string>() : "?";
    const std::string source = fmt::format("kvlab report of {}: a serve trace of {}, {} layout(s), pool {} token rows", file, model,
                                           t.layouts.size(), t.pool_rows.front());
    return html_page("kvlab report: serve " + model, serve_headline(t, summary), source, body, nlohmann::json{{"maps", std::move(maps)}});
}

}  // namespace kvlab
