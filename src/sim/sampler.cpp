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
}

std::int32_t argmax(const VectorF& logits) {
    Eigen::Index best = 0;
    logits.maxCoeff(&best);
    return static_cast<std::int32_t>(best);
}

Sampler::Sampler(const SamplerOptions& options, std::int64_t n_vocab) : options_(options), rng_(options.seed) {
    validate_sampler_options(options);
    if (options.temperature > 0.0) {  // greedy needs no buffers
        probs_.resize(static_cast<std::size_t>(n_vocab));
        order_.resize(static_cast<std::size_t>(n_vocab));
    }
}

std::int32_t Sampler::sample(const VectorF& logits) {
    if (options_.temperature == 0.0) return argmax(logits);
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

}  // namespace kvlab
