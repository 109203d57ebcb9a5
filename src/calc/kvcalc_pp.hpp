// kvcalc --pp without an engine's rules: how the generic tables split a model over pipeline stages
// (the --engine tables use each engine's own split, pp_layer_split in kvlab/calc/engine.hpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kvlab/calc/model_config.hpp"

namespace kvlab {

// The stage that decides the fit: its layers (a ModelConfig of just them), and its share of the weights.
struct PipelineStage {
    ModelConfig cfg;                // the stage's layers only (one TP rank's heads if given a per-GPU config)
    std::uint64_t index = 0;        // 0 = the first stage
    std::uint64_t first_layer = 0;  // its layers are [first_layer, first_layer + cfg.n_layer)
    std::uint64_t weights = 0;      // its bytes of weights, all TP ranks together
    std::vector<std::uint64_t> split;  // every stage's layer count, first to last
};

// The engine-independent split: L layers in pp stages of floor(L / pp), the first L mod pp stages one more
// (torch.tensor_split's rule). Non-layer weights: the token (and position) embeddings and a vision tower on the
// first stage, the output matrix on the last (tied embeddings: a copy of the vocab x d_model matrix there);
// the final norm counts with the layers. Stage weights = weights_total x stage params / all params.
// The stage chosen: the most layers, then the most full-attention (non-windowed) layers, then the first.
// pp == 1: the whole model; weights_total 0: weights stay 0 (no parameter count needed). UsageError for more stages than layers.
PipelineStage fullest_stage(const ModelConfig& gpu_cfg, const ModelConfig& cfg, std::uint64_t weights_total, std::uint64_t pp);

// "TP 2", "TP 2 × PP 2" (GPUs used: TP x PP).
std::string parallel_label(std::uint64_t tp, std::uint64_t pp);

}  // namespace kvlab
