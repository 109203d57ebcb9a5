#include "trace/serve_trace.hpp"

#include <algorithm>
#include <charconv>
#include <map>
#include <ostream>
#include <sstream>

#include <fmt/format.h>

#include <cmath>
#include <fstream>

#include "core/atomic_write.hpp"
#include "kvlab/core/mapped_file.hpp"
#include "report/gnuplot.hpp"
#include "report/serve_report.hpp"
#include "kvlab/core/error.hpp"
#include "core/json_input.hpp"
#include "kvlab/core/text.hpp"
#include "trace/perfetto_trace.hpp"
#include "trace/step_trace.hpp"
#include "trace/trace_schema.hpp"

namespace kvlab {

namespace {

using json = nlohmann::json;

// A step column of a serve trace: an integer member of ServeStep.
struct ServeField {
    const char* name;
    std::int64_t ServeStep::*member;
    bool measured;      // absent from --deterministic traces
    bool swap = false;  // present in the traces of --preempt swap runs only
};

constexpr ServeField serve_fields[] = {
    {"step", &ServeStep::step, false},
    {"seqs", &ServeStep::n_seqs, false},
    {"tokens", &ServeStep::n_tokens, false},
    {"decode_tokens", &ServeStep::n_decode, false},
    {"generated", &ServeStep::n_generated, false},
    {"stopped", &ServeStep::n_stopped, false},
    {"running", &ServeStep::n_running, false},
    {"waiting", &ServeStep::n_waiting, false},
    {"preempted", &ServeStep::n_preempted, false},
    {"rows_in_use", &ServeStep::rows_in_use, false},
    {"rows_tokens", &ServeStep::rows_tokens, false},
    {"rows_cached", &ServeStep::rows_cached, false},
    {"largest_free", &ServeStep::largest_free, false},
    {"out_blocks", &ServeStep::out_blocks, false},
    {"out_blocks_unshared", &ServeStep::out_blocks_unshared, false},
    {"cow_copies", &ServeStep::cow_copies, false},
    {"start_ns", &ServeStep::start_ns, true},
    {"forward_ns", &ServeStep::forward_ns, true},
    {"schedule_ns", &ServeStep::schedule_ns, true},
    {"swapped_out", &ServeStep::n_swapped_out, false, true},
    {"swapped_in", &ServeStep::n_swapped_in, false, true},
    {"swap_out_bytes", &ServeStep::swap_out_bytes, false, true},
    {"swap_in_bytes", &ServeStep::swap_in_bytes, false, true},
    {"swap_ns", &ServeStep::swap_ns, true, true},
};

// Whether the traces of these inputs carry the swap columns: a --preempt swap run's.
bool swap_inputs(const json& inputs) { return inputs.contains("preempt") && inputs.at("preempt") == "swap"; }

constexpr const char* magic = "# kvlab serve trace, format ";

json record_json(const ServeStep& s, KvLayout layout, std::int64_t pool_rows, bool deterministic, bool swap) {
    json j = {{"layout", std::string(choice_name(kv_layout_choices, layout))}, {"pool_rows", pool_rows}};
    for (const ServeField& f : serve_fields)
        if (!(deterministic && f.measured) && (swap || !f.swap)) j[f.name] = s.*f.member;
    for (int i = 0; i < n_ops; ++i) {
        const Op op = static_cast<Op>(i);
        for (const OpField& f : op_fields()) {
            if (deterministic && f.measured) continue;
            const std::string key = fmt::format("{}.{}", op_name(op), f.name);
            if (f.member) j[key] = s.cost.at(op).*f.member;
            else j[key] = s.cost.wall_ns_of(op);
        }
    }
    return j;
}

// A step's pool map as a JSONL record's "pool_map": the cell size, each cell's owner and filled rows, and
// the shared cells' indices (docs/trace-format.md, "block map").
json pool_map_json(const std::vector<KvPoolCell>& map, std::int64_t cell_rows) {
    json owner = json::array(), fill = json::array(), shared = json::array();
    for (std::size_t c = 0; c < map.size(); ++c) {
        owner.push_back(map[c].owner);
        fill.push_back(map[c].fill);
        if (map[c].shared) shared.push_back(c);
    }
    return {{"cell_rows", cell_rows}, {"owner", std::move(owner)}, {"fill", std::move(fill)}, {"shared", std::move(shared)}};
}

std::string csv_cell(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// Microseconds, the Perfetto timeline's unit, from nanoseconds.
double us(std::int64_t ns) { return static_cast<double>(ns) / 1000.0; }

// Each step's start and length on a layout's timeline, and where its last step ends.
struct StepTimes {
    std::map<std::int64_t, std::pair<std::int64_t, std::int64_t>> when;  // step -> (start, duration)
    std::int64_t end = 0;
    std::int64_t start_of(std::int64_t step) const {  // a step that did not run (idle): the next one that did
        const auto it = when.lower_bound(step);
        return it == when.end() ? end : it->second.first;
    }
    std::int64_t end_of(std::int64_t step) const {
        const auto& [s0, d] = when.at(step);
        return s0 + d;
    }
};

// A layout's process and its "steps" track: a slice per step and the counters, steps back to back from 0.
StepTimes add_step_events(std::vector<json>& ev, int pid, KvLayout kv_layout, const ServeResult& r, bool deterministic) {
    const std::string layout(choice_name(kv_layout_choices, kv_layout));
    ev.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 0}, {"args", {{"name", fmt::format("{} KV pool", layout)}}}});
    ev.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 0}, {"args", {{"name", "steps"}}}});
    // each step's start and length on this timeline: measured, or modelled from its counted cost
    StepTimes times;
    std::int64_t t = 0;
    for (const ServeStep& s : r.steps) {
        std::int64_t dur = s.forward_ns + s.schedule_ns;
        if (deterministic) {
            dur = 0;
            for (const OpCost& c : s.cost.ops) dur += modelled_op_ns(c);
        }
        times.when[s.step] = {t, dur};
        ev.push_back({{"name", fmt::format("step {}", s.step)}, {"cat", "step"}, {"ph", "X"}, {"ts", us(t)}, {"dur", us(dur)}, {"pid", pid},
                      {"tid", 0}, {"args", record_json(s, kv_layout, r.pool_rows, deterministic, r.host_bytes_per_s > 0)}});
        ev.push_back({{"name", "KV rows"}, {"ph", "C"}, {"ts", us(t)}, {"pid", pid}, {"tid", 0},
                      {"args", {{"holding tokens", s.rows_tokens}, {"allocated, no token", s.rows_in_use - s.rows_tokens},
                                {"free", r.pool_rows - s.rows_in_use}}}});
        ev.push_back({{"name", "batch"}, {"ph", "C"}, {"ts", us(t)}, {"pid", pid}, {"tid", 0},
                      {"args", {{"sequences", s.n_seqs}, {"tokens", s.n_tokens}}}});
        t += dur;
    }
    times.end = t;
    return times;
}

