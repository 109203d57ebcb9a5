// The forward pass with a KV cache, written to be read (kvlab/model/reference.hpp). One token at a time,
// fp32, plain loops, no threads: each step below names the paper it comes from. The fast path
// (model/transformer.cpp) computes the same thing a block of tokens at a time, threaded and vectorised,
// and is tested against this file.
#include "kvlab/model/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "kvlab/core/error.hpp"

namespace kvlab {

// Papers: [T] Vaswani et al. 2017, "Attention Is All You Need"; [G2] Radford et al. 2019, GPT-2;
// [LN] Ba et al. 2016, "Layer Normalization"; [RMS] Zhang & Sennrich 2019, "Root Mean Square Layer
// Normalization"; [RoPE] Su et al. 2021, "RoFormer"; [GLU] Shazeer 2020, "GLU Variants Improve
// Transformer"; [GQA] Ainslie et al. 2023; [SW] Beltagy et al. 2020, "Longformer" (sliding window);
// [SLLM] Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks".
namespace {

// out = W x (+ b): W is (rows, cols) row-major, one dot product per output
void matvec(float* out, const WeightMatrix& W, const float* x, const VectorF& b) {
    for (std::int64_t i = 0; i < W.rows(); ++i) {
        const float* row = W.data() + i * W.cols();
        float sum = 0.0f;
        for (std::int64_t j = 0; j < W.cols(); ++j) sum += row[j] * x[j];
        out[i] = b.size() ? sum + b[i] : sum;
    }
}

// [RMS] eq. 4: out = x / sqrt(mean(x^2) + eps) * w
void rmsnorm(float* out, const float* x, const VectorF& w, std::int64_t d, float eps) {
    float ss = 0.0f;
    for (std::int64_t i = 0; i < d; ++i) ss += x[i] * x[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
    for (std::int64_t i = 0; i < d; ++i) out[i] = x[i] * inv * w[i];
}

// [LN] eqs. 3-4: out = (x - mean) / sqrt(variance + eps) * w + b
void layernorm(float* out, const float* x, const VectorF& w, const VectorF& b, std::int64_t d, float eps) {
    float mean = 0.0f, var = 0.0f;
    for (std::int64_t i = 0; i < d; ++i) mean += x[i];
    mean /= static_cast<float>(d);
    for (std::int64_t i = 0; i < d; ++i) var += (x[i] - mean) * (x[i] - mean);
    const float inv = 1.0f / std::sqrt(var / static_cast<float>(d) + eps);
    for (std::int64_t i = 0; i < d; ++i) out[i] = (x[i] - mean) * inv * w[i] + b[i];
}

// [T] eq. 1's softmax, shifted by the max so exp never overflows
void softmax(float* x, std::int64_t n) {
    float max = x[0], sum = 0.0f;
    for (std::int64_t i = 1; i < n; ++i) max = std::max(max, x[i]);
    for (std::int64_t i = 0; i < n; ++i) sum += (x[i] = std::exp(x[i] - max));
    for (std::int64_t i = 0; i < n; ++i) x[i] /= sum;
}

// [RoPE] eq. 34: rotate each pair of a head's dimensions by pos * theta^(-2i/D). llama2.c's checkpoints
// pair neighbours (2i, 2i+1); Hugging Face Llama pairs halves (i, i + D/2).
void rope(float* vec, std::int64_t n_heads, std::int64_t D, std::int64_t pos, float theta, RopePairing pairing) {
    for (std::int64_t i = 0; i < D / 2; ++i) {
        const float freq = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(D));
        const float c = std::cos(static_cast<float>(pos) * freq), s = std::sin(static_cast<float>(pos) * freq);
        for (std::int64_t h = 0; h < n_heads; ++h) {
            float* a = vec + h * D + (pairing == RopePairing::halves ? i : 2 * i);
            float* b = pairing == RopePairing::halves ? a + D / 2 : a + 1;
            const float a0 = *a, b0 = *b;
            *a = a0 * c - b0 * s;
            *b = a0 * s + b0 * c;
        }
    }
}

// Does a query at `pos` attend the key at `t` in layer l? Causal [T] section 3.2.3; a sliding window
// keeps the last W positions [SW]; StreamingLLM also keeps the first S ("sinks") and the last W - S [SLLM].
bool attends(const ModelConfig& cfg, std::int64_t l, std::int64_t t, std::int64_t pos) {
    const std::int64_t W = cfg.layer_window(l), S = W > 0 ? cfg.sink_tokens : 0;
    return t <= pos && (W == 0 || t < S || t > pos - (W - S));
}

}  // namespace

ReferenceModel::ReferenceModel(const ModelConfig& cfg, const Weights& weights, std::int64_t n_positions)
    : cfg_(cfg), w_(weights), n_positions_(n_positions) {
    check_forward_shapes(cfg, weights);
    if (cfg.mla) throw ConfigError(fmt::format("{}: MLA's readable forward is model/reference_mla.hpp", cfg.name));
    if (n_positions <= 0 || (cfg.family == Family::gpt2 && n_positions > weights.pos_embed.rows()))
        throw UsageError(fmt::format("reference forward: {} positions; expected 1..{}", n_positions,
                                     cfg.family == Family::gpt2 ? weights.pos_embed.rows() : cfg.n_ctx_max));
    const auto d = static_cast<std::size_t>(cfg.d_model), dq = static_cast<std::size_t>(cfg.d_q()),
               f = static_cast<std::size_t>(cfg.d_ff), T = static_cast<std::size_t>(n_positions);
    x_.resize(d), xb_.resize(d), q_.resize(dq), q_sink_.resize(dq), att_.resize(dq), hb_.resize(f), hb2_.resize(f);
    scores_.resize(T), logits_.resize(static_cast<std::size_t>(cfg.n_vocab));
    key_cache_.resize(static_cast<std::size_t>(cfg.n_layer) * T * static_cast<std::size_t>(cfg.d_kv()));
    value_cache_.resize(key_cache_.size());
}

// 4. Attention per query head [T] eq. 1: softmax(q K^T / sqrt(D)) V over the cached positions it attends.
//    With GQA/MQA [GQA], query head h reads KV head h / (H / Hkv): the cache holds Hkv heads, not H,
//    which is what makes it smaller.
void ReferenceModel::attention(std::int64_t l, std::int64_t pos) {
    const std::int64_t H = cfg_.n_head, D = cfg_.d_head, d_kv = cfg_.d_kv(), T = n_positions_, W = cfg_.layer_window(l);
    // --sink-positions cache [SLLM] 3.2: once the window has evicted keys, each sink is scored at its slot in
    // the cache, `evicted` positions closer to the query than in the text: with q turned back by that much
    const std::int64_t evicted = W > 0 && cfg_.sink_cache_positions && cfg_.family != Family::gpt2 ? std::max<std::int64_t>(0, pos + 1 - W) : 0;
    std::copy(q_.begin(), q_.end(), q_sink_.begin());
    if (evicted > 0) rope(q_sink_.data(), H, D, -evicted, static_cast<float>(cfg_.rope_theta), w_.rope_pairing);
    for (std::int64_t h = 0; h < H; ++h) {
        const std::int64_t kv_head = h / (H / cfg_.n_head_kv);
        for (std::int64_t t = 0; t <= pos; ++t) {
            const float* qh = (t < cfg_.sink_tokens ? q_sink_.data() : q_.data()) + h * D;
            const float* kt = key_cache_.data() + (l * T + t) * d_kv + kv_head * D;
            float dot = 0.0f;
            for (std::int64_t i = 0; i < D; ++i) dot += qh[i] * kt[i];
            scores_[static_cast<std::size_t>(t)] =
                attends(cfg_, l, t, pos) ? dot / std::sqrt(static_cast<float>(D)) : -std::numeric_limits<float>::infinity();
        }
        softmax(scores_.data(), pos + 1);  // a masked key's weight is exp(-inf) = 0
        float* out = att_.data() + h * D;
        for (std::int64_t i = 0; i < D; ++i) out[i] = 0.0f;
        for (std::int64_t t = 0; t <= pos; ++t) {
            const float* vt = value_cache_.data() + (l * T + t) * d_kv + kv_head * D;
            for (std::int64_t i = 0; i < D; ++i) out[i] += scores_[static_cast<std::size_t>(t)] * vt[i];
        }
    }
}

std::span<const float> ReferenceModel::forward(std::int32_t token, std::int64_t pos) {
    if (pos < 0 || pos >= n_positions_ || token < 0 || token >= cfg_.n_vocab)
        throw UsageError(fmt::format("reference forward: token {} at position {}; expected a token in [0, {}) at 0..{}",
                                     token, pos, cfg_.n_vocab, n_positions_ - 1));
    const bool gpt2 = cfg_.family == Family::gpt2;
    const std::int64_t d = cfg_.d_model, H = cfg_.n_head, Hkv = cfg_.n_head_kv, D = cfg_.d_head, f = cfg_.d_ff;
    const std::int64_t d_kv = Hkv * D, T = n_positions_;
    const float eps = static_cast<float>(cfg_.norm_eps);
    float* x = x_.data();
    float* xb = xb_.data();
    auto norm = [&](const float* in, const VectorF& w, const VectorF& b) {  // GPT-2: LayerNorm; Llama: RMSNorm
        if (gpt2) layernorm(xb, in, w, b, d, eps);
        else rmsnorm(xb, in, w, d, eps);
    };

    // 1. The token's embedding [T] 3.4, plus GPT-2's learned position embedding [G2] (Llama adds no
    //    position here: RoPE rotates q and k below).
    for (std::int64_t i = 0; i < d; ++i) x[i] = w_.tok_embed(token, i) + (gpt2 ? w_.pos_embed(pos, i) : 0.0f);

    for (std::int64_t l = 0; l < cfg_.n_layer; ++l) {
        const LayerWeights& lw = w_.layers[static_cast<std::size_t>(l)];
        // 2. Pre-norm [G2] 2.3, then this token's query, key and value [T] 3.2.2. The key and value go
        //    straight into the cache at row `pos`: that is the KV cache. Later tokens read them back
        //    instead of recomputing them from the whole sequence.
        norm(x, lw.attn_norm, lw.attn_norm_bias);
        float* k = key_cache_.data() + (l * T + pos) * d_kv;
        float* v = value_cache_.data() + (l * T + pos) * d_kv;
        matvec(q_.data(), lw.wq, xb, lw.bq);
        matvec(k, lw.wk, xb, lw.bk);
        matvec(v, lw.wv, xb, lw.bv);
        // 3. Llama: rotate q and k by their position [RoPE]; the cached key keeps its rotation.
        if (!gpt2) {
            rope(q_.data(), H, D, pos, static_cast<float>(cfg_.rope_theta), w_.rope_pairing);
            rope(k, Hkv, D, pos, static_cast<float>(cfg_.rope_theta), w_.rope_pairing);
        }
        // 4. Attention over the cached positions (ReferenceModel::attention, above)
        attention(l, pos);
        // 5. Output projection and the residual connection [T] 3.1: x += W_o att (+ b_o)
        matvec(xb, lw.wo, att_.data(), lw.bo);
        for (std::int64_t i = 0; i < d; ++i) x[i] += xb[i];

        // 6. The MLP on the normed residual [T] eq. 2. Llama: SwiGLU, silu(W1 x) * (W3 x) [GLU] eq. 6;
        //    GPT-2: GELU (tanh approximation, as GPT-2 ships) of W1 x + b1 [G2].
        norm(x, lw.mlp_norm, lw.mlp_norm_bias);
        matvec(hb_.data(), lw.w1, xb, lw.b1);
        if (!gpt2) matvec(hb2_.data(), lw.w3, xb, VectorF());
        for (std::int64_t i = 0; i < f; ++i) {
            const float g = hb_[static_cast<std::size_t>(i)];
            hb_[static_cast<std::size_t>(i)] =
                gpt2 ? 0.5f * g * (1.0f + std::tanh(0.7978845608f * (g + 0.044715f * g * g * g)))  // sqrt(2/pi)
                     : g / (1.0f + std::exp(-g)) * hb2_[static_cast<std::size_t>(i)];
        }
        // 7. Down projection and the second residual: x += W2 h (+ b2)
        matvec(xb, lw.w2, hb_.data(), lw.b2);
        for (std::int64_t i = 0; i < d; ++i) x[i] += xb[i];
    }

    // 8. Final norm, then the classifier (the embedding matrix itself when tied): one logit per
    //    vocabulary entry; the next token is chosen from them.
    norm(x, w_.final_norm, w_.final_norm_bias);
    matvec(logits_.data(), w_.classifier(), xb, VectorF());
    return logits_;
}

}  // namespace kvlab
