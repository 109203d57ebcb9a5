// The named ops of the forward pass: the math of each, its threading, and the one line that records
// its cost. Threads: a matmul runs in one parallel region where each thread computes its shares of the
// output features (Shares), with the elementwise work that follows on the same share; attention runs one
// task per (query, part of its heads); row-wise work over several tokens is split by rows.
#include "kvlab/model/ops.hpp"

#include <algorithm>
#include <cmath>

#include <omp.h>

#include "kvlab/kv/kv_cache.hpp"
#include "kernels/matmul.hpp"
#include "kernels/narrow_weights.hpp"
#include "kernels/threads.hpp"

namespace kvlab {

OpRecorder::OpRecorder(StepCost* cost) : cost_(cost) {
    if (cost_) last_ = std::chrono::steady_clock::now();
}

std::int64_t OpRecorder::elapsed_ns() {
    const auto now = std::chrono::steady_clock::now();
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now - last_).count();
    last_ = now;
    return ns;
}

void OpRecorder::lap(Op op) {
    if (cost_) cost_->wall_ns[static_cast<std::size_t>(op)] += elapsed_ns();
}

void OpRecorder::record(std::initializer_list<Entry> entries) {
    if (!cost_) return;
    for (const Entry& e : entries) cost_->add(e.op, e.cost);
    const std::int64_t ns = elapsed_ns();
    double total_flops = 0.0;
    for (const Entry& e : entries) total_flops += static_cast<double>(cost_->at(e.op).flops);
    std::int64_t given = 0;
    for (const Entry& e : entries) {
        const bool last = &e == entries.end() - 1;
        const double flops = static_cast<double>(cost_->at(e.op).flops);
        const std::int64_t share =
            last ? ns - given : (total_flops > 0.0 ? static_cast<std::int64_t>(static_cast<double>(ns) * flops / total_flops) : 0);
        cost_->wall_ns[static_cast<std::size_t>(e.op)] += share;
        given += share;
    }
}

