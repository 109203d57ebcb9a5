#include "kvlab/weights/random_weights.hpp"

#include <algorithm>
#include <cmath>

#include "kvlab/core/checked.hpp"
#include "kvlab/core/huge_pages.hpp"

namespace kvlab {

namespace {

std::uint64_t mix64(std::uint64_t x) {  // splitmix64 finaliser
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// Fills `n` floats with N(0, sigma): the Box-Muller transform on counter-hashed uniforms, in blocks of
// 2*K values so that Eigen vectorises log, sqrt, sin and cos. Each block depends only on the key and its
// index, so the weights do not depend on the thread count.
void fill_normal(float* out, std::int64_t n, std::uint64_t key, float sigma) {
    constexpr std::int64_t K = 512;  // pairs per block
    constexpr float two_pi = 6.28318530717958647692f;
    const std::int64_t n_blocks = (n + 2 * K - 1) / (2 * K);
#pragma omp parallel
    {
        Eigen::ArrayXf u1(K), u2(K), radius(K), angle(K);  // (K) per thread
#pragma omp for schedule(static)
        for (std::int64_t block = 0; block < n_blocks; ++block) {
            for (std::int64_t j = 0; j < K; ++j) {
                const std::uint64_t h = mix64(key + static_cast<std::uint64_t>(block * K + j));
                u1[j] = static_cast<float>((h >> 40) + 1) * 0x1.0p-24f;          // (0, 1]: log is finite
                u2[j] = static_cast<float>((h >> 16) & 0xFFFFFF) * 0x1.0p-24f;   // [0, 1)
            }
            radius = sigma * (-2.0f * u1.log()).sqrt();
            angle = two_pi * u2;
            float* dst = out + 2 * K * block;
            const std::int64_t n_left = std::min(2 * K, n - 2 * K * block);
            Eigen::Map<Eigen::ArrayXf>(dst, std::min(K, n_left)) = (radius * angle.cos()).head(std::min(K, n_left));
            if (n_left > K) Eigen::Map<Eigen::ArrayXf>(dst + K, n_left - K) = (radius * angle.sin()).head(n_left - K);
        }
    }
}

}  // namespace

Weights random_weights(const ModelConfig& cfg, std::uint64_t seed, float sigma) {
    const std::vector<TensorSpec> specs = tensor_specs(cfg);
    Weights w;
    w.rope_pairing = RopePairing::neighbours;  // as llama2.c, the reference for random-init runs
    w.layers.resize(static_cast<std::size_t>(cfg.n_layer));
    // the matrices back to back in forward order, in one arena of huge pages (core/huge_pages.hpp): the
    // views below point into it and Weights::backing keeps it; the vectors have their own storage
    std::uint64_t arena_bytes = 0;
    for_each_tensor(specs, w.layers.size(), [&](const TensorSpec& s, std::size_t) {
        if (s.is_matrix())
            arena_bytes = checked_add(arena_bytes, HugeArena::footprint(checked_mul(s.n_values(), sizeof(float), "weight bytes")),
                                      "weight bytes");
    });
    auto arena = std::make_shared<HugeArena>(static_cast<std::size_t>(arena_bytes));
    std::uint64_t n_drawn = 0;  // matrices drawn so far: each draws from its own key, in forward order
    for_each_tensor(specs, w.layers.size(), [&](const TensorSpec& s, std::size_t layer) {
        std::span<float> data;
        if (s.is_matrix()) {
            data = {static_cast<float*>(arena->take(s.n_values() * sizeof(float))), static_cast<std::size_t>(s.n_values())};
            matrix_of(w, s, layer) = WeightMatrix::view(data.data(), s.rows, s.cols);
        } else {
            allocate_tensor(w, s, layer);
            data = tensor_data(w, s, layer);
        }
        if (s.init == TensorInit::normal)
            fill_normal(data.data(), static_cast<std::int64_t>(data.size()), mix64(seed ^ mix64(++n_drawn)), sigma);
        else
            std::fill(data.begin(), data.end(), s.init == TensorInit::ones ? 1.0f : 0.0f);
    });
    w.backing = std::move(arena);
    return w;
}

}  // namespace kvlab
