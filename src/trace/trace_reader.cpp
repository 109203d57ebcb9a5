#include "trace/trace_reader.hpp"

#include <charconv>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/text.hpp"
#include "core/json_input.hpp"
#include "core/mapped_file.hpp"
#include "trace/perfetto_trace.hpp"

namespace kvlab {

namespace fs = std::filesystem;

namespace {

using json = nlohmann::json;

class Reader {
public:
    explicit Reader(fs::path path) : path_(std::move(path)) {}

    StepTrace read() {
        // a 1024-step trace of both modes is ~6 MB; a file past 1 GiB is not one kvlab wrote
        text_ = read_input_file(path_, "trace file (CSV, JSON Lines or Perfetto JSON from kvlab simulate --trace)", 1ull << 30);
        const auto first = text_.find_first_not_of(" \t\r\n");
        if (first == std::string::npos)
            fail(1, "empty file; expected a kvlab trace (CSV, JSON Lines or Perfetto JSON from kvlab simulate --trace)");
        StepTrace trace;
        if (text_[first] == '{') {
            const std::string line1 = text_.substr(0, text_.find('\n'));
            if (json::accept(line1) && parse(1, line1).contains("kvlab_trace")) {
                trace.format = TraceFormat::jsonl;
                read_jsonl(trace);
            } else {
                trace.format = TraceFormat::perfetto;
                read_perfetto(trace);
            }
        } else {
            trace.format = TraceFormat::csv;
            read_csv(trace);
        }
        check_sequence(trace);
        return trace;
    }

private:
    [[noreturn]] void fail(std::size_t line, const std::string& what) const {
        throw FormatError(fmt::format("{}: line {}: {}", path_.string(), line, what));
    }

    json parse(std::size_t line, std::string_view text) const {
        return parse_json(text, fmt::format("{}: line {}", path_.string(), line));
    }

    // Text for a JSON document: UTF-8 (nlohmann_json would refuse to print it later), no NUL bytes.
    void check_text(std::size_t line, const std::string& text) const {
        if (text.find('\0') != std::string::npos || to_valid_utf8(text) != text)
            fail(line, fmt::format("{} is not valid UTF-8 text", quote(text, 60)));
    }

    std::vector<std::string> lines() const {
        std::vector<std::string> out;
        std::size_t pos = 0;
        while (pos < text_.size()) {
            auto end = text_.find('\n', pos);
            if (end == std::string::npos) end = text_.size();
            std::string line = text_.substr(pos, end - pos);
            if (!line.empty() && line.back() == '\r') line.pop_back();
            out.push_back(std::move(line));
            pos = end + 1;
        }
        return out;
    }

    void check_version(std::size_t line, const json& version) const {
        if (!version.is_number_integer())
            fail(line, fmt::format("trace format {}; expected {}", json_excerpt(version), trace_format_version));
        // compared as written, not narrowed: 4294967298 is not format 2
        if (version != trace_format_version)
            fail(line, fmt::format("trace format {}; this kvlab reads format {} (re-run kvlab simulate --trace)",
                                   json_excerpt(version), trace_format_version));
    }

    // Every column is required (Perfetto files leave out the slices of ops that did not run: their
    // columns are filled with zeros before the check). No wall_ns column: a --deterministic trace.
    void set_columns(bool deterministic) {
        deterministic_ = deterministic;
        columns_ = trace_columns(deterministic);
        column_set_ = std::set<std::string>(columns_.begin(), columns_.end());
    }

    void check_header_columns(std::size_t line, const std::vector<std::string>& got) const {
        std::set<std::string> seen;
        for (const auto& c : got) {
            if (!column_set_.count(c))
                fail(line, fmt::format("unknown column {}; expected the columns of trace format {} (docs/trace-format.md)",
                                       quote(c, 60), trace_format_version));
            if (!seen.insert(c).second) fail(line, fmt::format("column '{}' appears twice", c));
        }
        for (const auto& c : columns_)
            if (!seen.count(c)) fail(line, fmt::format("missing column '{}'", c));
    }