namespace {

// W (d_out, d_in) @ x (d_in) -> y (d_out), rows b of output features, one token.
void gemv_block(const WeightRef& w, const float* x, float* y, Block b) {
    if (w.narrow) gemv_narrow(*w.narrow, b.begin, b.size, x, y + b.begin);
    else gemv_rows(w.f32.row(b.begin).data(), w.f32.cols(), b.size, w.f32.cols(), x, y + b.begin);
}

// out rows (n, d_out) = x rows (n, d_in) W^T (+ bias), output features b (a share of the op's rows, inside
// its parallel region). Both kernels read the share's weights in place, once per call (kernels/matmul.hpp):
// one token is a GEMV (memory-bound), several tokens a GEMM that packs them into this thread's row of
// scratch.gemm and reuses each weight for all.
// Narrow weights are widened inside the kernels (kernels/narrow_weights.hpp).
void matmul_block(MatrixRM& out, const MatrixRM& x, std::int64_t n, const WeightRef& w, const VectorF& bias,
                  const OpScratch& scratch, Block b) {
    if (n == 1) gemv_block(w, x.row(0).data(), out.row(0).data(), b);
    float* gemm_scratch = n > 1 ? scratch.gemm->row(omp_get_thread_num()).data() : nullptr;
    if (n > 1 && w.narrow)
        gemm_narrow(*w.narrow, b.begin, b.size, x.data(), x.cols(), n, out.data() + b.begin, out.cols(),
                    scratch.panel->row(omp_get_thread_num()).data(), gemm_scratch);
    else if (n > 1)
        gemm_rows(w.f32.row(b.begin).data(), w.f32.cols(), b.size, w.f32.cols(), x.data(), x.cols(), n, out.data() + b.begin,
                  out.cols(), gemm_scratch);
    if (bias.size() != 0) out.block(0, b.begin, n, b.size).rowwise() += bias.segment(b.begin, b.size).transpose();
}

// The counted cost, the weights at their stored width.
OpCost matmul_cost(std::int64_t n, const WeightRef& w, const VectorF& bias) {
    const std::uint64_t bytes = w.narrow ? w.narrow->bytes() : sizeof(float) * static_cast<std::uint64_t>(w.f32.size());
    return cost_matmul(n, w.cols(), w.rows(), bias.size() != 0, bytes);
}

// ---- row kernels ----

// out (d) = x (d) / sqrt(mean(x^2) + eps) * w (d)
void rmsnorm_row(float* out, const float* x, const float* w, std::int64_t d, float eps) {
    const Eigen::Map<const VectorF> xv(x, d), wv(w, d);
    const float inv = 1.0f / std::sqrt(xv.squaredNorm() / static_cast<float>(d) + eps);  // a vectorised sum
    Eigen::Map<VectorF>(out, d) = (xv * inv).cwiseProduct(wv);
}

// out (d) = (x - mean) / sqrt(var + eps) * w + b
void layernorm_row(float* out, const float* x, const float* w, const float* b, std::int64_t d, float eps) {
    const Eigen::Map<const VectorF> xv(x, d), wv(w, d), bv(b, d);
    const float mean = xv.mean();
    const float var = (xv.array() - mean).square().sum() / static_cast<float>(d);
    const float inv = 1.0f / std::sqrt(var + eps);
    Eigen::Map<VectorF>(out, d) = ((xv.array() - mean) * inv * wv.array() + bv.array()).matrix();
}

// RoPE on one position: q (H*D) and k (Hkv*D) rotated in place by angle pos * inv_freq[i] on pair i of
// every head: (x[2i], x[2i+1]) as llama2.c's interleaved weights, or (x[i], x[i + D/2]) as Hugging
// Face's. One sin and cos per frequency, shared by every head.
void rope_row(float* q, std::int64_t n_head, float* k, std::int64_t n_head_kv, std::int64_t pos,
              std::span<const float> inv_freq, bool halves, std::int64_t D) {
    const std::int64_t n_freq = D / 2;
    for (std::int64_t i = 0; i < n_freq; ++i) {
        const float angle = static_cast<float>(pos) * inv_freq[static_cast<std::size_t>(i)];
        const float cos_a = std::cos(angle), sin_a = std::sin(angle);
        auto rotate = [&](float* x, std::int64_t heads) {
            for (std::int64_t h = 0; h < heads; ++h) {
                float& a = halves ? x[h * D + i] : x[h * D + 2 * i];
                float& b = halves ? x[h * D + i + n_freq] : x[h * D + 2 * i + 1];
                const float a0 = a, b0 = b;
                a = a0 * cos_a - b0 * sin_a;
                b = a0 * sin_a + b0 * cos_a;
            }
        };
        rotate(q, n_head);
        rotate(k, n_head_kv);
    }
}

// The run holding activation row i (runs are in row order and cover rows 0..n-1 without gaps).
const TokenRun& run_of(std::span<const TokenRun> runs, std::int64_t i) {
    const auto it = std::upper_bound(runs.begin(), runs.end(), i, [](std::int64_t row, const TokenRun& r) { return row < r.row0; });
    return *(it - 1);
}

}  // namespace

namespace {

// StreamingLLM's positions in the cache [Xiao et al. 2023, section 3.2]: a query at `pos` that attends
// n_keys keys after its window evicted delta = pos + 1 - n_keys positions sees its sinks delta positions
// closer than in the text. RoPE scores depend on the distance alone, so scoring the sinks with the query
// rotated back by delta is scoring them at their slots in the cache. Writes that query into `work` past
// attention_heads' own scratch; {nullptr, 0} when no rotation applies.
struct SinkQuery {
    const float* q = nullptr;
    std::int64_t n_rows = 0;
};
SinkQuery sink_query(const float* q, std::int64_t pos, std::int64_t n_keys, const KvView& kv, const AttentionShape& shape,
                     const SinkRope* sink_rope, float* work) {
    const std::int64_t delta = pos + 1 - n_keys;
    if (!sink_rope || kv.n_sink == 0 || delta <= 0) return {};
    float* qs = work + attention_scratch_floats(shape, n_keys) - shape.n_head * shape.d_head;
    std::copy(q, q + shape.n_head * shape.d_head, qs);
    rope_row(qs, shape.n_head, qs, 0, -delta, sink_rope->inv_freq, sink_rope->pairing == RopePairing::halves, shape.d_head);
    return {qs, kv.n_sink};
}

// Queries of the runs whose sinks sink_query turns (for the cost of that rotation).
std::int64_t sink_rotations(std::span<const TokenRun> runs, std::int64_t window) {
    std::int64_t n = 0;
    for (const TokenRun& r : runs)
        for (std::int64_t i = 0; i < r.n && r.kv.n_sink > 0; ++i) n += r.pos0 + i + 1 > keys_in_window(window, r.pos0 + i) ? 1 : 0;
    return n;
}

// A narrow cache's per-tensor scales come from the first rows written (the prefill).
void calibrate_stores(std::span<const TokenRun> runs, const MatrixRM& k_new, const MatrixRM& v_new) {
    for (const TokenRun& r : runs)
        if (r.kv.k_store && !r.kv.k_store->calibrated()) {
            r.kv.k_store->calibrate(k_new, r.n);
            r.kv.v_store->calibrate(v_new, r.n);
        }
}

}  // namespace

