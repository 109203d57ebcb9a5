// Read this beside reference.hpp: multi-head latent attention (DeepSeek-V2) one token at a time, in plain
// loops (src/model/reference_mla.cpp). The cache holds one latent row per token per layer; attention runs
// the naive path (decompress every cached latent into keys and values) or the absorbed one (attend over
// the latents with W_UK folded into the query and W_UV into the output). The fast path (model/mla.hpp) is
// tested against it.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "kvlab/calc/model_config.hpp"
#include "kvlab/model/mla.hpp"
#include "kvlab/weights/weights.hpp"

namespace kvlab {

class ReferenceMlaModel {
public:
    // A latent cache for positions 0..n_positions-1; `cfg` (an MLA config) and `weights` must outlive it.
    ReferenceMlaModel(const ModelConfig& cfg, const Weights& weights, std::int64_t n_positions, MlaPath path);
    // Runs `token` at `pos` (positions 0..pos-1 run before, in order), storing its latent row, and returns
    // the next-token logits (valid until the next call).
    std::span<const float> forward(std::int32_t token, std::int64_t pos);

private:
    void attention(std::int64_t layer, std::int64_t pos, const LayerWeights& lw);  // att_ from q_ and the cache

    const ModelConfig& cfg_;
    const Weights& w_;
    std::int64_t n_positions_;
    MlaPath path_;
    // activations of the current token (d model, H heads, dn nope, R rope, dv value, r latent, f FFN)
    std::vector<float> x_, xb_, q_, att_, hb_, hb2_, scores_, logits_, up_, q_lat_, o_lat_;
    // the latent cache: (L, T, r + R): row l*T + p holds position p's [c_KV; k_R] in layer l
    std::vector<float> latent_cache_;
};

}  // namespace kvlab
