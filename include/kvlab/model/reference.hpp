// Read this first: the whole forward pass with a KV cache, one token at a time, in plain loops, in the
// shape of llama2.c's run.c (src/model/reference.cpp). Llama and GPT-2, MHA/GQA/MQA, windows and sinks.
// No threads, SIMD or counting: every fast path is tested against it, and `kvlab simulate --kernel
// reference` runs it beside the fast one (same tokens, both speeds).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "kvlab/calc/model_config.hpp"
#include "kvlab/weights/weights.hpp"

namespace kvlab {

class ReferenceModel {
public:
    // A cache for positions 0..n_positions-1; `cfg` and `weights` must outlive it. Throws ConfigError for
    // shapes the forward pass does not run (MLA, MoE, an odd RoPE head size, weights of other shapes).
    ReferenceModel(const ModelConfig& cfg, const Weights& weights, std::int64_t n_positions);
    // Runs `token` at position `pos` (positions 0..pos-1 must have run before, in order), storing its K
    // and V in the cache, and returns the next-token logits (V values; valid until the next call).
    std::span<const float> forward(std::int32_t token, std::int64_t pos);

private:
    void attention(std::int64_t layer, std::int64_t pos);  // att_ from q_ and the cache (step 4)

    const ModelConfig& cfg_;
    const Weights& w_;
    std::int64_t n_positions_;
    // activations of the current token (d model, H*D queries, f FFN, V vocab, T positions)
    std::vector<float> x_, xb_, q_, q_sink_, att_, hb_, hb2_, scores_, logits_;
    // the KV cache: (L, T, Hkv*D) keys and values, position p of layer l at row l*T + p
    std::vector<float> key_cache_, value_cache_;
};

}  // namespace kvlab
