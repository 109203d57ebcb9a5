#include "trace/step_trace.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <system_error>

#include <fmt/format.h>

#include "core/atomic_write.hpp"
#include "core/error.hpp"
#include "core/json_input.hpp"
#include "trace/perfetto_trace.hpp"
#include "core/text.hpp"

namespace kvlab {

namespace fs = std::filesystem;

namespace {

const char* units_line =
    "flops and transcendentals: operations (a multiply-add = 2 FLOPs); bytes_* and kv_bytes_resident: bytes; "
    "wall_ns: nanoseconds; gflop_per_s: 1e9 FLOP/s; gb_per_s: 1e9 bytes/s; flop_per_byte: FLOP per byte moved; "
    "max_abs_dlogit: logit units; <op>.*: the same per op, summed over layers";

double ratio(double num, double den) { return den > 0.0 ? num / den : 0.0; }

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

std::vector<std::string> trace_op_fields(bool deterministic) {
    std::vector<std::string> fields = {"flops",          "transcendentals",   "bytes_weights_read", "bytes_act_read",
                                       "bytes_act_written", "bytes_kv_read", "bytes_kv_written"};
    if (!deterministic) fields.push_back("wall_ns");
    return fields;
}

std::vector<std::string> trace_columns(bool deterministic) {
    std::vector<std::string> cols = {
        "mode", "step", "phase", "position", "n_tokens", "n_keys", "flops", "flops_matmul", "flops_attention",
        "flops_other", "transcendentals", "bytes_weights_read", "bytes_act_read", "bytes_act_written", "bytes_kv_read",
        "bytes_kv_written", "bytes_total", "kv_bytes_resident", "flop_per_byte", "token", "max_abs_dlogit",
        "argmax_flip"};
    if (!deterministic) cols.insert(cols.end(), {"wall_ns", "gflop_per_s", "gb_per_s"});
    const auto fields = trace_op_fields(deterministic);
    for (int i = 0; i < n_ops; ++i)
        for (const auto& f : fields) cols.push_back(fmt::format("{}.{}", op_name(static_cast<Op>(i)), f));
    return cols;
}

nlohmann::json trace_record_json(const StepRecord& r, bool deterministic) {
    const OpCost total = r.cost.total();
    nlohmann::json j = nlohmann::json::object();
    j["mode"] = std::string(step_mode_name(r.mode));
    j["step"] = r.step;
    j["phase"] = r.step == 0 ? "prefill" : "decode";
    j["position"] = r.position;
    j["n_tokens"] = r.n_tokens;
    j["n_keys"] = r.n_keys;
    j["flops"] = total.flops;
    j["flops_matmul"] = r.cost.flops(OpCategory::matmul);
    j["flops_attention"] = r.cost.flops(OpCategory::attention);
    j["flops_other"] = r.cost.flops(OpCategory::other);
    j["transcendentals"] = total.transcendentals;
    j["bytes_weights_read"] = total.bytes_weights_read;
    j["bytes_act_read"] = total.bytes_act_read;
    j["bytes_act_written"] = total.bytes_act_written;
    j["bytes_kv_read"] = total.bytes_kv_read;
    j["bytes_kv_written"] = total.bytes_kv_written;
    j["bytes_total"] = total.bytes_total();
    j["kv_bytes_resident"] = r.kv_bytes_resident;
    j["flop_per_byte"] = ratio(static_cast<double>(total.flops), static_cast<double>(total.bytes_total()));
    j["token"] = r.token;
    j["max_abs_dlogit"] = r.max_abs_dlogit >= 0.0 ? nlohmann::json(r.max_abs_dlogit) : nlohmann::json(nullptr);
    j["argmax_flip"] = r.argmax_flip;
    if (!deterministic) {
        const double seconds = static_cast<double>(r.wall_ns) * 1e-9;
        j["wall_ns"] = r.wall_ns;
        j["gflop_per_s"] = ratio(static_cast<double>(total.flops) * 1e-9, seconds);
        j["gb_per_s"] = ratio(static_cast<double>(total.bytes_total()) * 1e-9, seconds);
    }
    for (int i = 0; i < n_ops; ++i) {
        const Op op = static_cast<Op>(i);
        const OpCost& c = r.cost.at(op);
        const auto prefix = std::string(op_name(op)) + ".";
        j[prefix + "flops"] = c.flops;
        j[prefix + "transcendentals"] = c.transcendentals;
        j[prefix + "bytes_weights_read"] = c.bytes_weights_read;
        j[prefix + "bytes_act_read"] = c.bytes_act_read;
        j[prefix + "bytes_act_written"] = c.bytes_act_written;
        j[prefix + "bytes_kv_read"] = c.bytes_kv_read;
        j[prefix + "bytes_kv_written"] = c.bytes_kv_written;
        if (!deterministic) j[prefix + "wall_ns"] = r.cost.wall_ns_of(op);
    }
    return j;
}

nlohmann::json run_summary_json(const RunSummary& run) {
    return {
        {"display_name", run.display_name},
        {"mode", run.mode == SimMode::both ? "both" : run.mode == SimMode::cached ? "cached" : "uncached"},
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
    };
}

void write_step_trace(const fs::path& path, const RunSummary& run, const std::vector<StepRecord>& records,
                      const nlohmann::json& inputs, bool deterministic) {
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
