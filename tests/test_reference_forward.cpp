// The readable forward pass (model/reference.cpp) is held to PyTorch, and every fast path is held to it:
// the threaded, chunked, batched transformer (prefill and decode, cached and uncached), the paged and
// contiguous serving pool with several sequences in one call, and narrow weights (bf16, fp16, q8_0) read
// by the kernels, compared with the reference run on the same weights widened to fp32.
//
// Tolerance: both sides compute in fp32 but sum in different orders (the fast path: SIMD lanes, blocked
// GEMMs, chunked attention; the reference: one running sum), a few ulps per op, amplified through the
// layers' norms and residuals. Measured: at most ~2e-6 relative to max(1, max |logit|) on these models.
// 1e-4 leaves ~50x margin; a wrong step (a flipped sign, a swapped projection, a missed RoPE rotation, a
// window off by one) moves logits by O(0.01-1) relative and fails.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <omp.h>

#include "kvlab/formats/checkpoint.hpp"
#include "kvlab/kv/kv_cache.hpp"
#include "kvlab/kv/kv_pool.hpp"
#include "kernels/narrow_weights.hpp"
#include "kvlab/weights/random_weights.hpp"
#include "kvlab/model/reference.hpp"
#include "kvlab/model/transformer.hpp"
#include "sim_configs.hpp"
#include "test_paths.hpp"

using namespace kvlab;
namespace fs = std::filesystem;

namespace {

double scale_of(std::span<const float> ref) {
    double m = 1.0;
    for (const float x : ref) m = std::max(m, static_cast<double>(std::abs(x)));
    return m;
}

// max |got - ref| / max(1, max |ref|)
template <typename Logits>
double relative_error(const Logits& got, std::span<const float> ref) {
    REQUIRE(static_cast<std::size_t>(got.size()) == ref.size());
    double d = 0.0;
    for (std::size_t i = 0; i < ref.size(); ++i)
        d = std::max(d, std::abs(static_cast<double>(got[static_cast<Eigen::Index>(i)]) - ref[i]));
    return d / scale_of(ref);
}

constexpr double kTolerance = 1e-4;

std::vector<TokenId> random_tokens(std::int64_t n, std::int64_t n_vocab, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<TokenId> pick(0, static_cast<TokenId>(n_vocab - 1));
    std::vector<TokenId> t(static_cast<std::size_t>(n));
    for (TokenId& x : t) x = pick(rng);
    return t;
}

// Every position's logits from the reference, token by token.
std::vector<std::vector<float>> reference_logits(const ModelConfig& cfg, const Weights& w, const std::vector<TokenId>& tokens) {
    ReferenceModel ref(cfg, w, static_cast<std::int64_t>(tokens.size()));
    std::vector<std::vector<float>> out;
    for (std::size_t p = 0; p < tokens.size(); ++p) {
        const auto logits = ref.forward(tokens[p], static_cast<std::int64_t>(p));
        out.emplace_back(logits.begin(), logits.end());
    }
    return out;
}

// The fast path on `tokens`: a prefill of n_prompt tokens in one call, then one token per call, each
// call's logits against the reference's at the same position; and the uncached mode at every position.
// Returns the worst relative error.
double fast_vs_reference(const ModelConfig& cfg, const Weights& w, const std::vector<TokenId>& tokens, std::int64_t n_prompt,
                         const NarrowWeights* narrow = nullptr, const Weights* reference_weights = nullptr) {
    const auto n = static_cast<std::int64_t>(tokens.size());
    const auto want = reference_logits(cfg, reference_weights ? *reference_weights : w, tokens);
    const bool uncached = narrow == nullptr && cfg.sink_tokens == 0;  // narrow weights and sinks: cached mode only
    Transformer tf(cfg, w, TransformerSize{n, uncached ? n : n_prompt, uncached, narrow != nullptr}, narrow);
    KvCache cache(cfg, n);
    double worst = 0.0;
    const std::span<const TokenId> all(tokens);
    worst = std::max(worst, relative_error(tf.forward_cached(all.first(static_cast<std::size_t>(n_prompt)), 0, cache, nullptr),
                                           want[static_cast<std::size_t>(n_prompt - 1)]));
    for (std::int64_t p = n_prompt; p < n; ++p)
        worst = std::max(worst, relative_error(tf.forward_cached(all.subspan(static_cast<std::size_t>(p), 1), p, cache, nullptr),
                                               want[static_cast<std::size_t>(p)]));
    if (uncached)
        for (std::int64_t p = 0; p < n; p += 7)
            worst = std::max(worst, relative_error(tf.forward_uncached(all.first(static_cast<std::size_t>(p + 1)), nullptr),
                                                   want[static_cast<std::size_t>(p)]));
    return worst;
}

// Runs f with 1 thread, then with 3 (uneven splits of heads and rows whatever the core count).
template <typename F>
void with_thread_counts(F f) {
    const int before = omp_get_max_threads();
    for (const int threads : {1, 3}) {
        CAPTURE(threads);
        omp_set_num_threads(threads);
        f();
    }
    omp_set_num_threads(before);
}

ModelConfig random_shape(Family family, std::int64_t H, std::int64_t Hkv, std::int64_t D) {
    ModelConfig c = test::tiny_config(family, H, Hkv, 3);
    c.d_head = D;
    c.d_model = 64;
    c.d_ff = 96;
    c.n_vocab = 80;
    c.n_ctx_max = 256;
    return c;
}

}  // namespace

