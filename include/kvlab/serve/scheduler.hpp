// The serving scheduler: many requests through one KV pool on the running model, one forward per step
// (continuous, iteration-level batching as vLLM V1 schedules it):
//   1. running sequences, oldest first: each gets its next token (decode) or its next prompt chunk, up
//      to max_batched_tokens per step (chunked prefill). A sequence that cannot get rows preempts the
//      newest running one (its rows freed; it is recomputed later from its prompt and the tokens it has
//      generated), or itself when it is the newest. With --preempt swap its rows are copied to host
//      memory instead (serve/swap.hpp) while the host budget has room, and copied back when it is admitted.
//   2. waiting requests, first come first served, while the step has tokens and sequence slots left and
//      the pool has rows for them; admission stops at the first that does not fit, and no request is
//      admitted in a step that preempted.
// Tokens from the Sampler (greedy by default), until max_tokens, end-of-text or a stop string; with n > 1 or beam_width > 1, several outputs per request
// sharing the prompt's blocks (src/serve/outputs.hpp). Every step is recorded (batch, pool, cost, time), and so is every request.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvlab/calc/model_config.hpp"
#include "kvlab/core/core_use.hpp"
#include "kvlab/model/cost.hpp"
#include "kvlab/kv/kv_pool.hpp"
#include "kvlab/sim/sampler.hpp"
#include "kvlab/weights/weights.hpp"

