#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "kvlab/core/error.hpp"
#include "trace/html_page.hpp"
#include "trace/perfetto_trace.hpp"
#include "trace/serve_trace.hpp"
#include "kvlab/weights/random_weights.hpp"
#include "report/simulation_report.hpp"
#include "kvlab/sim/simulator.hpp"
#include "trace/step_trace.hpp"
#include "trace/trace_plot.hpp"
#include "trace/trace_reader.hpp"
#include "trace/trace_report.hpp"
#include "trace/trace_schema.hpp"
#include "sim_configs.hpp"
#include "test_files.hpp"
#include "test_paths.hpp"

using namespace kvlab;
using kvlab::test::tiny_config;
namespace fs = std::filesystem;

namespace {

struct Run {
    ModelConfig cfg;
    SimulateOptions options;
    SimulationResult result;
    RunSummary summary;
    nlohmann::json inputs;
};

Run simulate(const ModelConfig& cfg, SimMode mode = SimMode::both) {
    Run r{cfg, {}, {}, {}, {}};
    r.options.n_prompt = 5;
    r.options.n_steps = 9;
    r.options.mode = mode;
    r.result = run_simulation(cfg, random_weights(cfg, 4), r.options);
    r.summary = run_summary(cfg, r.options, r.result);
    r.inputs = {{"model", cfg.name}, {"steps", 9}, {"seed", 4}, {"model_source", "1e5"}, {"note", "a, b"}};
    return r;
}

fs::path temp_dir() {
    const fs::path dir = fs::temp_directory_path() / fmt::format("kvlab-test-trace-{}", ::getpid());
    fs::create_directories(dir);
    return dir;
}

using kvlab::test::slurp;

void spit(const fs::path& p, const std::string& text) {
    std::ofstream out(p, std::ios::binary);
    out << text;
}

// Two runs written as deterministic traces (the format from each file's extension) and compared as
// `kvlab trace compare A B` does, labelled by the files' stems.
Report compare_runs(const Run& a, const std::string& file_a, const Run& b, const std::string& file_b) {
    const fs::path dir = temp_dir();
    write_step_trace(dir / file_a, a.summary, a.result.records, a.inputs, true);
    write_step_trace(dir / file_b, b.summary, b.result.records, b.inputs, true);
    Report report = trace_compare_report(read_step_trace(dir / file_a), read_step_trace(dir / file_b), fs::path(file_a).stem().string(),
                                         fs::path(file_b).stem().string(), 1, UnitSystem::iec);
    fs::remove_all(dir);
    return report;
}

std::string as_json(const Report& report) {
    std::ostringstream s;
    print_report(s, report, Format::json);
    return s.str();
}

// simulate's report without the rows a --deterministic trace cannot have
nlohmann::json without_wall_rows(nlohmann::json report) {
    // the headline's first line leads with the measured speed-up when there is wall time; its modelled
    // clause ("5.3x modelled on ...") and the counted second line must survive either way
    if (report.contains("headline")) {
        std::string& first = report["headline"][0].get_ref<std::string&>();
        const auto at = first.find("x modelled on ");
        const auto from = at == std::string::npos ? at : first.rfind(' ', at);
        first = at == std::string::npos ? std::string() : first.substr(from + 1, first.find(" (", at) - from - 1);
    }
    // the note on what is measured speaks of wall time
    if (report.contains("notes"))
        for (auto it = report["notes"].begin(); it != report["notes"].end();)
            it = it->get<std::string>().rfind("FLOPs, bytes, tokens and steps are counted", 0) == 0 ? report["notes"].erase(it) : std::next(it);
    for (auto& table : report["tables"]) {
        nlohmann::json rows = nlohmann::json::array();
        for (auto& row : table["rows"]) {
            const auto metric = row["metric"].get<std::string>();
            if (metric != "wall_ms" && metric != "ms_per_token" && metric != "tokens_per_s" && metric != "gflop_per_s" && metric != "gb_per_s")
                rows.push_back(row);
        }
        table["rows"] = rows;
        auto& notes = table["notes"];
        for (auto it = notes.begin(); it != notes.end();)
            it = it->get<std::string>().rfind("no wall time", 0) == 0 ? notes.erase(it) : std::next(it);
    }
    return report;
}

}  // namespace

TEST_CASE("Per-op wall time is measured inside the step and equality still compares costs only") {
    const Run r = simulate(tiny_config(Family::llama, 4, 2));
    for (const auto& rec : r.result.records) {
        std::int64_t sum = 0;
        for (const auto ns : rec.cost.wall_ns) {
            CHECK(ns >= 0);
            sum += ns;
        }
        CHECK(sum > 0);
        CHECK(sum <= rec.wall_ns);  // the op timers run inside the timed forward call
    }
    StepCost a = r.result.records[0].cost, b = a;
    b.wall_ns[0] += 1000;
    CHECK(a == b);
}

