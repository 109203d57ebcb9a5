// The forward pass reads like the math: one comment per step, one cost record per op, counted from
// the shapes the step actually processed (matrix rows/cols, keys attended).
#include "model/transformer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <initializer_list>

#include <fmt/format.h>
#include <omp.h>

#include "model/attention.hpp"
#include "core/checked.hpp"
#include "core/error.hpp"
#include "model/matmul.hpp"

namespace kvlab {

namespace {

// softmax(q_h K_h^T / sqrt(D)) V_h for one query and one head h; same layout as attention_rows.
// Runs on Eigen's vectorised GEMV and exp. `scores` (n_keys) is scratch.
void attention_head(const AttentionShape& shape, std::int64_t h, const float* q, const float* k, const float* v,
                    std::int64_t n_keys, float* out, float* scores) {
    using StridedRows = Eigen::Map<const MatrixRM, 0, Eigen::OuterStride<>>;
    const std::int64_t D = shape.d_head, d_kv = shape.n_head_kv * D, n_group = shape.n_head / shape.n_head_kv;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    const std::int64_t kv_off = (h / n_group) * D;  // column of this head's KV head in a (Hkv*D) row
    const StridedRows k_h(k + kv_off, n_keys, D, Eigen::OuterStride<>(d_kv));  // (n_keys, D)
    const StridedRows v_h(v + kv_off, n_keys, D, Eigen::OuterStride<>(d_kv));  // (n_keys, D)
    Eigen::Map<const VectorF> q_h(q + h * D, D);
    Eigen::Map<VectorF> out_h(out + h * D, D);
    Eigen::Map<VectorF> s(scores, n_keys);  // (n_keys)
    // scores = K_h q_h / sqrt(D), then softmax, max-subtracted
    s.noalias() = k_h * q_h;
    s *= scale;
    s = (s.array() - s.maxCoeff()).exp();
    const float sum = s.sum();
    // out_h = V_h^T p
    out_h.noalias() = v_h.transpose() * s;
    out_h /= sum;
}

}  // namespace

// softmax(q K^T / sqrt(D)) V per head for one query: the math of attention_decode_ref (same argument
// layout: q (H*D), k and v (n_keys, Hkv*D) rows, out (H*D), scores (n_keys)). A test holds the two to 1e-5.
void attention_rows(const AttentionShape& shape, const float* q, const float* k, const float* v, std::int64_t n_keys,
                    float* out, float* scores) {
    for (std::int64_t h = 0; h < shape.n_head; ++h) attention_head(shape, h, q, k, v, n_keys, out, scores);
}

namespace {

// out (d) = x (d) / sqrt(mean(x^2) + eps) * w (d)
void rmsnorm_row(float* out, const float* x, const float* w, std::int64_t d, float eps) {
    float ss = 0.0f;
    for (std::int64_t i = 0; i < d; ++i) ss += x[i] * x[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
    for (std::int64_t i = 0; i < d; ++i) out[i] = x[i] * inv * w[i];
}

// out (d) = (x - mean) / sqrt(var + eps) * w + b
void layernorm_row(float* out, const float* x, const float* w, const float* b, std::int64_t d, float eps) {
    float mean = 0.0f;
    for (std::int64_t i = 0; i < d; ++i) mean += x[i];
    mean /= static_cast<float>(d);
    float var = 0.0f;
    for (std::int64_t i = 0; i < d; ++i) var += (x[i] - mean) * (x[i] - mean);
    const float inv = 1.0f / std::sqrt(var / static_cast<float>(d) + eps);
    for (std::int64_t i = 0; i < d; ++i) out[i] = (x[i] - mean) * inv * w[i] + b[i];
}

// A thread's share of [0, n) inside a parallel region: contiguous, starting at a multiple of 16 (one
// 64-byte line of floats), so each thread streams its own rows of a weight matrix.
struct Block {
    std::int64_t begin = 0, size = 0;
};

Block thread_block(std::int64_t n) {
    const std::int64_t n_threads = omp_get_num_threads(), t = omp_get_thread_num(), n_lines = (n + 15) / 16;
    const std::int64_t begin = std::min(n, n_lines * t / n_threads * 16), end = std::min(n, n_lines * (t + 1) / n_threads * 16);
    return {begin, end - begin};
}

// W (d_out, d_in) @ x (d_in) -> y (d_out), this thread's block of output features, for one token (the
// GEMV of matmul_block, on raw vectors such as the classifier's).
Block gemv_block(const MatrixRM& w, const float* x, float* y) {
    const Block b = thread_block(w.rows());
    if (b.size > 0) gemv_rows(w.row(b.begin).data(), w.cols(), b.size, w.cols(), x, y + b.begin);
    return b;
}

// W (d_out, d_in) @ x rows (n, d_in) -> out rows (n, d_out) (+ bias), this thread's block of output
// features; called inside a parallel region, where every thread computes its own block. Both kernels
// read the block's weights in place, once per call (model/matmul.hpp): one token is a GEMV
// (memory-bound), several tokens a GEMM that packs the tokens into `scratch`
// (gemm_scratch_floats(d_in, n)) and reuses each weight for all of them.
Block matmul_block(MatrixRM& out, const MatrixRM& x, std::int64_t n, const MatrixRM& w, const VectorF& bias,
                   float* scratch) {
    const Block b = n == 1 ? gemv_block(w, x.row(0).data(), out.row(0).data()) : thread_block(w.rows());
    if (b.size == 0) return b;
    if (n > 1)
        gemm_rows(w.row(b.begin).data(), w.cols(), b.size, w.cols(), x.data(), x.cols(), n, out.data() + b.begin,
                  out.cols(), scratch);
    if (bias.size() != 0) out.block(0, b.begin, n, b.size).rowwise() += bias.segment(b.begin, b.size).transpose();
    return b;
}

// Input features of the widest matmul: the GEMM scratch is sized for it.
std::int64_t widest_input(const ModelConfig& cfg) { return std::max({cfg.d_model, cfg.d_q(), cfg.d_ff}); }

// f(i) for every task i in [0, n), handed out to the threads one at a time (tasks may differ in cost). One
// task, or one thread, runs here with no OpenMP region at all: libgomp allocates a new team for every
// one-thread region (an if() clause that serialises it included), and a decode step must not allocate.
template <typename TaskFn>
void for_each_task(std::int64_t n, TaskFn f) {
    if (!omp_in_parallel() && (n == 1 || omp_get_max_threads() == 1)) {
        for (std::int64_t i = 0; i < n; ++i) f(i);
        return;
    }
#pragma omp parallel for schedule(dynamic)
    for (std::int64_t i = 0; i < n; ++i) f(i);
}

// body() on every thread of a team, each taking its share by omp_get_thread_num (thread_block); with one
// thread it runs here, outside any region, since libgomp allocates a fresh team for every one-thread
// region. (Under --threads 0 libgomp may still size a team to one thread on a loaded machine.) Inside an
// enclosing region a nested region is kept, so thread_block sees a team of its own.
template <typename Body>
void on_threads(Body body) {
    if (omp_get_max_threads() == 1 && !omp_in_parallel()) {
        body();
        return;
    }
#pragma omp parallel
    body();
}

// Each thread's scores row starts 64-byte aligned (a multiple of 16 floats), so Eigen's vectorised sums
// peel the same way whichever thread computes a query: results do not depend on the schedule.
std::int64_t scores_row_floats(std::int64_t n_tokens_max) { return (n_tokens_max + 15) / 16 * 16; }

void count(StepCost* cost, Op op, const OpCost& c) {
    if (cost) cost->add(op, c);
}

void count_matmul(StepCost* cost, Op op, std::int64_t n, const MatrixRM& w, const VectorF& bias) {
    if (cost) cost->add(op, cost_matmul(n, w.cols(), w.rows(), bias.size() != 0));
}

// Per-op wall time: each mark charges the time since the previous mark to the op just run. No clock
// reads when counting is off. ~25 ns per mark, about 20 marks per layer.
class OpTimer {
public:
    explicit OpTimer(StepCost* cost) : cost_(cost) {
        if (cost_) last_ = std::chrono::steady_clock::now();
    }
    void mark(Op op) {
        if (cost_) cost_->wall_ns[static_cast<std::size_t>(op)] += lap();
    }
    // Ops that run fused in one pass (qk, softmax and av in attention; q/k/v, gate/up/activation, a
    // projection and its residual): the pass's time is split in proportion to the ops' FLOPs counted
    // so far in this call.
    void mark_split(std::initializer_list<Op> ops) {
        if (!cost_) return;
        const std::int64_t ns = lap();
        double total_flops = 0.0;
        for (const Op op : ops) total_flops += static_cast<double>(cost_->at(op).flops);
        std::int64_t given = 0;
        for (const Op op : ops) {
            const bool last = op == *(ops.end() - 1);
            const std::int64_t share = last ? ns - given
                                            : (total_flops > 0.0 ? static_cast<std::int64_t>(static_cast<double>(ns) *
                                                                     static_cast<double>(cost_->at(op).flops) / total_flops)
                                                                 : 0);
            cost_->wall_ns[static_cast<std::size_t>(op)] += share;
            given += share;
        }
    }

private:
    std::int64_t lap() {
        const auto now = std::chrono::steady_clock::now();
        const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now - last_).count();
        last_ = now;
        return ns;
    }
    StepCost* cost_;
    std::chrono::steady_clock::time_point last_{};
};

}  // namespace

Transformer::Transformer(const ModelConfig& cfg, const Weights& weights, const TransformerSize& size)
    : cfg_(cfg), w_(weights), size_(size), n_threads_(omp_get_max_threads()) {
    if (cfg.mla)
        throw ConfigError(fmt::format("{}: multi-head latent attention (MLA) is not simulated; kvcalc sizes its cache", cfg.name));
    if (cfg.n_expert > 1)
        throw ConfigError(fmt::format("{}: mixture-of-experts ({} experts) is not simulated; kvcalc sizes its cache, "
                                      "and the KV cache of one expert-free layer stack is what simulate would show",
                                      cfg.name, cfg.n_expert));
    if (size.n_tokens <= 0 || size.n_positions < size.n_tokens || (size.uncached && size.n_tokens != size.n_positions))
        throw UsageError(fmt::format("simulate: buffers for {} tokens per call over {} positions{}; expected 1 <= tokens "
                                     "<= positions (uncached: tokens = positions)",
                                     size.n_tokens, size.n_positions, size.uncached ? " (uncached)" : ""));
    if (cfg.family == Family::llama && cfg.d_head % 2 != 0)
        throw ConfigError(fmt::format("{}: head_dim {} is odd; RoPE needs an even head dimension", cfg.name, cfg.d_head));
    if (cfg.family == Family::gpt2 && size.n_positions > weights.pos_embed.rows())
        throw UsageError(fmt::format("simulate: {} positions exceed the {} learned position embeddings of {}",
                                     size.n_positions, weights.pos_embed.rows(), cfg.name));
    const std::int64_t d = cfg.d_model, d_q = cfg.d_q(), d_kv = cfg.d_kv(), f = cfg.d_ff;
    if (static_cast<std::int64_t>(weights.layers.size()) != cfg.n_layer || weights.tok_embed.rows() != cfg.n_vocab ||
        weights.tok_embed.cols() != d || weights.classifier().rows() != cfg.n_vocab)
        throw ConfigError(fmt::format("{}: weights ({} layers, embedding {}x{}) do not match the config ({} layers, {}x{})",
                                      cfg.name, weights.layers.size(), weights.tok_embed.rows(), weights.tok_embed.cols(),
                                      cfg.n_layer, cfg.n_vocab, d));
    if (weights.classifier().cols() != d)
        throw ConfigError(fmt::format("{}: the classifier is {} wide, expected d_model {}", cfg.name,
                                      weights.classifier().cols(), d));
    // the matmul kernels read raw rows: every shape is checked here, once
    auto check_shape = [&](std::size_t l, const char* name, const MatrixRM& m, std::int64_t rows, std::int64_t cols) {
        if (m.rows() != rows || m.cols() != cols)
            throw ConfigError(fmt::format("{}: layer {} {} is {}x{}, expected {}x{} from the config", cfg.name, l, name,
                                          m.rows(), m.cols(), rows, cols));
    };
    for (std::size_t l = 0; l < weights.layers.size(); ++l) {
        const LayerWeights& lw = weights.layers[l];
        check_shape(l, "wq", lw.wq, d_q, d);
        check_shape(l, "wk", lw.wk, d_kv, d);
        check_shape(l, "wv", lw.wv, d_kv, d);
        check_shape(l, "wo", lw.wo, d, d_q);
        check_shape(l, "w1", lw.w1, f, d);
        if (cfg.family == Family::llama) check_shape(l, "w3", lw.w3, f, d);
        check_shape(l, "w2", lw.w2, d, f);
    }

    const std::int64_t N = size.n_tokens, T = size.n_positions;
    x_.resize(N, d);
    xb_.resize(N, d);
    q_.resize(N, d_q);
    k_new_.resize(N, d_kv);
    v_new_.resize(N, d_kv);
    if (size.uncached) {
        k_act_.resize(T, d_kv);
        v_act_.resize(T, d_kv);
    }
    att_.resize(N, d_q);
    hb_.resize(N, f);
    if (cfg.family == Family::llama) hb2_.resize(N, f);
    scores_.resize(n_threads_, scores_row_floats(T));
    if (N > 1) gemm_scratch_.resize(n_threads_, gemm_scratch_floats(widest_input(cfg), N));
    if (cfg.family == Family::llama) {
        const std::int64_t n_freq = cfg.d_head / 2;
        inv_freq_.resize(static_cast<std::size_t>(n_freq));
        // as llama2.c: freq_i = 1 / theta^(2i / D), in float
        for (std::int64_t i = 0; i < n_freq; ++i)
            inv_freq_[static_cast<std::size_t>(i)] =
                1.0f / std::pow(static_cast<float>(cfg.rope_theta), static_cast<float>(2 * i) / static_cast<float>(cfg.d_head));
    }
    x_last_.resize(d);
    logits_.resize(cfg.n_vocab);
}

std::uint64_t Transformer::activation_bytes(const ModelConfig& cfg, const TransformerSize& size) {
    const auto N = static_cast<std::uint64_t>(size.n_tokens), T = static_cast<std::uint64_t>(size.n_positions);
    const auto d = static_cast<std::uint64_t>(cfg.d_model), d_q = static_cast<std::uint64_t>(cfg.d_q()),
               d_kv = static_cast<std::uint64_t>(cfg.d_kv()), f = static_cast<std::uint64_t>(cfg.d_ff);
    const bool llama = cfg.family == Family::llama;
    // every sum and product checked: the sizes come from user configs and flags
    const auto add = [](std::uint64_t a, std::uint64_t b) { return checked_add(a, b, "activation bytes"); };
    const auto mul = [](std::uint64_t a, std::uint64_t b) { return checked_mul(a, b, "activation bytes"); };
    const std::uint64_t row = add(add(add(mul(2, d), mul(2, d_q)), mul(2, d_kv)), mul(llama ? 2 : 1, f));
    std::uint64_t n = mul(N, row);                                      // x, xb, q, att, k_new, v_new, MLP
    if (size.uncached) n = add(n, mul(T, mul(2, d_kv)));                // k_act, v_act
    const auto n_threads = static_cast<std::uint64_t>(omp_get_max_threads());
    n = add(n, mul(n_threads, static_cast<std::uint64_t>(scores_row_floats(size.n_positions))));  // scores
    if (N > 1)  // packed tokens
        n = add(n, mul(n_threads, static_cast<std::uint64_t>(gemm_scratch_floats(widest_input(cfg), size.n_tokens))));
    if (llama) n = add(n, static_cast<std::uint64_t>(cfg.d_head) / 2);  // inv_freq
    n = add(n, add(d, static_cast<std::uint64_t>(cfg.n_vocab)));         // x_last, logits
    return mul(n, sizeof(float));
}

std::uint64_t Transformer::activation_bytes_held() const {
    const auto n = x_.size() + xb_.size() + q_.size() + k_new_.size() + v_new_.size() + k_act_.size() +
                   v_act_.size() + att_.size() + hb_.size() + hb2_.size() + scores_.size() + gemm_scratch_.size() +
                   static_cast<Eigen::Index>(inv_freq_.size()) + x_last_.size() + logits_.size();
    return static_cast<std::uint64_t>(n) * sizeof(float);
}

const VectorF& Transformer::forward_cached(std::span<const TokenId> tokens, std::int64_t pos0, KvCache& cache,
                                           StepCost* cost) {
    if (pos0 < 0 || pos0 + static_cast<std::int64_t>(tokens.size()) > cache.n_tokens_max())
        throw UsageError(fmt::format("simulate: positions {}..{} do not fit the KV cache of {} positions", pos0,
                                     pos0 + static_cast<std::int64_t>(tokens.size()) - 1, cache.n_tokens_max()));
    return forward(tokens, pos0, &cache, cost);
}

const VectorF& Transformer::forward_uncached(std::span<const TokenId> tokens, StepCost* cost) {
    if (!size_.uncached) throw Error("simulate: forward_uncached on a transformer sized for cached calls only");
    return forward(tokens, 0, nullptr, cost);
}

// RoPE on one position: q (H*D) and k (Hkv*D) rotated in place, pairs chosen by the weights' format.
// One sin and cos per frequency, shared by every head.
void Transformer::rope_row(float* q, float* k, std::int64_t pos) const {
    const std::int64_t D = cfg_.d_head, n_freq = D / 2;
    const bool halves = w_.rope_pairing == RopePairing::halves;
    for (std::int64_t i = 0; i < n_freq; ++i) {
        const float angle = static_cast<float>(pos) * inv_freq_[static_cast<std::size_t>(i)];
        const float cos_a = std::cos(angle), sin_a = std::sin(angle);
        auto rotate = [&](float* x, std::int64_t n_head) {
            for (std::int64_t h = 0; h < n_head; ++h) {
                float& a = halves ? x[h * D + i] : x[h * D + 2 * i];
                float& b = halves ? x[h * D + i + n_freq] : x[h * D + 2 * i + 1];
                const float a0 = a, b0 = b;
                a = a0 * cos_a - b0 * sin_a;
                b = a0 * sin_a + b0 * cos_a;
            }
        };
        rotate(q, cfg_.n_head);
        rotate(k, cfg_.n_head_kv);
    }
}

// Threads: every matmul runs in one parallel region where each thread computes its block of output
// features (matmul_block), with the elementwise work that follows on the same block; attention runs one
// task per (query, head); row-wise work over several tokens is split by rows.
const VectorF& Transformer::forward(std::span<const TokenId> tokens, std::int64_t pos0, KvCache* cache,
                                    StepCost* cost) {
    const auto n = static_cast<std::int64_t>(tokens.size());
    if (n == 0 || n > size_.n_tokens || pos0 + n > size_.n_positions)
        throw UsageError(fmt::format("simulate: {} tokens at position {} do not fit the buffers allocated ({} tokens per "
                                     "call, {} positions)", n, pos0, size_.n_tokens, size_.n_positions));
    if (omp_get_max_threads() > n_threads_)  // scores_ has one row per thread of the team sized at construction
        throw Error(fmt::format("simulate: {} threads, but the transformer was built for {}; set the thread count "
                                "before constructing it", omp_get_max_threads(), n_threads_));
    for (const TokenId t : tokens)
        if (t < 0 || t >= cfg_.n_vocab)
            throw UsageError(fmt::format("simulate: token id {} is outside the vocabulary [0, {})", t, cfg_.n_vocab));
    const bool gpt2 = cfg_.family == Family::gpt2;
    const std::int64_t d = cfg_.d_model, D = cfg_.d_head;
    const float eps = static_cast<float>(cfg_.norm_eps);
    const KvPlace place = cache ? KvPlace::cache : KvPlace::activations;
    const AttentionShape shape{cfg_.n_head, cfg_.n_head_kv, D};
    const VectorF no_bias;

    auto norm_rows = [&](const VectorF& w, const VectorF& b) {
        for_each_task(n, [&](std::int64_t i) {
            if (gpt2) layernorm_row(xb_.row(i).data(), x_.row(i).data(), w.data(), b.data(), d, eps);
            else rmsnorm_row(xb_.row(i).data(), x_.row(i).data(), w.data(), d, eps);
        });
    };
    auto norm_cost = [&](std::int64_t rows) { return gpt2 ? cost_layernorm(rows, d) : cost_rmsnorm(rows, d); };
    // out = in W^T (+ bias) for the n tokens, this thread's block of output features
    auto project = [&](MatrixRM& out, const MatrixRM& in, const MatrixRM& w, const VectorF& bias) {
        return matmul_block(out, in, n, w, bias, n > 1 ? gemm_scratch_.row(omp_get_thread_num()).data() : nullptr);
    };
    OpTimer timer(cost);

    // token embedding (+ learned positions for gpt2)
    for (std::int64_t i = 0; i < n; ++i) x_.row(i) = w_.tok_embed.row(tokens[static_cast<std::size_t>(i)]);
    count(cost, Op::embed, cost_embed(n, w_.tok_embed.cols()));
    timer.mark(Op::embed);
    if (gpt2) {
        x_.topRows(n) += w_.pos_embed.middleRows(pos0, n);
        count(cost, Op::pos_embed, cost_pos_embed(n, w_.pos_embed.cols()));
        timer.mark(Op::pos_embed);
    }

    for (std::int64_t l = 0; l < cfg_.n_layer; ++l) {
        const LayerWeights& lw = w_.layers[static_cast<std::size_t>(l)];

        // attention norm
        norm_rows(lw.attn_norm, lw.attn_norm_bias);
        count(cost, Op::attn_norm, norm_cost(n));
        timer.mark(Op::attn_norm);

        // q, k, v projections for the n new tokens, in one pass over the three weight matrices
        on_threads([&] {
            project(q_, xb_, lw.wq, lw.bq);
            project(k_new_, xb_, lw.wk, lw.bk);
            project(v_new_, xb_, lw.wv, lw.bv);
        });
        count_matmul(cost, Op::q_proj, n, lw.wq, lw.bq);
        count_matmul(cost, Op::k_proj, n, lw.wk, lw.bk);
        count_matmul(cost, Op::v_proj, n, lw.wv, lw.bv);
        timer.mark_split({Op::q_proj, Op::k_proj, Op::v_proj});  // one fused pass

        // RoPE on q and k (llama); keys are stored after rotation
        if (!gpt2) {
            for_each_task(n, [&](std::int64_t i) { rope_row(q_.row(i).data(), k_new_.row(i).data(), pos0 + i); });
            count(cost, Op::rope, cost_rope(n, q_.cols() / D, k_new_.cols() / D, D));
            timer.mark(Op::rope);
        }

        // K and V go to the cache (cached) or to this layer's activations (uncached): the only
        // difference between the two modes is where they are written and read.
        MatrixRM& k_store = cache ? cache->k(l) : k_act_;
        MatrixRM& v_store = cache ? cache->v(l) : v_act_;
        const bool windowed = cfg_.sliding_window && cfg_.layer_windowed[static_cast<std::size_t>(l)];
        auto store = [&](std::int64_t i) {
            const std::int64_t row = cache ? cache->row_of(l, pos0 + i) : pos0 + i;
            k_store.row(row) = k_new_.row(i);
            v_store.row(row) = v_new_.row(i);
        };
        // keys the query at row i attends
        auto n_keys_of = [&](std::int64_t i) {
            return windowed ? std::min(*cfg_.sliding_window, pos0 + i + 1) : pos0 + i + 1;
        };
        // first stored row of those keys: cache rows 0..n_keys-1 hold exactly the attended positions (a
        // full ring holds the window); activations hold position p in row p
        auto first_row_of = [&](std::int64_t i) { return cache ? 0 : pos0 + i + 1 - n_keys_of(i); };
        std::int64_t n_scores = 0;  // query-key pairs per head, over the n queries
        const bool ring_wraps_in_call = cache && n > 1 && pos0 + n > cache->n_rows(l);
        if (ring_wraps_in_call) {
            // a later token would overwrite a key an earlier query still needs: store and attend in order
            for (std::int64_t i = 0; i < n; ++i) {
                store(i);
                const std::int64_t row0 = first_row_of(i);
                attention_rows(shape, q_.row(i).data(), k_store.row(row0).data(), v_store.row(row0).data(), n_keys_of(i),
                               att_.row(i).data(), scores_.row(0).data());
            }
        } else {
            for (std::int64_t i = 0; i < n; ++i) store(i);
            timer.mark(Op::kv_store);
            // one task per (query, head): a decode step spreads its heads over the threads, a prefill its queries
            const std::int64_t n_tasks = n * shape.n_head;
            for_each_task(n_tasks, [&](std::int64_t task) {
                const std::int64_t i = task / shape.n_head, h = task % shape.n_head, row0 = first_row_of(i);
                attention_head(shape, h, q_.row(i).data(), k_store.row(row0).data(), v_store.row(row0).data(), n_keys_of(i),
                               att_.row(i).data(), scores_.row(omp_get_thread_num()).data());
            });
        }
        for (std::int64_t i = 0; i < n; ++i) n_scores += n_keys_of(i);
        const std::int64_t n_key_rows = n - 1 + n_keys_of(0);  // distinct positions read: first query's oldest .. newest
        count(cost, Op::kv_store, cost_kv_store(n, k_new_.cols(), place));
        count(cost, Op::qk, cost_qk(n, shape.n_head, k_store.cols(), D, n_scores, n_key_rows, place));
        count(cost, Op::softmax, cost_softmax(shape.n_head, n_scores));
        count(cost, Op::av, cost_av(n, shape.n_head, v_store.cols(), D, n_scores, n_key_rows, place));
        timer.mark_split({Op::qk, Op::softmax, Op::av});  // a wrapping ring's interleaved stores land here too

        // output projection and residual, the residual on each thread's block of the output
        on_threads([&] {
            const Block b = project(xb_, att_, lw.wo, lw.bo);
            x_.block(0, b.begin, n, b.size) += xb_.block(0, b.begin, n, b.size);
        });
        count_matmul(cost, Op::o_proj, n, lw.wo, lw.bo);
        count(cost, Op::attn_residual, cost_residual(n, d));
        timer.mark_split({Op::o_proj, Op::attn_residual});

        // MLP norm
        norm_rows(lw.mlp_norm, lw.mlp_norm_bias);
        count(cost, Op::mlp_norm, norm_cost(n));
        timer.mark(Op::mlp_norm);
        if (gpt2) {
            // gelu(x W_fc + b) W_proj + b; GELU on each thread's block while it is in cache
            on_threads([&] {
                const Block b = project(hb_, xb_, lw.w1, lw.b1);
                auto u = hb_.block(0, b.begin, n, b.size).array();
                constexpr float c = 0.7978845608028654f;  // sqrt(2/pi)
                u = 0.5f * u * (1.0f + (c * (u + 0.044715f * u * u * u)).tanh());
            });
            count_matmul(cost, Op::mlp_up, n, lw.w1, lw.b1);
            count(cost, Op::activation, cost_gelu_tanh(n, hb_.cols()));
            timer.mark_split({Op::mlp_up, Op::activation});
        } else {
            // w2(silu(w1 x) * w3 x): gate and up share the block split, so SwiGLU runs on each
            // thread's block while it is in cache
            on_threads([&] {
                const Block b = project(hb_, xb_, lw.w1, lw.b1);
                project(hb2_, xb_, lw.w3, no_bias);
                auto g = hb_.block(0, b.begin, n, b.size).array();
                g = g / (1.0f + (-g).exp()) * hb2_.block(0, b.begin, n, b.size).array();
            });
            count_matmul(cost, Op::mlp_gate, n, lw.w1, lw.b1);
            count_matmul(cost, Op::mlp_up, n, lw.w3, no_bias);
            count(cost, Op::activation, cost_swiglu(n, hb_.cols()));
            timer.mark_split({Op::mlp_gate, Op::mlp_up, Op::activation});
        }
        on_threads([&] {
            const Block b = project(xb_, hb_, lw.w2, lw.b2);
            x_.block(0, b.begin, n, b.size) += xb_.block(0, b.begin, n, b.size);
        });
        count_matmul(cost, Op::mlp_down, n, lw.w2, lw.b2);
        count(cost, Op::mlp_residual, cost_residual(n, d));
        timer.mark_split({Op::mlp_down, Op::mlp_residual});
    }

    // final norm and classifier, last position only: that is all the next token needs
    const float* x_last = x_.row(n - 1).data();
    if (gpt2) layernorm_row(x_last_.data(), x_last, w_.final_norm.data(), w_.final_norm_bias.data(), d, eps);
    else rmsnorm_row(x_last_.data(), x_last, w_.final_norm.data(), d, eps);
    count(cost, Op::final_norm, norm_cost(1));
    timer.mark(Op::final_norm);
    const MatrixRM& classifier = w_.classifier();
    on_threads([&] { gemv_block(classifier, x_last_.data(), logits_.data()); });
    count(cost, Op::lm_head, cost_matmul(1, classifier.cols(), classifier.rows(), false));
    timer.mark(Op::lm_head);
    return logits_;
}

}  // namespace kvlab
