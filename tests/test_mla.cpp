// Multi-head latent attention (issue 49): the fast path (model/mla.hpp) against the readable reference
// (model/reference_mla.hpp) and against PyTorch (models/tiny-mla, trained by scripts/train-tiny.py from
// DeepSeek-V2's equations); its counted costs against their closed form; and one KV number per token in
// three places (the cache simulate runs, kvcalc, docs/kv-memory.md's formula).
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvlab/calc/kv_memory.hpp"
#include "kvlab/formats/checkpoint.hpp"
#include "kvlab/kv/kv_cache.hpp"
#include "kvlab/model/reference_mla.hpp"
#include "kvlab/model/transformer.hpp"
#include "kvlab/weights/random_weights.hpp"
#include "report/decode_cost.hpp"
#include "sim_configs.hpp"
#include "test_paths.hpp"

using namespace kvlab;

namespace {

const std::filesystem::path models_dir = kvlab::test::models_dir;

// A small DeepSeek-V2-shaped config: 3 heads, latent 16 + rope 8, nope 12 and v 10 (all different, so a
// width mixed up in the code changes a shape or a result).
ModelConfig small_mla() {
    const nlohmann::json j = {{"model_type", "deepseek_v2"}, {"vocab_size", 40}, {"hidden_size", 24}, {"intermediate_size", 32},
                              {"num_hidden_layers", 2}, {"num_attention_heads", 3}, {"num_key_value_heads", 3},
                              {"kv_lora_rank", 16}, {"q_lora_rank", nullptr}, {"qk_nope_head_dim", 12}, {"qk_rope_head_dim", 8},
                              {"v_head_dim", 10}, {"n_routed_experts", nullptr}, {"max_position_embeddings", 32},
                              {"rms_norm_eps", 1e-5}, {"tie_word_embeddings", false}};
    return parse_model_config(j, "small-mla", "small-mla");
}

double max_abs_diff(std::span<const float> a, const VectorF& b) {
    double d = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(static_cast<double>(a[i]) - b[static_cast<Eigen::Index>(i)]));
    return d;
}

}  // namespace

TEST_CASE("MLA: the fast path equals the readable reference, naive and absorbed, cached and uncached") {
    const ModelConfig cfg = small_mla();
    REQUIRE(cfg.mla);
    const Weights w = random_weights(cfg, 7, 0.3f);  // sigma 0.3: logits of order 1, so differences show
    const std::vector<TokenId> seq{1, 5, 9, 2, 33, 17, 4};
    const auto T = static_cast<std::int64_t>(seq.size());
    ReferenceMlaModel ref_naive(cfg, w, T, MlaPath::naive), ref_abs(cfg, w, T, MlaPath::absorbed);
    for (const MlaPath path : {MlaPath::naive, MlaPath::absorbed}) {
        CAPTURE(static_cast<int>(path));
        Transformer tf(cfg, w, TransformerSize{T, T, true, false, 0, path});
        KvCache cache(cfg, T);
        // the prompt of 3 at once, then one token at a time
        tf.forward_cached(std::span(seq).first(3), 0, cache, nullptr);
        for (std::int64_t p = 0; p < T; ++p) {
            const std::span<const float> a = ref_naive.forward(seq[static_cast<std::size_t>(p)], p);
            const std::vector<float> want(a.begin(), a.end());
            // the two readable paths agree: the absorption is algebra, only the summation order differs
            CHECK(max_abs_diff(ref_abs.forward(seq[static_cast<std::size_t>(p)], p), VectorF::Map(want.data(), static_cast<Eigen::Index>(want.size()))) < 1e-4);
            if (p >= 3) {
                const VectorF cached = tf.forward_cached(std::span(seq).subspan(static_cast<std::size_t>(p), 1), p, cache, nullptr);
                CHECK(max_abs_diff(want, cached) < 1e-4);
            }
            const VectorF uncached = tf.forward_uncached(std::span(seq).first(static_cast<std::size_t>(p + 1)), nullptr);
            CHECK(max_abs_diff(want, uncached) < 1e-4);
        }
    }
}