// Request i's track: its queue, prefill chunks, decode stretches, preemptions and finish.
void add_request_events(std::vector<json>& ev, int pid, std::size_t i, const ServeRequestResult& q, const StepTimes& times) {
    const int tid = static_cast<int>(i) + 1;
    ev.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", tid},
                  {"args", {{"name", fmt::format("request {} ({}+{})", i, q.prompt_len, q.max_tokens)}}}});
    auto slice = [&](const std::string& name, std::int64_t t0, std::int64_t t1, json args) {
        ev.push_back({{"name", name}, {"cat", "request"}, {"ph", "X"}, {"ts", us(t0)}, {"dur", us(std::max<std::int64_t>(0, t1 - t0))},
                      {"pid", pid}, {"tid", tid}, {"args", std::move(args)}});
    };
    std::int64_t waiting_since = times.start_of(q.arrival_step);  // queued (first, or after a preemption)
    for (std::size_t e = 0; e < q.events.size(); ++e) {
        const ServeEvent& x = q.events[e];
        if (x.kind == ServeEventKind::preempted || x.kind == ServeEventKind::swapped_out) {
            if (x.kind == ServeEventKind::preempted)
                slice("preempted", times.start_of(x.step), times.start_of(x.step), {{"step", x.step}, {"kv_discarded_tokens", x.n_tokens}});
            else
                slice("swapped out", times.start_of(x.step), times.start_of(x.step), {{"step", x.step}, {"kv_swapped_tokens", x.n_tokens}});
            waiting_since = times.start_of(x.step);
            continue;
        }
        if (waiting_since >= 0) {
            if (times.start_of(x.step) > waiting_since) slice("queued", waiting_since, times.start_of(x.step), json::object());
            waiting_since = -1;
        }
        if (x.kind == ServeEventKind::prefill) {
            slice("prefill", times.start_of(x.step), times.end_of(x.step), {{"step", x.step}, {"tokens", x.n_tokens}});
            continue;
        }
        // a stretch of consecutive decode events is one slice
        std::size_t last = e;
        while (last + 1 < q.events.size() && q.events[last + 1].kind == ServeEventKind::decode) ++last;
        slice("decode", times.start_of(x.step), times.end_of(q.events[last].step),
              {{"first_step", x.step}, {"last_step", q.events[last].step}, {"tokens", static_cast<std::int64_t>(last - e + 1)}});
        e = last;
    }
    if (q.finish_step >= 0)
        ev.push_back({{"name", "finished"}, {"ph", "i"}, {"s", "t"}, {"ts", us(times.end_of(q.finish_step))}, {"pid", pid}, {"tid", tid},
                      {"args", {{"step", q.finish_step}, {"generated", q.generated.size()}}}});
}

// The timeline's otherData: the format, the inputs, and where its times come from.
json perfetto_other_data(const json& inputs, bool deterministic) {
    json other = {{"kvlab_serve_trace", serve_trace_format_version},
                  {"generator", "kvlab serve"},
                  {"time", deterministic ? "modelled" : "measured"},
                  {"inputs", inputs}};
    other["time_note"] = deterministic ? fmt::format("--deterministic: each step lasts the sum over its ops of max(flops / {:g}, bytes / {:g}) s "
                                                     "(a nominal machine); each layout's steps back to back from t = 0",
                                                     model_flop_per_s, model_bytes_per_s)
                                       : "measured: each step's forward and bookkeeping time; each layout's steps back to back from t = 0";
    return other;
}

// The Perfetto timeline: per layout a process; a "steps" track with a slice per step and the counters,
// and a track per request with its queue, prefill chunks, decode stretch, preemptions and finish.
void write_perfetto(std::ostream& out, const std::vector<ServeOptions>& runs, const std::vector<ServeResult>& results, const json& inputs,
                    bool deterministic) {
    std::vector<json> ev;
    for (std::size_t k = 0; k < results.size(); ++k) {
        const ServeResult& r = results[k];
        const int pid = static_cast<int>(k) + 1;
        const StepTimes times = add_step_events(ev, pid, runs[k].pool.layout, r, deterministic);
        for (std::size_t i = 0; i < r.requests.size(); ++i) add_request_events(ev, pid, i, r.requests[i], times);
    }
    const json other = perfetto_other_data(inputs, deterministic);
    out << "{\"traceEvents\":[\n";
    for (std::size_t i = 0; i < ev.size(); ++i) out << json_dump(ev[i]) << (i + 1 < ev.size() ? ",\n" : "\n");
    out << "],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":" << json_dump(other) << "}\n";
}

}  // namespace

