// Transformer: a decoder-only forward pass on Eigen (fp32, row-major) for the llama and gpt2
// families, with and without a KV cache, counting every op's cost from the shapes it processes; and
// the serving step: tokens of many sequences, each at its own positions, in one call over a KV pool.
// MLA configs (DeepSeek-V2's latent cache) run model/mla.hpp's attention block. Non-goal: MoE routing.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "kvlab/kernels/attention.hpp"
#include "kvlab/model/cost.hpp"
#include "kvlab/kv/kv_cache.hpp"
#include "kvlab/kv/kv_pool.hpp"
#include "kvlab/model/mla.hpp"
#include "kvlab/model/ops.hpp"
#include "kvlab/calc/model_config.hpp"
#include "kvlab/weights/weights.hpp"

namespace kvlab {

struct NarrowWeights;

// What the forward calls of one run need buffers for.
struct TransformerSize {
    std::int64_t n_positions = 0;  // longest sequence: keys one query attends (scores scratch)
    std::int64_t n_tokens = 0;     // most tokens in one call: the prompt (cached), the sequence (uncached)
    bool uncached = false;         // forward_uncached is called: every position's K and V in activations
    bool narrow_weights = false;   // the weights are read narrow: panels of widened rows for calls of N > 1
    std::int64_t n_seqs = 0;       // forward_batch: most sequences in one call (0: single-sequence calls only)
    MlaPath mla_path = MlaPath::absorbed;  // MLA configs only: how attention reads the latent cache
};

// One sequence's part of a serving step (Transformer::forward_batch): its n tokens follow the previous
// sequence's in the call, at positions pos0..pos0+n-1; its K and V rows live in the pool at `rows`.
struct SeqStep {
    std::int64_t n = 0;
    std::int64_t pos0 = 0;
    KvView rows;  // its block table in the pool (KvAllocator::rows)
    bool logits = false;  // its last token's logits are wanted (a prompt's last chunk, a decode step)
};

class Transformer {
public:
    // Buffers for `size` are allocated here, once; forward calls allocate nothing. `cfg` and `weights`
    // must outlive the Transformer. Throws ConfigError for MoE configs.
    // `narrow` (nullable): the weights stored narrow, which the matmuls then read instead of the fp32
    // matrices (kernels/narrow_weights.hpp); it must outlive the Transformer and `size.narrow_weights` be set.
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
    // Serving: one forward over the tokens of several sequences (decode tokens and prompt chunks), the
    // weights read once for all of them, attention per sequence over its rows of `pool`. Returns the
    // logits (rows 0..m-1) of the sequences that ask for them, in order. Needs size.n_seqs >= seqs.size().
    const MatrixRM& forward_batch(std::span<const TokenId> tokens, std::span<const SeqStep> seqs, KvPool& pool, StepCost* cost);

    // Bytes of activation buffers for `cfg` and `size` (what the constructor allocates).
    static std::uint64_t activation_bytes(const ModelConfig& cfg, const TransformerSize& size);
    std::uint64_t activation_bytes_held() const;

private:
    const VectorF& forward(std::span<const TokenId> tokens, std::int64_t pos0, KvCache* cache, StepCost* cost);
    // The layers over runs_[0..n_runs) (row0, n, pos0 set; each layer's KvView filled here): x_ after the
    // last layer. K and V go to `cache` (one run), the pool (one run per sequence) or the activations.
    void layers(std::span<const TokenId> tokens, std::int64_t n_runs, KvCache* cache, KvPool* pool, OpRecorder& rec);
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
    MatrixRM x_last_;   // (max(1, S), d) final-normed last position (of each sequence asking for logits)
    VectorF logits_;    // (V)
    MatrixRM batch_logits_;       // (S, V) forward_batch's logits; S = size.n_seqs (empty when 0)
    std::vector<TokenRun> runs_;  // (max(1, S)) the call's runs of tokens, one per sequence
    std::span<const SeqStep> pool_seqs_;  // forward_batch: the call's sequences (where their rows are)
    MlaBuffers mla_;    // MLA configs only (else empty): model/mla.hpp
};

}  // namespace kvlab
