// Uses kvlab's public headers only (<prefix>/include/kvlab/): sizes a model's KV cache from its
// config.json, then decodes a few tokens of a small random model through the fast forward pass and the
// readable reference, and prints whether they chose the same tokens.
#include <cstdio>
#include <exception>

#include "kvlab/calc/kv_memory.hpp"
#include "kvlab/calc/presets.hpp"
#include "kvlab/kv/kv_cache.hpp"
#include "kvlab/model/reference.hpp"
#include "kvlab/model/transformer.hpp"
#include "kvlab/weights/random_weights.hpp"

int main(int argc, char** argv) try {
    if (argc != 2) {
        std::fprintf(stderr, "usage: kvlab_consumer CONFIG.json\n");
        return 2;
    }
    const kvlab::ModelConfig cfg = kvlab::load_model(argv[1]);
    std::printf("%s: %llu bytes of KV cache per token in fp16\n", cfg.name.c_str(),
                static_cast<unsigned long long>(kvlab::kv_bytes_per_token(cfg, kvlab::DType::fp16).total()));

    // a 2-layer Llama-family model of the same family rule, small enough to run in milliseconds
    kvlab::ModelConfig tiny;
    tiny.name = tiny.display_name = "tiny";
    tiny.n_layer = 2, tiny.d_model = 32, tiny.n_head = 4, tiny.n_head_kv = 2, tiny.d_head = 8, tiny.d_ff = 64;
    tiny.n_vocab = 40, tiny.n_ctx_max = 16;
    tiny.layer_windowed.assign(2, false);
    const kvlab::Weights w = kvlab::random_weights(tiny, 7);
    kvlab::Transformer fast(tiny, w, tiny.n_ctx_max);
    kvlab::KvCache cache(tiny, tiny.n_ctx_max);
    kvlab::ReferenceModel readable(tiny, w, tiny.n_ctx_max);
    std::int32_t token = 1;
    int same = 0;
    const int steps = 12;
    for (int pos = 0; pos < steps; ++pos) {
        const kvlab::VectorF& a = fast.forward_cached(std::span<const std::int32_t>(&token, 1), pos, cache, nullptr);
        const std::span<const float> b = readable.forward(token, pos);
        Eigen::Index next_a = 0;
        a.maxCoeff(&next_a);
        std::int32_t next_b = 0;
        for (std::size_t i = 1; i < b.size(); ++i)
            if (b[i] > b[static_cast<std::size_t>(next_b)]) next_b = static_cast<std::int32_t>(i);
        same += next_a == next_b ? 1 : 0;
        token = next_b;
    }
    std::printf("fast and reference chose the same token at %d of %d steps\n", same, steps);
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "kvlab_consumer: %s\n", e.what());
    return 1;
}
