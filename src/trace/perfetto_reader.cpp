// Reading a Perfetto (Chrome trace-event JSON) trace kvlab wrote: step slices carry the step columns,
// op slices the per-op ones (perfetto_trace.cpp writes them).
#include "trace/perfetto_trace.hpp"

#include <cmath>
#include <set>

#include "trace/trace_parser.hpp"

namespace kvlab {

std::size_t TraceParser::line_of_offset(std::size_t offset) const {
    std::size_t line = 1;
    for (std::size_t i = 0; i < offset && i < text_.size(); ++i)
        if (text_[i] == '\n') ++line;
    return line;
}

namespace {

// A step slice whose op slices are still being read.
struct OpenStep {
    std::size_t row;                 // index in rows
    double ts_us, end_us;            // the step slice on the timeline
    double time_us;                  // its args' time: wall_ns (modelled_ns) / 1000
    std::set<std::string> ops_seen;  // each op has one slice per step
    double ops_us = 0;               // its op slices' durations, summed
};

// What the events build up: a row per step slice, and each process's latest step.
struct PerfettoRows {
    const TraceParser& parser;
    std::vector<std::string> op_fields;
    std::vector<std::pair<std::size_t, json>> rows;  // (line, row)
    std::map<int, OpenStep> open_step;               // pid -> its latest step
};

// The whole file as JSON with a 'traceEvents' array; a syntax error names its line.
json parse_perfetto_document(const TraceParser& p) {
    json doc;
    try {
        doc = parse_json(p.text_, p.path_.string(), Keys::unique);
    } catch (const JsonSyntaxError& e) {
        p.fail(p.line_of_offset(e.byte),
               e.at_end ? "the JSON ends early: the file is truncated"
                        : "not valid JSON; expected a kvlab trace (CSV, JSON Lines or Perfetto JSON)");
    }
    if (!doc.is_object() || !doc.contains("traceEvents") || !doc.at("traceEvents").is_array())
        p.fail(1, "a JSON document without a 'traceEvents' array; expected Perfetto JSON from kvlab simulate --trace FILE.json");
    return doc;
}

// otherData, after the events: the version, measured or modelled time, the inputs and the run summary.
void read_other_data(TraceParser& p, const json& doc, StepTrace& trace) {
    const std::size_t other_line = doc.at("traceEvents").size() + 4;
    if (!doc.contains("otherData") || !doc.at("otherData").is_object())
        p.fail(other_line, "no 'otherData' object: not written by kvlab simulate");
    const json& other = doc.at("otherData");
    if (!other.contains("kvlab_trace")) p.fail(other_line, "otherData has no 'kvlab_trace' version: not written by kvlab simulate");
    p.check_version(other_line, other.at("kvlab_trace"));
    if (!other.contains("time") || !other.at("time").is_string() ||
        (other.at("time") != "measured" && other.at("time") != "modelled"))
        p.fail(other_line, "otherData 'time' is missing; expected \"measured\" or \"modelled\"");
    p.set_columns(other.at("time") == "modelled");
    if (!other.contains("inputs") || !other.at("inputs").is_object()) p.fail(other_line, "otherData has no 'inputs' object");
    trace.inputs = other.at("inputs");
    p.check_inputs(other_line, trace.inputs);
    if (!other.contains("run")) p.fail(other_line, "otherData has no 'run' object (the run summary)");
    trace.run = p.run_from_json(other_line, other.at("run"));
}

// A slice's place on the timeline, which the Perfetto UI draws: numbers, the duration not negative.
std::pair<double, double> slice_span(const TraceParser& p, std::size_t line, const json& ev) {
    for (const char* key : {"ts", "dur"})
        if (!ev.contains(key) || !ev.at(key).is_number())
            p.fail(line, fmt::format("a slice without a numeric '{}'", key));
    const double ts = ev.at("ts").get<double>(), dur = ev.at("dur").get<double>();
    if (!std::isfinite(ts) || !std::isfinite(dur) || dur < 0)
        p.fail(line, fmt::format("slice ts {} dur {}; expected finite microseconds, dur 0 or more", json_excerpt(ev.at("ts")),
                                 json_excerpt(ev.at("dur"))));
    return std::pair{ts, ts + dur};
}

// The writer converts whole nanoseconds to microseconds; compare to within a nanosecond.
bool within_a_ns(double a_us, double b_us) { return std::abs(a_us - b_us) <= 1e-3 + 1e-12 * std::abs(b_us); }

// A step lasts its time or, measured, its ops' if they sum to more (perfetto_trace.cpp); checked
// once its ops are read, when the next step of its process starts or the events end.
void check_step_span(const PerfettoRows& r, const OpenStep& step) {
    const double expected = r.parser.deterministic_ ? step.time_us : std::max(step.time_us, step.ops_us);
    if (std::abs(step.end_us - step.ts_us - expected) > 1e-3 * (n_ops + 1) + 1e-12 * expected)
        r.parser.fail(r.rows[step.row].first, fmt::format("step slice lasts {:.3f} us on the timeline; its args and ops give {:.3f} us",
                                                          step.end_us - step.ts_us, expected));
}

// A counter event: numbers only; the three counter tracks repeat a step's columns at its start.
void read_counter(const PerfettoRows& r, std::size_t line, int pid, const json& ev, const json& args) {
    const TraceParser& p = r.parser;
    for (const auto& [key, value] : args.items())
        if (!value.is_number())
            p.fail(line, fmt::format("counter value {} is {}; expected a number", quote(key, 40), json_excerpt(value)));
    const std::string name = ev.contains("name") && ev.at("name").is_string() ? ev.at("name").get<std::string>() : "";
    const std::pair<const char*, const char*> tracks[] = {
        {"FLOPs per step", "flops"}, {"bytes per step", "bytes_total"}, {"KV cache resident", "kv_bytes_resident"}};
    for (const auto& [track, column] : tracks) {
        if (name != track) continue;
        if (!r.open_step.count(pid)) p.fail(line, fmt::format("counter '{}' before any step slice of its process", name));
        const json& row = r.rows[r.open_step.at(pid).row].second;
        const char* key = std::string_view(column) == "flops" ? "flops" : "bytes";
        if (!args.contains(key) || args.at(key) != row.at(column))
            p.fail(line, fmt::format("counter '{}' is {}; its step's {} is {}", name, args.contains(key) ? json_excerpt(args.at(key)) : "missing",
                                     column, json_excerpt(row.at(column))));
    }
}

// A step slice: its args give the step columns (ops' columns 0 until their slices come); it opens
// its process's next step, once the previous one's span is checked.
void read_step_slice(PerfettoRows& r, std::size_t line, int pid, const json& ev, const json& args) {
    const TraceParser& p = r.parser;
    json row = json::object();
    for (const auto& c : p.columns_) {
        if (c.find('.') != std::string::npos) {
            row[c] = 0;  // ops that did not run have no slice
            continue;
        }
        if (!args.contains(c)) p.fail(line, fmt::format("step slice without '{}' in its args", c));
        p.check_value_type(line, c, args.at(c));
        row[c] = args.at(c);
    }
    const std::string expected_mode(step_mode_name(pid == 1 ? StepMode::cached : StepMode::uncached));
    if (row.at("mode") != expected_mode)
        p.fail(line, fmt::format("mode {} in pid {}; expected '{}'", quote(row.at("mode").get<std::string>(), 20), pid, expected_mode));
    const auto [ts, end] = slice_span(p, line, ev);
    const char* time_key = p.deterministic_ ? "modelled_ns" : "wall_ns";
    if (!args.contains(time_key) || !args.at(time_key).is_number())
        p.fail(line, fmt::format("step slice without a numeric '{}' in its args", time_key));
    if (r.open_step.count(pid)) check_step_span(r, r.open_step[pid]);
    r.open_step[pid] = OpenStep{r.rows.size(), ts, end, args.at(time_key).get<double>() / 1000.0, {}};
    r.rows.emplace_back(line, std::move(row));
}

// An op slice: a known op, once in the step of its process it sits in; its args fill that step's op
// columns, and what the UI draws must be what the args say: the op's time, inside its step.
void read_op_slice(PerfettoRows& r, std::size_t line, int pid, const json& ev, const json& args) {
    const TraceParser& p = r.parser;
    if (!r.open_step.count(pid)) p.fail(line, "an op slice before any step slice of its process");
    OpenStep& step = r.open_step[pid];
    json& row = r.rows[step.row].second;
    const std::string name = ev.contains("name") && ev.at("name").is_string() ? ev.at("name").get<std::string>() : "";
    bool known = false;
    for (int i = 0; i < n_ops; ++i) known = known || op_name(static_cast<Op>(i)) == name;
    if (!known) p.fail(line, fmt::format("op slice {}; expected an op name such as q_proj", quote(name, 40)));
    if (!args.contains("step") || args.at("step") != row.at("step"))
        p.fail(line, fmt::format("op slice '{}' of step {} inside step {}", name,
                                 args.contains("step") ? json_excerpt(args.at("step")) : "?", json_excerpt(row.at("step"))));
    if (!step.ops_seen.insert(name).second)
        p.fail(line, fmt::format("a second '{}' slice in step {}; each op has one", name, json_excerpt(row.at("step"))));
    for (const auto& f : r.op_fields) {
        const std::string c = name + "." + f;
        if (!args.contains(f)) p.fail(line, fmt::format("op slice '{}' without '{}' in its args", name, f));
        p.check_value_type(line, c, args.at(f));
        row[c] = args.at(f);
    }
    const auto [ts, end] = slice_span(p, line, ev);
    const char* time_key = p.deterministic_ ? "modelled_ns" : "wall_ns";
    if (!args.contains(time_key) || !args.at(time_key).is_number())
        p.fail(line, fmt::format("op slice '{}' without a numeric '{}' in its args", name, time_key));
    const double op_us = args.at(time_key).get<double>() / 1000.0;
    if (!within_a_ns(end - ts, op_us))
        p.fail(line, fmt::format("op slice '{}' lasts {} us on the timeline and {} {} in its args", name,
                                 json_excerpt(ev.at("dur")), time_key, json_excerpt(args.at(time_key))));
    if (ts < step.ts_us && !within_a_ns(ts, step.ts_us))
        p.fail(line, fmt::format("op slice '{}' starts at {} us, before its step ({} us)", name, json_excerpt(ev.at("ts")),
                                 step.ts_us));
    if (end > step.end_us && !within_a_ns(end, step.end_us))
        p.fail(line, fmt::format("op slice '{}' ends at {} us, after its step ({} us)", name, end, step.end_us));
    step.ops_us += end - ts;
}

// One trace event: metadata is skipped; a counter, a step slice or an op slice of pid 1 or 2 is read.
void read_event(PerfettoRows& r, std::size_t line, const json& ev) {
    const TraceParser& p = r.parser;
    if (!ev.is_object() || !ev.contains("ph") || !ev.at("ph").is_string())
        p.fail(line, "a trace event without a 'ph' phase");
    const std::string ph = ev.at("ph").get<std::string>();
    if (ph == "M") return;
    if (!ev.contains("pid") || !ev.at("pid").is_number_integer()) p.fail(line, "an event without an integer 'pid'");
    const json& pid_value = ev.at("pid");
    if (pid_value != perfetto_pid(StepMode::cached) && pid_value != perfetto_pid(StepMode::uncached))
        p.fail(line, fmt::format("pid {}; expected 1 (cached) or 2 (uncached)", json_excerpt(pid_value)));
    const int pid = pid_value.get<int>();
    if (!ev.contains("args") || !ev.at("args").is_object()) p.fail(line, "an event without an 'args' object");
    const json& args = ev.at("args");
    if (ph == "C") {
        read_counter(r, line, pid, ev, args);
        return;
    }
    if (ph != "X") p.fail(line, fmt::format("phase {}; expected X, C or M", quote(ph, 20)));
    const std::string cat = ev.contains("cat") && ev.at("cat").is_string() ? ev.at("cat").get<std::string>() : "";
    if (cat == "step") read_step_slice(r, line, pid, ev, args);
    else if (cat == "op") read_op_slice(r, line, pid, ev, args);
    else p.fail(line, fmt::format("slice category {}; expected step or op", quote(cat, 40)));
}

}  // namespace

// Perfetto: the writer puts event i of traceEvents on line i + 2; errors name that line.
void TraceParser::read_perfetto(StepTrace& trace) {
    const json doc = parse_perfetto_document(*this);
    read_other_data(*this, doc, trace);
    PerfettoRows r{*this, trace_op_fields(deterministic_), {}, {}};
    const json& events = doc.at("traceEvents");
    for (std::size_t e = 0; e < events.size(); ++e) read_event(r, e + 2, events[e]);
    for (const auto& [pid, step] : r.open_step) check_step_span(r, step);
    for (const auto& [line, row] : r.rows) {
        trace.records.push_back(record_from_row(line, row));
        record_lines_.push_back(line);
    }
}

}  // namespace kvlab
