// `kvlab report`: one self-contained HTML page (inline SVG, a little script, no network) from a simulate
// trace, a serve trace or kvcalc's JSON: the headline, charts with values on hover, the per-op cost
// table, the formulas with this run's numbers, and for serve the KV pool's block map over the steps.
// Non-goals: reading Perfetto timelines (ui.perfetto.dev does that), comparing several files.
#pragma once
#include <filesystem>
#include <string>

namespace kvlab {

enum class ReportSource { simulate, serve, kvcalc };

// The page for `input`, told apart by content. Throws FormatError naming the file for anything that is
// not one of the three (an unreadable file: IoError).
std::string html_report(const std::filesystem::path& input, ReportSource* source = nullptr);

// Writes the page atomically. Throws UsageError naming -o unless `output` ends in .html or .htm.
void write_html_report(const std::filesystem::path& input, const std::filesystem::path& output);

}  // namespace kvlab