    json value_from_text(std::size_t line, const std::string& column, const std::string& text) const {
        const FieldType t = column_type(column);
        auto bad = [&]() -> json {
            fail(line, fmt::format("column '{}' is {}; expected {}", column, quote(text, 40), field_type_name(t)));
        };
        switch (t) {
            case FieldType::text: return text;
            case FieldType::boolean:
                if (text == "0" || text == "1") return text == "1";
                return bad();
            case FieldType::real_or_null:
                if (text.empty()) return nullptr;
                [[fallthrough]];
            case FieldType::real: {
                if (text.empty()) return bad();
                char* end = nullptr;
                const double v = std::strtod(text.c_str(), &end);
                if (end != text.c_str() + text.size()) return bad();
                return v;
            }
            case FieldType::integer: {
                std::int64_t v = 0;
                const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
                if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return bad();
                return v;
            }
            case FieldType::count: {
                std::uint64_t v = 0;
                const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
                if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return bad();
                return v;
            }
        }
        return bad();
    }

    void check_value_type(std::size_t line, const std::string& column, const json& v) const {
        const FieldType t = column_type(column);
        bool ok = false;
        switch (t) {
            case FieldType::text: ok = v.is_string(); break;
            case FieldType::boolean: ok = v.is_boolean(); break;
            case FieldType::real_or_null: ok = v.is_null() || v.is_number(); break;
            case FieldType::real: ok = v.is_number(); break;
            case FieldType::integer: ok = v.is_number_integer(); break;
            case FieldType::count: ok = v.is_number_unsigned() || (v.is_number_integer() && v.get<std::int64_t>() >= 0); break;
        }
        if (!ok) fail(line, fmt::format("column '{}' is {}; expected {}", column, json_excerpt(v), field_type_name(t)));
    }

    StepRecord record_from_row(std::size_t line, const json& row) const {
        try {
            return kvlab::record_from_row(row, deterministic_);
        } catch (const std::invalid_argument& e) {
            fail(line, e.what());
        }
    }

    RunSummary run_from_json(std::size_t line, const json& j) const {
        if (!j.is_object()) fail(line, "the run summary is not a JSON object");
        auto need = [&](const char* key, bool (json::*is)() const noexcept, const char* what) -> const json& {
            if (!j.contains(key) || !(j.at(key).*is)())
                fail(line, fmt::format("run summary: '{}' is {}; expected {}", key, j.contains(key) ? json_excerpt(j.at(key)) : "missing", what));
            return j.at(key);
        };
        RunSummary run;
        run.display_name = need("display_name", &json::is_string, "a string").get<std::string>();
        const auto mode = need("mode", &json::is_string, "a string").get<std::string>();
        if (mode == "both") run.mode = SimMode::both;
        else if (mode == "cached") run.mode = SimMode::cached;
        else if (mode == "uncached") run.mode = SimMode::uncached;
        else fail(line, fmt::format("run summary: mode {}; expected cached, uncached or both", quote(mode, 20)));
        run.n_prompt = need("prompt_tokens", &json::is_number_integer, "an integer").get<std::int64_t>();
        run.n_steps = need("steps_requested", &json::is_number_integer, "an integer").get<std::int64_t>();
        run.n_steps_done = need("steps_done", &json::is_number_integer, "an integer").get<std::int64_t>();
        run.interrupted = need("interrupted", &json::is_boolean, "a boolean").get<bool>();
        run.counted = need("counted", &json::is_boolean, "a boolean").get<bool>();
        run.kv_cache_bytes = need("kv_cache_bytes", &json::is_number_unsigned, "a non-negative integer").get<std::uint64_t>();
        run.max_abs_dlogit = need("max_abs_dlogit", &json::is_number, "a number").get<double>();
        run.n_argmax_flips = need("argmax_flips", &json::is_number_integer, "an integer").get<std::int64_t>();
        if (!j.contains("first_divergent_step") ||
            !(j.at("first_divergent_step").is_null() || j.at("first_divergent_step").is_number_integer()))
            fail(line, "run summary: 'first_divergent_step' is missing; expected an integer or null");
        if (!j.at("first_divergent_step").is_null()) run.first_divergent_step = j.at("first_divergent_step").get<std::int64_t>();
        run.divergent_dlogit = need("divergent_dlogit", &json::is_number, "a number").get<double>();
        run.divergent_tolerance = need("divergent_tolerance", &json::is_number, "a number").get<double>();
        run.has_wall_time = !deterministic_;
        return run;
    }

