#include <doctest/doctest.h>

#include <random>
#include <vector>

#include "kvlab/kernels/attention.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/kv/kv_cache.hpp"
#include "kvlab/calc/kv_memory.hpp"
#include "kvlab/weights/random_weights.hpp"
#include "kvlab/sim/sampler.hpp"
#include "kvlab/weights/tensor_table.hpp"
#include "kvlab/calc/param_count.hpp"
#include "kvlab/calc/presets.hpp"
#include "kvlab/model/transformer.hpp"
#include "sim_configs.hpp"
#include "test_support.hpp"

using namespace kvlab;
using kvlab::test::tiny_config;

namespace {

std::vector<TokenId> tokens_for(std::int64_t n, std::int64_t n_vocab) {
    std::vector<TokenId> t;
    for (std::int64_t i = 0; i < n; ++i) t.push_back(static_cast<TokenId>((11 * i + 5) % n_vocab));
    return t;
}

// Max |cached - uncached| logit over a prefill of n_prompt tokens and decode steps up to n_total.
float max_mode_difference(const ModelConfig& cfg, const Weights& w, std::int64_t n_prompt, std::int64_t n_total) {
    Transformer model(cfg, w, n_total);
    KvCache cache(cfg, n_total);
    const auto tokens = tokens_for(n_total, cfg.n_vocab);
    float worst = 0.0f;
    for (std::int64_t end = n_prompt; end <= n_total; ++end) {
        const VectorF cached = end == n_prompt ? model.forward_cached(std::span(tokens).first(end), 0, cache, nullptr)
                                               : model.forward_cached(std::span(tokens).subspan(end - 1, 1), end - 1, cache, nullptr);
        const VectorF& uncached = model.forward_uncached(std::span(tokens).first(end), nullptr);
        worst = std::max(worst, (cached - uncached).cwiseAbs().maxCoeff());
    }
    return worst;
}

}  // namespace

TEST_CASE("Cached and uncached decoding give the same logits for both families and every attention layout") {
    for (const auto& cfg : {tiny_config(Family::llama, 3, 3), tiny_config(Family::llama, 4, 2), tiny_config(Family::llama, 4, 1),
                            tiny_config(Family::gpt2, 3, 3)}) {
        INFO(cfg.name);
        const Weights w = random_weights(cfg, 11, 0.2f);  // larger sigma: logits of order 1, differences visible
        CHECK(max_mode_difference(cfg, w, 4, 20) < 1e-4f);
    }
}

TEST_CASE("Rotate-half RoPE pairing changes the logits but the two modes still agree") {
    const auto cfg = tiny_config(Family::llama, 4, 2);
    Weights w = random_weights(cfg, 5, 0.2f);
    Transformer neighbours(cfg, w, 6);
    const auto tokens = tokens_for(6, cfg.n_vocab);
    const VectorF a = neighbours.forward_uncached(tokens, nullptr);
    w.rope_pairing = RopePairing::halves;
    Transformer halves(cfg, w, 6);
    const VectorF b = halves.forward_uncached(tokens, nullptr);
    CHECK((a - b).cwiseAbs().maxCoeff() > 1e-3f);
    CHECK(max_mode_difference(cfg, w, 2, 10) < 1e-4f);
}

TEST_CASE("A sliding-window ring buffer agrees with the uncached run restricted to the window") {
    // window 4 on every layer, 14 positions: the ring wraps three times, including inside the prefill
    for (const auto& cfg : {tiny_config(Family::llama, 4, 2, 2, 4), tiny_config(Family::gpt2, 3, 3, 2, 4)}) {
        INFO(cfg.name);
        const Weights w = random_weights(cfg, 21, 0.2f);
        CHECK(max_mode_difference(cfg, w, 6, 14) < 1e-4f);  // prefill of 6 > window: stored and attended in order
        CHECK(max_mode_difference(cfg, w, 2, 14) < 1e-4f);
        // the window changes the result once T exceeds it: it is really applied
        auto full = cfg;
        full.sliding_window.reset();
        Transformer windowed_model(cfg, w, 10), full_model(full, w, 10);
        const auto tokens = tokens_for(10, cfg.n_vocab);
        const VectorF a = windowed_model.forward_uncached(tokens, nullptr);
        const VectorF b = full_model.forward_uncached(tokens, nullptr);
        CHECK((a - b).cwiseAbs().maxCoeff() > 1e-4f);
    }
}

