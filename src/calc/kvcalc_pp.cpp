#include "calc/kvcalc_pp.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "kvlab/calc/param_count.hpp"
#include "kvlab/core/error.hpp"

namespace kvlab {
namespace {

std::vector<std::uint64_t> even_split(std::uint64_t n_layers, std::uint64_t pp) {
    if (pp == 0 || pp > n_layers)
        throw UsageError(fmt::format("--pp {}: the model has {} layers; expected 1 to {} pipeline stages", pp, n_layers, n_layers));
    std::vector<std::uint64_t> parts(pp, n_layers / pp);
    for (std::uint64_t i = 0; i < n_layers % pp; ++i) parts[i] += 1;
    return parts;
}

std::uint64_t global_layers(const ModelConfig& cfg, std::uint64_t first, std::uint64_t n) {
    if (cfg.layer_windowed.empty()) return n;
    std::uint64_t g = 0;
    for (std::uint64_t l = first; l < first + n; ++l) g += cfg.layer_windowed[l] ? 0 : 1;
    return g;
}

}  // namespace

PipelineStage fullest_stage(const ModelConfig& gpu_cfg, const ModelConfig& cfg, std::uint64_t weights_total, std::uint64_t pp) {
    PipelineStage s;
    s.cfg = gpu_cfg;
    s.weights = weights_total;
    if (pp <= 1) {
        s.split = {static_cast<std::uint64_t>(cfg.n_layer)};
        return s;
    }
    s.split = even_split(static_cast<std::uint64_t>(cfg.n_layer), pp);
    std::uint64_t at = 0, best_layers = 0, best_global = 0;
    for (std::uint64_t i = 0; i < pp; ++i) {
        const auto n = s.split[i], g = global_layers(cfg, at, n);
        if (n > best_layers || (n == best_layers && g > best_global)) best_layers = n, best_global = g, s.index = i, s.first_layer = at;
        at += n;
    }
    s.cfg.n_layer = static_cast<std::int64_t>(best_layers);
    if (!gpu_cfg.layer_windowed.empty())
        s.cfg.layer_windowed = std::vector<bool>(gpu_cfg.layer_windowed.begin() + static_cast<std::ptrdiff_t>(s.first_layer),
                                                 gpu_cfg.layer_windowed.begin() + static_cast<std::ptrdiff_t>(s.first_layer + best_layers));
    if (weights_total == 0) return s;  // no weights sized (no GPU): the layers only
    // the stage's parameters: its layers' share of the per-layer ones, plus the first stage's embeddings (and vision
    // tower) and the last stage's output matrix (tied: a copy of the token embeddings, vocab x d_model)
    const ParamCount p = count_params(cfg);
    const std::uint64_t total = p.total();
    const std::uint64_t layer_params = total - p.embedding - p.lm_head - p.vision;
    std::uint64_t stage = layer_params / static_cast<std::uint64_t>(cfg.n_layer) * best_layers;
    if (s.index == 0) stage += p.embedding + p.vision;
    if (s.index == pp - 1) stage += cfg.tied_embeddings ? static_cast<std::uint64_t>(cfg.n_vocab * cfg.d_model) : p.lm_head;
    __extension__ using u128 = unsigned __int128;  // weights x params can exceed 64 bits
    s.weights = static_cast<std::uint64_t>((static_cast<u128>(weights_total) * stage + total - 1) / total);
    return s;
}

std::string parallel_label(std::uint64_t tp, std::uint64_t pp) {
    return pp > 1 ? fmt::format("TP {} × PP {}", tp, pp) : fmt::format("TP {}", tp);
}

}  // namespace kvlab
