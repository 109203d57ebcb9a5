// The three kinds of `kvlab report` page, one function each (html_report.cpp picks one by the file's content).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trace/html_page.hpp"
#include "trace/serve_trace.hpp"
#include "trace/step_trace.hpp"

namespace kvlab {

std::string simulate_html(const StepTrace& trace, const std::string& file);  // html_report.cpp
std::string serve_html(const ServeTrace& trace, const std::string& file);    // html_serve.cpp
std::string kvcalc_html(const nlohmann::json& report, const std::string& file);  // html_kvcalc.cpp

// Parts the pages share. A "Formulas" section: an intro line and a formula per list item.
std::string formulas_html(const std::vector<std::string>& lines, const std::string& intro);
// The nearest-rank p-th percentile (0 for none).
double percentile_of(std::vector<double> v, double p);
// A per-step time chart's axis stops at 3x the 90th percentile when a value is above it, so one spike
// does not flatten the rest; the chart's note says so.
void clip_spikes(ChartSpec& chart);

}  // namespace kvlab
