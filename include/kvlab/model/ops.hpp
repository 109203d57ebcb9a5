// The forward pass's named ops (llm.c style): each computes one step of the transformer on n token
// rows, splits its work over the threads itself, and records its cost (the formula from cost.hpp,
// called with the shapes it just processed) and its wall time through one OpRecorder. The forward pass
// (transformer.cpp) is then a list of op calls.
//
// Ops that run fused in one pass over the weights (q/k/v; gate, up and SwiGLU; a projection and its
// residual; attention's store, QK, softmax and AV) record each of their ops, and split the pass's time
// between them in proportion to their FLOPs. Shapes: n tokens, d model, H heads, Hkv KV heads, D head
// dim, f FFN, V vocab; matrices are row-major, one token per row.
#pragma once
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <span>

#include "kvlab/kernels/attention.hpp"
#include "kvlab/kv/kv_view.hpp"
#include "kvlab/model/cost.hpp"
#include "kvlab/weights/weights.hpp"

namespace kvlab {

// Costs and per-op wall time of one forward call into a StepCost; a null StepCost turns both off (no
// clock reads). Each record charges the time since the previous one to the op(s) it names.
class OpRecorder {
public:
    explicit OpRecorder(StepCost* cost);
    struct Entry {
        Op op;
        OpCost cost;
    };
    // One op that ran alone: its cost, and the time since the previous record.
    void record(Op op, const OpCost& cost) {
        add(op, cost);
        lap(op);
    }
    // Ops that ran in one pass: their costs, and the pass's time split in proportion to the FLOPs each
    // has counted so far in this call (the same proportions every layer, so the split is stable).
    void record(std::initializer_list<Entry> entries);
    void add(Op op, const OpCost& cost) {  // cost only, no time
        if (cost_) cost_->add(op, cost);
    }
    void lap(Op op);  // the time since the previous record, to `op`

private:
    std::int64_t elapsed_ns();
    StepCost* cost_;
    std::chrono::steady_clock::time_point last_{};
};

// Per-thread scratch the kernels need: packed tokens for the GEMMs, one scores row each.
struct OpScratch {
    MatrixRM* gemm = nullptr;    // (threads, gemm_scratch_floats(widest input, n_max)); unused for n = 1
    MatrixRM* scores = nullptr;  // (threads, attention_scratch_floats(shape, keys)): attention's scores and chunk
    MatrixRM* panel = nullptr;   // narrow weights, n > 1: (threads, narrow_panel_floats(widest input)) widened rows
};

// A weight matrix as the matmul ops read it: fp32, or its narrow copy when the run stores its weights
// narrow (kernels/narrow_weights.hpp), which the kernels widen as they read.
class NarrowMatrix;
struct NarrowLayer;
struct WeightRef {
    const WeightMatrix& f32;
    const NarrowMatrix* narrow = nullptr;
    std::int64_t rows() const { return f32.rows(); }
    std::int64_t cols() const { return f32.cols(); }
};

enum class NormKind { rms, layer };

// x (n, d) embedded: x[i] = E[tokens[i]]                                               records embed
void embed(MatrixRM& x, std::span<const std::int32_t> tokens, const WeightMatrix& table, OpRecorder& rec);

// out rows 0..n-1 (d) = rmsnorm(x) * w, or layernorm(x) * w + b, of x rows row0..row0+n-1     records `op`
void norm(NormKind kind, MatrixRM& out, const MatrixRM& x, std::int64_t row0, std::int64_t n, const VectorF& w,
          const VectorF& b, float eps, Op op, OpRecorder& rec);
// q (n, H*D), k (n, Hkv*D), v (n, Hkv*D) = x Wq^T, x Wk^T, x Wv^T (+ biases)           records q/k/v_proj
// nl: the layer's narrow matrices, or null for fp32 (also in the MLP ops)
void qkv_projections(MatrixRM& q, MatrixRM& k, MatrixRM& v, const MatrixRM& x, std::int64_t n, const LayerWeights& lw,
                     const NarrowLayer* nl, const OpScratch& scratch, OpRecorder& rec);
// One sequence's tokens in a forward call: rows row0..row0+n-1 of the activations hold its positions
// pos0..pos0+n-1, and its K and V live in kv. A single-sequence call is one run; a serving step packs
// one run per sequence (decode tokens and prompt chunks), each at its own positions.
struct TokenRun {
    std::int64_t row0 = 0;
    std::int64_t n = 0;
    std::int64_t pos0 = 0;
    KvView kv{};
};

// x (n, d) += P[pos] of each run's positions (gpt2's learned positions)                records pos_embed
void add_positions(MatrixRM& x, std::span<const TokenRun> runs, const WeightMatrix& table, OpRecorder& rec);
// q (n, H*D) and k (n, Hkv*D) rotated for each run's positions (RoPE; pairs as `pairing`)  records rope
void rope(MatrixRM& q, MatrixRM& k, std::span<const TokenRun> runs, std::span<const float> inv_freq, RopePairing pairing,
          std::int64_t d_head, OpRecorder& rec);
// For each run: store its new K and V rows at its positions, then out (its rows, H*D) = softmax(q K^T /
// sqrt(D)) V per head over the keys each of its queries attends in its own sequence (`window` > 0: its
// last `window` positions)                                              records kv_store, qk, softmax, av
// sink_rope (StreamingLLM's positions in the cache, --sink-positions cache): once a query's window has
// evicted keys, its sinks (rows 0..n_sink-1) are scored with the query turned back by the positions evicted,
// delta = pos + 1 - n_keys, so each sink sits at its slot in the cache (records that rotation as rope).
struct SinkRope {
    std::span<const float> inv_freq;
    RopePairing pairing = RopePairing::neighbours;
};
void attention(MatrixRM& out, const MatrixRM& q, const MatrixRM& k_new, const MatrixRM& v_new, std::span<const TokenRun> runs,
               const AttentionShape& shape, std::int64_t window, const OpScratch& scratch, OpRecorder& rec,
               const SinkRope* sink_rope = nullptr);
// One sequence: the n rows at positions pos0.. are one run.
inline void attention(MatrixRM& out, const MatrixRM& q, const MatrixRM& k_new, const MatrixRM& v_new, std::int64_t n,
                      std::int64_t pos0, const KvView& kv, const AttentionShape& shape, std::int64_t window,
                      const OpScratch& scratch, OpRecorder& rec) {
    const TokenRun run{0, n, pos0, kv};
    attention(out, q, k_new, v_new, std::span<const TokenRun>(&run, 1), shape, window, scratch, rec);
}

// x (n, d) += in (n, d_in) W^T (+ b), the product staged in tmp (n, d)       records `proj`, `residual`
void project_add(MatrixRM& x, MatrixRM& tmp, const MatrixRM& in, std::int64_t n, const WeightRef& w, const VectorF& b,
                 const OpScratch& scratch, Op proj, Op residual, OpRecorder& rec);
// h (n, f) = silu(x W1^T) * (x W3^T), W3's product staged in h2 (n, f)      records mlp_gate, mlp_up, activation
void swiglu_mlp_in(MatrixRM& h, MatrixRM& h2, const MatrixRM& x, std::int64_t n, const LayerWeights& lw,
                   const NarrowLayer* nl, const OpScratch& scratch, OpRecorder& rec);
// h (n, f) = gelu_tanh(x W1^T + b1)                                          records mlp_up, activation
void gelu_mlp_in(MatrixRM& h, const MatrixRM& x, std::int64_t n, const LayerWeights& lw, const NarrowLayer* nl,
                 const OpScratch& scratch, OpRecorder& rec);
// logits (V) = W x[0] (one token)                                             records lm_head
void classify(VectorF& logits, const MatrixRM& x, const WeightRef& w, OpRecorder& rec);
// logits (m, V) = x (m, d) W^T (the last token of each of m sequences)         records lm_head
void classify_rows(MatrixRM& logits, const MatrixRM& x, std::int64_t m, const WeightRef& w, const OpScratch& scratch, OpRecorder& rec);

}  // namespace kvlab