namespace kvlab {

struct ServeRequest {
    std::vector<TokenId> prompt;
    std::int64_t max_tokens = 0;    // tokens to generate at most (fewer when an output stops early)
    std::int64_t arrival_step = 0;  // the step at which it joins the queue
    std::optional<std::uint64_t> seed;  // its sampler's seed (output 0: this seed; output k: splitmix64(seed + k)); else from --seed
    std::vector<std::string> stop;      // its own stop strings, besides --stop (ServeOptions::stop_rule reads them)
    bool ignore_eos = false;            // it runs past end-of-text (as --ignore-eos)
    std::int64_t n = 0;                 // its own outputs (vLLM's per-request n); 0: ServeOptions' n
};

// Why an output stopped generating: it reached max_tokens, it wrote an end-of-text token (which counts as
// generated, as vLLM's finish_reason "stop" for EOS), or its text reached a stop string.
enum class FinishReason { length, end_of_text, stop_string };
inline constexpr std::array<Choice<FinishReason>, 3> finish_reason_choices{
    {{"length", FinishReason::length}, {"end-of-text", FinishReason::end_of_text}, {"stop", FinishReason::stop_string}}};

// Contiguous layout: rows each admitted request reserves up front.
enum class ReserveRule { max_len, request };  // the model length (a static cache), or its prompt + max_tokens
inline constexpr std::array<Choice<ReserveRule>, 2> reserve_rule_choices{
    {{"max-len", ReserveRule::max_len}, {"request", ReserveRule::request}}};

// What a preemption does with the sequence's K and V: discards them (recomputed when it runs again) or
// copies them to host memory (swapped back in), as vLLM V0's preemption_mode.
enum class PreemptMode { recompute, swap };
inline constexpr std::array<Choice<PreemptMode>, 2> preempt_mode_choices{{{"recompute", PreemptMode::recompute}, {"swap", PreemptMode::swap}}};

struct ServeOptions {
    KvPoolOptions pool;
    KvStorage kv_storage;                   // the pool's rows: fp32, or a narrow format (as simulate --kv-dtype)
    PreemptMode preempt = PreemptMode::recompute;
    std::uint64_t host_kv_bytes = 0;        // swap: host memory for swapped-out K and V (full: that preemption recomputes)
    double host_bytes_per_s = 0.0;          // swap: the host link, per direction; only the modelled swap time uses it
    std::int64_t max_batched_tokens = 256;  // tokens per step (decode tokens + prompt chunks)
    std::int64_t max_seqs = 16;             // sequences per step
    std::int64_t max_model_len = 0;         // positions a request may use; contiguous max-len reserves this many
    ReserveRule reserve = ReserveRule::max_len;
    bool check = false;  // each finished request against a solo run of the single-sequence path
    // outputs per request (paged only when more than one; src/serve/outputs.hpp): n samples, or the
    // beam_width best sequences by cumulative log-probability (beam search; then n is 1)
    std::int64_t n = 1;
    std::int64_t beam_width = 1;
    SamplerOptions sampling;  // how each output picks its tokens (greedy: argmax); beam search ignores it
    // Stopping early, as simulate does (sampled and greedy outputs; beams always run to max_tokens): after
    // each token an output writes, stop_rule(request, its generated tokens) says whether it stops there and
    // why (end-of-text, a stop string in its text: the session's rule, as serve sees only ids); empty:
    // every output runs to max_tokens. An output that stops gives its rows back at once; a request ends
    // when all its outputs have.
    std::function<std::optional<FinishReason>(std::int64_t request, std::span<const TokenId> generated)> stop_rule;
    bool record_pool_map = false;  // each step's ServeStep::pool_map (a JSONL trace's block map)
    const std::atomic<bool>* stop = nullptr;  // when set (SIGINT), stop after the current step
};

struct ServeStep {
    std::int64_t step = 0;
    std::int64_t start_ns = 0;          // run clock at the step's start (steps only: checks are not counted)
    std::int64_t n_seqs = 0;            // sequences in the forward
    std::int64_t n_tokens = 0;          // tokens in the forward
    std::int64_t n_decode = 0;          // of them, decode tokens (one per decoding sequence)
    std::int64_t n_generated = 0;       // tokens chosen from this step's logits
    std::int64_t n_stopped = 0;         // of their outputs, those that stopped early (end-of-text, a stop string)
    std::int64_t n_running = 0;         // sequences holding rows after the step
    std::int64_t n_waiting = 0;         // arrived requests not running after the step
    std::int64_t n_preempted = 0;       // preemptions in this step (swapped out or discarded)
    std::int64_t n_swapped_out = 0;     // of them, swapped out to host memory
    std::int64_t n_swapped_in = 0;      // swapped-out sequences admitted again, their rows copied back
    std::int64_t swap_out_bytes = 0;    // K and V copied to host memory (swap_bytes of each)
    std::int64_t swap_in_bytes = 0;     // and back
    std::int64_t swap_ns = 0;           // of schedule_ns, the copies to and from host memory (measured)
    // the pool when the step's K and V are written, before finished requests give their rows back
    std::int64_t rows_in_use = 0;       // rows held by running sequences
    std::int64_t rows_tokens = 0;       // of them, rows holding a token's K and V
    std::int64_t rows_cached = 0;       // paged: idle blocks' rows kept for the prefix cache
    std::int64_t largest_free = 0;      // contiguous: the longest free range (paged: free rows)
    // requests with several outputs (n > 1, beams) holding rows: the blocks their outputs hold, a shared
    // block once, and what they would hold if each output had its own copy of its rows (no sharing)
    std::int64_t out_blocks = 0, out_blocks_unshared = 0;
    std::int64_t cow_copies = 0;        // blocks copied before a write in this step (copy-on-write)
    StepCost cost;                      // per op, the whole batch
    std::int64_t forward_ns = 0;        // the forward call
    std::int64_t schedule_ns = 0;       // everything else in the step: scheduling, pool bookkeeping, sampling
    // record_pool_map: who holds each cell of the pool then (KvAllocator::pool_map; owners are request
    // indices); else empty
    std::vector<KvPoolCell> pool_map;
};

// What a request did in one step (the Perfetto timeline's slices).
enum class ServeEventKind { prefill, decode, preempted, swapped_out };
struct ServeEvent {
    std::int64_t step = 0;
    ServeEventKind kind = ServeEventKind::prefill;
    std::int64_t n_tokens = 0;  // prefill: the chunk's tokens; decode: 1; preempted: the K and V discarded; swapped_out: kept on the host
};

struct ServeRequestResult {
    std::int64_t arrival_step = 0;
    std::int64_t prompt_len = 0;
    std::int64_t max_tokens = 0;
    std::int64_t first_step = -1;        // first step it ran in
    std::int64_t first_token_step = -1;  // the step whose logits chose its first token
    std::int64_t finish_step = -1;
    std::int64_t arrival_ns = 0, first_token_ns = 0, finish_ns = 0;  // run clock: end of the step (arrival: its start)
    std::int64_t preemptions = 0;
    std::int64_t recomputed_tokens = 0;  // K and V computed again after its preemptions
    std::int64_t swaps = 0;              // of its preemptions, swapped out (its K and V kept)
    std::int64_t prefix_hit_tokens = 0;  // tokens found in the prefix cache at its admissions (not computed)
    std::vector<TokenId> generated;
    FinishReason finish_reason = FinishReason::length;  // (several outputs: the first's)
    // n > 1 or beams: every output's generated tokens (beams best first; `generated` is the first) and its
    // cumulative log-probability (sum of log softmax(logits) of its tokens); the most blocks its outputs
    // held at once (a shared block once) and the most unshared copies would have held; its copy-on-write copies
    std::vector<std::vector<TokenId>> outputs;
    std::vector<double> scores;
    std::vector<FinishReason> finish_reasons;  // every output's
    std::int64_t peak_blocks = 0, peak_blocks_unshared = 0, cow_copies = 0;
    std::vector<ServeEvent> events;
    // check: against a solo run of the single-sequence path on the same tokens
    bool checked = false;
    std::int64_t solo_agree = 0;          // generated tokens equal to the solo run's choice (every output's;
                                          // beams: the solo beam search's output of the same rank)
    double max_abs_dlogit = 0.0;
    double tolerance = 0.0;               // logit_tolerance of the worst step
    bool within_tolerance = true;
};

struct ServeResult {
    std::vector<ServeStep> steps;
    std::vector<ServeRequestResult> requests;
    KvAllocatorCounters counters;
    std::int64_t prefix_hit_blocks = 0;  // blocks admitted requests found in the prefix cache
    std::int64_t pool_rows = 0;
    std::uint64_t pool_bytes = 0;
    std::int64_t preemptions = 0;
    // swap: preemptions that found the host budget full and recomputed instead; the host memory's peak
    std::int64_t swap_fallbacks = 0;
    std::uint64_t host_peak_bytes = 0;
    std::uint64_t recompute_flops = 0;   // FLOPs of computing the discarded K and V again (recompute_cost)
    std::uint64_t kv_row_bytes = 0;      // one K (or V) row as the pool stores it
    DType kv_dtype = DType::fp32;
    double host_bytes_per_s = 0.0;       // the options', for the modelled swap time
    std::int64_t rows_left_in_use = 0;   // after the run: 0, or a leak
    bool interrupted = false;
    CoreUse core_use;  // over the steps: how many cores the threads had
};

// Most steps a workload may wait before a request arrives (2^40): the step counter never overflows.
inline constexpr std::int64_t max_arrival_step = std::int64_t{1} << 40;

// Throws UsageError naming the flag for a request that can never run (longer than max_model_len, or
// than the whole pool, or arriving after max_arrival_step), or for budgets that admit nothing.
void check_serve_workload(const ModelConfig& cfg, std::span<const ServeRequest> requests, const ServeOptions& options);

ServeResult run_serving(const ModelConfig& cfg, const Weights& weights, std::span<const ServeRequest> requests, const ServeOptions& options);

}  // namespace kvlab
