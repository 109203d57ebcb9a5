// The end-of-run report of `kvlab simulate`: cached vs uncached totals side by side, their ratios,
// how per-step cost grows, and the logit comparison, as a printer Report (table/csv/json/markdown).
#pragma once
#include <nlohmann/json.hpp>

#include "kvlab/printer.hpp"
#include "kvlab/simulator.hpp"
#include "kvlab/tokenizer.hpp"

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

// `inputs` is copied into the report (JSON "inputs", CSV comments).
Report simulation_report(const ModelConfig& cfg, const SimulateOptions& options, const SimulationResult& result,
                         const nlohmann::json& inputs, UnitSystem units);

// The tokens of the run as one row: prompt_ids and generated_ids (JSON arrays), and with a tokenizer
// prompt_text and generated_text (TextDecoder rules, invalid UTF-8 replaced by U+FFFD). For the
// csv/json/markdown reports; the table format streams the same text while the run goes.
Table simulation_tokens_table(const SimulationResult& result, const Tokenizer* tokenizer);

}  // namespace kvlab
