// Sampler: picks the next token from logits. Greedy (argmax) by default; temperature, top-k and
// top-p (nucleus) with a seeded generator, so a sampled run is reproducible. Two rules: kvlab's own
// (std::mt19937_64, double sums, top-k) and llama2.c's (run.c's xorshift generator, float sums, its
// top-p cutoff), which picks run.c's tokens for the same logits and seed. No allocation per call.
#pragma once
#include <array>
#include <cstdint>
#include <random>
#include <vector>

#include "kvlab/core/choice.hpp"
#include "kvlab/core/matrix.hpp"

namespace kvlab {

// kvlab: softmax in double, top-k then top-p, one 53-bit draw from std::mt19937_64(seed) per token.
// llama2c: run.c's sample() (llama2.c, docs/cli-simulate.md): logits / T and softmax in float, one
// float coin per token from its xorshift64* state (seeded with the seed, which must not be 0), then
// multinomial (top-p 1) or top-p over the tokens with p >= (1 - top_p) / (V - 1); no top-k.
enum class SamplerRule { kvlab, llama2c };
inline constexpr std::array<Choice<SamplerRule>, 2> sampler_rule_choices{
    {{"kvlab", SamplerRule::kvlab}, {"llama2c", SamplerRule::llama2c}}};

struct SamplerOptions {
    double temperature = 0.0;  // 0: greedy
    std::int64_t top_k = 0;    // 0: off; else keep the k most likely tokens
    double top_p = 1.0;        // 1: off; else keep the smallest set whose probability reaches top_p
    std::uint64_t seed = 0;
    SamplerRule rule = SamplerRule::kvlab;
};

// Throws UsageError naming the flag for temperature < 0, top_k < 0, top_p outside (0, 1]; with the
// llama2c rule also for top_k > 0 (run.c has none) and, when sampling, seed 0 (xorshift's fixed point).
void validate_sampler_options(const SamplerOptions& options);

// Index of the largest logit (the first one on exact ties).
std::int32_t argmax(const VectorF& logits);

// llama2.c's generator (run.c random_u32 / random_f32): xorshift64* on a 64-bit state.
class XorShiftRng {
public:
    explicit XorShiftRng(std::uint64_t seed) : state_(seed) {}
    std::uint32_t next_u32();
    float next_f32();  // the top 24 bits of next_u32() / 2^24: in [0, 1)

private:
    std::uint64_t state_;
};

class Sampler {
public:
    Sampler(const SamplerOptions& options, std::int64_t n_vocab);
    std::int32_t sample(const VectorF& logits);

private:
    std::int32_t sample_kvlab(const VectorF& logits);
    std::int32_t sample_llama2c(const VectorF& logits);

    SamplerOptions options_;
    std::mt19937_64 rng_;
    XorShiftRng xorshift_;
    std::vector<float> probs_;          // (V) when temperature > 0, else empty
    std::vector<std::int32_t> order_;   // (V) token ids, sorted by probability when filtering; as probs_
};

}  // namespace kvlab
