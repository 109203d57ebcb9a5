#include "trace/html_report.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>

#include <fmt/format.h>

#include "core/atomic_write.hpp"
#include "core/json_input.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/core/mapped_file.hpp"
#include "kvlab/core/text.hpp"
#include "kvlab/core/units.hpp"
#include "trace/html_page.hpp"
#include "trace/html_sections.hpp"
#include "trace/trace_reader.hpp"
#include "trace/trace_report.hpp"

namespace kvlab {

double percentile_of(std::vector<double> v, double p) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    const auto rank = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));  // nearest rank
    return v[std::clamp<std::size_t>(rank, 1, v.size()) - 1];
}

void clip_spikes(ChartSpec& chart) {
    std::vector<double> all;
    for (const ChartSeries& s : chart.series) all.insert(all.end(), s.y.begin(), s.y.end());
    const double top = 3.0 * percentile_of(all, 90.0);
    const auto above = std::count_if(all.begin(), all.end(), [&](double y) { return y > top; });
    if (above == 0 || top <= 0) return;
    chart.y_top = top;
    chart.note += fmt::format("{}The axis stops at 3x the 90th percentile ({}): {} above it {} drawn on the top edge as triangles "
                              "(hover for the values).", chart.note.empty() ? "" : " ", format_value(top, chart.y_kind), counted(above, "value"),
                              above == 1 ? "is" : "are");
}