std::vector<std::string> serve_trace_columns(bool deterministic, bool swap) {
    std::vector<std::string> cols = {"layout", "pool_rows"};
    for (const ServeField& f : serve_fields)
        if (!(deterministic && f.measured) && (swap || !f.swap)) cols.emplace_back(f.name);
    for (int i = 0; i < n_ops; ++i)
        for (const OpField& f : op_fields())
            if (!(deterministic && f.measured)) cols.push_back(fmt::format("{}.{}", op_name(static_cast<Op>(i)), f.name));
    return cols;
}

void write_serve_trace(const std::filesystem::path& path, const std::vector<ServeOptions>& runs, const std::vector<ServeResult>& results,
                       const json& inputs, bool deterministic) {
    const TraceFormat format = trace_format_for(path);
    const bool swap = swap_inputs(inputs);
    const auto columns = serve_trace_columns(deterministic, swap);
    write_atomically(path, "--trace", [&](std::ostream& out) {
        if (format == TraceFormat::perfetto) {
            write_perfetto(out, runs, results, inputs, deterministic);
            return;
        }
        if (format == TraceFormat::csv) {
            out << magic << serve_trace_format_version << " (docs/trace-format.md)\n";
            for (const auto& [key, value] : inputs.items()) out << "# " << key << "=" << json_dump(value) << "\n";
            for (std::size_t c = 0; c < columns.size(); ++c) out << (c ? "," : "") << columns[c];
            out << "\n";
        } else {
            out << json_dump(json{{"kvlab_serve_trace", serve_trace_format_version}, {"columns", columns}, {"inputs", inputs}}) << "\n";
        }
        for (std::size_t k = 0; k < results.size(); ++k)
            for (const ServeStep& s : results[k].steps) {
                json j = record_json(s, runs[k].pool.layout, results[k].pool_rows, deterministic, swap);
                if (format == TraceFormat::jsonl) {
                    if (!s.pool_map.empty())
                        j["pool_map"] = pool_map_json(s.pool_map, runs[k].pool.layout == KvLayout::paged ? runs[k].pool.block_size : kv_map_group_rows);
                    out << json_dump(j) << "\n";
                    continue;
                }
                for (std::size_t c = 0; c < columns.size(); ++c) out << (c ? "," : "") << csv_cell(j.at(columns[c]));
                out << "\n";
            }
    });
}

namespace {

// Reading a serve trace: its lines, its columns, the next line to read, and what is read so far.
struct ServeTraceReader {
    std::string_view text;
    const std::string& where;
    std::vector<std::string> lines;
    bool csv = false;
    std::vector<std::string> columns;
    std::size_t i = 1;  // the next line, from 0
    ServeTrace t;
    struct {
        std::int64_t ns = 0, counts = 0;  // times; every count field together (a bound on each one's sum)
        std::uint64_t bytes = 0;          // every op count together, likewise
    } sums;

    ServeTraceReader(std::string_view text_in, const std::string& where_in) : text(text_in), where(where_in) {}

    FormatError fail(std::size_t line, const std::string& what) const { return FormatError(fmt::format("{}:{}: {}", where, line, what)); }

    // The text's lines, each without its line end.
    void split_lines() {
        std::istringstream in{std::string(text)};
        for (std::string l; std::getline(in, l);) {
            if (!l.empty() && l.back() == '\r') l.pop_back();  // a file saved with CRLF line ends reads as it was written
            lines.push_back(l);
        }
    }

    // The header's format version: the one this kvlab reads.
    void check_version(const json& v) const {
        if (!v.is_number_integer() || v.get<std::int64_t>() != serve_trace_format_version)
            throw fail(1, fmt::format("serve trace format {}; this kvlab reads format {}", json_excerpt(v), serve_trace_format_version));
    }

    // A CSV header: the magic line with the version, '# key=value' inputs, then the column line.
    void read_csv_header() {
        const std::string v = lines[0].substr(std::string_view(magic).size(), lines[0].find(' ', std::string_view(magic).size()) - std::string_view(magic).size());
        check_version(json::accept(v) ? json::parse(v) : json(v));
        for (; i < lines.size() && !lines[i].empty() && lines[i][0] == '#'; ++i) {
            const auto eq = lines[i].find('=');
            if (lines[i].rfind("# ", 0) != 0 || eq == std::string::npos) throw fail(i + 1, fmt::format("header line {}; expected '# key=value'", quote(lines[i], 60)));
            const std::string value = lines[i].substr(eq + 1);
            t.inputs[lines[i].substr(2, eq - 2)] = json::accept(value) ? json::parse(value) : json(value);
        }
        if (i >= lines.size()) throw fail(lines.size(), "no column line after the '#' header; the file is truncated");
        std::istringstream cells(lines[i]);
        for (std::string c; std::getline(cells, c, ',');) columns.push_back(c);
        ++i;
    }

    // A JSON Lines header: one object with the version, the columns and the inputs.
    void read_jsonl_header() {
        const json header = parse_json(lines[0], fmt::format("{}:1", where), Keys::unique);
        if (!header.is_object() || !header.contains("kvlab_serve_trace")) throw fail(1, "not a kvlab serve trace header");
        check_version(header.at("kvlab_serve_trace"));
        if (!header.contains("columns") || !header.at("columns").is_array()) throw fail(1, "the header has no 'columns' array");
        for (const auto& c : header.at("columns")) {
            if (!c.is_string()) throw fail(1, "a column name that is not a string");
            columns.push_back(c.get<std::string>());
        }
        if (header.contains("inputs") && header.at("inputs").is_object()) t.inputs = header.at("inputs");
    }