TEST_CASE("The KV cache allocates exactly what kvcalc computes") {
    for (const auto& cfg : {tiny_config(Family::llama, 4, 2), tiny_config(Family::llama, 4, 1, 3, 5), load_preset("stories15m"),
                            load_preset("llama-3-8b")}) {
        INFO(cfg.name);
        const std::int64_t T = cfg.n_ctx_max < 64 ? cfg.n_ctx_max : 37;
        const KvCache cache(cfg, T);
        CHECK(cache.bytes() == kv_bytes_sequence(cfg, DType::fp32, static_cast<std::uint64_t>(T), WindowMode::cap).total());
    }
    // stories15M at 160 positions: 2 (K, V) * 6 layers * 160 * 288 * 4 B = 2,211,840
    CHECK(KvCache(load_preset("stories15m"), 160).bytes() == 2211840);
    // window 5 over 3 layers, 37 positions: each layer holds 5 rows: 2 * 3 * 5 * (1*8) * 4 B = 960
    CHECK(KvCache(tiny_config(Family::llama, 4, 1, 3, 5), 37).bytes() == 960);
}

TEST_CASE("Grouped, chunked attention matches the plain-loop reference, from fp32 rows and from a narrow cache") {
    const AttentionShape shape{8, 2, 16};  // 4 query heads per KV head
    const std::int64_t d_kv = shape.n_head_kv * shape.d_head, d_q = shape.n_head * shape.d_head;
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    // 23 keys: one chunk; 300: three chunks of 128 rows (2048 / D) from a narrow store, the last partial
    for (const std::int64_t n_keys : {23, 300}) {
        CAPTURE(n_keys);
        std::vector<float> q(static_cast<std::size_t>(d_q)), k(static_cast<std::size_t>(n_keys * d_kv)), v(k.size());
        for (auto* buf : {&q, &k, &v})
            for (auto& x : *buf) x = normal(rng);
        std::vector<float> out_ref(q.size()), out(q.size()), scores(static_cast<std::size_t>(n_keys)),
            work(static_cast<std::size_t>(attention_scratch_floats(shape, n_keys)));
        attention_decode_ref(shape, q.data(), k.data(), v.data(), n_keys, out_ref.data(), scores.data());
        MatrixRM k_rows = Eigen::Map<const MatrixRM>(k.data(), n_keys, d_kv), v_rows = Eigen::Map<const MatrixRM>(v.data(), n_keys, d_kv);
        const KvView kv{.k = &k_rows, .v = &v_rows};
        // whole groups (heads 0-3 and 4-7), one head per call, every head in one call, and ranges that
        // cut groups (0-2, 3-6 across the two KV heads, 7): the same numbers every way, bit for bit
        std::vector<float> first;
        for (const std::vector<std::int64_t>& cuts : std::vector<std::vector<std::int64_t>>{
                 {0, 4, 8}, {0, 1, 2, 3, 4, 5, 6, 7, 8}, {0, 8}, {0, 3, 7, 8}}) {
            std::fill(out.begin(), out.end(), 0.0f);
            for (std::size_t c = 0; c + 1 < cuts.size(); ++c)
                attention_heads(shape, cuts[c], cuts[c + 1] - cuts[c], q.data(), kv, 0, n_keys, out.data(), work.data());
            for (std::size_t i = 0; i < out.size(); ++i) CHECK(out[i] == doctest::Approx(out_ref[i]).epsilon(1e-5));
            if (first.empty()) first = out;
            CHECK(out == first);
        }
        // a narrow cache read chunk by chunk equals the reference over its rows decoded one by one;
        // q4_0's blocks of 32 hold two heads of D = 16, so each head reads half a block
        for (const DType dtype : {DType::fp16, DType::fp8_e4m3, DType::q4_0}) {
            CAPTURE(dtype_name(dtype));
            KvRowStore ks({dtype, KvScale::token_head}, n_keys, shape.n_head_kv, shape.d_head),
                vs({dtype, KvScale::token_head}, n_keys, shape.n_head_kv, shape.d_head);
            std::vector<float> k_dec(k.size()), v_dec(v.size());
            for (std::int64_t r = 0; r < n_keys; ++r) {
                ks.write(r, k.data() + r * d_kv);
                vs.write(r, v.data() + r * d_kv);
                ks.read(r, k_dec.data() + r * d_kv);
                vs.read(r, v_dec.data() + r * d_kv);
            }
            CHECK(k_dec != k);  // the format rounded something: the store is not a copy
            attention_decode_ref(shape, q.data(), k_dec.data(), v_dec.data(), n_keys, out_ref.data(), scores.data());
            for (std::int64_t g = 0; g < shape.n_head_kv; ++g)
                attention_heads(shape, g * 4, 4, q.data(), KvView{.k_store = &ks, .v_store = &vs}, 0, n_keys, out.data(), work.data());
            for (std::size_t i = 0; i < out.size(); ++i) CHECK(out[i] == doctest::Approx(out_ref[i]).epsilon(1e-5));
        }
    }
}