namespace {

std::vector<const StepRecord*> records_of(const StepTrace& t, StepMode mode) {
    std::vector<const StepRecord*> out;
    for (const StepRecord& r : t.records)
        if (r.mode == mode) out.push_back(&r);
    return out;
}

std::vector<StepMode> modes_of(const StepTrace& t) {
    std::vector<StepMode> modes;
    for (const StepMode m : {StepMode::cached, StepMode::uncached})
        if (!records_of(t, m).empty()) modes.push_back(m);
    return modes;
}

// A chart of one value per step, a series per mode.
ChartSpec per_step_chart(const StepTrace& t, const std::string& id, const std::string& title, const std::string& y_label, ValueKind kind,
                         double (*value)(const StepRecord&)) {
    ChartSpec c = make_chart(id, title, "step", y_label, kind);
    for (const StepMode m : modes_of(t)) {
        ChartSeries s = make_series(std::string(step_mode_name(m)));
        for (const StepRecord* r : records_of(t, m)) {
            s.x.push_back(static_cast<double>(r->step));
            s.y.push_back(value(*r));
        }
        c.series.push_back(std::move(s));
    }
    return c;
}

// The modelled GPU time so far per mode (the headline's modelled ratio is the last steps' ratio).
ChartSpec modelled_chart(const StepTrace& t, const GpuSpec& gpu) {
    ChartSpec c = modelled_time_chart("sim-gpu-time", gpu.display_name, "Both modes read the weights once a step, so the bytes decide.");
    for (const StepMode m : modes_of(t)) {
        ChartSeries s = make_series(std::string(step_mode_name(m)));
        for (const StepRecord* r : records_of(t, m)) add_running_total(s, static_cast<double>(r->step), modelled_step_seconds(gpu, *r) * 1e3);
        c.series.push_back(std::move(s));
    }
    return c;
}

// Cumulative wall time per mode, and the speed-up (uncached's over cached's) step by step.
std::string time_charts(const StepTrace& t) {
    if (!t.run.has_wall_time)
        return "<p class=\"note\">A --deterministic trace carries no wall time: the time charts need a trace written without it.</p>";
    ChartSpec step = per_step_chart(t, "sim-step-time", "time per step (measured)", "ms", ValueKind::ms,
                                    [](const StepRecord& r) { return static_cast<double>(r.wall_ns) * 1e-6; });
    step.note = "Measured on this machine in one run: timings vary from run to run.";
    clip_spikes(step);
    ChartSpec cum = per_step_chart(t, "sim-cum-time", "cumulative time (measured)", "ms", ValueKind::ms,
                                   [](const StepRecord& r) { return static_cast<double>(r.wall_ns) * 1e-6; });
    for (ChartSeries& s : cum.series)
        for (std::size_t i = 1; i < s.y.size(); ++i) s.y[i] += s.y[i - 1];
    std::string out = svg_chart(step) + svg_chart(cum);
    if (cum.series.size() == 2 && cum.series[0].y.size() == cum.series[1].y.size()) {
        ChartSpec up = make_chart("sim-speedup", "speed-up so far: uncached time / cached time (measured)", "step", "x", ValueKind::ratio);
        ChartSeries s = make_series("uncached / cached", cum.series[0].x, {});
        for (std::size_t i = 0; i < s.x.size(); ++i) s.y.push_back(cum.series[0].y[i] > 0 ? cum.series[1].y[i] / cum.series[0].y[i] : 0.0);
        up.series.push_back(std::move(s));
        up.note = "Total uncached wall time over total cached wall time up to each step; the prefill (step 0) is in both.";
        out += svg_chart(up);
    }
    return out;
}

std::string op_category_name(Op op) {
    switch (op_category(op)) {
    case OpCategory::matmul: return "matmul";
    case OpCategory::attention: return "attention";
    case OpCategory::other: break;
    }
    return "other";
}

// Per op over the run, a column pair per mode: FLOPs and bytes (counted, exact), wall time (measured).
Table simulate_op_table(const StepTrace& t) {
    const std::vector<StepMode> modes = modes_of(t);
    Table tab;
    tab.title = "per-op cost over the run";
    tab.columns = {{"op", "op", false}, {"category", "category", false}};
    for (const StepMode m : modes) {
        const std::string name(step_mode_name(m));
        tab.columns.push_back({name + "_flops", name + " FLOPs (exact)"});
        tab.columns.push_back({name + "_bytes", name + " bytes moved (exact)"});
        if (t.run.has_wall_time) tab.columns.push_back({name + "_ms", name + " time, ms (measured)"});
    }
    for (int i = 0; i < n_ops; ++i) {
        const Op op = static_cast<Op>(i);
        std::vector<Cell> row{text_cell(std::string(op_name(op))), text_cell(op_category_name(op))};
        bool ran = false;
        for (const StepMode m : modes) {
            OpCost sum;
            std::int64_t ns = 0;
            for (const StepRecord* r : records_of(t, m)) {
                sum += r->cost.at(op);
                ns += r->cost.wall_ns_of(op);
            }
            ran = ran || sum.flops > 0 || sum.bytes_total() > 0;
            row.push_back(count_cell(sum.flops, "FLOP"));
            row.push_back(bytes_cell(sum.bytes_total(), UnitSystem::iec));
            if (t.run.has_wall_time) row.push_back(real_cell(static_cast<double>(ns) * 1e-6, 3));
        }
        if (ran) tab.rows.push_back(std::move(row));
    }
    tab.notes.push_back("FLOPs and bytes are counted from the shapes each op processed: exact, the same on every machine. Times are one "
                        "run's wall clock on this machine: they vary.");
    return tab;
}

}  // namespace

}  // namespace kvlab