    // The input token_bytes, and the columns: those of the format, with or without the measured times.
    void check_token_bytes_and_columns() {
        // one token's K and V bytes: every byte figure of the summary and the chart is rows x this
        const auto token_bytes = t.inputs.find("token_bytes");
        if (token_bytes == t.inputs.end() || !token_bytes->is_number_unsigned() || token_bytes->get<std::uint64_t>() == 0)
            throw fail(1, fmt::format("input token_bytes is {}; expected one token's K and V bytes, 1 or more, as kvlab serve writes",
                                      token_bytes == t.inputs.end() ? std::string("missing") : json_excerpt(*token_bytes)));
        t.has_wall_time = std::find(columns.begin(), columns.end(), "forward_ns") != columns.end();
        const bool swap = swap_inputs(t.inputs);
        if (columns != serve_trace_columns(!t.has_wall_time, swap))
            throw fail(csv ? i : 1, fmt::format("the columns are not those of serve trace format {} ({} columns, expected {})", serve_trace_format_version,
                                                columns.size(), serve_trace_columns(!t.has_wall_time, swap).size()));
    }

    // Record line i as a JSON object: CSV cells (the layout as text, the rest integers), or a JSON object of the columns.
    json row_of_line(std::size_t line) const {
        json row = json::object();
        if (csv) {
            const std::vector<std::string> cells = split_fields(lines[i], ',');
            if (cells.size() != columns.size()) throw fail(line, fmt::format("{} fields; expected {}", cells.size(), columns.size()));
            for (std::size_t c = 0; c < cells.size(); ++c) {
                if (c == 0) {
                    row[columns[c]] = cells[c];
                    continue;
                }
                std::int64_t v = 0;
                const auto [end, ec] = std::from_chars(cells[c].data(), cells[c].data() + cells[c].size(), v);
                if (ec != std::errc() || end != cells[c].data() + cells[c].size())
                    throw fail(line, fmt::format("{} is {}; expected an integer", columns[c], quote(cells[c], 30)));
                row[columns[c]] = v;
            }
        } else {
            row = parse_json(lines[i], fmt::format("{}:{}", where, line), Keys::unique);
            const std::size_t extra = row.is_object() && row.contains("pool_map") ? 1 : 0;  // the block map, not a column
            if (!row.is_object() || row.size() != columns.size() + extra)
                throw fail(line, fmt::format("expected an object of the {} columns (and pool_map)", columns.size()));
        }
        return row;
    }

    // Tokens one sequence's logits may choose in a step: serve --n or --beam-width (a prompt's logits choose
    // every output's first token), else 1.
    std::int64_t outputs_per_request() const {
        std::int64_t w = 1;
        for (const char* key : {"n", "beam_width", "request_n_max"})
            if (const auto it = t.inputs.find(key); it != t.inputs.end() && it->is_number_unsigned()) w = std::max(w, it->get<std::int64_t>());
        return std::min<std::int64_t>(w, std::int64_t{1} << 20);
    }

    // A row's step, layout and pool size: every column present, counts integers >= 0 that hang together.
    void read_step(std::size_t line, const json& row, ServeStep& s, KvLayout& layout, std::int64_t& pool) const {
        for (const std::string& c : columns) {
            if (!row.contains(c)) throw fail(line, fmt::format("missing column '{}'", c));
            const json& v = row.at(c);
            if (c == "layout") {
                if (!v.is_string()) throw fail(line, "layout: expected paged or contiguous");
                layout = parse_choice(kv_layout_choices, v.get<std::string>(), fmt::format("{}:{}: layout", where, line));
                continue;
            }
            if (!v.is_number_integer() || v.get<std::int64_t>() < 0) throw fail(line, fmt::format("{} is {}; expected an integer >= 0", c, json_excerpt(v)));
            const std::int64_t x = v.get<std::int64_t>();
            if (c == "pool_rows") {
                pool = x;
                continue;
            }
            const auto dot = c.find('.');
            if (dot == std::string::npos) {
                for (const ServeField& f : serve_fields)
                    if (c == f.name) s.*f.member = x;
                continue;
            }
            for (int o = 0; o < n_ops; ++o) {
                if (c.compare(0, dot, op_name(static_cast<Op>(o))) != 0 || op_name(static_cast<Op>(o)).size() != dot) continue;
                for (const OpField& f : op_fields())
                    if (c.compare(dot + 1, std::string::npos, f.name) == 0) {
                        if (f.member) s.cost.ops[static_cast<std::size_t>(o)].*f.member = static_cast<std::uint64_t>(x);
                        else s.cost.wall_ns[static_cast<std::size_t>(o)] = x;
                    }
            }
        }
        if (s.rows_tokens > s.rows_in_use || s.rows_in_use > pool || s.rows_cached > pool - s.rows_in_use || s.n_decode > s.n_seqs ||
            s.n_seqs > s.n_tokens || s.n_generated > s.n_seqs * outputs_per_request() || s.n_stopped > s.n_generated)
            throw fail(line, "inconsistent counts (rows holding tokens > rows in use, rows in use + cached > pool, decodes > sequences > "
                             "tokens, tokens generated > sequences x outputs per request, or outputs stopped > tokens generated); the file was edited or corrupted");
    }