TEST_CASE("Random weights are reproducible from the seed and sized by weights_bytes") {
    const auto cfg = tiny_config(Family::llama, 4, 2);
    const Weights a = random_weights(cfg, 9), b = random_weights(cfg, 9), c = random_weights(cfg, 10);
    CHECK(a.layers[1].wk == b.layers[1].wk);
    CHECK(a.tok_embed == b.tok_embed);
    CHECK(a.layers[1].wk != c.layers[1].wk);
    CHECK(a.layers[0].attn_norm == VectorF::Ones(cfg.d_model));
    // sample std close to sigma = 0.02 over the 50*24 = 1200 embedding values
    const double mean = a.tok_embed.map().mean();
    const double var = (a.tok_embed.map().array() - mean).square().mean();
    CHECK(std::sqrt(var) == doctest::Approx(0.02).epsilon(0.1));
    auto biased = cfg;
    biased.attention_bias = true;
    for (const auto& cfg2 : {cfg, biased, tiny_config(Family::gpt2, 3, 3), load_preset("stories260k")}) {
        auto untied = cfg2;
        untied.tied_embeddings = !cfg2.tied_embeddings;
        for (const auto& cc : {cfg2, untied}) {
            INFO(cc.name, " tied=", cc.tied_embeddings);
            CHECK(weights_bytes_held(random_weights(cc, 1)) == weights_bytes(cc));
        }
    }
}

// The tensor table (what the simulator allocates and the loaders read) and count_params (pinned to
// published counts in test_config.cpp: stories15M 15,191,712, GPT-2 124,439,808, ...) are written
// independently; for every dense preset the simulator runs, the table must hold exactly that many fp32
// values: 4 bytes per parameter.
TEST_CASE("The tensor table holds count_params parameters for every dense preset, 4 bytes each") {
    int checked = 0;
    for (const auto& name : preset_names()) {
        const ModelConfig cfg = load_preset(name);
        if (cfg.n_expert > 1 || cfg.mla) continue;  // MoE and MLA: kvcalc sizes them, the simulator does not run them
        // Gemma's four norms a layer and Qwen3's / Gemma 3's q and k norms: counted for kvcalc's fit, not built by the
        // simulator, which runs those shapes with Llama's layer (a few hundred thousand of billions of parameters)
        if (cfg.norms_per_layer != 2 || cfg.qk_norm) continue;
        INFO(name);
        CHECK(weights_bytes(cfg) == 4 * count_params(cfg).total());
        ++checked;
    }
    CHECK(checked >= 10);  // the Llama 2/3 presets, stories*, gpt2, tiny-*
}

TEST_CASE("The transformer allocates the activation bytes it estimates") {
    for (const auto& cfg : {tiny_config(Family::llama, 4, 2), tiny_config(Family::gpt2, 3, 3)}) {
        const Weights w = random_weights(cfg, 1);
        const Transformer model(cfg, w, 17);
        CHECK(model.activation_bytes_held() == Transformer::activation_bytes(cfg, {17, 17, true}));
        const TransformerSize cached_only{17, 5, false};
        const Transformer small(cfg, w, cached_only);
        CHECK(small.activation_bytes_held() == Transformer::activation_bytes(cfg, cached_only));
        CHECK(small.activation_bytes_held() < model.activation_bytes_held());
        const TransformerSize decode_only{17, 1, false};  // one token per call: no GEMM scratch
        const Transformer gemv_only(cfg, w, decode_only);
        CHECK(gemv_only.activation_bytes_held() == Transformer::activation_bytes(cfg, decode_only));
        CHECK(gemv_only.activation_bytes_held() < small.activation_bytes_held());
    }
}

