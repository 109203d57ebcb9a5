// Transformer: a decoder-only forward pass on Eigen (fp32, row-major) for the llama and gpt2
// families, with and without a KV cache, counting every op's cost from the shapes it processes.
// Non-goals: batching several sequences, MoE routing, MLA, quantised weights.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "model/attention.hpp"
#include "model/cost.hpp"
#include "model/kv_cache.hpp"
#include "calc/model_config.hpp"
#include "model/weights.hpp"

namespace kvlab {

struct NarrowWeights;

using TokenId = std::int32_t;

// What the forward calls of one run need buffers for.
struct TransformerSize {
    std::int64_t n_positions = 0;  // longest sequence: keys one query attends (scores scratch)
    std::int64_t n_tokens = 0;     // most tokens in one call: the prompt (cached), the sequence (uncached)
    bool uncached = false;         // forward_uncached is called: every position's K and V in activations
    bool narrow_weights = false;   // the weights are read narrow: panels of widened rows for calls of N > 1
};

class Transformer {
public:
    // Buffers for `size` are allocated here, once; forward calls allocate nothing. `cfg` and `weights`
    // must outlive the Transformer. Throws ConfigError for MoE or MLA configs.
    // `narrow` (nullable): the weights stored narrow, which the matmuls then read instead of the fp32
    // matrices (model/narrow_weights.hpp); it must outlive the Transformer and `size.narrow_weights` be set.
    Transformer(const ModelConfig& cfg, const Weights& weights, const TransformerSize& size, const NarrowWeights* narrow = nullptr);
    // Both modes, up to n_positions tokens per call.
    Transformer(const ModelConfig& cfg, const Weights& weights, std::int64_t n_positions)
        : Transformer(cfg, weights, TransformerSize{n_positions, n_positions, true}) {}

    // Cached mode: runs tokens at positions pos0.. (prefill: pos0 = 0; decode: one token), writing
    // their K and V into `cache` and attending over it. Returns the logits (V) of the last position.
    // `cost` (nullable: counting off) accumulates every op's cost.
    const VectorF& forward_cached(std::span<const TokenId> tokens, std::int64_t pos0, KvCache& cache, StepCost* cost);
    // Uncached mode: the whole sequence from position 0, recomputing every K and V (naive generate).
    const VectorF& forward_uncached(std::span<const TokenId> tokens, StepCost* cost);

    // Bytes of activation buffers for `cfg` and `size` (what the constructor allocates).
    static std::uint64_t activation_bytes(const ModelConfig& cfg, const TransformerSize& size);
    std::uint64_t activation_bytes_held() const;

private:
    const VectorF& forward(std::span<const TokenId> tokens, std::int64_t pos0, KvCache* cache, StepCost* cost);
    void check_call(std::span<const TokenId> tokens, std::int64_t pos0) const;

    const ModelConfig& cfg_;
    const Weights& w_;
    const NarrowWeights* nw_;
    TransformerSize size_;
    int n_threads_;
    std::vector<float> inv_freq_;  // (D/2) theta^(-2i/D), RoPE frequencies

    // Legend: N = size.n_tokens (tokens per call), T = size.n_positions, d model, H heads, Hkv KV heads,
    // D head dim, f FFN, V vocab.
    MatrixRM x_;        // (N, d)      residual stream
    MatrixRM xb_;       // (N, d)      normed input / branch output
    MatrixRM q_;        // (N, H*D)    queries
    MatrixRM k_new_;    // (N, Hkv*D)  keys of the tokens in this call, before storing
    MatrixRM v_new_;    // (N, Hkv*D)  values of the tokens in this call
    MatrixRM k_act_;    // (T, Hkv*D)  uncached mode only (else empty): every key of the current layer
    MatrixRM v_act_;    // (T, Hkv*D)  uncached mode only (else empty): every value of the current layer
    MatrixRM att_;      // (N, H*D)    attention output
    MatrixRM hb_;       // (N, f)      MLP hidden (gate, then activation)
    MatrixRM hb2_;      // (N, f)      MLP up projection (llama)
    MatrixRM scores_;   // (threads, attention_scratch_floats(T) rounded up to 16) attention scratch, one row per thread
    MatrixRM gemm_scratch_;  // (threads, gemm_scratch_floats(max(d,H*D,f), N)) packed tokens; empty if N = 1
    MatrixRM panel_;    // narrow weights, N > 1: (threads, narrow_panel_floats(max(d,H*D,f))) widened weight rows
    MatrixRM x_last_;   // (1, d)      final-normed last position
    VectorF logits_;    // (V)
};

}  // namespace kvlab