    // A JSONL record's pool_map into s.pool_map: cell_rows >= 1, a cell per cell_rows of the pool, owners >= -2,
    // fills within a cell, shared cells held; the held cells' fill adds up to the step's rows holding tokens.
    std::int64_t read_pool_map(std::size_t line, const json& row, std::int64_t pool, ServeStep& s) const {
        if (!row.contains("pool_map")) return 0;
        const json& m = row.at("pool_map");
        auto ints = [&](const char* key) {
            if (!m.is_object() || !m.contains(key) || !m.at(key).is_array()) throw fail(line, fmt::format("pool_map.{}: expected an array", key));
            std::vector<std::int64_t> v;
            for (const json& x : m.at(key)) {
                if (!x.is_number_integer()) throw fail(line, fmt::format("pool_map.{} holds {}; expected integers", key, json_excerpt(x)));
                v.push_back(x.get<std::int64_t>());
            }
            return v;
        };
        const json cell = m.is_object() ? m.value("cell_rows", json()) : json();
        if (!cell.is_number_integer() || cell.get<std::int64_t>() < 1 || cell.get<std::int64_t>() > pool)
            throw fail(line, fmt::format("pool_map.cell_rows is {}; expected 1..{} (the pool's rows)", json_excerpt(cell), pool));
        const std::int64_t cell_rows = cell.get<std::int64_t>(), n_cells = (pool + cell_rows - 1) / cell_rows;
        const auto owner = ints("owner"), fill = ints("fill"), shared = ints("shared");
        if (std::ssize(owner) != n_cells || std::ssize(fill) != n_cells)
            throw fail(line, fmt::format("pool_map has {} owners and {} fills; expected {} cells ({} rows / {} per cell)", owner.size(), fill.size(),
                                         n_cells, pool, cell_rows));
        s.pool_map.resize(static_cast<std::size_t>(n_cells));
        std::int64_t held_fill = 0;
        for (std::size_t c = 0; c < owner.size(); ++c) {
            if (owner[c] < kv_cell_cached || fill[c] < 0 || fill[c] > cell_rows)
                throw fail(line, fmt::format("pool_map cell {}: owner {}, fill {}; expected an owner >= -2 and a fill 0..{}", c, owner[c], fill[c], cell_rows));
            s.pool_map[c] = {owner[c], static_cast<std::int32_t>(fill[c]), false};
            if (owner[c] >= 0) held_fill += fill[c];
        }
        for (std::size_t k = 0; k < shared.size(); ++k) {
            if (shared[k] < 0 || shared[k] >= n_cells || (k > 0 && shared[k] <= shared[k - 1]) || owner[static_cast<std::size_t>(shared[k])] < 0)
                throw fail(line, fmt::format("pool_map.shared holds {}; expected increasing indices of held cells", shared[k]));
            s.pool_map[static_cast<std::size_t>(shared[k])].shared = true;
        }
        if (held_fill != s.rows_tokens)
            throw fail(line, fmt::format("pool_map: the held cells' fill adds up to {} rows, the step's rows_tokens is {}; the file was edited or "
                                         "corrupted", held_fill, s.rows_tokens));
        return cell_rows;
    }

    // The steps of the step's layout: a new layout starts after the last one's steps, with its own pool.
    std::vector<ServeStep>& steps_of_layout(std::size_t line, KvLayout layout, std::int64_t pool) {
        auto it = std::find(t.layouts.begin(), t.layouts.end(), layout);
        if (it == t.layouts.end()) {
            t.layouts.push_back(layout);
            t.steps.emplace_back();
            t.pool_rows.push_back(pool);
            t.map_cell_rows.push_back(-1);  // set by the layout's first step
            it = t.layouts.end() - 1;
        } else if (it != t.layouts.end() - 1) {
            throw fail(line, "the layouts' records are interleaved; expected each layout's steps together");
        } else if (t.pool_rows.back() != pool) {
            throw fail(line, fmt::format("pool_rows {} in a {} layout whose pool has {}; one pool per layout", pool,
                                         choice_name(kv_layout_choices, layout), t.pool_rows.back()));
        }
        return t.steps[static_cast<std::size_t>(it - t.layouts.begin())];
    }

    // Adds the step to its layout's steps: a step number above the last, sums that fit 64 bits.
    void add_step(std::size_t line, const ServeStep& s, KvLayout layout, std::int64_t pool) {
        std::vector<ServeStep>& steps = steps_of_layout(line, layout, pool);
        if (!steps.empty() && s.step <= steps.back().step) throw fail(line, fmt::format("step {} after step {}; expected increasing steps", s.step, steps.back().step));
        // the summary adds up each layout's steps: the sums must fit (an edited file could wrap them)
        if (steps.empty()) sums = {};
        bool wrapped = __builtin_add_overflow(sums.ns, s.forward_ns, &sums.ns) || __builtin_add_overflow(sums.ns, s.schedule_ns, &sums.ns);
        for (const ServeField& f : serve_fields)  // the summary adds counts and durations, not the clock or step numbers
            if (std::string_view(f.name) != "step" && !f.measured)
                wrapped = __builtin_add_overflow(sums.counts, s.*f.member, &sums.counts) || wrapped;
        const OpCost c = s.cost.total();
        for (const std::uint64_t v : {c.flops, c.transcendentals, c.bytes_weights_read, c.bytes_act_read, c.bytes_act_written,
                                      c.bytes_kv_read, c.bytes_kv_written})
            wrapped = __builtin_add_overflow(sums.bytes, v, &sums.bytes) || wrapped;
        if (wrapped)
            throw fail(line, fmt::format("the {} layout's counts or times add up past what 64 bits hold by step {}; the file was edited "
                                         "or corrupted", choice_name(kv_layout_choices, layout), s.step));
        steps.push_back(s);
    }