TEST_CASE("A transformer sized for cached calls gives the same logits and refuses what it has no buffers for") {
    const auto cfg = tiny_config(Family::llama, 4, 2);
    const Weights w = random_weights(cfg, 3);
    const std::vector<TokenId> prompt = {3, 1, 4, 1, 5};
    Transformer full(cfg, w, 8);
    Transformer small(cfg, w, TransformerSize{8, 5, false});
    KvCache cache_full(cfg, 8), cache_small(cfg, 8);
    CHECK(full.forward_cached(prompt, 0, cache_full, nullptr) == small.forward_cached(prompt, 0, cache_small, nullptr));
    const std::vector<TokenId> next = {2};
    CHECK(full.forward_cached(next, 5, cache_full, nullptr) == small.forward_cached(next, 5, cache_small, nullptr));
    const std::vector<TokenId> six = {1, 2, 3, 4, 5, 6};
    KvCache cache_six(cfg, 8);
    CHECK_THROWS_AS(small.forward_cached(six, 0, cache_six, nullptr), UsageError);  // 6 tokens > 5 per call
    CHECK_THROWS_AS(small.forward_uncached(prompt, nullptr), Error);
    CHECK_THROWS_AS(Transformer(cfg, w, TransformerSize{4, 5, false}), UsageError);  // more tokens than positions
}

TEST_CASE("The transformer refuses token ids outside the vocabulary and calls beyond its positions") {
    const auto cfg = tiny_config(Family::llama, 4, 2);
    const Weights w = random_weights(cfg, 1);
    Transformer model(cfg, w, 4);
    KvCache cache(cfg, 4);
    const std::vector<TokenId> bad = {static_cast<TokenId>(cfg.n_vocab)};
    CHECK_THROWS_AS(model.forward_uncached(bad, nullptr), UsageError);
    const std::vector<TokenId> five = {1, 2, 3, 4, 5};
    CHECK_THROWS_AS(model.forward_uncached(five, nullptr), UsageError);
    const std::vector<TokenId> one = {1};
    CHECK_THROWS_AS(model.forward_cached(one, 4, cache, nullptr), UsageError);
}

TEST_CASE("Greedy sampling takes the argmax; seeded sampling is reproducible and respects top-k") {
    VectorF logits(6);
    logits << 0.1f, 2.0f, -1.0f, 1.9f, 0.0f, 0.5f;
    Sampler greedy({}, 6);
    CHECK(greedy.sample(logits) == 1);
    Sampler top1({1.0, 1, 1.0, 3}, 6);
    for (int i = 0; i < 20; ++i) CHECK(top1.sample(logits) == 1);
    Sampler a({1.0, 2, 1.0, 42}, 6), b({1.0, 2, 1.0, 42}, 6);
    std::vector<int> seen(6, 0);
    for (int i = 0; i < 200; ++i) {
        const auto x = a.sample(logits);
        CHECK(x == b.sample(logits));
        ++seen[static_cast<std::size_t>(x)];
    }
    CHECK(seen[1] > 0);
    CHECK(seen[3] > 0);                         // both top-2 tokens drawn
    CHECK(seen[0] + seen[2] + seen[4] + seen[5] == 0);  // nothing outside the top 2
    Sampler nucleus({1.0, 0, 0.3, 1}, 6);       // token 1 alone holds ~42% > 30%
    for (int i = 0; i < 20; ++i) CHECK(nucleus.sample(logits) == 1);
    CHECK_THROWS_AS(validate_sampler_options({-1.0, 0, 1.0, 0}), UsageError);
    CHECK_THROWS_AS(validate_sampler_options({1.0, -2, 1.0, 0}), UsageError);
    CHECK_THROWS_AS(validate_sampler_options({1.0, 0, 0.0, 0}), UsageError);
}

TEST_CASE("The transformer refuses weights whose shapes disagree with the config, naming the matrix") {
    // the matmul kernels read raw rows, so a wrong shape must stop construction, not read past a buffer
    const auto cfg = tiny_config(Family::llama, 4, 2);
    Weights w = random_weights(cfg, 5);
    w.layers[1].w2 = MatrixRM::Zero(w.layers[1].w2.rows(), w.layers[1].w2.cols() - 1);
    CHECK_THROWS_WITH_AS(Transformer(cfg, w, 8), doctest::Contains("layer 1 w2"), ConfigError);
    w = random_weights(cfg, 5);
    w.layers[0].w3 = MatrixRM::Zero(w.layers[0].w3.rows() + 1, w.layers[0].w3.cols());
    CHECK_THROWS_WITH_AS(Transformer(cfg, w, 8), doctest::Contains("layer 0 w3"), ConfigError);
}
