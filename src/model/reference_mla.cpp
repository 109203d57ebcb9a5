// Multi-head latent attention written to be read (kvlab/model/reference_mla.hpp), in the shape of
// reference.cpp: one token at a time, fp32, plain loops. The equations are DeepSeek-V2's [DS2] (Liu et al.
// 2024, arXiv 2405.04434) section 2.1; the rest of the layer is Llama's (reference.cpp names those papers).
#include "kvlab/model/reference_mla.hpp"

#include <cmath>

#include <fmt/format.h>

#include "kvlab/core/error.hpp"

namespace kvlab {

namespace {

// out = W x: W is (rows, cols) row-major; `row0` picks the first row used, `n_rows` how many
void matvec(float* out, const WeightMatrix& W, const float* x, std::int64_t row0, std::int64_t n_rows) {
    for (std::int64_t i = 0; i < n_rows; ++i) {
        const float* row = W.data() + (row0 + i) * W.cols();
        float sum = 0.0f;
        for (std::int64_t j = 0; j < W.cols(); ++j) sum += row[j] * x[j];
        out[i] = sum;
    }
}

// RMSNorm (Zhang & Sennrich 2019): out = x / sqrt(mean(x^2) + eps) * w
void rmsnorm(float* out, const float* x, const float* w, std::int64_t d, float eps) {
    float ss = 0.0f;
    for (std::int64_t i = 0; i < d; ++i) ss += x[i] * x[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
    for (std::int64_t i = 0; i < d; ++i) out[i] = x[i] * inv * w[i];
}

void softmax(float* x, std::int64_t n) {
    float max = x[0], sum = 0.0f;
    for (std::int64_t i = 1; i < n; ++i) max = std::max(max, x[i]);
    for (std::int64_t i = 0; i < n; ++i) sum += (x[i] = std::exp(x[i] - max));
    for (std::int64_t i = 0; i < n; ++i) x[i] /= sum;
}

// RoPE (Su et al. 2021) on one R-wide vector: pair i turns by pos * theta^(-2i/R)
void rope(float* v, std::int64_t R, std::int64_t pos, float theta, RopePairing pairing) {
    for (std::int64_t i = 0; i < R / 2; ++i) {
        const float freq = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(R));
        const float c = std::cos(static_cast<float>(pos) * freq), s = std::sin(static_cast<float>(pos) * freq);
        float* a = v + (pairing == RopePairing::halves ? i : 2 * i);
        float* b = pairing == RopePairing::halves ? a + R / 2 : a + 1;
        const float a0 = *a, b0 = *b;
        *a = a0 * c - b0 * s;
        *b = a0 * s + b0 * c;
    }
}

float dot(const float* a, const float* b, std::int64_t n) {
    float s = 0.0f;
    for (std::int64_t i = 0; i < n; ++i) s += a[i] * b[i];
    return s;
}

}  // namespace

ReferenceMlaModel::ReferenceMlaModel(const ModelConfig& cfg, const Weights& weights, std::int64_t n_positions, MlaPath path)
    : cfg_(cfg), w_(weights), n_positions_(n_positions), path_(path) {
    check_forward_shapes(cfg, weights);
    if (!cfg.mla) throw ConfigError(fmt::format("{}: not an MLA model; the reference forward is model/reference.hpp", cfg.name));
    if (n_positions <= 0 || n_positions > cfg.n_ctx_max)
        throw UsageError(fmt::format("reference forward: {} positions; expected 1..{}", n_positions, cfg.n_ctx_max));
    const MlaShape& m = *cfg.mla;
    const auto H = static_cast<std::size_t>(cfg.n_head), r = static_cast<std::size_t>(m.kv_lora_rank),
               R = static_cast<std::size_t>(m.qk_rope_head_dim), dn = static_cast<std::size_t>(m.qk_nope_head_dim),
               dv = static_cast<std::size_t>(m.v_head_dim), T = static_cast<std::size_t>(n_positions);
    x_.resize(static_cast<std::size_t>(cfg.d_model)), xb_.resize(x_.size());
    q_.resize(H * (dn + R)), att_.resize(H * dv), up_.resize(dn + dv), q_lat_.resize(r), o_lat_.resize(r);
    hb_.resize(static_cast<std::size_t>(cfg.d_ff)), hb2_.resize(hb_.size());
    scores_.resize(T), logits_.resize(static_cast<std::size_t>(cfg.n_vocab));
    latent_cache_.resize(static_cast<std::size_t>(cfg.n_layer) * T * (r + R));
}

// Attention of every head over the cached latent rows [DS2] eqs. 10-11, 17-19, two ways with one result.
// Head h's up-projection rows in kv_b_proj (lw.wv): W_UK_h = rows h*(dn+dv) .. +dn, W_UV_h the dv after.
void ReferenceMlaModel::attention(std::int64_t l, std::int64_t pos, const LayerWeights& lw) {
    const MlaShape& m = *cfg_.mla;
    const std::int64_t H = cfg_.n_head, r = m.kv_lora_rank, R = m.qk_rope_head_dim, dn = m.qk_nope_head_dim,
                       dv = m.v_head_dim, T = n_positions_;
    // eq. 19 divides by sqrt(d_h + d_h^R): the width of a query-key dot product, not v's
    const float scale = 1.0f / std::sqrt(static_cast<float>(dn + R));
    for (std::int64_t h = 0; h < H; ++h) {
        const float* q_c = q_.data() + h * (dn + R);  // q_C (dn), then q_R (R) right after it
        const float* q_r = q_c + dn;
        const WeightMatrix& kv_b = lw.wv;
        const std::int64_t uk = h * (dn + dv), uv = uk + dn;  // first rows of W_UK_h and W_UV_h
        // absorbed: q_C . (W_UK_h c) = (W_UK_h^T q_C) . c, so fold W_UK_h into the query once: q_lat (r)
        if (path_ == MlaPath::absorbed)
            for (std::int64_t j = 0; j < r; ++j) {
                float s = 0.0f;
                for (std::int64_t i = 0; i < dn; ++i) s += kv_b(uk + i, j) * q_c[i];
                q_lat_[static_cast<std::size_t>(j)] = s;
            }
        for (std::int64_t t = 0; t <= pos; ++t) {
            const float* c = latent_cache_.data() + (l * T + t) * (r + R);  // c_KV (r), then k_R (R)
            float score = dot(q_r, c + r, R);                                // the decoupled RoPE part, eq. 18
            if (path_ == MlaPath::naive) {
                matvec(up_.data(), kv_b, c, uk, dn);                          // k_C = W_UK_h c_KV, eq. 10
                score += dot(q_c, up_.data(), dn);
            } else {
                score += dot(q_lat_.data(), c, r);
            }
            scores_[static_cast<std::size_t>(t)] = score * scale;
        }
        softmax(scores_.data(), pos + 1);
        float* out = att_.data() + h * dv;
        for (std::int64_t i = 0; i < dv; ++i) out[i] = 0.0f;
        if (path_ == MlaPath::naive) {
            for (std::int64_t t = 0; t <= pos; ++t) {
                matvec(up_.data(), kv_b, latent_cache_.data() + (l * T + t) * (r + R), uv, dv);  // v_C = W_UV_h c_KV, eq. 11
                for (std::int64_t i = 0; i < dv; ++i) out[i] += scores_[static_cast<std::size_t>(t)] * up_[static_cast<std::size_t>(i)];
            }
        } else {
            // absorbed: sum_t p_t W_UV_h c_t = W_UV_h (sum_t p_t c_t): attend over the latents, project once
            for (std::int64_t j = 0; j < r; ++j) o_lat_[static_cast<std::size_t>(j)] = 0.0f;
            for (std::int64_t t = 0; t <= pos; ++t)
                for (std::int64_t j = 0; j < r; ++j)
                    o_lat_[static_cast<std::size_t>(j)] += scores_[static_cast<std::size_t>(t)] * latent_cache_[static_cast<std::size_t>((l * T + t) * (r + R) + j)];
            matvec(out, kv_b, o_lat_.data(), uv, dv);
        }
    }
}

std::span<const float> ReferenceMlaModel::forward(std::int32_t token, std::int64_t pos) {
    if (pos < 0 || pos >= n_positions_ || token < 0 || token >= cfg_.n_vocab)
        throw UsageError(fmt::format("reference forward: token {} at position {}; expected a token in [0, {}) at 0..{}",
                                     token, pos, cfg_.n_vocab, n_positions_ - 1));
    const MlaShape& m = *cfg_.mla;
    const std::int64_t d = cfg_.d_model, H = cfg_.n_head, r = m.kv_lora_rank, R = m.qk_rope_head_dim,
                       dn = m.qk_nope_head_dim, f = cfg_.d_ff, T = n_positions_;
    const float eps = static_cast<float>(cfg_.norm_eps), theta = static_cast<float>(cfg_.rope_theta);
    float* x = x_.data();
    float* xb = xb_.data();
    for (std::int64_t i = 0; i < d; ++i) x[i] = w_.tok_embed(token, i);

    for (std::int64_t l = 0; l < cfg_.n_layer; ++l) {
        const LayerWeights& lw = w_.layers[static_cast<std::size_t>(l)];
        rmsnorm(xb, x, lw.attn_norm.data(), d, eps);
        // 1. Queries, no compression (q_lora_rank absent: c_Q = h): each head's [q_C; q_R] = W_Q h, eqs. 12, 16
        matvec(q_.data(), lw.wq, xb, 0, lw.wq.rows());
        // 2. The token's latent row [c_KV; k_R] = [W_DKV; W_KR] h, eqs. 9 and 17, stored straight into the
        //    cache: that row is all MLA keeps of the token. c_KV is RMS-normed ([DS2] section 3.1.2).
        float* c = latent_cache_.data() + (l * T + pos) * (r + R);
        matvec(c, lw.wk, xb, 0, r + R);
        rmsnorm(c, c, lw.kv_norm.data(), r, eps);
        // 3. RoPE turns only the decoupled parts, q_R of every head and the shared k_R; never c_KV, whose
        //    keys W_UK c_KV must stay position-free for W_UK to be absorbed into the query (section 2.1.3)
        for (std::int64_t h = 0; h < H; ++h) rope(q_.data() + h * (dn + R) + dn, R, pos, theta, w_.rope_pairing);
        rope(c + r, R, pos, theta, w_.rope_pairing);
        // 4. Attention over the cached latents (above), then u = W_O o (eq. 19) and the residual
        attention(l, pos, lw);
        matvec(xb, lw.wo, att_.data(), 0, d);
        for (std::int64_t i = 0; i < d; ++i) x[i] += xb[i];
        // 5. The SwiGLU MLP, as Llama's: x += W2 (silu(W1 x) * W3 x) on the normed residual
        rmsnorm(xb, x, lw.mlp_norm.data(), d, eps);
        matvec(hb_.data(), lw.w1, xb, 0, f);
        matvec(hb2_.data(), lw.w3, xb, 0, f);
        for (std::size_t i = 0; i < hb_.size(); ++i) hb_[i] = hb_[i] / (1.0f + std::exp(-hb_[i])) * hb2_[i];
        matvec(xb, lw.w2, hb_.data(), 0, d);
        for (std::int64_t i = 0; i < d; ++i) x[i] += xb[i];
    }
    rmsnorm(xb, x, w_.final_norm.data(), d, eps);
    matvec(logits_.data(), w_.classifier(), xb, 0, cfg_.n_vocab);
    return logits_;
}

}  // namespace kvlab
