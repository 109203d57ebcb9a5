// Reading step traces: CSV and JSON Lines here, Perfetto JSON in perfetto_reader.cpp, the shared checks
// in trace_parser.hpp, the columns in trace_schema.hpp.
#include "trace/trace_reader.hpp"

#include <sstream>

#include "trace/trace_parser.hpp"

namespace kvlab {

// CSV: "# " header lines (format, units, run.*, inputs), the column line, one row per record.
void TraceParser::read_csv(StepTrace& trace) {
    const auto all = lines();
    const std::string magic = "# kvlab simulate step trace, format ";
    if (all[0].rfind(magic, 0) != 0)
        fail(1, fmt::format("{} is not a kvlab trace header; expected '{}{}' (CSV), a JSON Lines header or Perfetto JSON",
                            quote(all[0], 60), magic, trace_format_version));
    {
        const std::string v = all[0].substr(magic.size(), all[0].find(' ', magic.size()) - magic.size());
        int version = 0;
        const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), version);
        if (ec != std::errc() || end != v.data() + v.size()) fail(1, fmt::format("trace format {}; expected {}", quote(v, 20), trace_format_version));
        check_version(1, version);
    }
    std::size_t i = 1;
    json run = json::object();
    std::size_t run_line = 1;
    for (; i < all.size() && !all[i].empty() && all[i][0] == '#'; ++i) {
        const std::string& l = all[i];
        if (l.rfind("# units: ", 0) == 0) continue;
        const auto eq = l.find('=');
        if (l.size() < 3 || l[1] != ' ' || eq == std::string::npos)
            fail(i + 1, fmt::format("header line {}; expected '# key=value'", quote(l, 60)));
        const std::string key = l.substr(2, eq - 2), text = l.substr(eq + 1);
        check_text(i + 1, l);
        const json value = json::accept(text) ? parse(i + 1, text) : json(text);
        if (key.rfind("run.", 0) == 0) {
            run[key.substr(4)] = value;
            run_line = i + 1;
        } else {
            check_input(i + 1, key, value);
            trace.inputs[key] = value;
        }
    }
    if (i >= all.size()) fail(all.size(), "no column line after the '#' header; the file is truncated");
    const std::size_t header_line = i + 1;
    std::vector<std::string> got;
    {
        std::string cell;
        std::istringstream cells(all[i]);
        while (std::getline(cells, cell, ',')) got.push_back(cell);
    }
    const bool deterministic = std::find(got.begin(), got.end(), "wall_ns") == got.end();
    set_columns(deterministic);
    check_header_columns(header_line, got);
    if (run.empty()) fail(header_line, "no '# run.*' lines in the header; expected the run summary (trace format 2)");
    trace.run = run_from_json(run_line, run);
    for (++i; i < all.size(); ++i) {
        const std::size_t line = i + 1;
        if (all[i].empty()) {
            if (i + 1 == all.size()) break;  // the final newline
            fail(line, "empty line inside the records");
        }
        if (all[i][0] == '#') fail(line, "a '#' header line after the records: two traces concatenated?");
        const std::vector<std::string> cells = split_fields(all[i], ',');
        if (cells.size() != got.size())
            fail(line, fmt::format("{} fields; expected {} (the header's columns){}", cells.size(), got.size(),
                                   i + 1 == all.size() || (i + 2 == all.size() && all.back().empty()) ? ": the file is truncated" : ""));
        json row = json::object();
        for (std::size_t c = 0; c < cells.size(); ++c) row[got[c]] = value_from_text(line, got[c], cells[c]);
        trace.records.push_back(record_from_row(line, row));
        record_lines_.push_back(line);
    }
    if (!text_.empty() && text_.back() != '\n') fail(all.size(), "the last line has no line end: the file is truncated");
}

// JSON Lines: a header object, then one flat record object per line.
void TraceParser::read_jsonl(StepTrace& trace) {
    const auto all = lines();
    const json header = parse(1, all[0]);
    check_version(1, header.at("kvlab_trace"));
    if (!header.contains("columns") || !header.at("columns").is_array())
        fail(1, "the header has no 'columns' array");
    std::vector<std::string> got;
    for (const auto& c : header.at("columns")) {
        if (!c.is_string()) fail(1, fmt::format("column name {}; expected a string", json_excerpt(c)));
        got.push_back(c.get<std::string>());
    }
    const bool deterministic = std::find(got.begin(), got.end(), "wall_ns") == got.end();
    set_columns(deterministic);
    check_header_columns(1, got);
    if (!header.contains("inputs") || !header.at("inputs").is_object()) fail(1, "the header has no 'inputs' object");
    trace.inputs = header.at("inputs");
    check_inputs(1, trace.inputs);
    if (!header.contains("run")) fail(1, "the header has no 'run' object (the run summary)");
    trace.run = run_from_json(1, header.at("run"));
    for (std::size_t i = 1; i < all.size(); ++i) {
        const std::size_t line = i + 1;
        if (all[i].empty()) {
            if (i + 1 == all.size()) break;
            fail(line, "empty line inside the records");
        }
        json row;
        try {
            row = parse(line, all[i]);
        } catch (const JsonSyntaxError&) {
            fail(line, fmt::format("not a JSON object{}; a JSON Lines trace has one record object per line",
                                   i + 1 == all.size() ? " (the file is truncated)" : ""));
        }
        if (!row.is_object()) fail(line, fmt::format("{}; expected a record object", json_excerpt(row, 40)));
        if (row.contains("kvlab_trace")) fail(line, "a second trace header: two traces concatenated?");
        for (const auto& [key, value] : row.items()) {
            if (!column_set_.count(key)) fail(line, fmt::format("unknown column {}", quote(key, 60)));
            check_value_type(line, key, value);
        }
        for (const auto& c : columns_)
            if (!row.contains(c)) fail(line, fmt::format("missing column '{}'", c));
        trace.records.push_back(record_from_row(line, row));
        record_lines_.push_back(line);
    }
}

StepTrace read_step_trace(const fs::path& path) { return TraceParser(path).read(); }

}  // namespace kvlab
