// Step traces as Chrome Trace Event JSON, which ui.perfetto.dev and chrome://tracing open: one process
// per mode, a slice per step with per-op slices nested inside, counters for FLOPs, bytes and KV bytes.
// Non-goals: per-layer slices (ops are summed over layers, as in the other formats).
#pragma once
#include <cstdint>
#include <iosfwd>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvlab/model/cost.hpp"
#include "report/simulation_report.hpp"
#include "kvlab/sim/simulator.hpp"

namespace kvlab {

// The roofline of a nominal machine, used for --deterministic timelines (no measured time):
// an op takes max(flops / F, bytes / B). A few-core CPU socket's order of magnitude; the ridge point
// F / B = 4 FLOP/byte separates memory-bound from compute-bound ops.
inline constexpr double model_flop_per_s = 200e9;   // F
inline constexpr double model_bytes_per_s = 50e9;   // B
std::int64_t modelled_op_ns(const OpCost& cost);    // rounded to the nearest ns

// Process ids: cached 1, uncached 2; one thread (tid 1) each. Event i of traceEvents is on line i + 2.
int perfetto_pid(StepMode mode);

void write_perfetto_trace(std::ostream& out, const RunSummary& run, const std::vector<StepRecord>& records,
                          const nlohmann::json& inputs, bool deterministic);

}  // namespace kvlab
