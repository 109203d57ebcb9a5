// `kvlab report` of kvcalc's JSON: KV memory against context per model/dtype/batch with the GPU's KV budget,
// the tables, and the notes (with --explain, every formula with its numbers).
#include <map>
#include <set>

#include <fmt/format.h>

#include "kvlab/core/text.hpp"
#include "kvlab/core/units.hpp"
#include "trace/html_page.hpp"
#include "trace/html_sections.hpp"

namespace kvlab {

namespace {

using json = nlohmann::json;

const json* find_table(const json& report, std::string_view prefix) {
    for (const json& t : report.at("tables"))
        if (t.is_object() && t.value("table", std::string()).rfind(prefix, 0) == 0 && t.contains("rows") && t.at("rows").is_array()) return &t;
    return nullptr;
}

std::string text_of(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// KV bytes against context: a series per model/attention/dtype/batch from the per-sequence-and-batch table
// (from 0 at context 0), per GPU when the run split heads over GPUs; the GPU's KV budget as lines.
ChartSpec kv_chart(const json& report) {
    ChartSpec c = make_chart("kv-context", "KV cache against context", "context (tokens)", "KV bytes", ValueKind::bytes);
    const json* batch = find_table(report, "KV cache per sequence and batch");
    if (!batch) return c;
    std::map<std::string, ChartSeries> series;
    std::vector<std::string> order;
    for (const json& r : batch->at("rows")) {
        const bool per_gpu = r.contains("bytes_per_batch_per_gpu");
        const json& y = per_gpu ? r.at("bytes_per_batch_per_gpu") : r.value("bytes_per_batch", json());
        if (!y.is_number() || !r.value("context", json()).is_number()) continue;
        if (per_gpu) c.y_label = "KV bytes per GPU";
        const std::string name = fmt::format("{} {} {} batch {}", text_of(r.value("model", json("?"))), text_of(r.value("attention", json(""))),
                                             text_of(r.value("dtype", json(""))), text_of(r.value("batch", json("?"))));
        if (!series.count(name)) {
            order.push_back(name);
            series[name] = make_series(name, {0.0}, {0.0});
        }
        series[name].x.push_back(r.at("context").get<double>());
        series[name].y.push_back(y.get<double>());
    }
    for (const std::string& n : order) c.series.push_back(std::move(series[n]));
    if (const json* fit = find_table(report, "Does it fit")) {
        std::map<double, std::string> budgets;  // each distinct budget, named by the first model that has it
        for (const json& r : fit->at("rows"))
            if (r.value("bytes_kv_budget_per_gpu", json()).is_number())
                budgets.emplace(r.at("bytes_kv_budget_per_gpu").get<double>(), text_of(r.value("model", json("?"))));
        for (const auto& [b, model] : budgets)
            if (c.lines.size() < 2) c.lines.emplace_back(budgets.size() == 1 ? std::string("KV budget per GPU") : "KV budget, " + model, b);
    }
    c.note = "Counted from the formula (exact); lines join the contexts the run asked for, from 0 at context 0.";
    return c;
}

// A kvcalc JSON table as a printer table: its columns are the first row's keys; bytes in IEC units.
Table json_table(const json& t) {
    Table tab;
    tab.title = t.value("table", std::string());
    const json& rows = t.at("rows");
    if (!rows.empty() && rows.front().is_object())
        for (const auto& [key, v] : rows.front().items()) tab.columns.push_back({key, key, !v.is_string()});
    for (const json& r : rows) {
        std::vector<Cell> row;
        for (const Column& col : tab.columns) {
            const json v = r.is_object() ? r.value(col.key, json()) : json();
            if (col.key.rfind("bytes", 0) == 0 && v.is_number_unsigned()) row.push_back(bytes_cell(v.get<std::uint64_t>(), UnitSystem::iec));
            else row.push_back(text_cell(v.is_null() ? "" : text_of(v)));
        }
        tab.rows.push_back(std::move(row));
    }
    if (t.contains("notes") && t.at("notes").is_array())
        for (const json& n : t.at("notes")) tab.notes.push_back(text_of(n));
    return tab;
}

// kvcalc's own headline, or one line per model/dtype from its per-token table (the first three).
std::vector<std::string> kvcalc_headline(const json& report) {
    std::vector<std::string> lines;
    if (report.contains("headline") && report.at("headline").is_array()) {
        for (const json& l : report.at("headline")) lines.push_back(text_of(l));
        return lines;
    }
    if (const json* per_token = find_table(report, "KV cache per token"))
        for (const json& r : per_token->at("rows")) {
            if (lines.size() == 3 || !r.value("bytes_per_token", json()).is_number_unsigned()) break;
            lines.push_back(fmt::format("{} {} {}: {} of KV cache per token", text_of(r.value("model", json("?"))), text_of(r.value("attention", json(""))),
                                        text_of(r.value("dtype", json(""))), format_bytes(r.at("bytes_per_token").get<std::uint64_t>(), UnitSystem::iec)));
        }
    return lines;
}

}  // namespace

std::string kvcalc_html(const json& report, const std::string& file) {
    std::string body = "<h2>Chart</h2>\n<div class=\"charts\">\n" + svg_chart(kv_chart(report)) + "</div>\n<h2>Tables</h2>\n";
    for (const json& t : report.at("tables"))
        if (t.is_object() && t.contains("rows") && t.at("rows").is_array()) body += table_html(json_table(t));
    std::vector<std::string> notes;
    if (report.contains("notes") && report.at("notes").is_array())
        for (const json& n : report.at("notes")) notes.push_back(text_of(n));
    body += formulas_html(notes, "kvcalc's notes: the rules applied, and with --explain each formula with its numbers put in "
                                 "(docs/kv-memory.md).");
    const std::string source = fmt::format("kvlab report of {}: kvcalc's JSON", file);
    return html_page("kvlab report: kvcalc", kvcalc_headline(report), source, body, json{{"maps", json::array()}});
}

}  // namespace kvlab
