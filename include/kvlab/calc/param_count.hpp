// Parameter count computed from a config (embeddings, attention, MLP/MoE experts, norms, biases).
#pragma once
#include <cstdint>

#include "kvlab/calc/model_config.hpp"
#include "kvlab/core/printer.hpp"

namespace kvlab {

struct ParamCount {
    std::uint64_t embedding = 0;   // token (+ position) embeddings
    std::uint64_t attention = 0;   // all layers' attention projections (+ biases)
    std::uint64_t mlp = 0;         // all layers' MLPs, every expert counted (+ routers)
    std::uint64_t norms = 0;
    std::uint64_t lm_head = 0;     // 0 when tied to the embedding
    std::uint64_t vision = 0;      // a multimodal model's vision tower and projector (ModelConfig::vision_params)
    std::uint64_t total() const;   // every weight, vision included
    std::uint64_t active_per_token = 0;  // parameters a decoded token touches: MoE's top-k experts; never the vision tower
    std::uint64_t routed_expert = 0;     // MoE: parameters of one routed expert; 0 for dense
    std::uint64_t n_moe_layer = 0;       // MoE: layers with routed experts
};

ParamCount count_params(const ModelConfig& cfg);

// Routed experts of one MoE layer that at least one of `batch` tokens uses, in expectation, when every
// token picks its k of E experts uniformly at random: E (1 - (1 - k/E)^B). One token: k; a large
// batch: all E. Skewed routing (some experts favoured) touches fewer, down to k.
double expected_experts_read(std::int64_t n_expert, std::int64_t n_active, std::uint64_t batch);

// Parameters one decode step at batch B reads: every token's share (attention, dense MLPs, shared
// experts, routers, norms, embeddings, classifier) plus, on each MoE layer, the routed experts above.
// = active_per_token at B = 1 and for dense models.
double decode_params_read(const ModelConfig& cfg, std::uint64_t batch);

// A parameter count as model names write it: "68.98 B" (10^9), "15.19 M", "262.50 K", "512"; the exact
// count is the cell's value (csv/json).
Cell params_cell(std::uint64_t count);

}  // namespace kvlab