    // The records, a line each, from line i to the end.
    void read_records() {
        for (; i < lines.size(); ++i) {
            const std::size_t line = i + 1;
            if (lines[i].empty()) throw fail(line, "empty line inside the records");
            const json row = row_of_line(line);
            ServeStep s;
            KvLayout layout = KvLayout::paged;
            std::int64_t pool = 0;
            read_step(line, row, s, layout, pool);
            const std::int64_t cell_rows = read_pool_map(line, row, pool, s);
            add_step(line, s, layout, pool);
            std::int64_t& layout_cells = t.map_cell_rows.back();
            if (layout_cells >= 0 && layout_cells != cell_rows)
                throw fail(line, cell_rows == 0 ? std::string("a step without pool_map in a layout whose steps have one")
                                                : fmt::format("pool_map.cell_rows {}; the layout's earlier steps have {}", cell_rows, layout_cells));
            layout_cells = cell_rows;
        }
    }
};

}  // namespace

ServeTrace parse_serve_trace(std::string_view text, const std::string& where) {
    ServeTraceReader r{text, where};
    r.split_lines();
    if (r.lines.empty()) throw FormatError(fmt::format("{}: empty file; expected a kvlab serve trace", where));
    if (!text.empty() && text.back() != '\n') throw r.fail(r.lines.size(), "the last line has no line end: the file is truncated");
    r.csv = r.lines[0].rfind(magic, 0) == 0;
    if (r.csv) r.read_csv_header();
    else r.read_jsonl_header();
    r.check_token_bytes_and_columns();
    r.read_records();
    if (r.t.layouts.empty()) throw FormatError(fmt::format("{}: a serve trace with no step records", where));
    return std::move(r.t);
}

}  // namespace kvlab

namespace kvlab {

double trace_host_bytes_per_s(const ServeTrace& t) {
    const auto it = t.inputs.find("host_bytes_per_s");
    if (it == t.inputs.end()) return 0.0;
    if (!it->is_number() || !(it->get<double>() > 0))
        throw FormatError(fmt::format("the trace's input \"host_bytes_per_s\" is {}; expected the host link's bytes per second, > 0", json_excerpt(*it)));
    return it->get<double>();
}

// The GPU the modelled time is for: the trace's "gpu" input (serve --gpu), h100 for a trace without one.
GpuSpec trace_gpu(const ServeTrace& t) {
    const auto it = t.inputs.find("gpu");
    if (it == t.inputs.end()) return find_gpu("h100");
    if (!it->is_string()) throw FormatError(fmt::format("the trace's input \"gpu\" is {}; expected a GPU preset's name", json_excerpt(*it)));
    try {
        return find_gpu(it->get<std::string>());
    } catch (const UsageError&) {
        throw FormatError(fmt::format("the trace's input \"gpu\" is {}, not a GPU preset (kvlab presets --gpus lists them)", quote(it->get<std::string>(), 40)));
    }
}

namespace {

}  // namespace

bool is_serve_trace_file(const std::filesystem::path& path) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) return false;  // the step-trace reader says what it is
    std::ifstream in(path, std::ios::binary);
    constexpr std::size_t window = 1 << 20;  // bounded reads: the head line, or a Perfetto file's tail
    std::string head(window, '\0');
    in.read(head.data(), static_cast<std::streamsize>(window));
    head.resize(static_cast<std::size_t>(in.gcount()));
    const std::string first = head.substr(0, head.find('\n'));
    if (first.rfind(magic, 0) == 0) return true;                                                        // CSV
    if (first.rfind("{\"traceEvents\"", 0) != 0) return first.find("\"kvlab_serve_trace\":") != std::string::npos;  // JSON Lines
    // a Perfetto file: serve's names itself in otherData, at the end
    const auto size = std::filesystem::file_size(path, ec);
    if (ec) return false;
    in.clear();
    in.seekg(static_cast<std::streamoff>(size > window ? size - window : 0));
    std::string tail(window, '\0');
    in.read(tail.data(), static_cast<std::streamsize>(window));
    tail.resize(static_cast<std::size_t>(in.gcount()));
    return tail.find("\"kvlab_serve_trace\":") != std::string::npos;
}

ServeTrace read_serve_trace(const std::filesystem::path& path) {
    const std::string text = read_input_file(path, "trace file", 1ull << 30);
    if (text.rfind("{\"traceEvents\"", 0) == 0)
        throw FormatError(fmt::format("{}: a Perfetto serve timeline, for ui.perfetto.dev; kvlab trace reads serve traces as .csv or .jsonl",
                                      path.string()));
    ServeTrace t = parse_serve_trace(text, path.string());
    try {
        trace_gpu(t);  // the modelled time's GPU: a preset, checked before any work
    } catch (const FormatError& e) {
        throw FormatError(fmt::format("{}: {}", path.string(), e.what()));
    }
    return t;
}

namespace {

// An input for a title: as text whatever its JSON type ("?" when absent).
std::string input_text(const ServeTrace& t, const char* key) {
    const auto it = t.inputs.find(key);
    if (it == t.inputs.end()) return "?";
    return it->is_string() ? it->get<std::string>() : it->dump();
}

std::uint64_t trace_token_bytes(const ServeTrace& t) { return t.inputs.at("token_bytes").get<std::uint64_t>(); }  // checked by the reader

}  // namespace

Report serve_trace_summary(const ServeTrace& t, UnitSystem units, Format format) {
    const std::uint64_t token_bytes = trace_token_bytes(t);
    std::vector<ServeSummary> summaries;
    for (std::size_t k = 0; k < t.layouts.size(); ++k) {
        ServeResult r;
        r.steps = t.steps[k];
        r.pool_rows = t.pool_rows[k];
        r.pool_bytes = static_cast<std::uint64_t>(r.pool_rows) * token_bytes;
        r.host_bytes_per_s = trace_host_bytes_per_s(t);
        const GpuSpec gpu = trace_gpu(t);
        summaries.push_back(summarize_serving(r, t.layouts[k], &gpu));
        summaries.back().has_wall_time = t.has_wall_time;
    }
    return serve_report(summaries, {}, t.inputs, fmt::format("kvlab trace summary: serve trace of {} ({} requests)",
                                                             input_text(t, "model"), input_text(t, "requests")),
                        token_bytes, units, format);
}

