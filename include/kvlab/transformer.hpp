// Transformer: a decoder-only forward pass on Eigen (fp32, row-major) for the llama and gpt2
// families, with and without a KV cache, counting every op's cost from the shapes it processes.
// Non-goals: batching several sequences, MoE routing, MLA, quantised weights.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "kvlab/attention.hpp"
#include "kvlab/cost.hpp"
#include "kvlab/kv_cache.hpp"
#include "kvlab/model_config.hpp"
#include "kvlab/weights.hpp"

namespace kvlab {

using TokenId = std::int32_t;

// One query's attention, same layout and math as attention_decode_ref, vectorised with Eigen:
// q (H*D); k, v (n_keys, Hkv*D) rows; out (H*D); scores (n_keys) scratch.
void attention_rows(const AttentionShape& shape, const float* q, const float* k, const float* v, std::int64_t n_keys,
                    float* out, float* scores);

class Transformer {
public:
    // Buffers for up to n_tokens_max positions are allocated here, once; forward calls allocate nothing.
    // `cfg` and `weights` must outlive the Transformer. Throws ConfigError for MoE or MLA configs.
    Transformer(const ModelConfig& cfg, const Weights& weights, std::int64_t n_tokens_max);

    // Cached mode: runs tokens at positions pos0.. (prefill: pos0 = 0; decode: one token), writing
    // their K and V into `cache` and attending over it. Returns the logits (V) of the last position.
    // `cost` (nullable: counting off) accumulates every op's cost.
    const VectorF& forward_cached(std::span<const TokenId> tokens, std::int64_t pos0, KvCache& cache, StepCost* cost);
    // Uncached mode: the whole sequence from position 0, recomputing every K and V (naive generate).
    const VectorF& forward_uncached(std::span<const TokenId> tokens, StepCost* cost);

    // Bytes of activation buffers for `cfg` at n_tokens_max positions (what the constructor allocates).
    static std::uint64_t activation_bytes(const ModelConfig& cfg, std::int64_t n_tokens_max);
    std::uint64_t activation_bytes_held() const;

private:
    const VectorF& forward(std::span<const TokenId> tokens, std::int64_t pos0, KvCache* cache, StepCost* cost);
    void norm(const VectorF& weight, const VectorF& bias, std::int64_t row0, std::int64_t n, MatrixRM& out,
              const MatrixRM& in) const;
    void rope_row(float* q, float* k, std::int64_t pos) const;

    const ModelConfig& cfg_;
    const Weights& w_;
    std::int64_t n_tokens_max_;
    int n_threads_;
    std::vector<float> inv_freq_;  // (D/2) theta^(-2i/D), RoPE frequencies

    // Legend: T = n_tokens_max positions, d model, H heads, Hkv KV heads, D head dim, f FFN, V vocab.
    MatrixRM x_;        // (T, d)      residual stream
    MatrixRM xb_;       // (T, d)      normed input / branch output
    MatrixRM q_;        // (T, H*D)    queries
    MatrixRM k_new_;    // (T, Hkv*D)  keys of the tokens in this call, before storing
    MatrixRM v_new_;    // (T, Hkv*D)  values of the tokens in this call
    MatrixRM k_act_;    // (T, Hkv*D)  uncached mode: every key of the current layer
    MatrixRM v_act_;    // (T, Hkv*D)  uncached mode: every value of the current layer
    MatrixRM att_;      // (T, H*D)    attention output
    MatrixRM hb_;       // (T, f)      MLP hidden (gate, then activation)
    MatrixRM hb2_;      // (T, f)      MLP up projection (llama)
    MatrixRM scores_;   // (threads, T rounded up to 16) attention scores scratch, one row per thread
    VectorF x_last_;    // (d)         final-normed last position
    VectorF logits_;    // (V)
};

}  // namespace kvlab
