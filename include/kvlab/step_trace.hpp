// Step traces: one record per step per mode, as CSV or JSON Lines (docs/trace-format.md).
// Written atomically: a temporary file in the same directory, renamed over the target at the end.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvlab/simulator.hpp"

namespace kvlab {

enum class TraceFormat { csv, jsonl };
inline constexpr int trace_format_version = 1;

// From the extension: .csv or .jsonl. Throws UsageError naming --trace.
TraceFormat trace_format_for(const std::filesystem::path& path);
// Before any work: the extension is known and a file can be created next to `path`.
// Throws UsageError naming --trace and the reason.
void check_trace_writable(const std::filesystem::path& path);

// Column names in order; `deterministic` drops wall_ns, gflop_per_s and gb_per_s.
std::vector<std::string> trace_columns(bool deterministic);
// One record as a JSON object keyed by trace_columns (max_abs_dlogit null when not compared).
nlohmann::json trace_record_json(const StepRecord& record, bool deterministic);

// `inputs` (flat JSON object) goes to the header. Throws IoError if the file cannot be written.
void write_step_trace(const std::filesystem::path& path, const std::vector<StepRecord>& records,
                      const nlohmann::json& inputs, bool deterministic);

}  // namespace kvlab
