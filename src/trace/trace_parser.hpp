// The reader shared by the trace layouts (internal to src/trace): the file's text, errors naming file and
// line, column and value checks against the schema, records and the run summary, the step sequence.
// read() tells the layout apart by content and calls read_csv, read_jsonl or read_perfetto.
#pragma once
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvlab/core/error.hpp"
#include "core/json_input.hpp"
#include "kvlab/core/mapped_file.hpp"
#include "kvlab/core/text.hpp"

#include "trace/step_trace.hpp"

namespace kvlab {

namespace fs = std::filesystem;
using json = nlohmann::json;

class TraceParser {
public:
    explicit TraceParser(fs::path path) : path_(std::move(path)) {}

    StepTrace read() {
        // a 1024-step trace of both modes is ~6 MB; a file past 1 GiB is not one kvlab wrote
        const char* what = "trace file (CSV, JSON Lines or Perfetto JSON from kvlab simulate --trace)";
        // a checkpoint or a chart given by mistake: said before it is read whole, not shown as a "line"
        if (const std::size_t nul = read_input_head(path_, what, 4096).find('\0'); nul != std::string::npos)
            throw FormatError(fmt::format("{}: binary data (a NUL byte at offset {}); expected a text trace: CSV, JSON Lines or "
                                          "Perfetto JSON from kvlab simulate --trace", quote(path_.string()), nul));
        text_ = read_input_file(path_, what, 1ull << 30);
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

    // The three layouts (trace_reader.cpp: CSV and JSON Lines; perfetto_reader.cpp: Perfetto JSON).
    void read_csv(StepTrace& trace);
    void read_jsonl(StepTrace& trace);
    void read_perfetto(StepTrace& trace);
    std::size_t line_of_offset(std::size_t offset) const;

    // The inputs the reports read (simulation_report.cpp) must have their types: a count is an integer
    // of 0 or more, a dtype a string. The rest of the inputs are only printed.
    void check_input(std::size_t line, const std::string& key, const json& value) const {
        static const char* counts[] = {"layers", "layers_in_model", "window", "sink_tokens"};
        static const char* texts[] = {"kv_dtype", "kv_scale", "weight_dtype"};
        for (const char* k : counts)
            if (key == k && !(value.is_number_integer() && value.get<std::int64_t>() >= 0))
                fail(line, fmt::format("input '{}' is {}; expected an integer, 0 or more", key, json_excerpt(value)));
        for (const char* k : texts)
            if (key == k && !value.is_string()) fail(line, fmt::format("input '{}' is {}; expected a string", key, json_excerpt(value)));
    }
    void check_inputs(std::size_t line, const json& inputs) const {
        for (const auto& [key, value] : inputs.items()) check_input(line, key, value);
    }

    [[noreturn]] void fail(std::size_t line, const std::string& what) const {
        throw FormatError(fmt::format("{}: line {}: {}", path_.string(), line, what));
    }

    json parse(std::size_t line, std::string_view text) const {
        return parse_json(text, fmt::format("{}: line {}", path_.string(), line), Keys::unique);
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
                // decimal only (strtod also took hex floats), and finite: kvlab writes no nan or inf
                double v = 0;
                const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v, std::chars_format::general);
                if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v)) return bad();
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
            case FieldType::real_or_null: ok = v.is_null() || (v.is_number() && std::isfinite(v.get<double>())); break;
            case FieldType::real: ok = v.is_number() && std::isfinite(v.get<double>()); break;
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

    // A count in a run summary: an integer 0..2^40, as config fields are bounded, so that sums of them
    // (prompt + steps positions) cannot overflow and 2^64 - 1 is not read back as -1.
    std::int64_t count_value(std::size_t line, const json& v, const std::string& what) const {
        constexpr std::int64_t max_count = std::int64_t{1} << 40;
        if (!v.is_number_integer() || (v.is_number_unsigned() ? v.get<std::uint64_t>() > static_cast<std::uint64_t>(max_count)
                                                              : (v.get<std::int64_t>() < 0 || v.get<std::int64_t>() > max_count)))
            fail(line, fmt::format("run summary: {} is {}; expected a count from 0 to 2^40", what, json_excerpt(v)));
        return v.get<std::int64_t>();
    }

