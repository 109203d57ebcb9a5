// The parts of `kvlab report`'s HTML page: text escaped into HTML, data escaped into a <script>, a line
// chart as inline SVG (a <title> tooltip per point), a printer Table as an HTML table, and the page around
// them (style, tooltip and block-map script, error hooks). Non-goals: reading traces (html_report.cpp).
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvlab/core/printer.hpp"

namespace kvlab {

// Text for an HTML element or attribute: & < > " ' as entities, bytes that are not UTF-8 as U+FFFD.
std::string html_escape(std::string_view text);
// JSON for inside a <script>: < > & as \u escapes, so no string in it can close the script.
std::string script_json(const nlohmann::json& value);

// How a chart writes its y values (axis labels and tooltips).
enum class ValueKind { plain, count, bytes, ms, percent, ratio };
std::string format_value(double v, ValueKind kind);

struct ChartSeries {
    std::string name;
    std::vector<double> x, y;
};

struct ChartSpec {
    std::string id;        // the points' data-c, for tests and scripts
    std::string title, x_label, y_label;
    ValueKind y_kind = ValueKind::plain;
    std::vector<ChartSeries> series;
    std::optional<double> y_top;  // clip the axis here: points above are drawn on its top edge as triangles
    std::vector<std::pair<std::string, double>> lines;  // horizontal lines (a budget), labelled
    std::string note;              // under the chart
};

// A chart with no series yet.
ChartSpec make_chart(std::string id, std::string title, std::string x_label, std::string y_label, ValueKind kind);
ChartSeries make_series(std::string name, std::vector<double> x = {}, std::vector<double> y = {});

// The modelled GPU time so far (simulate per mode, serve per layout): a chart titled with the GPU, its
// note giving the roofline rule and `why` (what the reader should see in it); its series come from
// add_running_total.
ChartSpec modelled_time_chart(std::string id, const std::string& gpu_name, const std::string& why);
// Appends a point at x whose value is the series' last value plus `step_value` (a running total).
void add_running_total(ChartSeries& series, double x, double step_value);

// The chart as a <figure> with an inline <svg>: axes from 0, a polyline and a hoverable point per value.
std::string svg_chart(const ChartSpec& chart);

// A printer table as a <table>, its title as a caption and its notes under it.
std::string table_html(const Table& table);

// The whole page: `title` in <title>, the headline lines big at the top, `body` (HTML), and `data` as the
// script's KV object (the block maps).
std::string html_page(const std::string& title, const std::vector<std::string>& headline, const std::string& source_line,
                      const std::string& body, const nlohmann::json& data);

}  // namespace kvlab
