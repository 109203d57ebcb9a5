// The shapes a forward pass checks once before it reads raw rows (weights/weights.hpp).
#include "kvlab/weights/weights.hpp"

#include <fmt/format.h>

#include "kvlab/core/error.hpp"

namespace kvlab {

void check_forward_shapes(const ModelConfig& cfg, const Weights& weights) {
    if (cfg.mla)
        throw ConfigError(fmt::format("{}: multi-head latent attention (MLA) is not simulated; kvcalc sizes its cache", cfg.name));
    if (cfg.n_expert > 1)
        throw ConfigError(fmt::format("{}: mixture-of-experts ({} experts) is not simulated; kvcalc sizes its cache, "
                                      "and the KV cache of one expert-free layer stack is what simulate would show",
                                      cfg.name, cfg.n_expert));
    if (cfg.family == Family::llama && cfg.d_head % 2 != 0)
        throw ConfigError(fmt::format("{}: head_dim {} is odd; RoPE needs an even head dimension", cfg.name, cfg.d_head));
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
    auto check_shape = [&](std::size_t l, const char* name, const WeightMatrix& m, std::int64_t rows, std::int64_t cols) {
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
}

}  // namespace kvlab
