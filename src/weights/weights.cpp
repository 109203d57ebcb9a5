// The shapes a forward pass checks once before it reads raw rows (weights/weights.hpp).
#include "kvlab/weights/weights.hpp"

#include <fmt/format.h>

#include "kvlab/core/error.hpp"

namespace kvlab {

void check_forward_shapes(const ModelConfig& cfg, const Weights& weights) {
    if (cfg.mla && cfg.mla->q_lora_rank > 0)
        throw ConfigError(fmt::format("{}: MLA with a compressed query (q_lora_rank {}) is not simulated; kvlab runs MLA with "
                                      "q_lora_rank absent (DeepSeek-V2-Lite's form), and kvcalc sizes this model's cache",
                                      cfg.name, cfg.mla->q_lora_rank));
    if (cfg.mla && (cfg.family != Family::llama || cfg.mla->qk_nope_head_dim <= 0 || cfg.mla->qk_rope_head_dim % 2 != 0))
        throw ConfigError(fmt::format("{}: MLA needs the llama family, qk_nope_head_dim > 0 and an even qk_rope_head_dim (got {}, {})",
                                      cfg.name, cfg.mla->qk_nope_head_dim, cfg.mla->qk_rope_head_dim));
    if (cfg.mla && (cfg.sliding_window || cfg.sink_tokens > 0))
        throw ConfigError(fmt::format("{}: MLA with a sliding window or sinks is not simulated (its latent cache keeps every position)", cfg.name));
    if (cfg.n_expert > 1)
        throw ConfigError(fmt::format("{}: mixture-of-experts ({} experts) is not simulated; kvcalc sizes its cache, "
                                      "and the KV cache of one expert-free layer stack is what simulate would show",
                                      cfg.name, cfg.n_expert));
    if (cfg.family == Family::llama && !cfg.mla && cfg.d_head % 2 != 0)
        throw ConfigError(fmt::format("{}: head_dim {} is odd; RoPE needs an even head dimension", cfg.name, cfg.d_head));
    const std::int64_t d = cfg.d_model, f = cfg.d_ff;
    std::int64_t d_q = cfg.d_q(), d_kv = cfg.d_kv(), k_in = d, v_out = d_kv, v_in = d, o_in = d_q;
    if (cfg.mla) {  // the shapes LayerWeights lists for MLA
        const MlaShape& m = *cfg.mla;
        d_q = cfg.n_head * (m.qk_nope_head_dim + m.qk_rope_head_dim);
        d_kv = m.kv_lora_rank + m.qk_rope_head_dim;
        v_out = cfg.n_head * (m.qk_nope_head_dim + m.v_head_dim);
        v_in = m.kv_lora_rank;
        o_in = cfg.n_head * m.v_head_dim;
    }
    if (static_cast<std::int64_t>(weights.layers.size()) != cfg.n_layer || weights.tok_embed.rows() != cfg.n_vocab ||
        weights.tok_embed.cols() != d || weights.classifier().rows() != cfg.n_vocab)
        throw ConfigError(fmt::format("{}: weights ({} layers, embedding {}x{}) do not match the config ({} layers, {}x{})",
                                      cfg.name, weights.layers.size(), weights.tok_embed.rows(), weights.tok_embed.cols(),
                                      cfg.n_layer, cfg.n_vocab, d));
    if (weights.classifier().cols() != d)
        throw ConfigError(fmt::format("{}: the classifier is {} wide, expected d_model {}", cfg.name,
                                      weights.classifier().cols(), d));
    // the matmul kernels read raw rows: every shape is checked here, once
    auto check_shape = [&](std::size_t l, const char* name, const WeightMatrix& m, std::int64_t rows, std::int64_t cols) {
        if (m.rows() != rows || m.cols() != cols)
            throw ConfigError(fmt::format("{}: layer {} {} is {}x{}, expected {}x{} from the config", cfg.name, l, name,
                                          m.rows(), m.cols(), rows, cols));
    };
    for (std::size_t l = 0; l < weights.layers.size(); ++l) {
        const LayerWeights& lw = weights.layers[l];
        check_shape(l, "wq", lw.wq, d_q, d);
        check_shape(l, "wk", lw.wk, d_kv, k_in);
        check_shape(l, "wv", lw.wv, v_out, v_in);
        check_shape(l, "wo", lw.wo, d, o_in);
        if (cfg.mla && lw.kv_norm.size() != cfg.mla->kv_lora_rank)
            throw ConfigError(fmt::format("{}: layer {} kv_a_layernorm has {} values, expected kv_lora_rank {}", cfg.name, l,
                                          lw.kv_norm.size(), cfg.mla->kv_lora_rank));
        check_shape(l, "w1", lw.w1, f, d);
        if (cfg.family == Family::llama) check_shape(l, "w3", lw.w3, f, d);
        check_shape(l, "w2", lw.w2, d, f);
    }
}

}  // namespace kvlab
