// Step traces: one record per step per mode, per-op costs included, as CSV, JSON Lines or Chrome
// Trace Event JSON (Perfetto), docs/trace-format.md. trace_reader reads them back.
// Written atomically: a temporary file in the same directory, renamed over the target at the end.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "report/simulation_report.hpp"
#include "kvlab/sim/simulator.hpp"
#include "trace/trace_schema.hpp"

namespace kvlab {

enum class TraceFormat { csv, jsonl, perfetto };
inline constexpr int trace_format_version = 2;
std::string_view trace_format_name(TraceFormat format);  // "csv" | "jsonl" | "perfetto"

// A trace as written or read back: the run's inputs and summary, and its records in file order.
struct StepTrace {
    nlohmann::json inputs = nlohmann::json::object();  // flat object of run inputs
    RunSummary run;                                     // run.has_wall_time false: --deterministic
    std::vector<StepRecord> records;
    TraceFormat format = TraceFormat::csv;              // set by the reader
};

// A trace's records by mode and step, indexed in one pass: find() is O(1), so a report or chart that
// looks up every step stays linear in the steps (a search of all records per lookup made trace
// compare take 20 s at 40k steps, trace plot over 54 s at 100k).
class StepIndex {
public:
    explicit StepIndex(const StepTrace& trace);
    // Step `step`'s record in `mode`, or nullptr when the trace has none.
    const StepRecord* find(StepMode mode, std::int64_t step) const;

private:
    std::unordered_map<std::int64_t, const StepRecord*> by_step_[2];  // [StepMode]
};

// From the extension: .csv, .jsonl or .json (Perfetto). Throws UsageError naming --trace.
TraceFormat trace_format_for(const std::filesystem::path& path);
// Before any work: the extension is known and a file can be created next to `path`.
// Throws UsageError naming --trace and the reason.
void check_trace_writable(const std::filesystem::path& path);

// The run summary as a flat JSON object (JSONL/Perfetto header "run", CSV "# run.key=value" lines).
nlohmann::json run_summary_json(const RunSummary& run);

// Writes `trace` in the format the extension names; `deterministic` leaves out wall time (Perfetto:
// modelled time instead). Throws IoError if the file cannot be written.
void write_step_trace(const std::filesystem::path& path, const RunSummary& run, const std::vector<StepRecord>& records,
                      const nlohmann::json& inputs, bool deterministic);

}  // namespace kvlab
