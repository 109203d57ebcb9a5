// Teacher-forced quality of a model on a text: the mean negative log-likelihood (NLL) of each token
// given the tokens before it, and its exponential, the perplexity. The quality figure every cache
// policy is measured with (docs/cli-simulate.md, "--eval").
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "kvlab/calc/model_config.hpp"
#include "kvlab/kv/kv_cache.hpp"
#include "kvlab/model/transformer.hpp"
#include "kvlab/weights/weights.hpp"

namespace kvlab {

struct NarrowWeights;

struct EvalResult {
    std::int64_t n_tokens = 0;   // ids given (BOS included)
    std::int64_t n_scored = 0;   // predictions scored: n_tokens - 1
    std::int64_t n_windows = 0;  // context windows the text was cut into
    double nll_sum = 0.0;        // sum of -ln p(ids[i] | window's ids before i), nats
    double mean_nll = 0.0;       // nll_sum / n_scored
    double perplexity = 0.0;     // exp(mean_nll)
};

// `ids` is the text encoded with BOS first (at least 2 tokens). The text is read in windows of at most
// C = cfg.n_ctx_max tokens that overlap by one: window k holds ids[k(C-1) .. k(C-1)+C-1], starts with an
// empty KV cache, and scores its positions 0..len-2 as predictions of the next id. So every id but the
// first is scored exactly once, a text that fits one window is scored with its whole prefix, and
// later windows see only their own tokens. Tokens go through the cached forward pass one at a time;
// log-softmax is taken in double precision of the fp32 logits.
// `storage`: how the KV cache stores K and V (kv/kv_cache.hpp): the quality a cache format costs.
EvalResult evaluate_nll(const ModelConfig& cfg, const Weights& weights, std::span<const TokenId> ids, const KvStorage& storage = {});

// Cache policies on a text: `cfg` (with its --window / sinks) through a cache stored as each of
// `storages`, and in lockstep on the same tokens the reference, `reference_cfg` through an fp32 full
// cache (one pass for all): each policy's perplexity and how far it moved every next-token
// distribution, KL(p_ref || p) in nats.
struct EvalComparison {
    EvalResult policy;
    double mean_kl = 0.0;
    double max_kl = 0.0;
    std::int64_t n_agree = 0;  // predictions whose argmax is the reference's
};
struct EvalPolicies {
    EvalResult reference;
    std::vector<EvalComparison> policies;  // in the order of `storages`
};
// `narrow[i]` (null: fp32): the narrow weights policy i's matmuls read (simulate --weight-dtype); the
// reference always reads the fp32 weights.
EvalPolicies evaluate_policies(const ModelConfig& cfg, const ModelConfig& reference_cfg, const Weights& weights, std::span<const TokenId> ids,
                               std::span<const KvStorage> storages, std::span<const NarrowWeights* const> narrow);

}  // namespace kvlab
