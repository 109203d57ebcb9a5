// Parameter count computed from a config (embeddings, attention, MLP/MoE experts, norms, biases).
#pragma once
#include <cstdint>

#include "calc/model_config.hpp"
#include "core/printer.hpp"

namespace kvlab {

struct ParamCount {
    std::uint64_t embedding = 0;   // token (+ position) embeddings
    std::uint64_t attention = 0;   // all layers' attention projections (+ biases)
    std::uint64_t mlp = 0;         // all layers' MLPs, every expert counted (+ routers)
    std::uint64_t norms = 0;
    std::uint64_t lm_head = 0;     // 0 when tied to the embedding
    std::uint64_t total() const;
    std::uint64_t active_per_token = 0;  // MoE: parameters a token touches (top-k experts); = total for dense
};

ParamCount count_params(const ModelConfig& cfg);

// A parameter count as model names write it: "68.98 B" (10^9), "15.19 M", "262.50 K", "512"; the exact
// count is the cell's value (csv/json).
Cell params_cell(std::uint64_t count);

}  // namespace kvlab