TEST_CASE("MLA: counted costs equal the closed form; absorbed reads fewer bytes in decode, costs more FLOPs in prefill") {
    const ModelConfig cfg = small_mla();
    const Weights w = random_weights(cfg, 3);
    const std::vector<TokenId> seq{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    const auto T = static_cast<std::int64_t>(seq.size());
    StepCost prefill[2], decode[2];
    for (const MlaPath path : {MlaPath::naive, MlaPath::absorbed}) {
        const int k = path == MlaPath::absorbed;
        Transformer tf(cfg, w, TransformerSize{T, T, true, false, 0, path});
        KvCache cache(cfg, T);
        tf.forward_cached(std::span(seq).first(9), 0, cache, &prefill[k]);
        CHECK(prefill[k] == closed_form_step_cost(cfg, StepMode::cached, 0, 9, 0, path));
        tf.forward_cached(std::span(seq).subspan(9, 1), 9, cache, &decode[k]);
        CHECK(decode[k] == closed_form_step_cost(cfg, StepMode::cached, 9, 1, 0, path));
        StepCost un;
        tf.forward_uncached(seq, &un);
        CHECK(un == closed_form_step_cost(cfg, StepMode::uncached, 0, T, 0, path));
    }
    // decode at position 9 attends 10 latent rows. Naive decompresses them: per layer 2 x 10 x r 16 x H 3 x
    // (dn 12 + dv 10) = 21120 FLOPs, and writes 10 x 3 x 22 fp32 = 2640 B of keys and values; absorbed
    // folds the up-projection into the one query instead: 2 x 3 x 16 x 22 = 2112 FLOPs.
    CHECK(decode[0].at(Op::v_proj).flops == 2 * 21120);
    CHECK(decode[1].at(Op::v_proj).flops == 2 * 2112);
    CHECK(decode[0].at(Op::v_proj).bytes_act_written == 2 * 2640);
    CHECK(decode[1].total().bytes_total() < decode[0].total().bytes_total());
    // prefill of 9: 45 (query, key) pairs; absorbed's qk and av run r + R = 24 and r = 16 wide per pair
    // (2 x 3 x (24 + 16) x 45 = 10800 per layer), naive's dn + R = 20 and dv = 10 (2 x 3 x 30 x 45 = 8100)
    CHECK(prefill[1].at(Op::qk).flops + prefill[1].at(Op::av).flops == 2 * 10800);
    CHECK(prefill[0].at(Op::qk).flops + prefill[0].at(Op::av).flops == 2 * 8100);
}

TEST_CASE("simulate --cost-at: a decoded token's attention is the sum of the ops a run counts for it, MLA and GQA") {
    // the figures --cost-at prints (report/decode_cost.hpp) against a real decode step at position 9 (T = 10)
    const auto attention_of = [](const StepCost& step) {
        DecodeCost c;
        for (const Op op : {Op::attn_norm, Op::q_proj, Op::k_proj, Op::v_proj, Op::rope, Op::kv_store, Op::qk, Op::softmax, Op::av, Op::o_proj}) {
            c.flops += step.at(op).flops;
            c.kv_read += step.at(op).bytes_kv_read;
            c.bytes_read += step.at(op).bytes_kv_read + step.at(op).bytes_act_read;
        }
        return c;
    };
    const std::vector<TokenId> seq{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    DecodeCost mla[2];
    for (const ModelConfig& cfg : {small_mla(), test::tiny_config(Family::llama, 4, 2)}) {
        const Weights w = random_weights(cfg, 3);
        for (const MlaPath path : {MlaPath::naive, MlaPath::absorbed}) {
            CAPTURE(cfg.name);
            Transformer tf(cfg, w, TransformerSize{10, 10, true, false, 0, path});
            KvCache cache(cfg, 10);
            StepCost step;
            tf.forward_cached(std::span(seq).first(9), 0, cache, nullptr);
            tf.forward_cached(std::span(seq).subspan(9, 1), 9, cache, &step);
            const DecodeCost c = attention_decode_cost(DecodeCostLine{"", cfg, path, 0, kv_stored_token_bytes({}, cfg)}, 10);
            const DecodeCost counted = attention_of(step);
            CHECK(c.flops == counted.flops);
            CHECK(c.kv_read == counted.kv_read);
            CHECK(c.bytes_read == counted.bytes_read);
            if (cfg.mla) mla[path == MlaPath::absorbed] = c;
        }
    }
    // both paths read the 10 latent rows once from the cache: 10 x (r 16 + R 8) x 4 B x 2 layers = 1920 B.
    // The reads that differ, per layer (docs/cost-model.md, MLA): naive's qk reads q (3 heads x (12 + 8)) and
    // k_C, k_R (10 x (3 x 12 + 8)), 4 x 500 = 2000 B, its av the probabilities (3 x 10) and v_C (10 x 3 x 10),
    // 4 x 330 = 1320 B; absorbed's qk reads its folded q (3 x (16 + 8)), 288 B, its av the probabilities and
    // the latents' r part again (10 x 16), 4 x 190 = 760 B, and its fold q_C and the latent output
    // (3 x (12 + 16)), 336 B
    CHECK(mla[0].kv_read == 1920);
    CHECK(mla[1].kv_read == 1920);
    CHECK(mla[0].bytes_read - mla[1].bytes_read == 2 * ((2000 + 1320) - (288 + 760 + 336)));
}

TEST_CASE("MLA: one KV number per token in three places: the cache simulate runs, kvcalc, docs/kv-memory.md") {
    const ModelConfig cfg = load_checkpoint_config(models_dir / "tiny-mla");
    REQUIRE(cfg.mla);
    // docs/kv-memory.md: MLA caches per token per layer one row of kv_lora_rank + qk_rope_head_dim values and no
    // V: tiny-mla, 4 layers x (32 + 16) x 2 B (fp16) = 384 B per token
    const std::uint64_t by_hand = 4 * (32 + 16) * 2;
    CHECK(kv_bytes_per_token(cfg, DType::fp16).total() == by_hand);  // kvcalc
    KvCache cache(cfg, 8, KvStorage{DType::fp16});                      // the cache simulate runs
    CHECK(cache.bytes() == 8 * by_hand);
    CHECK(kv_stored_token_bytes(KvStorage{DType::fp16}, cfg) == by_hand);
    // and the bytes simulate counts its decode step writing to that cache: one latent row per layer
    const LoadedModel model = load_checkpoint(models_dir / "tiny-mla");
    Transformer tf(model.config, model.weights, TransformerSize{8, 8, false});
    const std::vector<TokenId> ids{1, 40, 41, 42};
    tf.forward_cached(std::span(ids).first(3), 0, cache, nullptr);
    StepCost step;
    tf.forward_cached(std::span(ids).subspan(3, 1), 3, cache, &step);
    CHECK(step.total().bytes_kv_written == by_hand);
}

TEST_CASE("MLA: tiny-mla reproduces its PyTorch reference in both paths, cached and uncached, fast and readable") {
    // models/reference.json's tiny-mla entry (scripts/train-tiny.py, from DeepSeek-V2's equations in PyTorch);
    // test_reference.cpp checks the default (absorbed) path's logits, greedy text and NLL; here every path
    std::ifstream in(models_dir / "reference.json");
    REQUIRE(in);
    const nlohmann::json ref = nlohmann::json::parse(in);
    REQUIRE(ref.at("models").contains("tiny-mla"));
    const nlohmann::json& m = ref.at("models").at("tiny-mla");
    const LoadedModel model = load_checkpoint(models_dir / m.at("checkpoint").get<std::string>());
    const ModelConfig& cfg = model.config;
    REQUIRE(cfg.mla);
    for (const auto& prompt : m.at("prompts")) {
        const std::vector<TokenId> seq = prompt.at("teacher_forced_ids").get<std::vector<TokenId>>();
        const auto n = static_cast<std::int64_t>(seq.size());
        for (const MlaPath path : {MlaPath::naive, MlaPath::absorbed}) {
            CAPTURE(static_cast<int>(path));
            Transformer tf(cfg, model.weights, TransformerSize{n, n, true, false, 0, path});
            KvCache cache(cfg, n);
            ReferenceMlaModel readable(cfg, model.weights, n, path);
            for (std::int64_t p = 0; p < n; ++p) {
                const VectorF cached = tf.forward_cached(std::span(seq).subspan(static_cast<std::size_t>(p), 1), p, cache, nullptr);
                const std::span<const float> slow = readable.forward(seq[static_cast<std::size_t>(p)], p);
                const std::string key = std::to_string(p);
                if (!prompt.at("logits").contains(key)) continue;
                CAPTURE(p);
                const auto want = prompt.at("logits").at(key).get<std::vector<float>>();
                double scale = 1.0;
                for (const float v : want) scale = std::max(scale, static_cast<double>(std::abs(v)));
                // the tolerance of test_reference.cpp: 1e-4 x max(1, max |logit|), fp32 summation-order noise
                CHECK(max_abs_diff(want, cached) <= 1e-4 * scale);
                CHECK(max_abs_diff(slow, VectorF::Map(want.data(), static_cast<Eigen::Index>(want.size()))) <= 1e-4 * scale);
                const VectorF uncached = tf.forward_uncached(std::span(seq).first(static_cast<std::size_t>(p + 1)), nullptr);
                CHECK(max_abs_diff(want, uncached) <= 1e-4 * scale);
            }
        }
    }
}