namespace {

// The chart's data: per layout, a block of its steps and a block of its steps in buckets (index k and
// layouts + k), and the scales the panels need.
struct ServePlotData {
    std::string text;
    double max_bytes = 0, max_wpt = 0;
    std::int64_t bucket = 1;  // steps per bucket of the time panel
    bool outputs = false;     // requests with several outputs (--n, --beam-width): their blocks get two panels
    std::int64_t max_out_blocks = 0, max_cow = 0;
};

// Steps per bucket: at most about 100 buckets over the longest run, a round number (1, 2, 5, 10, 20, ...).
std::int64_t bucket_steps(const ServeTrace& t) {
    std::int64_t last = 0;
    for (const auto& steps : t.steps)
        if (!steps.empty()) last = std::max(last, steps.back().step + 1);
    std::int64_t n = 1;
    for (int i = 0; n * 100 < last; ++i) n = (i % 3 == 1 ? n / 2 * 5 : n * 2);  // 1, 2, 5, 10, 20, 50, ...
    return n;
}

// Per step: step, allocated and holding bytes, KV utilization %, pool reserved %, running, waiting,
// weight bytes per generated token, cumulative modelled GPU ms.
void add_step_block(std::ostringstream& data, const ServeTrace& t, std::size_t k, const GpuSpec& gpu, ServePlotData& d) {
    const double token_bytes = static_cast<double>(trace_token_bytes(t)), pool = static_cast<double>(std::max<std::int64_t>(1, t.pool_rows[k]));
    data << "# step allocated holding utilization_pct reserved_pct running waiting weight_bytes_per_token modelled_ms_cumulative "
            "out_blocks out_blocks_unshared cow_copies_cumulative\n";
    double modelled_s = 0;
    std::int64_t cow = 0;
    for (const ServeStep& s : t.steps[k]) {
        const OpCost c = s.cost.total();
        modelled_s += modelled_serve_time(gpu, {s}, trace_host_bytes_per_s(t)).seconds;  // serve's rule, swaps included
        const double alloc = static_cast<double>(s.rows_in_use) * token_bytes, hold = static_cast<double>(s.rows_tokens) * token_bytes;
        const double wpt = s.n_generated > 0 ? static_cast<double>(c.bytes_weights_read) / static_cast<double>(s.n_generated) : 0.0;
        d.max_bytes = std::max(d.max_bytes, alloc);
        d.max_wpt = std::max(d.max_wpt, wpt);
        d.outputs = d.outputs || s.out_blocks_unshared > 0;
        d.max_out_blocks = std::max(d.max_out_blocks, s.out_blocks_unshared);
        cow += s.cow_copies;
        d.max_cow = std::max(d.max_cow, cow);
        data << s.step << ' ' << fmt::format("{:.17g} {:.17g} ", alloc, hold)
             << (s.rows_in_use > 0 ? fmt::format("{:.6g}", 100.0 * static_cast<double>(s.rows_tokens) / static_cast<double>(s.rows_in_use)) : "?")
             << ' ' << fmt::format("{:.6g}", 100.0 * static_cast<double>(s.rows_in_use) / pool) << ' ' << s.n_running << ' ' << s.n_waiting << ' '
             << (s.n_generated > 0 ? fmt::format("{:.17g}", wpt) : std::string("?")) << ' ' << fmt::format("{:.9g}", modelled_s * 1e3) << ' '
             << s.out_blocks << ' ' << s.out_blocks_unshared << ' ' << cow << '\n';
    }
}

// Per bucket of d.bucket steps (the steps that ran in it): its middle step, the mean measured ms per step
// ('?' without wall time), the mean modelled GPU µs per step.
void add_bucket_block(std::ostringstream& data, const ServeTrace& t, std::size_t k, const GpuSpec& gpu, const ServePlotData& d) {
    data << "# bucket_middle_step measured_ms_per_step modelled_us_per_step\n";
    const auto& steps = t.steps[k];
    for (std::size_t i = 0; i < steps.size();) {
        const std::int64_t b = steps[i].step / d.bucket;
        double ms = 0, us = 0;
        std::int64_t n = 0;
        for (; i < steps.size() && steps[i].step / d.bucket == b; ++i, ++n) {
            ms += static_cast<double>(steps[i].forward_ns + steps[i].schedule_ns) * 1e-6;
            us += modelled_serve_time(gpu, {steps[i]}, trace_host_bytes_per_s(t)).seconds * 1e6;
        }
        data << fmt::format("{:.17g} ", (static_cast<double>(b) + 0.5) * static_cast<double>(d.bucket))
             << (t.has_wall_time ? fmt::format("{:.6g}", ms / static_cast<double>(n)) : "?") << ' '
             << fmt::format("{:.6g}", us / static_cast<double>(n)) << '\n';
    }
}

ServePlotData serve_plot_data(const ServeTrace& t, const GpuSpec& gpu) {
    ServePlotData d;
    d.bucket = bucket_steps(t);
    std::ostringstream data;
    for (std::size_t k = 0; k < t.layouts.size(); ++k) {
        data << (k ? "\n\n" : "");
        add_step_block(data, t, k, gpu, d);
    }
    for (std::size_t k = 0; k < t.layouts.size(); ++k) {
        data << "\n\n";
        add_bucket_block(data, t, k, gpu, d);
    }
    d.text = data.str();
    return d;
}

}  // namespace

