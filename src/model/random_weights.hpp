// Seeded random weights for any config: matrices N(0, sigma), norm weights 1, biases 0, so a
// simulation is reproducible from --seed. Non-goal: trained behaviour (the loaders provide that).
#pragma once
#include <cstdint>

#include "calc/model_config.hpp"
#include "model/weights.hpp"

namespace kvlab {

inline constexpr float default_weight_sigma = 0.02f;  // GPT-2's initialiser std

// Bytes the Weights for `cfg` take in fp32 (what random_weights allocates; a test pins them equal).
// Throws OverflowError.
std::uint64_t weights_bytes(const ModelConfig& cfg);

// Same seed, same config -> the same values on any machine and thread count (counter-based
// generator: each value depends only on seed, tensor index and element index). RoPE pairs neighbours.
Weights random_weights(const ModelConfig& cfg, std::uint64_t seed, float sigma = default_weight_sigma);

// Bytes actually held by `weights` (sum of tensor sizes * 4).
std::uint64_t weights_bytes_held(const Weights& weights);

}  // namespace kvlab
