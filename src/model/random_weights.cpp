#include "model/random_weights.hpp"

#include <algorithm>
#include <cmath>

#include "core/checked.hpp"

namespace kvlab {

namespace {

std::uint64_t mix64(std::uint64_t x) {  // splitmix64 finaliser
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// Fills `n` floats with N(0, sigma): the Box-Muller transform on counter-hashed uniforms, in blocks of
// 2*K values so that Eigen vectorises log, sqrt, sin and cos. Each block depends only on the key and its
// index, so the weights do not depend on the thread count.
void fill_normal(float* out, std::int64_t n, std::uint64_t key, float sigma) {
    constexpr std::int64_t K = 512;  // pairs per block
    constexpr float two_pi = 6.28318530717958647692f;
    const std::int64_t n_blocks = (n + 2 * K - 1) / (2 * K);
#pragma omp parallel
    {
        Eigen::ArrayXf u1(K), u2(K), radius(K), angle(K);  // (K) per thread
#pragma omp for schedule(static)
        for (std::int64_t block = 0; block < n_blocks; ++block) {
            for (std::int64_t j = 0; j < K; ++j) {
                const std::uint64_t h = mix64(key + static_cast<std::uint64_t>(block * K + j));
                u1[j] = static_cast<float>((h >> 40) + 1) * 0x1.0p-24f;          // (0, 1]: log is finite
                u2[j] = static_cast<float>((h >> 16) & 0xFFFFFF) * 0x1.0p-24f;   // [0, 1)
            }
            radius = sigma * (-2.0f * u1.log()).sqrt();
            angle = two_pi * u2;
            float* dst = out + 2 * K * block;
            const std::int64_t n_left = std::min(2 * K, n - 2 * K * block);
            Eigen::Map<Eigen::ArrayXf>(dst, std::min(K, n_left)) = (radius * angle.cos()).head(std::min(K, n_left));
            if (n_left > K) Eigen::Map<Eigen::ArrayXf>(dst + K, n_left - K) = (radius * angle.sin()).head(n_left - K);
        }
    }
}

struct Filler {
    std::uint64_t seed;
    float sigma;
    std::uint64_t n_tensors = 0;

    MatrixRM matrix(std::int64_t rows, std::int64_t cols) {
        MatrixRM m(rows, cols);
        fill_normal(m.data(), m.size(), mix64(seed ^ mix64(++n_tensors)), sigma);
        return m;
    }
};

}  // namespace

std::uint64_t weights_bytes(const ModelConfig& cfg) {
    const bool gpt2 = cfg.family == Family::gpt2;
    const auto d = static_cast<std::uint64_t>(cfg.d_model), d_q = static_cast<std::uint64_t>(cfg.d_q()),
               d_kv = static_cast<std::uint64_t>(cfg.d_kv()), f = static_cast<std::uint64_t>(cfg.d_ff);
    // every sum and product checked: the shapes come from user configs
    const auto sum = [](std::initializer_list<std::uint64_t> terms) {
        std::uint64_t total = 0;
        for (const std::uint64_t t : terms) total = checked_add(total, t, "weights bytes");
        return total;
    };
    const auto mul = [](std::uint64_t a, std::uint64_t b) { return checked_mul(a, b, "weights bytes"); };
    const std::uint64_t qkv_bias = sum({d_q, mul(2, d_kv)});
    std::uint64_t layer = sum({mul(d_q, d), mul(2, mul(d_kv, d)), mul(d, d_q), mul(f, d), mul(d, f)});  // wq wk wv wo w1 w2
    layer = gpt2 ? sum({layer, mul(4, d), qkv_bias, d, f, d})                                      // norms + biases
                 : sum({layer, mul(f, d), mul(2, d), cfg.attention_bias ? qkv_bias : 0});          // w3 + norms (+ q, k, v biases)
    std::uint64_t n_values = mul(layer, static_cast<std::uint64_t>(cfg.n_layer));
    n_values = sum({n_values, mul(static_cast<std::uint64_t>(cfg.n_vocab), d)});
    if (gpt2) n_values = sum({n_values, mul(static_cast<std::uint64_t>(cfg.n_ctx_max), d)});
    if (!cfg.tied_embeddings) n_values = sum({n_values, mul(static_cast<std::uint64_t>(cfg.n_vocab), d)});
    n_values = sum({n_values, gpt2 ? mul(2, d) : d});
    return mul(n_values, sizeof(float));
}

Weights random_weights(const ModelConfig& cfg, std::uint64_t seed, float sigma) {
    const bool gpt2 = cfg.family == Family::gpt2;
    const std::int64_t d = cfg.d_model, d_q = cfg.d_q(), d_kv = cfg.d_kv(), f = cfg.d_ff;
    Filler fill{seed, sigma};
    Weights w;
    w.rope_pairing = RopePairing::neighbours;  // as llama2.c, the reference for random-init runs
    w.tok_embed = fill.matrix(cfg.n_vocab, d);
    if (gpt2) w.pos_embed = fill.matrix(cfg.n_ctx_max, d);
    w.layers.resize(static_cast<std::size_t>(cfg.n_layer));
    for (auto& lw : w.layers) {
        lw.attn_norm = VectorF::Ones(d);
        lw.mlp_norm = VectorF::Ones(d);
        lw.wq = fill.matrix(d_q, d);
        lw.wk = fill.matrix(d_kv, d);
        lw.wv = fill.matrix(d_kv, d);
        lw.wo = fill.matrix(d, d_q);
        lw.w1 = fill.matrix(f, d);
        if (!gpt2) lw.w3 = fill.matrix(f, d);
        lw.w2 = fill.matrix(d, f);
        if (gpt2) {
            lw.attn_norm_bias = VectorF::Zero(d);
            lw.mlp_norm_bias = VectorF::Zero(d);
            lw.bq = VectorF::Zero(d_q);
            lw.bk = VectorF::Zero(d_kv);
            lw.bv = VectorF::Zero(d_kv);
            lw.bo = VectorF::Zero(d);
            lw.b1 = VectorF::Zero(f);
            lw.b2 = VectorF::Zero(d);
        } else if (cfg.attention_bias) {
            lw.bq = VectorF::Zero(d_q);
            lw.bk = VectorF::Zero(d_kv);
            lw.bv = VectorF::Zero(d_kv);
        }
    }
    w.final_norm = VectorF::Ones(d);
    if (gpt2) w.final_norm_bias = VectorF::Zero(d);
    if (!cfg.tied_embeddings) w.lm_head = fill.matrix(cfg.n_vocab, d);
    return w;
}

std::uint64_t weights_bytes_held(const Weights& w) {
    std::uint64_t n = static_cast<std::uint64_t>(w.tok_embed.size() + w.pos_embed.size() + w.final_norm.size() +
                                                 w.final_norm_bias.size() + w.lm_head.size());
    for (const auto& lw : w.layers)
        n += static_cast<std::uint64_t>(
            lw.attn_norm.size() + lw.attn_norm_bias.size() + lw.wq.size() + lw.wk.size() + lw.wv.size() +
            lw.wo.size() + lw.bq.size() + lw.bk.size() + lw.bv.size() + lw.bo.size() + lw.mlp_norm.size() +
            lw.mlp_norm_bias.size() + lw.w1.size() + lw.w3.size() + lw.w2.size() + lw.b1.size() + lw.b2.size());
    return n * sizeof(float);
}

}  // namespace kvlab