// ---- the ops ----

void embed(MatrixRM& x, std::span<const std::int32_t> tokens, const WeightMatrix& table, OpRecorder& rec) {
    const auto n = static_cast<std::int64_t>(tokens.size());
    for (std::int64_t i = 0; i < n; ++i) x.row(i) = table.row(tokens[static_cast<std::size_t>(i)]);
    rec.record(Op::embed, cost_embed(n, table.cols()));
}

void add_positions(MatrixRM& x, std::span<const TokenRun> runs, const WeightMatrix& table, OpRecorder& rec) {
    std::int64_t n = 0;
    for (const TokenRun& r : runs) {
        x.middleRows(r.row0, r.n) += table.map().middleRows(r.pos0, r.n);
        n += r.n;
    }
    rec.record(Op::pos_embed, cost_pos_embed(n, table.cols()));
}

void norm(NormKind kind, MatrixRM& out, const MatrixRM& x, std::int64_t row0, std::int64_t n, const VectorF& w,
          const VectorF& b, float eps, Op op, OpRecorder& rec) {
    const std::int64_t d = x.cols();
    for_each_task(n, [&](std::int64_t i) {
        if (kind == NormKind::layer) layernorm_row(out.row(i).data(), x.row(row0 + i).data(), w.data(), b.data(), d, eps);
        else rmsnorm_row(out.row(i).data(), x.row(row0 + i).data(), w.data(), d, eps);
    });
    rec.record(op, kind == NormKind::layer ? cost_layernorm(n, d) : cost_rmsnorm(n, d));
}

void qkv_projections(MatrixRM& q, MatrixRM& k, MatrixRM& v, const MatrixRM& x, std::int64_t n, const LayerWeights& lw,
                     const NarrowLayer* nl, const OpScratch& scratch, OpRecorder& rec) {
    const WeightRef wq{lw.wq, nl ? &nl->wq : nullptr}, wk{lw.wk, nl ? &nl->wk : nullptr}, wv{lw.wv, nl ? &nl->wv : nullptr};
    Shares sq(wq.rows(), n == 1), sk(wk.rows(), n == 1), sv(wv.rows(), n == 1);
    on_threads([&] {  // one pass over the three weight matrices
        sq.each([&](Block b) { matmul_block(q, x, n, wq, lw.bq, scratch, b); });
        sk.each([&](Block b) { matmul_block(k, x, n, wk, lw.bk, scratch, b); });
        sv.each([&](Block b) { matmul_block(v, x, n, wv, lw.bv, scratch, b); });
    });
    rec.record({{Op::q_proj, matmul_cost(n, wq, lw.bq)},
                {Op::k_proj, matmul_cost(n, wk, lw.bk)},
                {Op::v_proj, matmul_cost(n, wv, lw.bv)}});
}

void rope(MatrixRM& q, MatrixRM& k, std::span<const TokenRun> runs, std::span<const float> inv_freq, RopePairing pairing,
          std::int64_t d_head, OpRecorder& rec) {
    const std::int64_t n_head = q.cols() / d_head, n_head_kv = k.cols() / d_head;
    const bool halves = pairing == RopePairing::halves;
    const std::int64_t n = runs.back().row0 + runs.back().n;
    for_each_task(n, [&](std::int64_t i) {
        const TokenRun& r = run_of(runs, i);
        rope_row(q.row(i).data(), n_head, k.row(i).data(), n_head_kv, r.pos0 + i - r.row0, inv_freq, halves, d_head);
    });
    rec.record(Op::rope, cost_rope(n, n_head, n_head_kv, d_head));
}