    // --repeat's wall time of each run per mode, and the host's load (traces before them, of one run, or
    // --deterministic, have no such keys)
    void read_timings(std::size_t line, const json& j, RunSummary& run) const {
        // --repeat: each run's wall time per mode (traces before it, and of one run, have no such key)
        if (j.contains("repeat_wall_ns")) {
            const json& r = j.at("repeat_wall_ns");
            auto walls = [&](const char* key) {
                std::vector<std::int64_t> out;
                if (!r.is_object() || !r.contains(key) || !r.at(key).is_array())
                    fail(line, fmt::format("run summary: repeat_wall_ns '{}' is missing; expected an array of nanoseconds", key));
                for (const json& v : r.at(key)) out.push_back(count_value(line, v, fmt::format("repeat_wall_ns '{}'", key)));
                return out;
            };
            run.repeats.cached_ns = walls("cached");
            run.repeats.uncached_ns = walls("uncached");
        }
        if (j.contains("host_load")) {
            const json& h = j.at("host_load");
            if (!h.is_object() || !h.contains("load1") || !h.at("load1").is_number() || !h.contains("cores"))
                fail(line, fmt::format("run summary: 'host_load' is {}; expected {{\"load1\": number, \"cores\": count}}", json_excerpt(h)));
            run.host_load = HostLoad{h.at("load1").get<double>(), static_cast<int>(count_value(line, h.at("cores"), "host_load 'cores'"))};
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
        auto count = [&](const char* key) { return count_value(line, need(key, &json::is_number_integer, "an integer"), fmt::format("'{}'", key)); };
        run.n_prompt = count("prompt_tokens");
        run.n_steps = count("steps_requested");
        run.n_steps_done = count("steps_done");
        run.interrupted = need("interrupted", &json::is_boolean, "a boolean").get<bool>();
        run.counted = need("counted", &json::is_boolean, "a boolean").get<bool>();
        run.kv_cache_bytes = need("kv_cache_bytes", &json::is_number_unsigned, "a non-negative integer").get<std::uint64_t>();
        run.max_abs_dlogit = need("max_abs_dlogit", &json::is_number, "a number").get<double>();
        run.n_argmax_flips = count("argmax_flips");
        if (!j.contains("first_divergent_step") ||
            !(j.at("first_divergent_step").is_null() || j.at("first_divergent_step").is_number_integer()))
            fail(line, "run summary: 'first_divergent_step' is missing; expected an integer or null");
        if (!j.at("first_divergent_step").is_null()) run.first_divergent_step = count("first_divergent_step");
        run.divergent_dlogit = need("divergent_dlogit", &json::is_number, "a number").get<double>();
        run.divergent_tolerance = need("divergent_tolerance", &json::is_number, "a number").get<double>();
        // a cache policy's quality against fp32 (traces before it have no such key)
        if (j.contains("kv_quality") && !j.at("kv_quality").is_null()) {
            const json& q = j.at("kv_quality");
            if (!q.is_object()) fail(line, fmt::format("run summary: 'kv_quality' is {}; expected an object or null", json_excerpt(q)));
            auto num = [&](const char* key) {
                if (!q.contains(key) || !q.at(key).is_number())
                    fail(line, fmt::format("run summary: kv_quality '{}' is {}; expected a number", key, q.contains(key) ? json_excerpt(q.at(key)) : "missing"));
                return q.at(key);
            };
            KvQuality kq;
            kq.max_abs_dlogit = num("max_abs_dlogit").get<double>();
            kq.mean_kl = num("mean_kl").get<double>();
            kq.max_kl = num("max_kl").get<double>();
            // counts as above (a float such as 1e300 is no count), agreeing steps at most the steps
            kq.n_agree = count_value(line, num("argmax_agree"), "kv_quality 'argmax_agree'");
            kq.n_steps = count_value(line, num("steps"), "kv_quality 'steps'");
            if (kq.n_agree > kq.n_steps)
                fail(line, fmt::format("run summary: kv_quality 'argmax_agree' is {}; expected at most its 'steps' ({})", kq.n_agree, kq.n_steps));
            for (const auto& [key, v] : {std::pair{"max_abs_dlogit", kq.max_abs_dlogit}, {"mean_kl", kq.mean_kl}, {"max_kl", kq.max_kl}})
                if (!std::isfinite(v) || v < 0) fail(line, fmt::format("run summary: kv_quality '{}' is {}; expected 0 or more", key, v));
            if (kq.mean_kl > kq.max_kl * (1 + 1e-9))  // equal KLs: their mean may round a hair above
                fail(line, fmt::format("run summary: kv_quality 'mean_kl' {} is above its 'max_kl' {}", kq.mean_kl, kq.max_kl));
            if (kq.n_steps > run.n_steps_done)
                fail(line, fmt::format("run summary: kv_quality 'steps' is {}; expected at most the {} steps done", kq.n_steps, run.n_steps_done));
            run.kv_quality = kq;
        }
        read_timings(line, j, run);
        // what the summary says of the run must hang together
        if (run.n_steps_done > run.n_steps || run.interrupted != (run.n_steps_done < run.n_steps))
            fail(line, fmt::format("run summary: {} of {} steps done with 'interrupted' {}; expected all steps done, or fewer and "
                                   "interrupted", run.n_steps_done, run.n_steps, run.interrupted));
        if (run.first_divergent_step && *run.first_divergent_step >= run.n_steps_done)
            fail(line, fmt::format("run summary: 'first_divergent_step' {} in a run of {} steps", *run.first_divergent_step, run.n_steps_done));
        for (const auto& [key, v] : {std::pair{"max_abs_dlogit", run.max_abs_dlogit}, {"divergent_dlogit", run.divergent_dlogit},
                                     {"divergent_tolerance", run.divergent_tolerance}})
            if (!std::isfinite(v) || v < 0) fail(line, fmt::format("run summary: '{}' is {}; expected 0 or more", key, v));
        run_line_ = line;
        run.has_wall_time = !deterministic_;
        return run;
    }

    // Each mode's steps 0, 1, 2, ... in order, as many as the run summary says, modes as it says.
    // What a step of a P-token prompt ran: cached, the prompt at step 0 and then one token; uncached, all
    // P + step tokens. Its newest token sits at P + step - 1 and attends at most that many keys plus one.
    // Only the cached mode keeps a cache, at most what the run allocated.
    void check_step(std::size_t line, const RunSummary& run, const StepRecord& r) const {
        const std::string mode(step_mode_name(r.mode));
        const std::int64_t n_prompt = run.n_prompt;
        const std::int64_t tokens = r.mode == StepMode::cached ? (r.step == 0 ? n_prompt : 1) : n_prompt + r.step;
        if (r.n_tokens != tokens)
            fail(line, fmt::format("{} step {} ran {} tokens; a prompt of {} tokens gives {}", mode, r.step, r.n_tokens, n_prompt, tokens));
        if (r.position != n_prompt + r.step - 1)
            fail(line, fmt::format("{} step {} at position {}; a prompt of {} tokens puts it at {}", mode, r.step, r.position, n_prompt,
                                   n_prompt + r.step - 1));
        if (r.n_keys < 1 || r.n_keys > r.position + 1)
            fail(line, fmt::format("{} step {} attends {} keys; expected 1..{} at position {}", mode, r.step, r.n_keys, r.position + 1,
                                   r.position));
        for (int op = 0; op < n_ops; ++op)
            if (r.cost.wall_ns[static_cast<std::size_t>(op)] < 0)
                fail(line, fmt::format("{}.wall_ns {}; expected 0 or more", op_name(static_cast<Op>(op)),
                                       r.cost.wall_ns[static_cast<std::size_t>(op)]));
        if (r.mode == StepMode::uncached && r.kv_bytes_resident != 0)
            fail(line, fmt::format("uncached step {} holds {} bytes of KV cache; the uncached mode keeps none", r.step, r.kv_bytes_resident));
        if (r.mode == StepMode::cached && r.kv_bytes_resident > run.kv_cache_bytes)
            fail(line, fmt::format("cached step {} holds {} bytes of KV cache, more than the {} the run allocated", r.step,
                                   r.kv_bytes_resident, run.kv_cache_bytes));
    }

    // The reports add up each mode's steps: the sums must fit their types (an edited file could wrap them).
    struct Totals {
        OpCost cost;
        std::int64_t wall_ns = 0, n_tokens = 0;
    };
    void add_to_totals(std::size_t line, const StepRecord& r, Totals& t) const {
        bool wrapped = false;
        auto add = [&](auto& sum, auto value) { wrapped = __builtin_add_overflow(sum, value, &sum) || wrapped; };
        const OpCost c = r.cost.total();
        for (std::uint64_t OpCost::*field : {&OpCost::flops, &OpCost::transcendentals, &OpCost::bytes_weights_read, &OpCost::bytes_act_read,
                                             &OpCost::bytes_act_written, &OpCost::bytes_kv_read, &OpCost::bytes_kv_written})
            add(t.cost.*field, c.*field);
        std::uint64_t bytes = 0;  // the reports' bytes_total of the sums
        for (std::uint64_t OpCost::*field : {&OpCost::bytes_weights_read, &OpCost::bytes_act_read, &OpCost::bytes_act_written,
                                             &OpCost::bytes_kv_read, &OpCost::bytes_kv_written})
            add(bytes, t.cost.*field);
        add(t.wall_ns, r.wall_ns);
        add(t.n_tokens, r.n_tokens);
        if (wrapped)
            fail(line, fmt::format("the {} steps' counts or times add up past what 64 bits hold by step {}; the file was edited or "
                                   "corrupted", step_mode_name(r.mode), r.step));
    }

    void check_sequence(const StepTrace& trace) const {
        const std::size_t end_line = record_lines_.empty() ? 1 : record_lines_.back();
        if (trace.records.empty()) fail(end_line, "no records; expected at least one step");
        std::map<StepMode, std::int64_t> next;
        std::map<StepMode, Totals> sums;
        std::int64_t flips = 0;
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
            check_step(record_lines_[i], trace.run, r);
            add_to_totals(record_lines_[i], r, sums[r.mode]);
            flips += r.argmax_flip && r.mode == StepMode::cached ? 1 : 0;  // a flip marks both records of its step
        }
        for (const StepMode m : {StepMode::cached, StepMode::uncached}) {
            const bool expected = trace.run.mode == SimMode::both || (trace.run.mode == SimMode::cached) == (m == StepMode::cached);
            if (expected && next[m] != trace.run.n_steps_done)
                fail(next[m] < trace.run.n_steps_done ? end_line : run_line_,
                     fmt::format("{} {} steps; the run summary says {} were done: {}", next[m], step_mode_name(m), trace.run.n_steps_done,
                                 next[m] < trace.run.n_steps_done ? "the file is truncated" : "the file has more steps than its run"));
        }
        // the summary's counts against the records
        if (flips != trace.run.n_argmax_flips)
            fail(run_line_, fmt::format("run summary: 'argmax_flips' is {}, but {} steps have argmax_flip set", trace.run.n_argmax_flips, flips));
        const bool any_cost = std::any_of(sums.begin(), sums.end(), [](const auto& m) { return !(m.second.cost == OpCost{}); });
        if (!trace.run.counted && any_cost)
            fail(run_line_, "run summary: 'counted' is false (counting off), but the steps hold FLOP and byte counts");
    }

    fs::path path_;
    std::string text_;
    bool deterministic_ = false;
    std::vector<std::string> columns_;
    std::set<std::string> column_set_;
    std::vector<std::size_t> record_lines_;
    mutable std::size_t run_line_ = 1;  // where the run summary was read (set by run_from_json)
};

}  // namespace kvlab