TEST_CASE("The reference forward reproduces PyTorch's logits and greedy tokens on the trained models") {
    std::ifstream in(fs::path(test::models_dir) / "reference.json");
    REQUIRE(in);
    const nlohmann::json ref = nlohmann::json::parse(in);
    for (const auto& item : ref.at("models").items()) {
        const std::string name = item.key();
        CAPTURE(name);
        const LoadedModel model = load_checkpoint(fs::path(test::models_dir) / item.value().at("checkpoint").get<std::string>());
        if (model.config.mla) continue;  // MLA's readable forward is model/reference_mla.hpp: test_mla.cpp checks it on these entries
        for (const auto& prompt : item.value().at("prompts")) {
            const auto seq = prompt.at("teacher_forced_ids").get<std::vector<TokenId>>();
            const auto got = reference_logits(model.config, model.weights, seq);
            for (const auto& [key, want] : prompt.at("logits").items()) {
                const auto p = static_cast<std::size_t>(std::stoi(key));
                const auto w = want.get<std::vector<float>>();
                CHECK(relative_error(Eigen::Map<const VectorF>(got[p].data(), static_cast<Eigen::Index>(got[p].size())), w) <= kTolerance);
            }
            // the greedy continuation PyTorch chose, token by token through the reference's cache
            std::vector<TokenId> ids = prompt.at("ids").get<std::vector<TokenId>>();
            const auto want_greedy = prompt.at("greedy_ids").get<std::vector<TokenId>>();
            ReferenceModel rm(model.config, model.weights, static_cast<std::int64_t>(ids.size() + want_greedy.size()));
            std::span<const float> logits;
            for (std::size_t p = 0; p < ids.size(); ++p) logits = rm.forward(ids[p], static_cast<std::int64_t>(p));
            std::vector<TokenId> greedy;
            for (std::size_t i = 0; i < want_greedy.size(); ++i) {
                greedy.push_back(static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
                if (i + 1 < want_greedy.size()) logits = rm.forward(greedy.back(), static_cast<std::int64_t>(ids.size() + i));
            }
            CHECK(greedy == want_greedy);
        }
    }
}

TEST_CASE("The fast forward pass matches the reference on the trained models, 1 and 3 threads") {
    for (const char* name : {"tiny-llama/model.bin", "tiny-gpt2"}) {
        CAPTURE(name);
        const LoadedModel model = load_checkpoint(fs::path(test::models_dir) / name);
        const auto tokens = random_tokens(96, model.config.n_vocab, 7);
        with_thread_counts([&] { CHECK(fast_vs_reference(model.config, model.weights, tokens, 17) <= kTolerance); });
    }
}

TEST_CASE("The fast forward pass matches the reference on random shapes: MHA, GQA, MQA, RoPE pairings, windows, sinks") {
    struct Case {
        Family family;
        std::int64_t H, Hkv, D;
        RopePairing pairing;
        std::int64_t window, sinks;
    };
    // D = 16 gives attention chunks of 128 rows (kernels/attention.cpp), so 200 positions cross a chunk
    for (const Case& c : {Case{Family::llama, 4, 4, 16, RopePairing::neighbours, 0, 0},
                          Case{Family::llama, 8, 2, 8, RopePairing::halves, 0, 0},
                          Case{Family::llama, 4, 1, 16, RopePairing::neighbours, 0, 0},
                          Case{Family::gpt2, 4, 4, 16, RopePairing::neighbours, 0, 0},
                          Case{Family::llama, 6, 3, 16, RopePairing::halves, 40, 0},
                          Case{Family::llama, 4, 2, 16, RopePairing::neighbours, 48, 4},
                          Case{Family::gpt2, 4, 4, 16, RopePairing::neighbours, 33, 0}}) {
        ModelConfig cfg = random_shape(c.family, c.H, c.Hkv, c.D);
        if (c.window > 0) apply_window_policy(cfg, c.window, c.sinks);
        CAPTURE(cfg.name);
        CAPTURE(c.window);
        CAPTURE(c.sinks);
        Weights w = random_weights(cfg, 3, 0.08f);
        w.rope_pairing = c.pairing;
        const auto tokens = random_tokens(200, cfg.n_vocab, 11);
        with_thread_counts([&] { CHECK(fast_vs_reference(cfg, w, tokens, 23) <= kTolerance); });
    }
}

TEST_CASE("--sink-positions cache: the fast path matches the reference, and the sinks move only once keys are evicted") {
    for (const RopePairing pairing : {RopePairing::neighbours, RopePairing::halves}) {
        for (const std::int64_t n_prompt : {23, 5}) {  // a prefill that wraps the 16-row ring, and one that does not
            ModelConfig cfg = random_shape(Family::llama, 4, 2, 16);
            apply_window_policy(cfg, 16, 4);
            cfg.sink_cache_positions = true;
            CAPTURE(n_prompt);
            CAPTURE(static_cast<int>(pairing));
            Weights w = random_weights(cfg, 3, 0.08f);
            w.rope_pairing = pairing;
            const auto tokens = random_tokens(60, cfg.n_vocab, 11);
            with_thread_counts([&] { CHECK(fast_vs_reference(cfg, w, tokens, n_prompt) <= kTolerance); });
        }
    }
    // against the sinks at their text positions: the same logits while nothing is evicted (positions 0..15 of
    // a 16-row window), other logits after (position 16 evicts position 4: every sink moves one closer)
    ModelConfig text = random_shape(Family::llama, 4, 2, 16);
    apply_window_policy(text, 16, 4);
    ModelConfig cache = text;
    cache.sink_cache_positions = true;
    const Weights w = random_weights(text, 3, 0.08f);
    const auto tokens = random_tokens(20, text.n_vocab, 11);
    const auto a = reference_logits(text, w, tokens), b = reference_logits(cache, w, tokens);
    CHECK(a[15] == b[15]);
    CHECK(a[16] != b[16]);
}

TEST_CASE("Narrow weights read by the kernels match the reference on the same weights widened to fp32") {
    const ModelConfig cfg = random_shape(Family::llama, 4, 2, 16);  // every width a multiple of 32, for q8_0
    const Weights w = random_weights(cfg, 5, 0.08f);
    const auto tokens = random_tokens(60, cfg.n_vocab, 13);
    for (const DType dtype : {DType::bf16, DType::fp16, DType::q8_0}) {
        CAPTURE(dtype_name(dtype));
        const NarrowWeights nw = narrow_weights(w, dtype);
        // the reference's weights: each narrow matrix decoded back to fp32, the classifier untied (the
        // embedding lookup stays fp32 in the fast path; its classifier reads the narrow copy)
        Weights widened = w;
        auto widen = [](WeightMatrix& m, const NarrowMatrix& n) {
            MatrixRM out(n.rows(), n.cols());
            for (std::int64_t r = 0; r < n.rows(); ++r) n.decode(r, 0, n.cols(), out.row(r).data());
            m = out;
        };
        for (std::size_t l = 0; l < w.layers.size(); ++l) {
            LayerWeights& lw = widened.layers[l];
            const NarrowLayer& nl = nw.layers[l];
            widen(lw.wq, nl.wq), widen(lw.wk, nl.wk), widen(lw.wv, nl.wv), widen(lw.wo, nl.wo);
            widen(lw.w1, nl.w1), widen(lw.w3, nl.w3), widen(lw.w2, nl.w2);
        }
        widen(widened.lm_head, nw.classifier);
        CHECK(widened.layers[0].wq.map() != w.layers[0].wq.map());  // the rounding happened
        with_thread_counts([&] { CHECK(fast_vs_reference(cfg, w, tokens, 9, &nw, &widened) <= kTolerance); });
    }
}

TEST_CASE("The serving step over a paged or contiguous pool matches the reference for every sequence") {
    for (const std::int64_t window : {std::int64_t{0}, std::int64_t{12}}) {
        for (const KvLayout layout : {KvLayout::paged, KvLayout::contiguous}) {
            ModelConfig cfg = random_shape(Family::llama, 4, 2, 16);
            if (window > 0) apply_window_policy(cfg, window, 3);
            CAPTURE(window);
            CAPTURE(layout == KvLayout::paged);
            const Weights w = random_weights(cfg, 9, 0.08f);
            // three sequences: prompts of 10, 7 and 5 tokens, then decode to 30 positions each
            constexpr std::int64_t kLen = 30;
            std::vector<std::vector<TokenId>> seqs;
            std::vector<std::vector<std::vector<float>>> want;
            for (std::uint32_t s = 0; s < 3; ++s) {
                seqs.push_back(random_tokens(kLen, cfg.n_vocab, 100 + s));
                want.push_back(reference_logits(cfg, w, seqs.back()));
            }
            const std::vector<std::int64_t> prompt{10, 7, 5};
            const std::int64_t rows = kv_seq_rows(cfg, kLen);
            KvAllocator alloc(KvPoolOptions{layout, 3 * ((rows + 3) / 4 * 4) + 8, 4, false});
            KvPool pool(cfg, alloc.options().n_rows);
            Transformer tf(cfg, w, TransformerSize{kLen, 24, false, false, 3});
            std::vector<std::int64_t> done(3, 0);
            // each step: sequence 0's prompt in chunks of 6, the others whole, then one token each
            while (done[0] < kLen) {
                std::vector<TokenId> tokens;
                std::vector<SeqStep> steps;
                std::vector<std::size_t> who;
                for (std::size_t s = 0; s < 3; ++s) {
                    const std::int64_t n = done[s] < prompt[s] ? std::min<std::int64_t>(s == 0 ? 6 : prompt[s], prompt[s] - done[s]) : 1;
                    if (done[s] >= kLen) continue;
                    REQUIRE(alloc.reserve(static_cast<SeqId>(s), layout == KvLayout::paged ? std::min(rows, done[s] + n) : rows));
                    tokens.insert(tokens.end(), seqs[s].begin() + done[s], seqs[s].begin() + done[s] + n);
                    steps.push_back(SeqStep{n, done[s], alloc.rows(static_cast<SeqId>(s)), true});
                    who.push_back(s);
                    done[s] += n;
                }
                const MatrixRM& logits = tf.forward_batch(tokens, steps, pool, nullptr);
                for (std::size_t i = 0; i < who.size(); ++i) {
                    CAPTURE(who[i]);
                    CAPTURE(done[who[i]]);
                    CHECK(relative_error(logits.row(static_cast<Eigen::Index>(i)),
                                         want[who[i]][static_cast<std::size_t>(done[who[i]] - 1)]) <= kTolerance);
                }
            }
        }
    }
}

TEST_CASE("The reference forward refuses what it cannot run, naming the value") {
    const ModelConfig cfg = random_shape(Family::gpt2, 4, 4, 16);
    const Weights w = random_weights(cfg, 1, 0.08f);
    CHECK_THROWS_AS(ReferenceModel(cfg, w, cfg.n_ctx_max + 1), UsageError);  // past GPT-2's learned positions
    ReferenceModel rm(cfg, w, 8);
    CHECK_THROWS_AS(rm.forward(0, 8), UsageError);
    CHECK_THROWS_AS(rm.forward(static_cast<TokenId>(cfg.n_vocab), 0), UsageError);
    ModelConfig odd = random_shape(Family::llama, 4, 4, 16);
    odd.d_head = 15;
    CHECK_THROWS_AS(ReferenceModel(odd, random_weights(random_shape(Family::llama, 4, 4, 16), 1), 8), ConfigError);
}
