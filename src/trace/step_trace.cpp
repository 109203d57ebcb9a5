#include "trace/step_trace.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <system_error>

#include <fmt/format.h>

#include "core/atomic_write.hpp"
#include "kvlab/core/error.hpp"
#include "core/json_input.hpp"
#include "trace/perfetto_trace.hpp"
#include "kvlab/core/text.hpp"

namespace kvlab {

namespace fs = std::filesystem;

StepIndex::StepIndex(const StepTrace& trace) {
    for (const StepRecord& r : trace.records) by_step_[static_cast<int>(r.mode)].emplace(r.step, &r);  // the first of a repeat, as a search found
}

const StepRecord* StepIndex::find(StepMode mode, std::int64_t step) const {
    const auto& m = by_step_[static_cast<int>(mode)];
    const auto it = m.find(step);
    return it == m.end() ? nullptr : it->second;
}

namespace {

std::string csv_value(const nlohmann::json& v) {
    if (v.is_null()) return "";
    if (v.is_string()) return v.get<std::string>();
    if (v.is_boolean()) return v.get<bool>() ? "1" : "0";
    return v.dump();
}

// A header value: strings as they are, unless they would read back as something else (a number,
// true, "quoted", empty) or hold a control byte (a line break would end the line) or bytes that are not
// UTF-8; those, and non-strings, as JSON (escaped, invalid UTF-8 as U+FFFD).
std::string csv_header_value(const nlohmann::json& v) {
    if (!v.is_string()) return json_dump(v);
    const auto s = v.get<std::string>();
    const bool control = std::any_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7F; });
    if (s.empty() || control || !is_valid_utf8(s) || nlohmann::json::accept(s)) return json_dump(v);
    return s;
}

}  // namespace

std::string_view trace_format_name(TraceFormat format) {
    switch (format) {
        case TraceFormat::csv: return "csv";
        case TraceFormat::jsonl: return "jsonl";
        case TraceFormat::perfetto: return "perfetto";
    }
    return "csv";
}

TraceFormat trace_format_for(const fs::path& path) {
    const auto ext = path.extension().string();
    if (ext == ".csv") return TraceFormat::csv;
    if (ext == ".jsonl") return TraceFormat::jsonl;
    if (ext == ".json") return TraceFormat::perfetto;
    throw UsageError(fmt::format("--trace: {} has extension {}; expected .csv, .jsonl or .json (Perfetto)",
                                 quote(path.string()), quote(ext, 20)));
}

void check_trace_writable(const fs::path& path) {
    std::error_code ec;
    if (fs::is_directory(path, ec))
        throw UsageError(fmt::format("--trace: {} is a directory; expected a file name ending in .csv, .jsonl or .json",
                                     quote(path.string())));
    trace_format_for(path);
    check_output_path(path, "--trace");
}

nlohmann::json run_summary_json(const RunSummary& run) {
    nlohmann::json j = {
        {"display_name", run.display_name},
        {"mode", choice_name(sim_mode_choices, run.mode)},
        {"prompt_tokens", run.n_prompt},
        {"steps_requested", run.n_steps},
        {"steps_done", run.n_steps_done},
        {"interrupted", run.interrupted},
        {"counted", run.counted},
        {"kv_cache_bytes", run.kv_cache_bytes},
        {"max_abs_dlogit", run.max_abs_dlogit},
        {"argmax_flips", run.n_argmax_flips},
        {"first_divergent_step", run.first_divergent_step ? nlohmann::json(*run.first_divergent_step) : nlohmann::json(nullptr)},
        {"divergent_dlogit", run.divergent_dlogit},
        {"divergent_tolerance", run.divergent_tolerance},
        {"kv_quality", run.kv_quality ? nlohmann::json{{"max_abs_dlogit", run.kv_quality->max_abs_dlogit},
                                                       {"mean_kl", run.kv_quality->mean_kl},
                                                       {"max_kl", run.kv_quality->max_kl},
                                                       {"argmax_agree", run.kv_quality->n_agree},
                                                       {"steps", run.kv_quality->n_steps}}
                                      : nlohmann::json(nullptr)},
    };
    // --repeat N > 1: each run's summed wall time per mode (added in kvlab 51; absent for one run)
    if (!run.repeats.cached_ns.empty() || !run.repeats.uncached_ns.empty())
        j["repeat_wall_ns"] = {{"cached", run.repeats.cached_ns}, {"uncached", run.repeats.uncached_ns}};
    // the host's load as the run ended (added in issue 51; absent with --deterministic)
    if (run.host_load) j["host_load"] = {{"load1", run.host_load->load1}, {"cores", run.host_load->n_cores}};
    return j;
}

void write_step_trace(const fs::path& path, const RunSummary& measured_run, const std::vector<StepRecord>& records,
                      const nlohmann::json& inputs, bool deterministic) {
    // --deterministic: nothing measured goes in, --repeat's wall times and the host's load included
    RunSummary run = measured_run;
    if (deterministic) run.repeats = {}, run.host_load.reset();
    const TraceFormat format = trace_format_for(path);
    const auto columns = trace_columns(deterministic);
    write_atomically(path, "--trace", [&](std::ostream& out) {
        if (format == TraceFormat::perfetto) {
            write_perfetto_trace(out, run, records, inputs, deterministic);
        } else if (format == TraceFormat::csv) {
            out << fmt::format("# kvlab simulate step trace, format {} (docs/trace-format.md)\n", trace_format_version);
            out << "# units: " << units_line << "\n";
            const nlohmann::json run_json = run_summary_json(run);
            for (const auto& [key, value] : run_json.items())
                out << "# run." << key << "=" << csv_header_value(value) << "\n";
            for (const auto& [key, value] : inputs.items()) out << "# " << key << "=" << csv_header_value(value) << "\n";
            for (std::size_t c = 0; c < columns.size(); ++c) out << (c ? "," : "") << columns[c];
            out << "\n";
            for (const auto& r : records) {
                const auto j = trace_record_json(r, deterministic);
                for (std::size_t c = 0; c < columns.size(); ++c) out << (c ? "," : "") << csv_value(j.at(columns[c]));
                out << "\n";
            }
        } else {
            nlohmann::json header = {{"kvlab_trace", trace_format_version},
                                     {"units", units_line},
                                     {"columns", columns},
                                     {"run", run_summary_json(run)},
                                     {"inputs", inputs}};
            out << json_dump(header) << "\n";
            for (const auto& r : records) out << json_dump(trace_record_json(r, deterministic)) << "\n";
        }
    });
}

}  // namespace kvlab