void attention(MatrixRM& out, const MatrixRM& q, const MatrixRM& k_new, const MatrixRM& v_new, std::span<const TokenRun> runs,
               const AttentionShape& shape, std::int64_t window, const OpScratch& scratch, OpRecorder& rec, const SinkRope* sink_rope) {
    const std::int64_t n = runs.back().row0 + runs.back().n;
    calibrate_stores(runs, k_new, v_new);
    auto store = [&](const TokenRun& r, std::int64_t i) {  // activation row i, into the row holding its position
        const std::int64_t row = r.kv.row_of(r.pos0 + i - r.row0);
        if (r.kv.k_store) {  // encoded; attention reads (decodes) what was stored
            r.kv.k_store->write(row, k_new.row(i).data());
            r.kv.v_store->write(row, v_new.row(i).data());
            return;
        }
        r.kv.k->row(row) = k_new.row(i);
        r.kv.v->row(row) = v_new.row(i);
    };
    // keys the query at activation row i attends: its last `window` positions, or all
    auto n_keys_of = [&](const TokenRun& r, std::int64_t i) { return keys_in_window(window, r.pos0 + i - r.row0); };
    // first stored row of those keys: cache rows 0..n_keys-1 hold exactly the attended positions (a
    // full ring holds the window); activations hold position p in row p
    auto first_row_of = [&](const TokenRun& r, std::int64_t i) {
        return r.kv.place == KvView::Place::cache ? 0 : r.pos0 + i - r.row0 + 1 - n_keys_of(r, i);
    };
    // query row i, query heads h0..h0+nh-1
    auto attend = [&](const TokenRun& r, std::int64_t i, std::int64_t h0, std::int64_t nh, float* work) {
        const SinkQuery sq = sink_query(q.row(i).data(), r.pos0 + i - r.row0, n_keys_of(r, i), r.kv, shape, sink_rope, work);
        attention_heads(shape, h0, nh, q.row(i).data(), r.kv, first_row_of(r, i), n_keys_of(r, i), out.row(i).data(), work, sq.q, sq.n_rows);
    };
    // a ring that wraps within a run: a later token would overwrite a key an earlier query still needs,
    // so that run stores and attends in order (the stores' time lands in the attention ops')
    auto wraps = [](const TokenRun& r) { return r.kv.place == KvView::Place::cache && r.n > 1 && r.pos0 + r.n > r.kv.n_rows; };
    std::int64_t n_parallel = 0;  // rows of the runs that do not wrap: stored first, then attended in one parallel pass
    for (const TokenRun& r : runs)
        if (!wraps(r)) {
            n_parallel += r.n;
            for (std::int64_t i = r.row0; i < r.row0 + r.n; ++i) store(r, i);
        }
    if (n_parallel > 0) rec.lap(Op::kv_store);
    for (const TokenRun& r : runs) {
        if (!wraps(r)) continue;
        for (std::int64_t i = r.row0; i < r.row0 + r.n; ++i) {
            store(r, i);
            attend(r, i, 0, shape.n_head, scratch.scores->row(0).data());
        }
    }
    if (n_parallel > 0) {
        // one task per (query, part of its heads): as few parts as keep every thread busy (one per thread
        // in a decode step, one per query in a prefill), so that a task reads each row's slice of its KV
        // heads in one run and each key once for the query heads that share it. Parts are whole groups
        // while there are enough KV heads; past that (fewer KV heads than threads) groups are split.
        const std::int64_t n_group = shape.n_head / shape.n_head_kv;
        const std::int64_t parts = std::min(shape.n_head, (omp_get_max_threads() + n - 1) / n);
        auto first_head = [&](std::int64_t p) {
            return parts <= shape.n_head_kv ? p * shape.n_head_kv / parts * n_group : p * shape.n_head / parts;
        };
        for_each_task(n * parts, [&](std::int64_t task) {
            const std::int64_t i = task / parts, p = task % parts;
            const TokenRun& r = run_of(runs, i);
            if (wraps(r)) return;
            const std::int64_t h0 = first_head(p);
            attend(r, i, h0, first_head(p + 1) - h0, scratch.scores->row(omp_get_thread_num()).data());
        });
    }
    // costs per run: each reads its own sequence's keys
    const std::int64_t d_kv = k_new.cols();
    OpCost store_cost, qk_cost, softmax_cost, av_cost;
    for (const TokenRun& r : runs) {
        std::int64_t n_scores = 0;  // query-key pairs per head, over the run's queries
        for (std::int64_t i = r.row0; i < r.row0 + r.n; ++i) n_scores += n_keys_of(r, i);
        const std::int64_t n_key_rows = r.n - 1 + n_keys_of(r, r.row0);  // distinct positions read: first query's oldest .. newest
        store_cost += cost_kv_store(r.n, d_kv, r.kv.place, r.kv.row_bytes);
        qk_cost += cost_qk(r.n, shape.n_head, d_kv, shape.d_head, n_scores, n_key_rows, r.kv.place, r.kv.row_bytes);
        softmax_cost += cost_softmax(shape.n_head, n_scores);
        av_cost += cost_av(r.n, shape.n_head, d_kv, shape.d_head, n_scores, n_key_rows, r.kv.place, r.kv.row_bytes);
    }
    rec.add(Op::kv_store, store_cost);
    if (sink_rope) rec.add(Op::rope, cost_rope(sink_rotations(runs, window), shape.n_head, 0, shape.d_head));
    rec.record({{Op::qk, qk_cost}, {Op::softmax, softmax_cost}, {Op::av, av_cost}});
}