namespace kvlab {

namespace {

std::string num(std::uint64_t v) { return fmt::format("{}", v); }

// The formulas of docs/cost-model.md with the last decode step's numbers put in (cached mode), and the run's ratios.
std::vector<std::string> simulate_formulas(const StepTrace& t) {
    std::vector<std::string> f;
    const auto cached = records_of(t, StepMode::cached), uncached = records_of(t, StepMode::uncached);
    const std::int64_t L = t.inputs.value("layers", std::int64_t{0});
    if (!cached.empty() && cached.back()->step > 0) {
        const StepRecord& r = *cached.back();
        const OpCost c = r.cost.total();
        f.push_back(fmt::format("step {} (cached decode, position {}): FLOPs = matmul + attention + other = {} + {} + {} = {} FLOP (counted)", r.step,
                                r.position, num(r.cost.flops(OpCategory::matmul)), num(r.cost.flops(OpCategory::attention)),
                                num(r.cost.flops(OpCategory::other)), num(c.flops)));
        const std::uint64_t kv_written = r.cost.at(Op::kv_store).bytes_kv_written, b = 4;
        if (L > 0 && r.n_tokens > 0 && t.inputs.value("kv_dtype", std::string("fp32")) == "fp32" && kv_written > 0) {
            const std::uint64_t d_kv = kv_written / (2 * b * static_cast<std::uint64_t>(L * r.n_tokens));
            const std::uint64_t read = r.cost.at(Op::qk).bytes_kv_read + r.cost.at(Op::av).bytes_kv_read;
            const std::uint64_t model = 2 * static_cast<std::uint64_t>(L) * static_cast<std::uint64_t>(r.n_keys) * d_kv * b;
            f.push_back(fmt::format("d_kv = Hkv·D = KV written / (2 · L · n · b) = {} / (2 · {} · {} · 4) = {}", num(kv_written), L, r.n_tokens, d_kv));
            f.push_back(fmt::format("KV read at step {} = 2 (K and V) · L · T · d_kv · b = 2 · {} · {} · {} · 4 = {} B; counted {} B{}", r.step, L,
                                    r.n_keys, d_kv, num(model), num(read), model == read ? " (equal)" : " (a window or sinks: fewer rows read)"));
            f.push_back(fmt::format("KV cache resident after step {} = 2 · L · (position + 1) · d_kv · b = 2 · {} · {} · {} · 4 = {} B; counted {} B",
                                    r.step, L, r.position + 1, d_kv, num(2 * static_cast<std::uint64_t>(L * (r.position + 1)) * d_kv * b),
                                    num(r.kv_bytes_resident)));
        }
        f.push_back(fmt::format("arithmetic intensity at step {} (cached) = FLOPs / bytes = {} / {} = {:.2f} FLOP/B", r.step, num(c.flops),
                                num(c.bytes_total()), static_cast<double>(c.flops) / static_cast<double>(std::max<std::uint64_t>(1, c.bytes_total()))));
    }
    if (!cached.empty() && !uncached.empty()) {
        const ModeTotals a = mode_totals(t.records, StepMode::cached), u = mode_totals(t.records, StepMode::uncached);
        f.push_back(fmt::format("FLOPs over the run: uncached / cached = {} / {} = {:.2f}x (counted, exact)", num(u.cost.flops), num(a.cost.flops),
                                static_cast<double>(u.cost.flops) / static_cast<double>(std::max<std::uint64_t>(1, a.cost.flops))));
        if (t.run.has_wall_time && a.wall_ns > 0)
            f.push_back(fmt::format("speed-up = uncached wall time / cached wall time = {:.1f} ms / {:.1f} ms = {:.2f}x (measured, one run: it varies)",
                                    static_cast<double>(u.wall_ns) * 1e-6, static_cast<double>(a.wall_ns) * 1e-6,
                                    static_cast<double>(u.wall_ns) / static_cast<double>(a.wall_ns)));
    }
    return f;
}

}  // namespace

std::string formulas_html(const std::vector<std::string>& lines, const std::string& intro) {
    std::string s = fmt::format("<h2>Formulas with this run's numbers</h2>\n<p class=\"note\">{}</p>\n<ul class=\"formulas\">", html_escape(intro));
    for (const std::string& l : lines) s += fmt::format("<li>{}</li>", html_escape(l));
    return s + "</ul>\n";
}

std::string simulate_html(const StepTrace& t, const std::string& file) {
    const Report summary = trace_summary_report(t, UnitSystem::iec);
    std::string body = "<h2>Charts</h2>\n<div class=\"charts\">\n" + time_charts(t);
    if (const std::optional<GpuSpec> gpu = modelled_gpu(t.inputs)) body += svg_chart(modelled_chart(t, *gpu));
    body += svg_chart(per_step_chart(t, "sim-flops", "FLOPs per step (counted, exact)", "FLOP", ValueKind::count,
                                     [](const StepRecord& r) { return static_cast<double>(r.cost.total().flops); }));
    body += svg_chart(per_step_chart(t, "sim-bytes", "bytes moved per step (counted, exact)", "bytes", ValueKind::bytes,
                                     [](const StepRecord& r) { return static_cast<double>(r.cost.total().bytes_total()); }));
    body += svg_chart(per_step_chart(t, "sim-kv", "KV cache resident after each step (counted, exact)", "bytes", ValueKind::bytes,
                                     [](const StepRecord& r) { return static_cast<double>(r.kv_bytes_resident); }));
    body += "</div>\n<h2>Per-op cost</h2>\n" + table_html(simulate_op_table(t));
    body += formulas_html(simulate_formulas(t), "From docs/cost-model.md (a multiply-add is 2 FLOPs; b = 4 bytes, fp32). L layers, T keys "
                                                "attended, n tokens in the call, d_kv = KV heads x head dim.");
    body += "<h2>Summary</h2>\n";
    for (const Table& tab : summary.tables) body += table_html(tab);
    for (const std::string& n : summary.notes) body += fmt::format("<p class=\"note\">{}</p>", html_escape(n));
    const std::string source = fmt::format("kvlab report of {}: a simulate trace of {}, {} per mode", file, t.run.display_name,
                                           counted(t.run.n_steps_done, "step"));
    return html_page("kvlab report: " + t.run.display_name, summary.headline, source, body, nlohmann::json{{"maps", nlohmann::json::array()}});
}

namespace {

// kvcalc's JSON: a kvlab report whose inputs name the models and contexts, with its per-token table.
bool is_kvcalc_json(const nlohmann::json& j) {
    if (!j.is_object() || j.value("schema", std::string()) != report_json_schema || !j.contains("tables") || !j.at("tables").is_array()) return false;
    const nlohmann::json& in = j.value("inputs", nlohmann::json::object());
    return in.is_object() && in.contains("models") && in.contains("contexts");
}

}  // namespace

std::string html_report(const std::filesystem::path& input, ReportSource* source) {
    const std::string file = input.filename().string();
    if (is_serve_trace_file(input)) {
        if (source) *source = ReportSource::serve;
        return serve_html(read_serve_trace(input), file);
    }
    std::string head;
    {
        std::ifstream in(input, std::ios::binary);
        char ch = 0;
        while (in.get(ch) && std::isspace(static_cast<unsigned char>(ch))) {}
        head = std::string(1, ch);
    }
    if (head == "{") {
        const std::string text = read_input_file(input, "report input", 1ull << 30);
        if (text.rfind("{\"traceEvents\"", 0) != 0 && nlohmann::json::accept(text)) {  // one document: not JSON Lines
            const nlohmann::json j = parse_json(text, input.string());
            if (!is_kvcalc_json(j))
                throw FormatError(fmt::format("{}: JSON that is not kvcalc's report; kvlab report reads `kvlab kvcalc ... --format json`, "
                                              "a simulate trace (.csv, .jsonl, Perfetto .json) or a serve trace (.csv, .jsonl)", input.string()));
            if (source) *source = ReportSource::kvcalc;
            return kvcalc_html(j, file);
        }
    }
    if (source) *source = ReportSource::simulate;
    return simulate_html(read_step_trace(input), file);
}

void write_html_report(const std::filesystem::path& input, const std::filesystem::path& output) {
    const std::string ext = output.extension().string();
    if (ext != ".html" && ext != ".htm")
        throw UsageError(fmt::format("-o/--output: {}; expected a file name ending in .html", quote(output.string())));
    const std::string page = html_report(input);
    write_atomically(output, "--output", [&](std::ostream& out) { out << page; });
}

}  // namespace kvlab
