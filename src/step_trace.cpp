#include "kvlab/step_trace.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <system_error>
#include <unistd.h>

#include <fmt/format.h>

#include "kvlab/error.hpp"

namespace kvlab {

namespace fs = std::filesystem;

namespace {

const char* units_line =
    "flops and transcendentals: operations (a multiply-add = 2 FLOPs); bytes_* and kv_bytes_resident: bytes; "
    "wall_ns: nanoseconds; gflop_per_s: 1e9 FLOP/s; gb_per_s: 1e9 bytes/s; flop_per_byte: FLOP per byte moved; "
    "max_abs_dlogit: logit units";

fs::path temp_path_for(const fs::path& path) {
    return path.parent_path() / fmt::format(".{}.tmp-{}", path.filename().string(), ::getpid());
}

double ratio(double num, double den) { return den > 0.0 ? num / den : 0.0; }

std::string csv_value(const nlohmann::json& v) {
    if (v.is_null()) return "";
    if (v.is_string()) return v.get<std::string>();
    if (v.is_boolean()) return v.get<bool>() ? "1" : "0";
    return v.dump();
}

}  // namespace

TraceFormat trace_format_for(const fs::path& path) {
    const auto ext = path.extension().string();
    if (ext == ".csv") return TraceFormat::csv;
    if (ext == ".jsonl") return TraceFormat::jsonl;
    throw UsageError(fmt::format("--trace: '{}' has extension '{}'; expected .csv or .jsonl", path.string(), ext));
}

void check_trace_writable(const fs::path& path) {
    trace_format_for(path);
    std::error_code ec;
    if (fs::is_directory(path, ec))
        throw UsageError(fmt::format("--trace: '{}' is a directory; expected a file name", path.string()));
    const fs::path dir = path.parent_path().empty() ? fs::path(".") : path.parent_path();
    if (!fs::is_directory(dir, ec))
        throw UsageError(fmt::format("--trace: cannot write '{}': directory '{}' does not exist", path.string(), dir.string()));
    const fs::path probe = temp_path_for(path);
    {
        std::ofstream out(probe);
        if (!out)
            throw UsageError(fmt::format("--trace: cannot write '{}': {}", path.string(), std::strerror(errno)));
    }
    fs::remove(probe, ec);
}

std::vector<std::string> trace_columns(bool deterministic) {
    std::vector<std::string> cols = {
        "mode", "step", "phase", "position", "n_tokens", "n_keys", "flops", "flops_matmul", "flops_attention",
        "flops_other", "transcendentals", "bytes_weights_read", "bytes_act_read", "bytes_act_written", "bytes_kv_read",
        "bytes_kv_written", "bytes_total", "kv_bytes_resident", "flop_per_byte", "token", "max_abs_dlogit",
        "argmax_flip"};
    if (!deterministic) cols.insert(cols.end(), {"wall_ns", "gflop_per_s", "gb_per_s"});
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
    return j;
}

void write_step_trace(const fs::path& path, const std::vector<StepRecord>& records, const nlohmann::json& inputs,
                      bool deterministic) {
    const TraceFormat format = trace_format_for(path);
    const auto columns = trace_columns(deterministic);
    const fs::path temp = temp_path_for(path);
    {
        std::ofstream out(temp, std::ios::binary);
        if (!out) throw IoError(fmt::format("--trace: cannot write '{}': {}", temp.string(), std::strerror(errno)));
        if (format == TraceFormat::csv) {
            out << fmt::format("# kvlab simulate step trace, format {} (docs/trace-format.md)\n", trace_format_version);
            out << "# units: " << units_line << "\n";
            for (const auto& [key, value] : inputs.items()) out << "# " << key << "=" << csv_value(value) << "\n";
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
                                     {"inputs", inputs}};
            out << header.dump() << "\n";
            for (const auto& r : records) out << trace_record_json(r, deterministic).dump() << "\n";
        }
        out.flush();
        if (!out) {
            std::error_code ec;
            fs::remove(temp, ec);
            throw IoError(fmt::format("--trace: writing '{}' failed: {}", temp.string(), std::strerror(errno)));
        }
    }
    std::error_code ec;
    fs::rename(temp, path, ec);
    if (ec) {
        const std::string reason = ec.message();
        fs::remove(temp, ec);
        throw IoError(fmt::format("--trace: cannot rename '{}' to '{}': {}", temp.string(), path.string(), reason));
    }
}

}  // namespace kvlab
