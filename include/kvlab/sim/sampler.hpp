// Sampler: picks the next token from logits. Greedy (argmax) by default; temperature, top-k and
// top-p (nucleus) with a seeded generator, so a sampled run is reproducible. No allocation per call.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "kvlab/core/matrix.hpp"

namespace kvlab {

struct SamplerOptions {
    double temperature = 0.0;  // 0: greedy
    std::int64_t top_k = 0;    // 0: off; else keep the k most likely tokens
    double top_p = 1.0;        // 1: off; else keep the smallest set whose probability reaches top_p
    std::uint64_t seed = 0;
};

// Throws UsageError naming the flag for temperature < 0, top_k < 0, top_p outside (0, 1].
void validate_sampler_options(const SamplerOptions& options);

// Index of the largest logit (the first one on exact ties).
std::int32_t argmax(const VectorF& logits);

class Sampler {
public:
    Sampler(const SamplerOptions& options, std::int64_t n_vocab);
    std::int32_t sample(const VectorF& logits);

private:
    SamplerOptions options_;
    std::mt19937_64 rng_;
    std::vector<float> probs_;          // (V) when temperature > 0, else empty
    std::vector<std::int32_t> order_;   // (V) token ids, sorted by probability when filtering; as probs_
};

}  // namespace kvlab
