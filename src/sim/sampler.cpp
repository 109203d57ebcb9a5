#include "kvlab/sim/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <fmt/format.h>

#include "kvlab/core/error.hpp"

namespace kvlab {

void validate_sampler_options(const SamplerOptions& o) {
    if (!(o.temperature >= 0.0) || !std::isfinite(o.temperature))
        throw UsageError(fmt::format("--temperature: {}; expected a finite number >= 0 (0 = greedy)", o.temperature));
    // the logits are scaled by 1 / T in float: below 1 / FLT_MAX (2.9e-39) that is infinite, and
    // 0 x inf for the largest logit would make every probability NaN
    constexpr double min_temperature = 1.0 / static_cast<double>(std::numeric_limits<float>::max());
    if (o.temperature > 0.0 && o.temperature < min_temperature)
        throw UsageError(fmt::format("--temperature: {}; expected 0 (greedy) or at least {:.3g} (1 / the largest float)", o.temperature, min_temperature));
    if (o.top_k < 0) throw UsageError(fmt::format("--top-k: {}; expected >= 0 (0 = off)", o.top_k));
    if (!(o.top_p > 0.0 && o.top_p <= 1.0))
        throw UsageError(fmt::format("--top-p: {}; expected a value in (0, 1] (1 = off)", o.top_p));
    if (o.rule == SamplerRule::llama2c && o.top_k != 0)
        throw UsageError(fmt::format("--top-k: {}; llama2.c's sampler has no top-k, expected 0 with --sampler llama2c", o.top_k));
    if (o.rule == SamplerRule::llama2c && o.temperature > 0.0 && o.seed == 0)
        throw UsageError("--seed: 0; expected a seed >= 1 with --sampler llama2c (its xorshift generator never leaves state 0, "
                         "and run.c reads -s 0 as 'seed from the clock')");
}

std::uint32_t XorShiftRng::next_u32() {
    // xorshift64* (Marsaglia's shifts 12, 25, 27; Vigna's multiplier), the high 32 bits of the product
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return static_cast<std::uint32_t>((state_ * 0x2545F4914F6CDD1DULL) >> 32);
}

float XorShiftRng::next_f32() { return static_cast<float>(next_u32() >> 8) / 16777216.0f; }

std::int32_t argmax(const VectorF& logits) {
    Eigen::Index best = 0;
    logits.maxCoeff(&best);
    return static_cast<std::int32_t>(best);
}

Sampler::Sampler(const SamplerOptions& options, std::int64_t n_vocab)
    : options_(options), rng_(options.seed), xorshift_(options.seed) {
    validate_sampler_options(options);
    if (options.temperature > 0.0) {  // greedy needs no buffers
        probs_.resize(static_cast<std::size_t>(n_vocab));
        order_.resize(static_cast<std::size_t>(n_vocab));
    }
}

std::int32_t Sampler::sample(const VectorF& logits) {
    if (options_.temperature == 0.0) return argmax(logits);
    return options_.rule == SamplerRule::llama2c ? sample_llama2c(logits) : sample_kvlab(logits);
}

std::int32_t Sampler::sample_kvlab(const VectorF& logits) {
    const auto n = static_cast<std::size_t>(logits.size());
    // softmax(logits / temperature), max-subtracted
    const float max_logit = logits.maxCoeff();
    const auto inv_t = static_cast<float>(1.0 / options_.temperature);
    double sum = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
        probs_[i] = std::exp((logits[static_cast<Eigen::Index>(i)] - max_logit) * inv_t);
        sum += probs_[i];
    }
    std::iota(order_.begin(), order_.end(), 0);
    std::size_t n_keep = n;
    auto by_prob = [&](std::int32_t a, std::int32_t b) {
        const float pa = probs_[static_cast<std::size_t>(a)], pb = probs_[static_cast<std::size_t>(b)];
        return pa != pb ? pa > pb : a < b;  // ties by id: the order is total, so the result is reproducible
    };
    if (options_.top_k > 0 && static_cast<std::size_t>(options_.top_k) < n) {
        n_keep = static_cast<std::size_t>(options_.top_k);
        std::partial_sort(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(n_keep), order_.end(), by_prob);
    } else if (options_.top_p < 1.0) {
        std::sort(order_.begin(), order_.end(), by_prob);
    }
    if (options_.top_p < 1.0) {
        double kept = 0.0;
        std::size_t i = 0;
        while (i < n_keep) {
            kept += probs_[static_cast<std::size_t>(order_[i++])] / sum;
            if (kept >= options_.top_p) break;
        }
        n_keep = i;
    }
    double kept_sum = 0.0;
    for (std::size_t i = 0; i < n_keep; ++i) kept_sum += probs_[static_cast<std::size_t>(order_[i])];
    // uniform in [0, kept_sum) from the top 53 bits: the same on every standard library
    const double r = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * kept_sum;
    double cdf = 0.0;
    for (std::size_t i = 0; i < n_keep; ++i) {
        cdf += probs_[static_cast<std::size_t>(order_[i])];
        if (r < cdf) return order_[i];
    }
    return order_[n_keep - 1];
}