TEST_CASE("The Perfetto trace has two named processes, nested per-op slices and numeric counters") {
    const Run r = simulate(tiny_config(Family::llama, 4, 2));
    const fs::path dir = temp_dir();
    for (const bool deterministic : {false, true}) {
        INFO("deterministic " << deterministic);
        write_step_trace(dir / "t.json", r.summary, r.result.records, r.inputs, deterministic);
        const auto doc = nlohmann::json::parse(slurp(dir / "t.json"));
        REQUIRE(doc["traceEvents"].is_array());
        CHECK(doc["displayTimeUnit"] == "ms");
        CHECK(doc["otherData"]["time"] == (deterministic ? "modelled" : "measured"));
        CHECK(doc["otherData"]["kvlab_trace"] == trace_format_version);
        std::map<int, std::string> process_names;
        std::map<int, int> n_steps, n_counters;
        std::map<int, std::pair<double, double>> open_step;  // pid -> [ts, end] of its latest step
        std::map<int, double> last_step_end;
        for (const auto& ev : doc["traceEvents"]) {
            const std::string ph = ev["ph"];
            REQUIRE((ph == "M" || ph == "X" || ph == "C"));
            const int pid = ev["pid"];
            CHECK(ev["tid"] == 1);
            if (ph == "M") {
                if (ev["name"] == "process_name") process_names[pid] = ev["args"]["name"];
                continue;
            }
            REQUIRE(ev["ts"].is_number());
            if (ph == "C") {
                ++n_counters[pid];
                REQUIRE(ev["args"].size() == 1);
                for (const auto& [key, value] : ev["args"].items()) CHECK(value.is_number());
                continue;
            }
            REQUIRE(ev["dur"].is_number());
            const double ts = ev["ts"], end = ts + ev["dur"].get<double>();
            CHECK(ev["dur"].get<double>() >= 0.0);
            if (ev["cat"] == "step") {
                ++n_steps[pid];
                CHECK(ts >= last_step_end[pid] - 1e-6);  // steps of one process do not overlap
                last_step_end[pid] = end;
                open_step[pid] = {ts, end};
                CHECK(ev["args"]["flops"].is_number_unsigned());
                CHECK(ev["args"]["mode"] == (pid == 1 ? "cached" : "uncached"));
            } else {
                REQUIRE(ev["cat"] == "op");
                REQUIRE(open_step.count(pid));
                CHECK(ts >= open_step[pid].first - 1e-6);  // the op lies within its step
                CHECK(end <= open_step[pid].second + 1e-6);
                CHECK(ev["args"]["flops"].is_number_unsigned());
            }
        }
        CHECK(process_names[1].rfind("cached", 0) == 0);
        CHECK(process_names[2].rfind("uncached", 0) == 0);
        CHECK(n_steps[1] == 9);
        CHECK(n_steps[2] == 9);
        CHECK(n_counters[1] == 3 * 9);  // FLOPs, bytes and KV resident per step
    }
    fs::remove_all(dir);
}

