// One printer for every report kvlab writes: aligned table, CSV, JSON or Markdown.
// A cell has a display text (human units) and an exact value (for CSV/JSON).
#pragma once
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvlab/core/choice.hpp"
#include "kvlab/core/units.hpp"

namespace kvlab {

enum class Format { table, csv, json, markdown };
inline constexpr std::array<Choice<Format>, 4> format_choices{
    {{"table", Format::table}, {"csv", Format::csv}, {"json", Format::json}, {"markdown", Format::markdown}}};

struct Column {
    std::string key;      // machine name for CSV header / JSON key, e.g. "kv_bytes_per_token"
    std::string header;   // human header for table/markdown, e.g. "KV/token"
    bool align_right = true;
};

struct Cell {
    std::string text;       // what a person reads
    nlohmann::json value;   // what a script reads: exact integers, plain numbers, strings
};

Cell text_cell(std::string text);
Cell int_cell(std::int64_t value);
Cell uint_cell(std::uint64_t value);
Cell bytes_cell(std::uint64_t bytes, UnitSystem units);  // text "512.00 KiB", value 524288
Cell real_cell(double value, int decimals);               // text fixed-point, value the double
Cell ratio_cell(double value);                            // text "4.00x", value the double
Cell count_cell(std::uint64_t value, const char* unit);   // text "30.38 MFLOP" (10^3 steps), value exact
// text "94.7%", value the percentage; a share that is not exactly 0 or 100 never reads "0.0%" or "100.0%":
// it gets the decimals that tell it apart ("99.97%", "0.03%")
Cell percent_cell(double percent);
// text "+0.189%" (sign always, 3 decimals), value the change in percent; a change that is not exactly 0
// never reads "+0.000%": it gets the decimals that show it (up to 6, then "+0.000000%")
Cell change_percent_cell(double percent);

struct Table {
    std::string title;                      // printed above the table (table/markdown), "table" key in JSON
    std::vector<Column> columns;
    std::vector<std::vector<Cell>> rows;
    std::vector<std::string> notes;         // printed under the table; in JSON as "notes"
};

struct Report {
    // The answer to the question the command was asked, in 1-3 plain lines with the figures that prove it,
    // printed before any table (table, markdown; JSON "headline" when there is one; CSV keeps rows only).
    std::vector<std::string> headline;
    nlohmann::json inputs = nlohmann::json::object();  // every input used (JSON: "inputs")
    std::vector<Table> tables;
    std::vector<std::string> notes;         // report-wide notes (warnings, rules applied)
};

// Writes `report` to `out`. CSV: each table as a header line + rows of exact values (the rows carry
// their inputs as columns); with several tables, each starts with a "# <title>" line after a blank line.
// Report-wide warnings (notes that start "warning:") go to `notes` (stderr), one per line, in every format,
// so no format drops or buries one: table, markdown and CSV leave them off `out`; JSON also keeps them in
// its "notes" array (stdout stays one JSON document). CSV has no place for the other notes.
void print_report(std::ostream& out, const Report& report, Format format, std::ostream& notes = std::cerr);
// The "schema" field of every JSON report: the layout's name and version (docs/cli.md, "JSON output").
inline constexpr const char* report_json_schema = "kvlab-report/1";

}  // namespace kvlab
