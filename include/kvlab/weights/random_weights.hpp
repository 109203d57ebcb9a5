// Seeded random weights for any config: matrices N(0, sigma), norm weights 1, biases 0, so a
// simulation is reproducible from --seed. Non-goal: trained behaviour (the loaders provide that).
#pragma once
#include <cstdint>

#include "kvlab/calc/model_config.hpp"
#include "kvlab/weights/tensor_table.hpp"
#include "kvlab/weights/weights.hpp"

namespace kvlab {

inline constexpr float default_weight_sigma = 0.02f;  // GPT-2's initialiser std

// Same seed, same config -> the same values on any machine and thread count (counter-based
// generator: each value depends only on seed, tensor index and element index). RoPE pairs neighbours.
Weights random_weights(const ModelConfig& cfg, std::uint64_t seed, float sigma = default_weight_sigma);

}  // namespace kvlab