TEST_CASE("Modelled op time is the roofline max(flops / F, bytes / B)") {
    OpCost c;
    c.flops = 2'000'000;          // 2e6 / 200e9 = 10 us
    c.bytes_weights_read = 1000;  // 1e3 / 50e9 = 0.02 us
    CHECK(modelled_op_ns(c) == 10'000);
    c.bytes_weights_read = 5'000'000;  // 5e6 / 50e9 = 100 us, memory-bound
    CHECK(modelled_op_ns(c) == 100'000);
}

TEST_CASE("Every trace format reads back to the same records and the same summary simulate printed") {
    const fs::path dir = temp_dir();
    for (const auto& cfg : {tiny_config(Family::llama, 4, 2), tiny_config(Family::gpt2, 3, 3)}) {
        for (const SimMode mode : {SimMode::both, SimMode::cached, SimMode::uncached}) {
            const Run r = simulate(cfg, mode);
            const std::string printed = as_json(simulation_report(r.cfg, r.options, r.result, r.inputs, UnitSystem::iec));
            for (const char* name : {"t.csv", "t.jsonl", "t.json"}) {
                for (const bool deterministic : {false, true}) {
                    INFO(cfg.name << " " << name << " deterministic " << deterministic);
                    write_step_trace(dir / name, r.summary, r.result.records, r.inputs, deterministic);
                    const StepTrace t = read_step_trace(dir / name);
                    CHECK(t.format == trace_format_for(dir / name));
                    CHECK(t.inputs == r.inputs);  // "1e5" stays a string
                    REQUIRE(t.records.size() == r.result.records.size());
                    for (std::size_t i = 0; i < t.records.size(); ++i) {
                        const StepRecord &a = t.records[i], &b = r.result.records[i];
                        CHECK(a.cost == b.cost);
                        CHECK(a.mode == b.mode);
                        CHECK(a.step == b.step);
                        CHECK(a.token == b.token);
                        CHECK(a.kv_bytes_resident == b.kv_bytes_resident);
                        CHECK(a.max_abs_dlogit == b.max_abs_dlogit);
                        CHECK(a.wall_ns == (deterministic ? 0 : b.wall_ns));
                        if (!deterministic) CHECK(a.cost.wall_ns == b.cost.wall_ns);
                    }
                    const std::string read_back = as_json(trace_summary_report(t, UnitSystem::iec));
                    if (deterministic)
                        CHECK(without_wall_rows(nlohmann::json::parse(read_back)) ==
                              without_wall_rows(nlohmann::json::parse(printed)));
                    else
                        CHECK(read_back == printed);  // byte for byte, wall time included
                }
            }
        }
    }
    fs::remove_all(dir);
}

TEST_CASE("Bad trace files are refused with the file and line named") {
    const Run r = simulate(tiny_config(Family::llama, 4, 2));
    const fs::path dir = temp_dir();
    write_step_trace(dir / "good.csv", r.summary, r.result.records, r.inputs, false);
    write_step_trace(dir / "good.jsonl", r.summary, r.result.records, r.inputs, false);
    write_step_trace(dir / "good.json", r.summary, r.result.records, r.inputs, false);
    const std::string csv = slurp(dir / "good.csv"), jsonl = slurp(dir / "good.jsonl"), perfetto = slurp(dir / "good.json");
    auto refused = [&](const std::string& name, const std::string& text, const std::string& expected) {
        INFO(name << ": " << expected);
        spit(dir / name, text);
        CHECK_THROWS_WITH_AS(read_step_trace(dir / name), doctest::Contains(((dir / name).string() + ": line ").c_str()), FormatError);
        CHECK_THROWS_WITH_AS(read_step_trace(dir / name), doctest::Contains(expected.c_str()), FormatError);
    };
    const auto csv_lines = std::count(csv.begin(), csv.end(), '\n');
    refused("empty.csv", "", "line 1: empty file");
    refused("blank.jsonl", "\n \n", "empty file");
    // truncated: cut inside the last row / record / event
    refused("cut.csv", csv.substr(0, csv.size() - 40), fmt::format("line {}: ", csv_lines));
    refused("cut.csv", csv.substr(0, csv.size() - 40), "truncated");
    refused("cut.jsonl", jsonl.substr(0, jsonl.size() - 40), "truncated");
    refused("cut.json", perfetto.substr(0, perfetto.size() / 2), "truncated");
    // a whole record missing at the end
    refused("short.csv", csv.substr(0, csv.rfind('\n', csv.size() - 2) + 1), "the file is truncated");
    // wrong columns
    {
        std::string bad = csv;
        bad.replace(bad.find("n_keys"), 6, "n_kays");
        refused("columns.csv", bad, "unknown column 'n_kays'");
        std::string bad_jsonl = jsonl;
        const auto at = bad_jsonl.find("\"n_keys\"", bad_jsonl.find('\n'));
        bad_jsonl.replace(at, 8, "\"n_kays\"");
        refused("columns.jsonl", bad_jsonl, "line 2: unknown column 'n_kays'");
    }
    // mixed formats: JSON Lines records after CSV, CSV rows after a JSON Lines header, two traces concatenated
    refused("mixed.csv", csv + jsonl.substr(jsonl.find('\n') + 1), fmt::format("line {}: ", csv_lines + 1));
    refused("mixed.jsonl", jsonl + csv.substr(csv.rfind('\n', csv.size() - 2) + 1), "not a JSON object");
    refused("twice.csv", csv + csv, "two traces concatenated");
    refused("twice.jsonl", jsonl + jsonl, "two traces concatenated");
    // a hand-edited total that is no longer the sum of its ops
    {
        std::string bad = jsonl;
        const auto line2 = bad.find('\n') + 1;
        const auto at = bad.find("\"flops\":", line2) + 8;
        bad.insert(at, "1");
        refused("edited.jsonl", bad, "line 2: flops is 1");
    }
    // Perfetto: what the timeline draws must agree with the args the numbers are read from
    {
        // the first op slice: its line (one event per line, "," after all but the last) and its event
        const auto start = perfetto.find("\"cat\":\"op\"");
        REQUIRE(start != std::string::npos);
        const auto begin = perfetto.rfind('\n', start) + 1, end = perfetto.find(",\n", start);
        const std::string op_line = perfetto.substr(begin, end - begin);
        const nlohmann::json op = nlohmann::json::parse(op_line);
        const std::string name = op.at("name").get<std::string>();
        auto with_op = [&](const nlohmann::json& edited) {
            return perfetto.substr(0, begin) + edited.dump() + perfetto.substr(end);
        };
        refused("twice.json", perfetto.substr(0, end) + ",\n" + op_line + perfetto.substr(end),
                fmt::format("a second '{}' slice in step 0", name));
        nlohmann::json late = op;
        late["ts"] = op.at("ts").get<double>() + 1e6;  // a second later: past the end of step 0
        refused("late.json", with_op(late), fmt::format("op slice '{}' ends at", name));
        nlohmann::json early = op;
        early["ts"] = op.at("ts").get<double>() - 1.0;  // the first op starts with its step; 1 us before it
        refused("early.json", with_op(early), "before its step");
        nlohmann::json longer = op;
        longer["dur"] = op.at("dur").get<double>() + 0.5;  // 500 ns more than its wall_ns
        refused("longer.json", with_op(longer), "on the timeline and wall_ns");
        nlohmann::json no_ts = op;
        no_ts.erase("ts");
        refused("no-ts.json", with_op(no_ts), "a slice without a numeric 'ts'");
    }
    {
        // the first step slice and the first counter: one event per line, as above
        auto edited = [&](const std::string& marker, const std::function<void(nlohmann::json&)>& edit) {
            const auto at = perfetto.find(marker);
            REQUIRE(at != std::string::npos);
            const auto begin = perfetto.rfind('\n', at) + 1, end = perfetto.find(",\n", at);
            nlohmann::json ev = nlohmann::json::parse(perfetto.substr(begin, end - begin));
            edit(ev);
            return perfetto.substr(0, begin) + ev.dump() + perfetto.substr(end);
        };
        refused("step-dur.json", edited("\"cat\":\"step\"", [](nlohmann::json& ev) { ev["dur"] = ev["dur"].get<double>() * 100; }),
                "step slice lasts");
        refused("counter.json", edited("\"name\":\"FLOPs per step\"", [](nlohmann::json& ev) { ev["args"]["flops"] = 1; }),
                "counter 'FLOPs per step' is 1; its step's flops is");
    }
    // a record's shape and times against the run (line 4: the header, cached step 0, uncached step 0, then cached step 1)
    {
        auto with_record = [&](const std::function<void(nlohmann::json&)>& edit) {
            std::vector<std::string> lines;
            std::istringstream in(jsonl);
            for (std::string l; std::getline(in, l);) lines.push_back(l);
            nlohmann::json rec = nlohmann::json::parse(lines.at(3));
            REQUIRE(rec.at("step") == 1);
            REQUIRE(rec.at("mode") == "cached");
            edit(rec);
            lines[3] = rec.dump();
            std::string out;
            for (const auto& l : lines) out += l + "\n";
            return out;
        };
        // cached step 1 runs one token at position P = 5 (a 5-token prompt), attending at most 6 keys
        refused("tokens.jsonl", with_record([](nlohmann::json& r) { r["n_tokens"] = -5; }), "line 4: cached step 1 ran -5 tokens; a prompt of 5 tokens gives 1");
        refused("position.jsonl", with_record([](nlohmann::json& r) { r["position"] = 2; }), "at position 2; a prompt of 5 tokens puts it at 5");
        refused("keys.jsonl", with_record([](nlohmann::json& r) { r["n_keys"] = 7; }), "attends 7 keys; expected 1..6");
        refused("op-wall.jsonl", with_record([](nlohmann::json& r) { r["q_proj.wall_ns"] = -1; }), "q_proj.wall_ns -1; expected 0 or more");
        {  // a key written twice: the last value would win silently
            const auto line2_end = jsonl.find('\n', jsonl.find('\n') + 1);
            std::string dup = jsonl;
            dup.insert(line2_end - 1, ",\"n_tokens\":99");
            refused("dup.jsonl", dup, "line 2: key 'n_tokens' appears twice in one object");
        }
        refused("rate.jsonl", with_record([](nlohmann::json& r) { r["gflop_per_s"] = 999.0; }), "gflop_per_s is 999 but its counts give");
        refused("resident.jsonl", with_record([](nlohmann::json& r) { r["kv_bytes_resident"] = std::uint64_t{1} << 40; }),
                "more than the");  // more than the cache the run allocated
        // two steps of 2^63 - 1 ns each: their sum does not fit (it printed a negative wall time)
        std::string huge = with_record([](nlohmann::json& r) {
            const double ns = static_cast<double>(std::numeric_limits<std::int64_t>::max());
            r["wall_ns"] = std::numeric_limits<std::int64_t>::max();
            r["gflop_per_s"] = r["flops"].get<double>() / ns;  // the rates edited to match, as a careful edit would
            r["gb_per_s"] = r["bytes_total"].get<double>() / ns;
        });
        refused("wall.jsonl", huge, "add up past what 64 bits hold by step 1");
    }
    // CSV reals: decimal and finite (strtod took "nan", "inf" and hex floats)
    {
        std::vector<std::string> lines;
        std::istringstream in(csv);
        for (std::string l; std::getline(in, l);) lines.push_back(l);
        std::size_t header = 0;
        while (lines[header].rfind('#', 0) == 0) ++header;
        auto cells_of = [](const std::string& l) {
            std::vector<std::string> cells;
            std::istringstream c(l);
            for (std::string cell; std::getline(c, cell, ',');) cells.push_back(cell);
            return cells;
        };
        const auto names = cells_of(lines[header]);
        const auto column = static_cast<std::size_t>(std::find(names.begin(), names.end(), "max_abs_dlogit") - names.begin());
        REQUIRE(column < names.size());
        for (const char* value : {"nan", "inf", "0x1p-3"}) {
            auto cells = cells_of(lines[header + 1]);
            cells[column] = value;
            std::string row, out;
            for (std::size_t i = 0; i < cells.size(); ++i) row += (i ? "," : "") + cells[i];
            for (std::size_t i = 0; i < lines.size(); ++i) out += (i == header + 1 ? row : lines[i]) + "\n";
            refused("real.csv", out, fmt::format("column 'max_abs_dlogit' is '{}'; expected a number or empty", value));
        }
    }
    // a run summary that contradicts itself or its records (each was printed as it stood)
    {
        auto with_run = [&](const std::string& from, const std::string& to) {
            std::string bad = csv;
            const auto at = bad.find(from);
            REQUIRE(at != std::string::npos);
            return bad.replace(at, from.size(), to);
        };
        refused("flips.csv", with_run("# run.argmax_flips=0", "# run.argmax_flips=5"), "'argmax_flips' is 5, but 0 steps have argmax_flip set");
        refused("interrupted.csv", with_run("# run.interrupted=false", "# run.interrupted=true"),
                "9 of 9 steps done with 'interrupted' true");  // the run: 9 steps
        refused("diverged.csv", with_run("# run.first_divergent_step=null", "# run.first_divergent_step=100"),
                "'first_divergent_step' 100 in a run of 9 steps");
        refused("counted.csv", with_run("# run.counted=true", "# run.counted=false"), "'counted' is false (counting off), but the steps hold");
        refused("more.csv", with_run("# run.steps_done=9", "# run.steps_done=8"), "8 of 9 steps done with 'interrupted' false");
        std::string fewer = with_run("# run.steps_done=9", "# run.steps_done=8");
        fewer.replace(fewer.find("# run.steps_requested=9"), 23, "# run.steps_requested=8");
        refused("fewer.csv", fewer, "9 cached steps; the run summary says 8 were done: the file has more steps than its run");
    }
    // inputs the reports read must have their types (they crashed the summary as internal errors)
    {
        const auto second = csv.find('\n') + 1;
        refused("layers.csv", csv.substr(0, second) + "# layers=abc\n" + csv.substr(second), "line 2: input 'layers' is \"abc\"; expected an integer");
        std::string bad = jsonl;
        bad.replace(bad.find("\"inputs\":{"), 10, "\"inputs\":{\"kv_dtype\":8,");
        refused("kv_dtype.jsonl", bad, "line 1: input 'kv_dtype' is 8; expected a string");
        bad = perfetto;
        bad.replace(bad.find("\"inputs\":{"), 10, "\"inputs\":{\"window\":-1,");
        refused("window.json", bad, "input 'window' is -1; expected an integer, 0 or more");
    }
    refused("not-a-trace.json", "{\"a\": 1}\n", "without a 'traceEvents' array");
    refused("text.csv", "hello,world\n1,2\n", "line 1: 'hello,world' is not a kvlab trace header");
    CHECK_THROWS_AS(read_step_trace(dir / "missing.csv"), InputError);  // a missing input file: exit code 2
    fs::remove_all(dir);
}

TEST_CASE("The steps table shows every K-th step and the last, with an optional per-op breakdown") {
    CHECK(steps_shown(9, 1).size() == 9);
    CHECK(steps_shown(9, 4) == std::vector<std::int64_t>{0, 4, 8});
    CHECK(steps_shown(10, 4) == std::vector<std::int64_t>{0, 4, 8, 9});
    CHECK_THROWS_AS(steps_shown(9, 0), UsageError);
    const Run r = simulate(tiny_config(Family::llama, 4, 2));
    const fs::path dir = temp_dir();
    write_step_trace(dir / "t.jsonl", r.summary, r.result.records, r.inputs, false);
    const StepTrace t = read_step_trace(dir / "t.jsonl");
    const Report plain = trace_steps_report(t, 4, false, UnitSystem::iec);
    REQUIRE(plain.tables.size() == 1);
    CHECK(plain.tables[0].rows.size() == 3 * 2);  // steps 0, 4, 8, both modes
    const Report ops = trace_steps_report(t, 4, true, UnitSystem::iec);
    REQUIRE(ops.tables.size() == 2);
    // llama runs 19 of the 21 ops (no pos_embed, no gelu activation apart from swiglu): rows per step and mode
    CHECK(ops.tables[1].rows.size() == 3 * 2 * 20);
    fs::remove_all(dir);
}

TEST_CASE("A comparison's small ratios keep three significant digits, and a ratio over A = 0 is '-'") {
    const Report report =
        compare_runs(simulate(tiny_config(Family::llama, 12, 12)), "mha.csv", simulate(tiny_config(Family::llama, 12, 1)), "mqa.csv");
    const auto j = nlohmann::json::parse(as_json(report));
    const auto& totals = report.tables.at(0);
    int seen = 0;
    for (std::size_t i = 0; i < totals.rows.size(); ++i) {
        const auto& row = j["tables"][0]["rows"][i];
        const std::string ratio_text = totals.rows[i].back().text;
        if (row["mode"] == "cached" && row["metric"] == "kv_bytes_resident") {
            ++seen;  // 1 KV head of 12: 1/12 = 0.0833, which two decimals would print as 0.08x
            CHECK(ratio_text == "0.0833x");
            CHECK(row["ratio"].get<double>() == doctest::Approx(1.0 / 12));
        }
        if (row["mode"] == "uncached" && row["metric"] == "bytes_kv_read") {
            ++seen;  // the uncached mode reads no cache: 0 / 0 has no ratio
            CHECK(ratio_text == "-");
            CHECK(row["ratio"].is_null());
        }
    }
    CHECK(seen == 2);
}

TEST_CASE("An argmax flip marks both records of its step and counts once in the run summary") {
    // what simulate writes on a near-tie (simulator.cpp): step 0 of a --mode both trace, flipped
    const Run r = simulate(tiny_config(Family::llama, 4, 2));
    const fs::path dir = temp_dir();
    write_step_trace(dir / "t.jsonl", r.summary, r.result.records, r.inputs, true);
    std::vector<std::string> lines;
    {
        std::ifstream in(dir / "t.jsonl");
        for (std::string l; std::getline(in, l);) lines.push_back(l);
    }
    nlohmann::json header = nlohmann::json::parse(lines[0]);
    REQUIRE(header.at("run").at("argmax_flips") == 0);
    header["run"]["argmax_flips"] = 1;
    lines[0] = header.dump();
    for (const std::size_t i : {1, 2}) {  // cached step 0, then uncached step 0
        nlohmann::json rec = nlohmann::json::parse(lines[i]);
        REQUIRE(rec.at("step") == 0);
        rec["argmax_flip"] = true;
        lines[i] = rec.dump();
    }
    std::ofstream out(dir / "flip.jsonl");
    for (const auto& l : lines) out << l << "\n";
    out.close();
    const StepTrace t = read_step_trace(dir / "flip.jsonl");
    CHECK(t.run.n_argmax_flips == 1);
    fs::remove_all(dir);
}

TEST_CASE("A comparison names the mode and the inputs only one trace has") {
    Run both = simulate(tiny_config(Family::llama, 4, 4));
    const Run cached = simulate(tiny_config(Family::llama, 4, 4), SimMode::cached);
    both.inputs["weight_dtype"] = "bf16";  // as a newer trace records it; the other has no such key
    const Report report = compare_runs(both, "both.csv", cached, "cached.csv");
    const auto& notes = report.tables.at(0).notes;
    auto has = [&](const std::string& text) {
        return std::any_of(notes.begin(), notes.end(), [&](const std::string& n) { return n.find(text) != std::string::npos; });
    };
    CHECK(has("the uncached mode is only in A: not compared"));
    CHECK(has("weight_dtype \"bf16\" vs absent"));
}

TEST_CASE("Comparing MHA with GQA traces shows KV bytes falling by the head ratio") {
    const Report report =
        compare_runs(simulate(tiny_config(Family::llama, 4, 4)), "mha.csv", simulate(tiny_config(Family::llama, 4, 1)), "gqa.json");
    REQUIRE(report.tables.size() == 2);
    const auto j = nlohmann::json::parse(as_json(report));
    bool seen = false;
    for (const auto& row : j["tables"][0]["rows"])
        if (row["mode"] == "cached" && row["metric"] == "kv_bytes_resident") {
            seen = true;
            CHECK(row["ratio"].get<double>() == doctest::Approx(0.25));  // 1 KV head of 4: a quarter of the cache
            CHECK(row["delta"].get<std::int64_t>() < 0);
        }
    CHECK(seen);
    CHECK(j["tables"][1]["rows"].size() == 9 * 2);
    CHECK(j["tables"][1]["rows"][2]["kv_read_ratio"].get<double>() == doctest::Approx(0.25));  // step 1, cached
}

TEST_CASE("Plots are drawn by gnuplot, and its absence names the package") {
    const Run r = simulate(tiny_config(Family::llama, 4, 2));
    const fs::path dir = temp_dir();
    write_step_trace(dir / "t.csv", r.summary, r.result.records, r.inputs, false);
    const StepTrace t = read_step_trace(dir / "t.csv");
    const std::vector<PlotInput> one{{&t, ""}};
    CHECK_THROWS_WITH_AS(plot_traces(one, dir / "chart.pdf", PlotScale::log), doctest::Contains("expected .svg or .png"), UsageError);
    CHECK_THROWS_WITH_AS(plot_traces(std::vector<PlotInput>(7, {&t, "x"}), dir / "chart.svg", PlotScale::log),
                         doctest::Contains("7 traces; expected 1 to 6"), UsageError);
    ::setenv("KVLAB_GNUPLOT", "/nonexistent/gnuplot", 1);
    CHECK_THROWS_WITH_AS(plot_traces(one, dir / "chart.svg", PlotScale::log), doctest::Contains("gnuplot-nox"), UnavailableError);
    ::unsetenv("KVLAB_GNUPLOT");
    bool have_gnuplot = true;
    try {
        find_gnuplot();
    } catch (const UnavailableError&) {
        have_gnuplot = false;
    }
    if (have_gnuplot) {
        plot_traces(one, dir / "chart.svg", PlotScale::linear);
        const std::string svg = slurp(dir / "chart.svg");
        CHECK(svg.find("<svg") != std::string::npos);
        CHECK(svg.find("KiB (2</tspan>") != std::string::npos);  // byte axes in binary units, as the tables
        CHECK(svg.find(" FLOP)</tspan>") != std::string::npos);   // FLOP axes name their decimal prefix
        CHECK(svg.find("FLOPs so far") != std::string::npos); // the cumulative panel
        // two traces overlaid: every series is labelled with its trace
        plot_traces({{&t, "mha"}, {&t, "gqa"}}, dir / "both.svg", PlotScale::linear);
        const std::string both = slurp(dir / "both.svg");
        for (const char* series : {"mha cached", "mha uncached", "gqa cached", "gqa uncached"}) CHECK(both.find(series) != std::string::npos);
        plot_traces(one, dir / "chart.png", PlotScale::log);
        CHECK(slurp(dir / "chart.png").substr(1, 3) == "PNG");
        for (const auto& entry : fs::directory_iterator(dir)) CHECK(entry.path().filename().string()[0] != '.');
    } else {
        MESSAGE("gnuplot not installed: drawing not checked");
    }
    fs::remove_all(dir);
}

// docs/trace-format.md is what users read; the schema is what the program writes. Each row of the
// doc's "Columns" table must be the schema's column of that position, with its type and unit, and
// every per-op field must be named in the text with the unit of the step column of the same name.
TEST_CASE("docs/trace-format.md's column table is the trace schema, in order, with types and units") {
    std::ifstream in(std::string(kvlab::test::docs_dir) + "/trace-format.md");
    REQUIRE(in);
    std::stringstream text;
    text << in.rdbuf();
    std::istringstream lines(text.str());
    std::vector<std::array<std::string, 3>> rows;  // column, type, unit
    bool in_columns = false;
    for (std::string line; std::getline(lines, line);) {
        if (line.rfind("## ", 0) == 0) in_columns = line == "## Columns";
        if (!in_columns || line.rfind("| `", 0) != 0) continue;
        std::vector<std::string> cells;
        std::istringstream row(line.substr(1));
        for (std::string cell; std::getline(row, cell, '|');) {
            const auto b = cell.find_first_not_of(' '), e = cell.find_last_not_of(' ');
            cells.push_back(b == std::string::npos ? "" : cell.substr(b, e - b + 1));
        }
        REQUIRE(cells.size() >= 3);
        rows.push_back({cells[0].substr(1, cells[0].size() - 2), cells[1], cells[2]});
    }
    const auto doc_type = [](FieldType t) -> std::string {
        switch (t) {
            case FieldType::text: return "string";
            case FieldType::boolean: return "boolean";
            case FieldType::real: return "number";
            case FieldType::real_or_null: return "number or empty/null";
            case FieldType::integer:
            case FieldType::count: return "integer";
        }
        return "?";
    };
    const auto fields = step_fields();
    REQUIRE(rows.size() == fields.size());
    std::map<std::string, std::string> step_unit;
    for (std::size_t i = 0; i < fields.size(); ++i) {
        INFO("row ", i + 1, " of the table: ", rows[i][0]);
        CHECK(rows[i][0] == fields[i].name);
        CHECK(rows[i][1] == doc_type(fields[i].type));
        CHECK(rows[i][2] == fields[i].unit);
        step_unit[std::string(fields[i].name)] = fields[i].unit;
    }
    for (const OpField& f : op_fields()) {
        INFO("op field ", f.name);
        CHECK(text.str().find("`<op>." + std::string(f.name) + "`") != std::string::npos);
        CHECK(step_unit.at(std::string(f.name)) == f.unit);
    }
}

TEST_CASE("A serve JSONL trace carries each step's block map and reads it back; CSV and older traces read without one") {
    const fs::path dir = temp_dir();
    // two steps of a paged pool of 4 blocks of 4 rows (hand-made): requests 0 and 1 share block 0, block 3 is cached idle
    ServeResult r;
    r.pool_rows = 16;
    ServeStep s;
    s.step = 0;
    s.n_seqs = s.n_tokens = s.n_running = 2;
    s.rows_in_use = 12;   // blocks 0, 1, 2 held
    s.rows_tokens = 4 + 3 + 2;
    s.rows_cached = 4;
    s.pool_map = {{0, 4, true}, {0, 3, false}, {1, 2, false}, {kv_cell_cached, 4, false}};
    r.steps.push_back(s);
    s.step = 1;
    s.rows_tokens = 4 + 4 + 3;
    s.pool_map = {{0, 4, true}, {0, 4, false}, {1, 3, false}, {kv_cell_cached, 4, false}};
    r.steps.push_back(s);
    ServeOptions o;
    o.pool = {KvLayout::paged, 16, 4, true};
    const nlohmann::json inputs = {{"token_bytes", 64}, {"model", "hand-made"}};
    write_serve_trace(dir / "s.jsonl", {o}, {r}, inputs, true);
    const ServeTrace t = read_serve_trace(dir / "s.jsonl");
    REQUIRE(t.steps.size() == 1);
    CHECK(t.map_cell_rows == std::vector<std::int64_t>{4});
    CHECK(t.steps[0][0].pool_map == r.steps[0].pool_map);
    CHECK(t.steps[0][1].pool_map == r.steps[1].pool_map);

    write_serve_trace(dir / "s.csv", {o}, {r}, inputs, true);  // CSV has no map
    const ServeTrace c = read_serve_trace(dir / "s.csv");
    CHECK(c.map_cell_rows == std::vector<std::int64_t>{0});
    CHECK(c.steps[0][0].pool_map.empty());

    // an older trace: the same records without pool_map read as before, with no map
    std::ifstream in(dir / "s.jsonl");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::string old = text;
    for (std::size_t at; (at = old.find(",\"pool_map\":{")) != std::string::npos;) old.erase(at, old.find("]}", old.find("\"shared\"", at)) + 2 - at);
    const ServeTrace o2 = parse_serve_trace(old, "old.jsonl");
    CHECK(o2.map_cell_rows == std::vector<std::int64_t>{0});
    CHECK(o2.steps[0].size() == 2);

    // an edited map whose filled rows do not add up to the step's rows holding tokens is refused, naming the line
    std::string edited = text;
    edited.replace(edited.find("\"fill\":[4,3,2,4]"), 16, "\"fill\":[4,4,2,4]");
    CHECK_THROWS_WITH_AS(parse_serve_trace(edited, "e.jsonl"), doctest::Contains("e.jsonl:2: pool_map: the held cells' fill adds up to 10"), FormatError);
}

TEST_CASE("The HTML report escapes every text it shows, and no data can close its script") {
    CHECK(html_escape("<b a=\"x\">R&D's</b>") == "&lt;b a=&quot;x&quot;&gt;R&amp;D&#39;s&lt;/b&gt;");
    CHECK(script_json(nlohmann::json{{"name", "</script><script>alert(1)</script>"}}) ==
          "{\"name\":\"\\u003c/script\\u003e\\u003cscript\\u003ealert(1)\\u003c/script\\u003e\"}");
}