// run.c's sample(): every sum in float, in run.c's order, so the same logits pick the same token.
std::int32_t Sampler::sample_llama2c(const VectorF& logits) {
    const auto n = static_cast<std::size_t>(logits.size());
    const auto t = static_cast<float>(options_.temperature);
    float max_x = -std::numeric_limits<float>::infinity();
    for (std::size_t i = 0; i < n; ++i) {
        probs_[i] = logits[static_cast<Eigen::Index>(i)] / t;  // divided, not multiplied by 1 / T
        max_x = std::max(max_x, probs_[i]);
    }
    float sum = 0.0f;
    for (std::size_t i = 0; i < n; ++i) {
        probs_[i] = std::exp(probs_[i] - max_x);
        sum += probs_[i];
    }
    for (std::size_t i = 0; i < n; ++i) probs_[i] /= sum;
    const float coin = xorshift_.next_f32();  // one coin per sampled token, drawn before the rule splits
    const auto top_p = static_cast<float>(options_.top_p);
    if (top_p >= 1.0f) {  // multinomial over all tokens in id order
        float cdf = 0.0f;
        for (std::size_t i = 0; i < n; ++i) {
            cdf += probs_[i];
            if (coin < cdf) return static_cast<std::int32_t>(i);
        }
        return static_cast<std::int32_t>(n - 1);
    }
    // candidates: p >= (1 - top_p) / (V - 1), in id order (no token below it can be in the nucleus)
    const float cutoff = (1.0f - top_p) / static_cast<float>(n - 1);
    std::size_t n0 = 0;
    for (std::size_t i = 0; i < n; ++i)
        if (probs_[i] >= cutoff) order_[n0++] = static_cast<std::int32_t>(i);
    // most likely first; equal probabilities keep id order (a stable sort of the id-ordered list)
    std::sort(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(n0), [&](std::int32_t a, std::int32_t b) {
        const float pa = probs_[static_cast<std::size_t>(a)], pb = probs_[static_cast<std::size_t>(b)];
        return pa != pb ? pa > pb : a < b;
    });
    // the nucleus ends at the first token whose running sum exceeds top_p (strictly)
    float cumulative = 0.0f;
    std::size_t last = n0 - 1;
    for (std::size_t i = 0; i < n0; ++i) {
        cumulative += probs_[static_cast<std::size_t>(order_[i])];
        if (cumulative > top_p) {
            last = i;
            break;
        }
    }
    const float r = coin * cumulative;
    float cdf = 0.0f;
    for (std::size_t i = 0; i <= last; ++i) {
        cdf += probs_[static_cast<std::size_t>(order_[i])];
        if (r < cdf) return order_[i];
    }
    return order_[last];
}

}  // namespace kvlab
