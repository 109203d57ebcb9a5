// The serving run's numbers (docs/serving.md defines each): throughput, latency per request, the KV
// pool's use per step, preemptions, prefix sharing, counted cost; one summary per layout, and the
// report that puts the layouts side by side.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvlab/calc/gpu_specs.hpp"
#include "kvlab/core/printer.hpp"
#include "kvlab/model/cost.hpp"
#include "kvlab/kv/kv_pool.hpp"
#include "kvlab/serve/scheduler.hpp"

namespace kvlab {

// Nearest-rank percentiles of a sample (all 0 for an empty one): p-th = the ceil(p/100 * n)-th smallest.
struct Percentiles {
    double median = 0.0, p90 = 0.0, max = 0.0;
    std::size_t n = 0;  // values; none: undefined (TPOT when no request generated two tokens)
};
Percentiles percentiles(std::vector<double> values);

// The modelled time of serving steps on one GPU (docs/kv-memory.md, "Modelled GPU time"): each step's
// roofline time, max(FLOPs counted / BF16 peak, bytes counted / bandwidth), over its whole cost (every
// op), summed over the steps. From counted figures only: exact, the same on any host.
// With a host link (--preempt swap, host_bytes_per_s > 0), each step also waits for its swaps: + (bytes
// swapped out + in) / host_bytes_per_s (a step's swaps finish before its forward, as vLLM V0's cache ops).
struct ModelledServeTime {
    double seconds = 0.0;                 // swap time included
    double swap_seconds = 0.0;            // of it, the host link's
    std::int64_t memory_bound_steps = 0;  // steps whose memory time is at least their compute time
};
ModelledServeTime modelled_serve_time(const GpuSpec& gpu, const std::vector<ServeStep>& steps, double host_bytes_per_s = 0.0);

struct ServeSummary {
    KvLayout layout = KvLayout::paged;
    std::string name;                    // the table's column (empty: the layout's name)
    std::uint64_t token_bytes = 0;       // one token row at the pool's width (0: serve_report's token_bytes)
    std::int64_t n_requests = 0, n_finished = 0, n_steps = 0;
    std::int64_t n_generated = 0;        // tokens chosen
    // outputs that stopped before max_tokens (the steps' count); of the finished requests' outputs (a
    // run's, not a trace's): how many, those stopped at end-of-text and at a stop string, and the tokens
    // their max_tokens allowed but they did not generate
    std::int64_t n_stopped = 0;
    std::int64_t n_outputs = 0, n_end_of_text = 0, n_stop_string = 0, n_tokens_unused = 0;
    std::int64_t n_prompt_tokens = 0;    // the requests' prompts
    std::int64_t n_computed_tokens = 0;  // tokens run through the model (prompts, less prefix hits, plus recomputation and decodes)
    double seconds = 0.0;                // the steps' wall time
    double tokens_per_s = 0.0;           // generated / seconds
    // per request: time to first token (arrival to the step that chose it, inclusive) and time per
    // output token after the first ((finish - first token) / (generated - 1))
    Percentiles ttft_steps, ttft_ms, tpot_steps, tpot_ms;
    std::int64_t max_running = 0;        // most sequences in one step
    double mean_running = 0.0;           // sequences per step
    double mean_batch_tokens = 0.0;      // tokens per step
    std::int64_t pool_rows = 0;
    std::uint64_t pool_bytes = 0;
    std::int64_t peak_rows_in_use = 0;
    double mean_utilization = 0.0;       // mean over steps of rows holding tokens / rows in use
    double mean_pool_usage = 0.0;        // mean over steps of rows in use / pool rows (vLLM's "KV cache usage")
    double mean_slack_rows = 0.0;        // rows in use not holding a token: last-block slack (paged), reservation waste (contiguous)
    std::int64_t preemptions = 0, recomputed_tokens = 0;
    // --preempt swap (swap_mode): sequences and bytes moved each way over the host link, and the host
    // tier's peak; recompute_flops: computing the discarded K and V again (a run's, not a trace's)
    bool swap_mode = false;
    double host_bytes_per_s = 0.0;
    std::int64_t swap_outs = 0, swap_ins = 0, swap_fallbacks = 0;
    std::uint64_t swap_out_bytes = 0, swap_in_bytes = 0, host_peak_bytes = 0, recompute_flops = 0;
    std::int64_t swap_ns = 0;            // measured: the copies' wall time
    DType kv_dtype = DType::fp32;        // how the pool stored K and V
    std::int64_t prefix_hit_tokens = 0, prefix_hit_blocks = 0, cow_copies = 0, evictions = 0;
    // requests with several outputs (n > 1, beams): the most blocks their outputs held at once (a shared
    // block once) and the most they would have held unshared (each output its own copy); cow_copies above
    std::int64_t peak_out_blocks = 0, peak_out_blocks_unshared = 0;
    StepCost cost;                       // every step's, summed
    double weight_bytes_per_token = 0.0; // weight bytes read / generated tokens
    double kv_read_bytes_per_token = 0.0;
    double schedule_share = 0.0;         // bookkeeping time / step time
    std::uint64_t max_step_weight_bytes = 0;  // the most weight bytes one step read (about the model's weights)
    // modelled on a GPU (summarize_serving's `gpu`; none: no modelled time)
    std::optional<GpuSpec> gpu;
    ModelledServeTime modelled;
    double modelled_tokens_per_s = 0.0;  // generated / modelled seconds
    bool has_wall_time = true;           // false: from a --deterministic trace, whose steps carry no time
    std::int64_t rows_left_in_use = 0;
    // --check
    std::int64_t n_checked = 0, n_tokens_checked = 0, n_tokens_agree = 0;
    double max_abs_dlogit = 0.0;
    bool all_within_tolerance = true;
};

// `gpu`: also the modelled time on it (none: no modelled time).
ServeSummary summarize_serving(const ServeResult& result, KvLayout layout, const GpuSpec* gpu = nullptr);

// The report's headline: paged against contiguous (or one layout's figures) in 1-3 lines, the same
// numbers as the table's rows (KV utilization, sequences at once, steps, modelled time, wall time).
std::vector<std::string> serve_headline(const std::vector<ServeSummary>& summaries, UnitSystem units);

// The layouts side by side (one column each), and per request in csv/json/markdown. `token_bytes`: one
// token's K and V over every layer, as kvcalc counts it. `results` empty: summaries rebuilt from a trace's
// steps, without the per-request rows. `timing_note`: the one line that says how noisy the timed figures
// are (the host's load, or that they are one run's).
Report serve_report(const std::vector<ServeSummary>& summaries, const std::vector<ServeResult>& results, const nlohmann::json& inputs,
                    const std::string& title, std::uint64_t token_bytes, UnitSystem units, Format format,
                    const std::string& timing_note = "");

}  // namespace kvlab
