// Serving traces (`kvlab serve --trace`): one record per step per layout as CSV or JSON Lines, or a
// Perfetto timeline with one track per request (queued, prefill chunks, decode, preempted, finished)
// and counters for the pool and the batch; docs/trace-format.md, "serve traces". `kvlab trace` reads
// the CSV and JSONL forms back (summary, plot). Written atomically.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvlab/calc/gpu_specs.hpp"
#include "kvlab/core/printer.hpp"
#include "kvlab/serve/scheduler.hpp"

namespace kvlab {

inline constexpr int serve_trace_format_version = 1;

// The columns, in file order (--deterministic: without the measured times).
std::vector<std::string> serve_trace_columns(bool deterministic, bool swap = false);  // swap: a --preempt swap run's

void write_serve_trace(const std::filesystem::path& path, const std::vector<ServeOptions>& runs, const std::vector<ServeResult>& results,
                       const nlohmann::json& inputs, bool deterministic);

// A serve trace read back: the inputs, and each layout's steps in file order.
struct ServeTrace {
    nlohmann::json inputs = nlohmann::json::object();
    std::vector<KvLayout> layouts;                 // in file order
    std::vector<std::vector<ServeStep>> steps;     // per layout
    std::vector<std::int64_t> pool_rows;           // per layout
    // per layout: rows per cell of the steps' pool_map (JSONL "pool_map"); 0: the trace has no map (CSV,
    // --trace written by a kvlab before the block map), and the steps' pool_map are empty
    std::vector<std::int64_t> map_cell_rows;
    bool has_wall_time = true;
};

// Throws FormatError naming the file and line for anything that is not a serve trace as written.
ServeTrace parse_serve_trace(std::string_view text, const std::string& where);
// The file says it is a serve trace (CSV magic line, JSON Lines header, Perfetto otherData), so `kvlab trace`
// can tell it from a simulate trace; false for an unreadable file (the step-trace reader reports that).
bool is_serve_trace_file(const std::filesystem::path& path);
// Reads a CSV or JSONL serve trace (a Perfetto one is for the Perfetto UI: FormatError says so).
ServeTrace read_serve_trace(const std::filesystem::path& path);

// The GPU a serve trace's modelled time is for: its "gpu" input (serve --gpu), h100 for a trace without one;
// FormatError for a name that is not a GPU preset.
GpuSpec trace_gpu(const ServeTrace& trace);
// The host link of a --preempt swap run's trace (its "host_bytes_per_s" input), 0 for other traces.
double trace_host_bytes_per_s(const ServeTrace& trace);

// `kvlab trace summary` of a serve trace: serve's table of per-step numbers, rebuilt from the steps.
Report serve_trace_summary(const ServeTrace& trace, UnitSystem units, Format format);
// `kvlab trace plot` of a serve trace: KV memory allocated vs holding tokens, sequences per step, time per
// step and weight bytes per generated token, over the steps, every layout overlaid (.svg or .png).
// The modelled time's GPU is the trace's "gpu" input (h100 when the trace has none). `flag`: the option
// that named `output`, for errors.
void plot_serve_trace(const ServeTrace& trace, const std::filesystem::path& output, const char* flag = "-o");

}  // namespace kvlab
