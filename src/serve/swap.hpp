// Swap preemption's host tier (vLLM V0's swap space): a preempted sequence's K and V rows copied out of
// the KV pool into host memory, bit for bit as the pool stores them, and copied back into fresh rows when
// it is admitted again, instead of being discarded and recomputed. The copies are real (memcpy); the time
// they would take on the host link is modelled from the bytes moved (docs/serving.md, "Swap or
// recompute"), never slept. Also the figures that compare the two: the FLOPs of recomputing a sequence's
// tokens and the lengths at which recomputing them on a GPU is faster than swapping them out and in.
#pragma once
#include <cstdint>
#include <map>
#include <vector>

#include "kvlab/calc/gpu_specs.hpp"
#include "kvlab/calc/model_config.hpp"
#include "kvlab/kv/kv_pool.hpp"
#include "kvlab/model/cost.hpp"

namespace kvlab {

// Bytes a sequence holding positions 0..n_tokens-1 keeps in a pool whose rows are `row_bytes` wide:
// per layer its held rows (a windowed layer its window) x 2 (K and V) x row_bytes. What a swap moves
// each way.
std::uint64_t swap_bytes(const ModelConfig& cfg, std::uint64_t row_bytes, std::int64_t n_tokens);

class HostKvTier {
public:
    HostKvTier(const ModelConfig& cfg, std::uint64_t budget_bytes) : cfg_(cfg), budget_(budget_bytes) {}
    // Whether a sequence of n_tokens positions fits in what is left of the budget.
    bool fits(const KvPool& pool, std::int64_t n_tokens) const;
    // Copies the rows of `seq`'s positions 0..n_tokens-1 (every layer, K and V) out of the pool, through
    // its block table `rows`. Returns the bytes moved.
    std::uint64_t swap_out(SeqId seq, const KvPool& pool, const KvView& rows, std::int64_t n_tokens);
    // Copies them back into the sequence's new rows and frees the host copy. Returns the bytes moved.
    std::uint64_t swap_in(SeqId seq, KvPool& pool, const KvView& rows);
    bool holds(SeqId seq) const { return held_.count(seq) != 0; }
    std::uint64_t bytes_held() const { return used_; }
    std::uint64_t peak_bytes() const { return peak_; }

private:
    struct Held {
        std::int64_t n_tokens = 0;
        std::vector<std::uint8_t> bytes;  // layer by layer: K rows, then V rows
    };
    // Each run of pool rows holding the sequence's rows 0..n-1: within a block they are consecutive.
    template <typename F>
    void each_run(const KvView& rows, std::int64_t n, F f) const;

    const ModelConfig& cfg_;
    std::uint64_t budget_ = 0, used_ = 0, peak_ = 0;
    std::map<SeqId, Held> held_;
};

// The cost of computing the K and V of positions 0..n_tokens-1 again after a preemption: the closed-form
// cost of a prefill of them (docs/cost-model.md), every layer, without the final norm and the classifier
// (their logits were taken before). `kv_row_bytes`: the pool's stored row (0: fp32).
StepCost recompute_cost(const ModelConfig& cfg, std::int64_t n_tokens, std::uint64_t kv_row_bytes);

// Recompute against swap for one sequence of n tokens, on a GPU and a host link:
//   recompute: roofline_time(FLOPs, bytes less weight bytes) of recompute_cost (in a serving step the
//              weights are read once for the whole batch, so the recomputed tokens add none);
//   swap:      2 x swap_bytes / host bandwidth (out, then in).
struct SwapOrRecompute {
    double recompute_s = 0.0, swap_s = 0.0;
    bool recompute_faster() const { return recompute_s < swap_s; }
};
SwapOrRecompute swap_or_recompute(const ModelConfig& cfg, std::uint64_t kv_row_bytes, const GpuSpec& gpu, double host_bytes_per_s,
                                  std::int64_t n_tokens);
// The lengths 1..max_len where the faster of the two changes: each the first length at which the other
// wins (found between powers of two by bisection), in order; and which wins at length 1.
struct SwapCrossover {
    bool recompute_faster_at_1 = false;
    std::vector<std::int64_t> flips;
};
SwapCrossover swap_crossover(const ModelConfig& cfg, std::uint64_t kv_row_bytes, const GpuSpec& gpu, double host_bytes_per_s, std::int64_t max_len);

}  // namespace kvlab