void plot_serve_trace(const ServeTrace& t, const std::filesystem::path& output, const char* flag) {
    gnuplot_terminal(output, 1, 1, flag);  // the extension, checked before any work
    const GpuSpec gpu = trace_gpu(t);
    const ServePlotData d = serve_plot_data(t, gpu);
    // (plain variables, not structured bindings: clang 14 cannot capture those in the lambdas below)
    const ByteAxis mem = byte_axis(d.max_bytes), wpt = byte_axis(d.max_wpt);
    const double mem_scale = mem.scale, wpt_scale = wpt.scale;
    const std::size_t n = t.layouts.size();
    static const char* colours[] = {"#1b6ca8", "#d1495b"};
    std::ostringstream gp;
    const int rows = d.outputs ? 4 : 3;  // several outputs per request: a row for their blocks and copies
    gp << gnuplot_terminal(output, 1200, 400 * rows, flag) << "set output\nset datafile missing '?'\nset grid\nset xlabel 'step'\n";
    for (std::size_t k = 0; k < n; ++k)
        gp << fmt::format("set style line {} lc rgb '{}' lw 2\nset style line {} lc rgb '{}' lw 1.5 dt 2\n", 10 + k, colours[k % 2], 20 + k, colours[k % 2]);
    // every panel from 0; `top`: the y range's top as a multiple of the data's largest value (room for the key)
    auto plot = [&](const std::string& title, const std::string& ylabel, auto series, const char* key = "top right", double top = 0) {
        gp << "set title " << gp_quote(title) << "\nset ylabel " << gp_quote(ylabel) << "\nset key " << key << " opaque\n"
           << (top > 0 ? fmt::format("set yrange [0:{:.17g}]\n", top) : std::string("set yrange [0:*]\n")) << "plot ";
        for (std::size_t k = 0; k < n; ++k) gp << (k ? ", " : "") << series(k, std::string(choice_name(kv_layout_choices, t.layouts[k])));
        gp << "\n";
    };
    // two series of one layout: a solid line of column a, a dashed one of column b
    auto pair = [&](std::size_t k, const std::string& name, const std::string& a, const std::string& b, const char* ta, const char* tb) {
        return fmt::format("ARG1 index {0} using 1:{1} with lines ls {2} title {3}, ARG1 index {0} using 1:{4} with lines ls {5} title {6}", k, a,
                           10 + k, gp_quote(name + ta), b, 20 + k, gp_quote(name + tb));
    };
    gp << "set multiplot layout " << rows << ",2 title ARG2 font ',14' noenhanced\n";
    plot("KV memory: allocated (solid) vs holding tokens (dashed)", mem.label, [&](std::size_t k, const std::string& name) {
        return pair(k, name, fmt::format("($2/{:.17g})", mem_scale), fmt::format("($3/{:.17g})", mem_scale), " allocated", " holding tokens");
    }, "top right", 1.45 * d.max_bytes / mem_scale);
    plot("KV utilization: tokens / allocated (solid); pool reserved (dashed)", "%", [&](std::size_t k, const std::string& name) {
        return pair(k, name, "4", "5", " tokens / allocated", " pool reserved");
    }, "bottom right", 105);
    plot("requests running (solid) and waiting (dashed), per step", "requests", [&](std::size_t k, const std::string& name) {
        return pair(k, name, "6", "7", " running", " waiting");
    }, "top right");
    plot("weight bytes read per generated token: falls as 1 / batch", wpt.label, [&](std::size_t k, const std::string& name) {
        return fmt::format("ARG1 index {} using 1:($8/{:.17g}) with points ls {} pt 7 ps 0.4 title {}", k, wpt_scale, 10 + k, gp_quote(name));
    }, "top left", 1.2 * d.max_wpt / wpt_scale);
    const std::string per = d.bucket > 1 ? fmt::format(", mean over each {} steps", d.bucket) : std::string();
    plot(t.has_wall_time ? "CPU time per step (measured, one run" + per + ")" : "modelled GPU time per step (no wall time in a --deterministic trace" + per + ")",
         t.has_wall_time ? "ms" : "µs", [&](std::size_t k, const std::string& name) {
             return fmt::format("ARG1 index {} using 1:{} with histeps ls {} title {}", n + k, t.has_wall_time ? 2 : 3, 10 + k, gp_quote(name));
         });
    plot("modelled time on " + gpu.display_name + ", cumulative (roofline)", "ms",
         [&](std::size_t k, const std::string& name) {
             return fmt::format("ARG1 index {} using 1:9 with lines ls {} title {}", k, 10 + k, gp_quote(name));
         }, "top left");
    if (d.outputs) {
        plot("outputs' KV blocks: held, a shared block once (solid), vs each output its own copy (dashed)", "blocks",
             [&](std::size_t k, const std::string& name) { return pair(k, name, "10", "11", " held", " unshared"); }, "top right",
             1.3 * static_cast<double>(d.max_out_blocks));
        plot("copy-on-write block copies, cumulative (a write into a block outputs share)", "blocks copied",
             [&](std::size_t k, const std::string& name) {
                 return fmt::format("ARG1 index {} using 1:12 with lines ls {} title {}", k, 10 + k, gp_quote(name));
             }, "top left", 1.2 * static_cast<double>(std::max<std::int64_t>(1, d.max_cow)));
    }
    gp << "unset multiplot\nset output\n";
    const std::string title = fmt::format("kvlab serve trace: {}, {} requests, pool {} token rows", input_text(t, "model"),
                                          input_text(t, "requests"), t.pool_rows.front());
    draw_with_gnuplot(output, d.text, gp.str(), {title}, flag);
}

}  // namespace kvlab
