// Simulator: decodes one prompt with the KV cache, without it, or both in lockstep on the same
// tokens, recording one StepRecord per step per mode and comparing the two modes' logits.
// Non-goals: printing (simulation_report does that), files (step_trace does that).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

#include "kvlab/core/checked.hpp"
#include "kvlab/core/choice.hpp"
#include "kvlab/core/core_use.hpp"
#include "kvlab/model/cost.hpp"
#include "kvlab/kv/kv_cache.hpp"
#include "kvlab/calc/model_config.hpp"
#include "kvlab/sim/sampler.hpp"
#include "kvlab/model/transformer.hpp"
#include "kvlab/weights/weights.hpp"

namespace kvlab {

enum class SimMode { cached, uncached, both };
inline constexpr std::array<Choice<SimMode>, 3> sim_mode_choices{
    {{"cached", SimMode::cached}, {"uncached", SimMode::uncached}, {"both", SimMode::both}}};
std::string_view step_mode_name(StepMode mode);                       // "cached" | "uncached"

// simulate --kernel: the fast forward pass alone, or the readable one (model/reference.hpp) beside it.
enum class ForwardKernel { fast, reference };
inline constexpr std::array<Choice<ForwardKernel>, 2> forward_kernel_choices{
    {{"fast", ForwardKernel::fast}, {"reference", ForwardKernel::reference}}};

struct SimulateOptions {
    SimMode mode = SimMode::both;
    std::int64_t n_prompt = 32;             // random prompt length, used when prompt_ids is empty
    std::vector<TokenId> prompt_ids;        // explicit prompt
    std::int64_t n_steps = 128;             // tokens generated; step 0 is the prefill
    SamplerOptions sampler;                 // greedy by default
    std::uint64_t seed = 42;                // random prompt ids (weights take their own seed)
    bool count = true;                      // false: no cost counting (benchmarks measure its overhead)
    KvStorage kv_storage;                   // how the cache stores K and V (fp32 by default); narrow: cached mode only,
                                            // and an fp32 cache runs beside it on the same tokens for the comparison
    DType weight_dtype = DType::fp32;       // how the matmuls read the weights (kernels/narrow_weights.hpp); narrow: cached
                                            // mode only, and the fp32 weights run beside it on the same tokens
    bool quality = true;                    // false (--no-quality): a policy runs alone, without the fp32 model beside
                                            // it (speed and memory only; kv_quality stays empty)
    // The model the run's cache policy is measured against when the policy changes the model's own
    // attention (--window, --sink-tokens): its full-attention config, run beside it in fp32 on the same tokens.
    std::optional<ModelConfig> reference_config;
    // reference: the readable forward (model/reference.hpp) runs beside the cached mode on the same tokens
    // (fp32 weights and cache, no policy): its logits, the token its own sampler picks, and its time
    ForwardKernel kernel = ForwardKernel::fast;
    MlaPath mla_path = MlaPath::absorbed;  // MLA models: naive or absorbed attention (model/mla.hpp)
    const std::atomic<bool>* stop = nullptr;  // when set (SIGINT), stop after the current step
    std::function<void(std::int64_t n_done, std::int64_t n_steps)> on_step;  // progress, may be empty
    std::function<void(TokenId token)> on_token;  // each generated token as soon as it is chosen, may be empty
    // The run ends early after choosing one of these (end of text; the token counts as generated, on_token
    // does not see it), or when stop_after(token), called after on_token, says so (a stop string).
    std::vector<TokenId> end_tokens;
    std::function<bool(TokenId token)> stop_after;
    // each step's logits, the ones the sampler reads (cached mode when it runs, with any policy; else
    // uncached), before the token is chosen; may be empty (simulate --logits)
    std::function<void(const VectorF& logits)> on_logits;
};

// One forward call of one mode. Costs are summed over layers.
struct StepRecord {
    StepMode mode = StepMode::cached;
    std::int64_t step = 0;          // 0 = prefill (cached) / first full forward (uncached)
    std::int64_t position = 0;      // position of the newest token processed
    std::int64_t n_tokens = 0;      // tokens run through the model in this call
    std::int64_t n_keys = 0;        // keys the newest token's query attends (widest layer)
    StepCost cost;                  // per op
    std::uint64_t kv_bytes_resident = 0;  // bytes of valid K and V in the cache after the step (uncached: 0)
    std::int64_t wall_ns = 0;       // the forward call only (not sampling or comparison)
    TokenId token = 0;              // token chosen from this step's logits
    double max_abs_dlogit = -1.0;   // both modes: max |cached - uncached| logit this step; else -1
    bool argmax_flip = false;       // both modes: argmaxes differ within tolerance (a near-tie)
};

// A policy (narrow KV storage, a window, sinks, narrow weights) against the model's fp32 weights and fp32 full cache on the same tokens, over the steps run: the logits' largest
// difference, the KL divergence KL(p_fp32 || p_narrow) of the next-token distributions (nats), and how
// often both pick the same argmax.
struct KvQuality {
    double max_abs_dlogit = 0.0;
    double mean_kl = 0.0;
    double max_kl = 0.0;
    std::int64_t n_agree = 0;
    std::int64_t n_steps = 0;
};

// --kernel reference: the readable forward beside the fast cached path, fed the same tokens, one token per
// call on one thread. Its own sampler (the same options and seed) picks a token from its logits each step.
struct ReferenceKernelRun {
    std::int64_t n_steps = 0;
    std::int64_t n_same_token = 0;                  // steps where it picked the fast path's token
    std::optional<std::int64_t> first_other_token;  // the first step it picked another one (a near-tie), if any
    double max_rel_dlogit = 0.0;                    // max |fast - reference| / max(1, max |reference logit|), over steps
    std::vector<std::int64_t> wall_ns;              // per step: its time (step 0: the prompt, token by token)
    int fast_threads = 1;                           // the threads the fast path ran on
};

// --repeat: every run's summed forward wall time per mode (ns), the first run's included; empty for one run.
struct RepeatWalls {
    std::vector<std::int64_t> cached_ns, uncached_ns;
};

// Why a run ended before its steps: an end-of-text token, or stop_after (a stop string in the text).
enum class EarlyStop { none, end_token, stop_after };

struct SimulationResult {
    EarlyStop early_stop = EarlyStop::none;
    std::vector<TokenId> prompt;
    std::vector<TokenId> generated;
    std::vector<StepRecord> records;  // per step: the cached record, then the uncached one
    std::int64_t n_steps_done = 0;
    bool interrupted = false;
    std::uint64_t kv_cache_bytes = 0;   // allocated (0 in uncached mode)
    double max_abs_dlogit = 0.0;        // over all steps (both modes)
    std::int64_t n_argmax_flips = 0;
    std::optional<std::int64_t> first_divergent_step;  // Δlogit beyond tolerance
    double divergent_dlogit = 0.0;
    double divergent_tolerance = 0.0;
    std::optional<KvQuality> kv_quality;  // a policy: against the fp32 weights and full cache
    std::optional<ReferenceKernelRun> reference_kernel;  // --kernel reference
    CoreUse core_use;                     // over the steps: how many cores the threads had
    RepeatWalls repeats;                  // --repeat N > 1: filled by the caller from N runs
};

// KL(p || q) of the softmax distributions of two logit vectors, in nats (double precision).
double kl_divergence(const VectorF& p_logits, const VectorF& q_logits);

// Tolerance for comparing the two modes' logits: 1e-3 * max(1, max |reference logit|).
double logit_tolerance(const VectorF& reference);

// The config simulate runs: `n_layers` (--layers) keeps the real layer shapes, fewer layers.
// Throws ConfigError for MoE or MLA configs and UsageError for n_layers outside 1..L.
ModelConfig simulation_config(const ModelConfig& cfg, std::optional<std::int64_t> n_layers);

// Positions the run reads and allocates: prompt + steps - 1 (the last generated token is not fed back).
// Throws UsageError for empty/negative sizes, token ids outside the vocabulary, or more positions than
// the model's context.
std::int64_t simulation_positions(const ModelConfig& cfg, const SimulateOptions& options);

struct MemoryEstimate {
    std::uint64_t weights = 0;
    std::uint64_t kv_cache = 0;
    std::uint64_t activations = 0;
    std::uint64_t records = 0;  // StepRecords kept for the report and trace
    std::uint64_t total() const {
        return checked_add(checked_add(weights, kv_cache, "memory estimate"), checked_add(activations, records, "memory estimate"),
                           "memory estimate");
    }
};
// The transformer buffers a run needs: cached-only runs hold the prompt's tokens per call (then one per
// step), runs with the uncached mode the whole sequence. Call simulation_positions first (it validates).
TransformerSize simulation_size(const ModelConfig& cfg, const SimulateOptions& options);
MemoryEstimate estimate_simulation_memory(const ModelConfig& cfg, const SimulateOptions& options);
// The estimate, or UsageError naming --max-memory with a --layers hint when it exceeds max_bytes.
MemoryEstimate check_simulation_memory(const ModelConfig& cfg, const SimulateOptions& options, std::uint64_t max_bytes);

// The prompt a run decodes: options.prompt_ids, or n_prompt ids drawn uniformly from the vocabulary
// with options.seed. Call simulation_positions first (it validates the sizes).
std::vector<TokenId> simulation_prompt(const ModelConfig& cfg, const SimulateOptions& options);

SimulationResult run_simulation(const ModelConfig& cfg, const Weights& weights, const SimulateOptions& options);

}  // namespace kvlab