    // CSV: "# " header lines (format, units, run.*, inputs), the column line, one row per record.
    void read_csv(StepTrace& trace) {
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
            std::vector<std::string> cells;
            std::size_t pos = 0;
            while (true) {
                const auto comma = all[i].find(',', pos);
                cells.push_back(all[i].substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
                if (comma == std::string::npos) break;
                pos = comma + 1;
            }
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
    void read_jsonl(StepTrace& trace) {
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

    std::size_t line_of_offset(std::size_t offset) const {
        std::size_t line = 1;
        for (std::size_t i = 0; i < offset && i < text_.size(); ++i)
            if (text_[i] == '\n') ++line;
        return line;
    }

    // Perfetto: the writer puts event i of traceEvents on line i + 2; errors name that line.
    void read_perfetto(StepTrace& trace) {
        json doc;
        try {
            doc = parse_json(text_, path_.string());
        } catch (const JsonSyntaxError& e) {
            fail(line_of_offset(e.byte),
                 e.at_end ? "the JSON ends early: the file is truncated"
                          : "not valid JSON; expected a kvlab trace (CSV, JSON Lines or Perfetto JSON)");
        }
        if (!doc.is_object() || !doc.contains("traceEvents") || !doc.at("traceEvents").is_array())
            fail(1, "a JSON document without a 'traceEvents' array; expected Perfetto JSON from kvlab simulate --trace FILE.json");
        const std::size_t other_line = doc.at("traceEvents").size() + 4;
        if (!doc.contains("otherData") || !doc.at("otherData").is_object())
            fail(other_line, "no 'otherData' object: not written by kvlab simulate");
        const json& other = doc.at("otherData");
        if (!other.contains("kvlab_trace")) fail(other_line, "otherData has no 'kvlab_trace' version: not written by kvlab simulate");
        check_version(other_line, other.at("kvlab_trace"));
        if (!other.contains("time") || !other.at("time").is_string() ||
            (other.at("time") != "measured" && other.at("time") != "modelled"))
            fail(other_line, "otherData 'time' is missing; expected \"measured\" or \"modelled\"");
        set_columns(other.at("time") == "modelled");
        if (!other.contains("inputs") || !other.at("inputs").is_object()) fail(other_line, "otherData has no 'inputs' object");
        trace.inputs = other.at("inputs");
        if (!other.contains("run")) fail(other_line, "otherData has no 'run' object (the run summary)");
        trace.run = run_from_json(other_line, other.at("run"));

        const auto op_fields = trace_op_fields(deterministic_);
        std::vector<std::pair<std::size_t, json>> rows;  // (line, row)
        std::map<int, std::size_t> open_step;            // pid -> index in rows of its latest step
        const json& events = doc.at("traceEvents");
        for (std::size_t e = 0; e < events.size(); ++e) {
            const std::size_t line = e + 2;
            const json& ev = events[e];
            if (!ev.is_object() || !ev.contains("ph") || !ev.at("ph").is_string())
                fail(line, "a trace event without a 'ph' phase");
            const std::string ph = ev.at("ph").get<std::string>();
            if (ph == "M") continue;
            if (!ev.contains("pid") || !ev.at("pid").is_number_integer()) fail(line, "an event without an integer 'pid'");
            const json& pid_value = ev.at("pid");
            if (pid_value != perfetto_pid(StepMode::cached) && pid_value != perfetto_pid(StepMode::uncached))
                fail(line, fmt::format("pid {}; expected 1 (cached) or 2 (uncached)", json_excerpt(pid_value)));
            const int pid = pid_value.get<int>();
            if (!ev.contains("args") || !ev.at("args").is_object()) fail(line, "an event without an 'args' object");
            const json& args = ev.at("args");
            if (ph == "C") {
                for (const auto& [key, value] : args.items())
                    if (!value.is_number())
                        fail(line, fmt::format("counter value {} is {}; expected a number", quote(key, 40), json_excerpt(value)));
                continue;
            }
            if (ph != "X") fail(line, fmt::format("phase {}; expected X, C or M", quote(ph, 20)));
            const std::string cat = ev.contains("cat") && ev.at("cat").is_string() ? ev.at("cat").get<std::string>() : "";
            if (cat == "step") {
                json row = json::object();
                for (const auto& c : columns_) {
                    if (c.find('.') != std::string::npos) {
                        row[c] = 0;  // ops that did not run have no slice
                        continue;
                    }
                    if (!args.contains(c)) fail(line, fmt::format("step slice without '{}' in its args", c));
                    check_value_type(line, c, args.at(c));
                    row[c] = args.at(c);
                }
                const std::string expected_mode(step_mode_name(pid == 1 ? StepMode::cached : StepMode::uncached));
                if (row.at("mode") != expected_mode)
                    fail(line, fmt::format("mode {} in pid {}; expected '{}'", quote(row.at("mode").get<std::string>(), 20), pid, expected_mode));
                open_step[pid] = rows.size();
                rows.emplace_back(line, std::move(row));
            } else if (cat == "op") {
                if (!open_step.count(pid)) fail(line, "an op slice before any step slice of its process");
                json& row = rows[open_step[pid]].second;
                const std::string name = ev.contains("name") && ev.at("name").is_string() ? ev.at("name").get<std::string>() : "";
                bool known = false;
                for (int i = 0; i < n_ops; ++i) known = known || op_name(static_cast<Op>(i)) == name;
                if (!known) fail(line, fmt::format("op slice {}; expected an op name such as q_proj", quote(name, 40)));
                if (!args.contains("step") || args.at("step") != row.at("step"))
                    fail(line, fmt::format("op slice '{}' of step {} inside step {}", name,
                                           args.contains("step") ? json_excerpt(args.at("step")) : "?", json_excerpt(row.at("step"))));
                for (const auto& f : op_fields) {
                    const std::string c = name + "." + f;
                    if (!args.contains(f)) fail(line, fmt::format("op slice '{}' without '{}' in its args", name, f));
                    check_value_type(line, c, args.at(f));
                    row[c] = args.at(f);
                }
            } else {
                fail(line, fmt::format("slice category {}; expected step or op", quote(cat, 40)));
            }
        }
        for (const auto& [line, row] : rows) {
            trace.records.push_back(record_from_row(line, row));
            record_lines_.push_back(line);
        }
    }

    // Each mode's steps 0, 1, 2, ... in order, as many as the run summary says, modes as it says.
    void check_sequence(const StepTrace& trace) const {
        const std::size_t end_line = record_lines_.empty() ? 1 : record_lines_.back();
        if (trace.records.empty()) fail(end_line, "no records; expected at least one step");
        std::map<StepMode, std::int64_t> next;
        for (std::size_t i = 0; i < trace.records.size(); ++i) {
            const StepRecord& r = trace.records[i];
            const bool allowed = trace.run.mode == SimMode::both ||
                                 (trace.run.mode == SimMode::cached) == (r.mode == StepMode::cached);
            if (!allowed)
                fail(record_lines_[i], fmt::format("a {} record in a --mode {} trace", step_mode_name(r.mode),
                                                   trace.run.mode == SimMode::cached ? "cached" : "uncached"));
            if (r.step != next[r.mode])
                fail(record_lines_[i], fmt::format("{} step {}; expected step {} (steps in order, each once)",
                                                   step_mode_name(r.mode), r.step, next[r.mode]));
            ++next[r.mode];
        }
        for (const StepMode m : {StepMode::cached, StepMode::uncached}) {
            const bool expected = trace.run.mode == SimMode::both || (trace.run.mode == SimMode::cached) == (m == StepMode::cached);
            if (expected && next[m] != trace.run.n_steps_done)
                fail(end_line, fmt::format("{} {} steps; the run summary says {} were done: the file is truncated",
                                           next[m], step_mode_name(m), trace.run.n_steps_done));
        }
    }

    fs::path path_;
    std::string text_;
    bool deterministic_ = false;
    std::vector<std::string> columns_;
    std::set<std::string> column_set_;
    std::vector<std::size_t> record_lines_;
};

}  // namespace

StepTrace read_step_trace(const fs::path& path) { return Reader(path).read(); }

}  // namespace kvlab