void project_add(MatrixRM& x, MatrixRM& tmp, const MatrixRM& in, std::int64_t n, const WeightRef& w, const VectorF& b,
                 const OpScratch& scratch, Op proj, Op residual, OpRecorder& rec) {
    Shares sh(w.rows(), n == 1);
    on_threads([&] {  // the residual on each thread's block of the output, while it is in cache
        sh.each([&](Block blk) {
            matmul_block(tmp, in, n, w, b, scratch, blk);
            x.block(0, blk.begin, n, blk.size) += tmp.block(0, blk.begin, n, blk.size);
        });
    });
    rec.record({{proj, matmul_cost(n, w, b)}, {residual, cost_residual(n, x.cols())}});
}

void swiglu_mlp_in(MatrixRM& h, MatrixRM& h2, const MatrixRM& x, std::int64_t n, const LayerWeights& lw,
                   const NarrowLayer* nl, const OpScratch& scratch, OpRecorder& rec) {
    const WeightRef w1{lw.w1, nl ? &nl->w1 : nullptr}, w3{lw.w3, nl ? &nl->w3 : nullptr};
    const VectorF no_bias;
    Shares sh(w1.rows(), n == 1);
    on_threads([&] {  // gate and up share the block split, so SwiGLU runs on each thread's block in cache
        sh.each([&](Block blk) {
            matmul_block(h, x, n, w1, lw.b1, scratch, blk);
            matmul_block(h2, x, n, w3, no_bias, scratch, blk);
            auto g = h.block(0, blk.begin, n, blk.size).array();
            g = g / (1.0f + (-g).exp()) * h2.block(0, blk.begin, n, blk.size).array();
        });
    });
    rec.record({{Op::mlp_gate, matmul_cost(n, w1, lw.b1)},
                {Op::mlp_up, matmul_cost(n, w3, no_bias)},
                {Op::activation, cost_swiglu(n, h.cols())}});
}

void gelu_mlp_in(MatrixRM& h, const MatrixRM& x, std::int64_t n, const LayerWeights& lw, const NarrowLayer* nl,
                 const OpScratch& scratch, OpRecorder& rec) {
    const WeightRef w1{lw.w1, nl ? &nl->w1 : nullptr};
    Shares sh(w1.rows(), n == 1);
    on_threads([&] {  // GELU on each thread's block while it is in cache
        sh.each([&](Block blk) {
            matmul_block(h, x, n, w1, lw.b1, scratch, blk);
            auto u = h.block(0, blk.begin, n, blk.size).array();
            constexpr float c = 0.7978845608028654f;  // sqrt(2/pi)
            u = 0.5f * u * (1.0f + (c * (u + 0.044715f * u * u * u)).tanh());
        });
    });
    rec.record({{Op::mlp_up, matmul_cost(n, w1, lw.b1)}, {Op::activation, cost_gelu_tanh(n, h.cols())}});
}

void classify(VectorF& logits, const MatrixRM& x, const WeightRef& w, OpRecorder& rec) {
    Shares sh(w.rows(), true);
    on_threads([&] { sh.each([&](Block b) { gemv_block(w, x.row(0).data(), logits.data(), b); }); });
    rec.record(Op::lm_head, matmul_cost(1, w, VectorF()));
}

void classify_rows(MatrixRM& logits, const MatrixRM& x, std::int64_t m, const WeightRef& w, const OpScratch& scratch, OpRecorder& rec) {
    const VectorF no_bias;
    Shares sh(w.rows(), m == 1);
    on_threads([&] { sh.each([&](Block b) { matmul_block(logits, x, m, w, no_bias, scratch, b); }); });
    rec.record(Op::lm_head, matmul_cost(m, w, no_bias));
}

}  // namespace kvlab
