// The end-of-run report of `kvlab simulate`: cached vs uncached totals side by side, their ratios,
// how per-step cost grows, and the logit comparison, as a printer Report (table/csv/json/markdown).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvlab/calc/gpu_specs.hpp"
#include "kvlab/core/printer.hpp"
#include "kvlab/sim/simulator.hpp"

namespace kvlab {

// Totals of one mode's records.
struct ModeTotals {
    std::int64_t n_steps = 0;
    std::int64_t n_tokens = 0;          // tokens run through the model, summed over steps
    OpCost cost;
    std::uint64_t flops_matmul = 0, flops_attention = 0, flops_other = 0;
    std::uint64_t kv_bytes_resident = 0;  // at the last step
    std::int64_t wall_ns = 0;
};
ModeTotals mode_totals(const std::vector<StepRecord>& records, StepMode mode);

// The host's load when a run was timed: /proc/loadavg's 1-minute average (load1 < 0: unknown) and its cores.
struct HostLoad {
    double load1 = -1;
    int n_cores = 0;
};

// What the report needs beyond the records. simulate takes it from its run; `kvlab trace summary`
// from a trace file's header, so both print the same table from the same code.
struct RunSummary {
    std::string display_name;
    SimMode mode = SimMode::both;
    std::int64_t n_prompt = 0;            // prompt tokens
    std::int64_t n_steps = 0;             // steps requested
    std::int64_t n_steps_done = 0;
    bool interrupted = false;
    bool counted = true;                  // false: cost counting was off
    bool has_wall_time = true;            // false: read from a --deterministic trace (no wall-time rows)
    std::uint64_t kv_cache_bytes = 0;     // allocated (0 without the cached mode)
    double max_abs_dlogit = 0.0;
    std::int64_t n_argmax_flips = 0;
    std::optional<std::int64_t> first_divergent_step;
    double divergent_dlogit = 0.0;
    double divergent_tolerance = 0.0;
    std::optional<KvQuality> kv_quality;  // a cache policy (--kv-dtype, --window, --sink-tokens) against the fp32 full cache
    std::optional<ReferenceKernelRun> reference_kernel;  // --kernel reference (not in traces)
    RepeatWalls repeats;                  // --repeat N > 1: each run's wall time per mode (traces: "repeat_wall_ns")
    std::optional<HostLoad> host_load;    // when the run was timed (traces: "host_load"; not with --deterministic)
};
RunSummary run_summary(const ModelConfig& cfg, const SimulateOptions& options, const SimulationResult& result);

// The GPU a run's steps are modelled on (simulate --gpu), from the run's inputs ("gpu": name, display
// name, BF16 peak, bandwidth); nullopt for traces written before it.
std::optional<GpuSpec> modelled_gpu(const nlohmann::json& inputs);
// One step's modelled time on `gpu`: roofline_time of its counted FLOPs and bytes moved (docs/kv-memory.md,
// "Modelled GPU time"), in seconds.
double modelled_step_seconds(const GpuSpec& gpu, const StepRecord& record);

// A measured figure over repeated runs: median (the mean of the middle two for an even count), min, max.
struct Spread {
    double median = 0, min = 0, max = 0;
    std::size_t n = 0;
};
Spread spread_of(std::vector<double> values);
// Each run's summed wall time of `mode` (ns): the repeats when there are any, else the records' one run.
std::vector<double> run_walls_ns(const RunSummary& run, const std::vector<StepRecord>& records, StepMode mode);

// The note that says once which figures are exact (counted), computed (modelled) and measured (wall,
// with their spread over --repeat runs, or one run's with the host's load).
std::string timing_note(const RunSummary& run, const HostLoad& load);

// `inputs` is copied into the report (JSON "inputs", CSV comments).
Report simulation_report(const RunSummary& run, const std::vector<StepRecord>& records, const nlohmann::json& inputs,
                         UnitSystem units);
Report simulation_report(const ModelConfig& cfg, const SimulateOptions& options, const SimulationResult& result,
                         const nlohmann::json& inputs, UnitSystem units);

}  // namespace kvlab
