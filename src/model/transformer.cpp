// The transformer: buffers sized once per run, and the forward pass as a list of named ops
// (model/ops.hpp), each counting its cost from the shapes it actually processed.
#include "kvlab/model/transformer.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>
#include <omp.h>

#include "kvlab/core/checked.hpp"
#include "kvlab/core/error.hpp"
#include "kernels/matmul.hpp"
#include "kernels/narrow_weights.hpp"
#include "kvlab/model/ops.hpp"

namespace kvlab {

namespace {

// Input features of the widest matmul: the GEMM scratch is sized for it.
std::int64_t widest_input(const ModelConfig& cfg) { return std::max({cfg.d_model, cfg.d_q(), cfg.d_ff}); }

// Each thread's attention scratch row starts 64-byte aligned (a multiple of 16 floats), so Eigen's
// vectorised sums peel the same way whichever thread computes a query: results do not depend on the schedule.
std::int64_t scores_row_floats(const ModelConfig& cfg, std::int64_t n_tokens_max) {
    return (attention_scratch_floats({cfg.n_head, cfg.n_head_kv, cfg.d_head}, n_tokens_max) + 15) / 16 * 16;
}

}  // namespace

Transformer::Transformer(const ModelConfig& cfg, const Weights& weights, const TransformerSize& size, const NarrowWeights* narrow)
    : cfg_(cfg), w_(weights), nw_(narrow), size_(size), n_threads_(omp_get_max_threads()) {
    if (narrow && (!size.narrow_weights || static_cast<std::int64_t>(narrow->layers.size()) != cfg.n_layer))
        throw std::logic_error("Transformer: narrow weights without TransformerSize::narrow_weights, or of another layer count");
    check_forward_shapes(cfg, weights);
    // (a serving step packs several sequences: its tokens may outnumber one sequence's positions)
    if (size.n_tokens <= 0 || size.n_positions <= 0 || (size.n_seqs == 0 && size.n_positions < size.n_tokens) ||
        (size.uncached && size.n_tokens != size.n_positions))
        throw UsageError(fmt::format("simulate: buffers for {} tokens per call over {} positions{}; expected 1 <= tokens "
                                     "<= positions (uncached: tokens = positions)",
                                     size.n_tokens, size.n_positions, size.uncached ? " (uncached)" : ""));
    if (cfg.family == Family::gpt2 && size.n_positions > weights.pos_embed.rows())
        throw UsageError(fmt::format("simulate: {} positions exceed the {} learned position embeddings of {}",
                                     size.n_positions, weights.pos_embed.rows(), cfg.name));

    const std::int64_t d = cfg.d_model, d_q = cfg.d_q(), d_kv = cfg.d_kv(), f = cfg.d_ff;
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
    att_.resize(N, cfg.mla ? cfg.n_head * cfg.mla->v_head_dim : d_q);
    if (cfg.mla) {
        if (narrow) throw ConfigError(fmt::format("{}: MLA runs on fp32 weights only (--weights-dtype fp32)", cfg.name));
        mla_.allocate(cfg, N, T, size.uncached, size.mla_path, n_threads_);
    }
    hb_.resize(N, f);
    if (cfg.family == Family::llama) hb2_.resize(N, f);
    scores_.resize(n_threads_, scores_row_floats(cfg, T));
    if (N > 1) gemm_scratch_.resize(n_threads_, gemm_scratch_floats(widest_input(cfg), N));
    if (N > 1 && size.narrow_weights) panel_.resize(n_threads_, narrow_panel_floats(widest_input(cfg)));
    if (cfg.family == Family::llama) {
        const std::int64_t n_freq = cfg.d_head / 2;
        inv_freq_.resize(static_cast<std::size_t>(n_freq));
        // as llama2.c: freq_i = 1 / theta^(2i / D), in float
        for (std::int64_t i = 0; i < n_freq; ++i)
            inv_freq_[static_cast<std::size_t>(i)] =
                1.0f / std::pow(static_cast<float>(cfg.rope_theta), static_cast<float>(2 * i) / static_cast<float>(cfg.d_head));
    }
    x_last_.resize(std::max<std::int64_t>(1, size.n_seqs), d);
    logits_.resize(cfg.n_vocab);
    if (size.n_seqs > 0) batch_logits_.resize(size.n_seqs, cfg.n_vocab);
    runs_.resize(static_cast<std::size_t>(std::max<std::int64_t>(1, size.n_seqs)));
}

std::uint64_t Transformer::activation_bytes(const ModelConfig& cfg, const TransformerSize& size) {
    const auto N = static_cast<std::uint64_t>(size.n_tokens), T = static_cast<std::uint64_t>(size.n_positions);
    const auto d = static_cast<std::uint64_t>(cfg.d_model), d_q = static_cast<std::uint64_t>(cfg.d_q()),
               d_kv = static_cast<std::uint64_t>(cfg.d_kv()), f = static_cast<std::uint64_t>(cfg.d_ff);
    const bool llama = cfg.family == Family::llama;
    // every sum and product checked: the sizes come from user configs and flags
    const auto add = [](std::uint64_t a, std::uint64_t b) { return checked_add(a, b, "activation bytes"); };
    const auto mul = [](std::uint64_t a, std::uint64_t b) { return checked_mul(a, b, "activation bytes"); };
    const auto d_att = cfg.mla ? static_cast<std::uint64_t>(cfg.n_head * cfg.mla->v_head_dim) : d_q;
    const std::uint64_t row = add(add(add(add(mul(2, d), d_q), d_att), mul(2, d_kv)), mul(llama ? 2 : 1, f));
    std::uint64_t n = mul(N, row);                                      // x, xb, q, att, k_new, v_new, MLP
    if (size.uncached) n = add(n, mul(T, mul(2, d_kv)));                // k_act, v_act
    const auto n_threads = static_cast<std::uint64_t>(omp_get_max_threads());
    n = add(n, mul(n_threads, static_cast<std::uint64_t>(scores_row_floats(cfg, size.n_positions))));  // scores
    if (N > 1)  // packed tokens
        n = add(n, mul(n_threads, static_cast<std::uint64_t>(gemm_scratch_floats(widest_input(cfg), size.n_tokens))));
    if (N > 1 && size.narrow_weights)  // widened weight rows
        n = add(n, mul(n_threads, static_cast<std::uint64_t>(narrow_panel_floats(widest_input(cfg)))));
    if (llama) n = add(n, static_cast<std::uint64_t>(cfg.d_head) / 2);  // inv_freq
    if (cfg.mla) n = add(n, MlaBuffers::floats(cfg, size.n_tokens, size.n_positions, size.uncached, size.mla_path, static_cast<int>(n_threads)));
    const auto S = static_cast<std::uint64_t>(size.n_seqs);
    n = add(n, add(mul(std::max<std::uint64_t>(1, S), d), static_cast<std::uint64_t>(cfg.n_vocab)));  // x_last, logits
    n = add(n, mul(S, static_cast<std::uint64_t>(cfg.n_vocab)));        // batch logits
    return mul(n, sizeof(float));
}

std::uint64_t Transformer::activation_bytes_held() const {
    const auto n = x_.size() + xb_.size() + q_.size() + k_new_.size() + v_new_.size() + k_act_.size() +
                   v_act_.size() + att_.size() + hb_.size() + hb2_.size() + scores_.size() + gemm_scratch_.size() + panel_.size() +
                   static_cast<Eigen::Index>(inv_freq_.size()) + x_last_.size() + logits_.size() + batch_logits_.size() +
                   mla_.q.size() + mla_.latent.size() + mla_.rows.size() + mla_.up.size() + mla_.act.size() + mla_.scratch.size();
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
    if (cfg_.sink_tokens > 0) throw UsageError("--sink-tokens: sinks are a cache policy; the uncached mode has no cache (expected --mode cached)");
    return forward(tokens, 0, nullptr, cost);
}

// One line per op (model/ops.hpp: each computes, splits its work over the threads and records its cost
// and time). Cached and uncached calls differ only in where K and V are stored and read.
const VectorF& Transformer::forward(std::span<const TokenId> tokens, std::int64_t pos0, KvCache* cache,
                                    StepCost* cost) {
    const auto n = static_cast<std::int64_t>(tokens.size());
    check_call(tokens, pos0);
    OpRecorder rec(cost);
    runs_[0] = TokenRun{0, n, pos0, {}};
    layers(tokens, 1, cache, nullptr, rec);
    // final norm and classifier on the last position only: that is all the next token needs
    const bool gpt2 = cfg_.family == Family::gpt2;
    norm(gpt2 ? NormKind::layer : NormKind::rms, x_last_, x_, n - 1, 1, w_.final_norm, w_.final_norm_bias,
         static_cast<float>(cfg_.norm_eps), Op::final_norm, rec);
    classify(logits_, x_last_, WeightRef{w_.classifier(), nw_ ? &nw_->classifier : nullptr}, rec);
    return logits_;
}

const MatrixRM& Transformer::forward_batch(std::span<const TokenId> tokens, std::span<const SeqStep> seqs, KvPool& pool,
                                           StepCost* cost) {
    const auto n_seqs = static_cast<std::int64_t>(seqs.size());
    if (n_seqs == 0 || n_seqs > size_.n_seqs)
        throw std::logic_error(fmt::format("forward_batch: {} sequences; the transformer was built for 1..{}", n_seqs, size_.n_seqs));
    std::int64_t row = 0, m = 0;
    for (std::int64_t s = 0; s < n_seqs; ++s) {
        const SeqStep& q = seqs[static_cast<std::size_t>(s)];
        check_call(tokens.subspan(static_cast<std::size_t>(row), static_cast<std::size_t>(q.n)), q.pos0);
        runs_[static_cast<std::size_t>(s)] = TokenRun{row, q.n, q.pos0, {}};
        row += q.n;
    }
    if (row != static_cast<std::int64_t>(tokens.size()) || row > size_.n_tokens)
        throw std::logic_error(fmt::format("forward_batch: {} tokens for sequences holding {} (buffers: {})", tokens.size(), row, size_.n_tokens));
    OpRecorder rec(cost);
    pool_seqs_ = seqs;
    layers(tokens, n_seqs, nullptr, &pool, rec);
    // final norm of each asking sequence's last token, then one classifier matmul for all of them
    const bool gpt2 = cfg_.family == Family::gpt2;
    for (std::int64_t s = 0; s < n_seqs; ++s)
        if (seqs[static_cast<std::size_t>(s)].logits) x_last_.row(m++) = x_.row(runs_[static_cast<std::size_t>(s)].row0 + runs_[static_cast<std::size_t>(s)].n - 1);
    if (m == 0) return batch_logits_;
    norm(gpt2 ? NormKind::layer : NormKind::rms, x_last_, x_last_, 0, m, w_.final_norm, w_.final_norm_bias,
         static_cast<float>(cfg_.norm_eps), Op::final_norm, rec);
    classify_rows(batch_logits_, x_last_, m, WeightRef{w_.classifier(), nw_ ? &nw_->classifier : nullptr},
                  OpScratch{&gemm_scratch_, &scores_, &panel_}, rec);
    return batch_logits_;
}

void Transformer::layers(std::span<const TokenId> tokens, std::int64_t n_runs, KvCache* cache, KvPool* pool, OpRecorder& rec) {
    const auto n = static_cast<std::int64_t>(tokens.size());
    const std::span<TokenRun> runs(runs_.data(), static_cast<std::size_t>(n_runs));
    const bool gpt2 = cfg_.family == Family::gpt2;
    const NormKind norm_kind = gpt2 ? NormKind::layer : NormKind::rms;
    const float eps = static_cast<float>(cfg_.norm_eps);
    const AttentionShape shape{cfg_.n_head, cfg_.n_head_kv, cfg_.d_head};
    const OpScratch scratch{&gemm_scratch_, &scores_, &panel_};

    // x = token embeddings (+ learned positions for gpt2)
    embed(x_, tokens, w_.tok_embed, rec);
    if (gpt2) add_positions(x_, runs, w_.pos_embed, rec);

    const SinkRope sink_rope{inv_freq_, w_.rope_pairing};  // --sink-positions cache (ops.hpp, attention)
    for (std::int64_t l = 0; l < cfg_.n_layer; ++l) {
        const LayerWeights& lw = w_.layers[static_cast<std::size_t>(l)];
        const NarrowLayer* nl = nw_ ? &nw_->layers[static_cast<std::size_t>(l)] : nullptr;
        // K and V go to the cache (cached), the pool (serving: each sequence's rows, a windowed layer a
        // ring of its window within them) or this layer's activations (uncached)
        const std::int64_t window = cfg_.layer_window(l), n_sink = window > 0 ? cfg_.sink_tokens : 0;
        for (std::int64_t r = 0; r < n_runs; ++r) {
            KvView& kv = runs[static_cast<std::size_t>(r)].kv;
            if (cache) {
                kv = cache->view(l);
            } else if (pool) {
                kv = pool_seqs_[static_cast<std::size_t>(r)].rows;  // the sequence's blocks
                pool->attach(l, kv);  // fp32 rows, or a narrow format's
                if (window > 0) kv.n_rows = window;
                kv.n_sink = n_sink;
            } else {
                kv = KvView{};  // this layer's activations: position p in row p
                kv.place = KvView::Place::activations;
                kv.k = cfg_.mla ? &mla_.act : &k_act_;
                kv.v = &v_act_;
                kv.n_rows = kv.k->rows();
            }
        }
        // attention block: x += W_o attention(rope(q), rope(k), v) over the normed x
        norm(norm_kind, xb_, x_, 0, n, lw.attn_norm, lw.attn_norm_bias, eps, Op::attn_norm, rec);
        if (cfg_.mla) {  // the latent cache: model/mla.hpp
            mla_attention(att_, xb_, n, runs, lw, cfg_, w_.rope_pairing, size_.mla_path, mla_, rec);
        } else {
            qkv_projections(q_, k_new_, v_new_, xb_, n, lw, nl, scratch, rec);
            if (!gpt2) rope(q_, k_new_, runs, inv_freq_, w_.rope_pairing, cfg_.d_head, rec);
            attention(att_, q_, k_new_, v_new_, runs, shape, window, scratch, rec, cfg_.sink_cache_positions && !gpt2 ? &sink_rope : nullptr);
        }
        project_add(x_, xb_, att_, n, WeightRef{lw.wo, nl ? &nl->wo : nullptr}, lw.bo, scratch, Op::o_proj, Op::attn_residual, rec);

        // MLP block: x += W_2 act(W_1 x (, W_3 x)) over the normed x
        norm(norm_kind, xb_, x_, 0, n, lw.mlp_norm, lw.mlp_norm_bias, eps, Op::mlp_norm, rec);
        if (gpt2) gelu_mlp_in(hb_, xb_, n, lw, nl, scratch, rec);
        else swiglu_mlp_in(hb_, hb2_, xb_, n, lw, nl, scratch, rec);
        project_add(x_, xb_, hb_, n, WeightRef{lw.w2, nl ? &nl->w2 : nullptr}, lw.b2, scratch, Op::mlp_down, Op::mlp_residual, rec);
    }
}

void Transformer::check_call(std::span<const TokenId> tokens, std::int64_t pos0) const {
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
}

}  // namespace kvlab
