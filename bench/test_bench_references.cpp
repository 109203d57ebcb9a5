// The benchmark's ceilings are only as good as their read kernels: every read pattern must sum every
// float exactly once, and the decode replay must read what a decode step reads. Plain loops and hand
// arithmetic are the references here.
#include <doctest/doctest.h>

#include <numeric>
#include <vector>

#include "../tests/sim_configs.hpp"
#include "bench_references.hpp"
#include "decode_replay.hpp"
#include "kvlab/weights/random_weights.hpp"

using namespace kvlab;
using namespace kvlab::bench;

TEST_CASE("every read pattern sums each float once, tails and unaligned starts included") {
    // small integers: every partial sum is an integer below 2^24, so float sums are exact in any order
    std::vector<float> buf(20000);
    for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i % 7 + 1);
    for (const std::int64_t offset : {0, 3})
        for (const std::int64_t n : {0, 1, 63, 64, 1000, 4096 + 17, 12345, 19990}) {
            const float* x = buf.data() + offset;
            const double expected = std::accumulate(x, x + n, 0.0);  // the plain loop
            for (std::size_t p = 0; p < kNumPatterns; ++p) {
                CAPTURE(offset);
                CAPTURE(n);
                CAPTURE(pattern_name(kReadPatterns[p]));
                CHECK(sum_pattern(p, x, n) == expected);
            }
        }
    CHECK_THROWS_AS(sum_pattern(kNumPatterns, buf.data(), 1), Error);
}

TEST_CASE("the decode replay reads a decode step's weights and KV rows, on evenly spaced steps") {
    // tiny llama: d_model 24, 2 heads x 8 (d_q 16), 1 KV head (d_kv 8), d_ff 40, vocab 50, 2 layers.
    // Floats a step reads in its matrices: per layer wq 16*24 = 384, wk 8*24 = 192, wv 192, wo 24*16 = 384,
    // w1 and w3 40*24 = 960 each, w2 24*40 = 960: 4032; two layers 8064; the classifier 50*24 = 1200;
    // 9264 in all. Cached K and V at position pos: 2 layers * 2 * (pos + 1) keys * 8 floats.
    const ModelConfig cfg = test::tiny_config(Family::llama, 2, 1);
    const Weights w = random_weights(cfg, 7);
    SUBCASE("32 steps from position 4: 16 sampled, positions 4, 6, ..., 34") {
        DecodeReplay replay(cfg, w, 4, 32);
        CHECK(replay.sample_steps() == 16);
        // keys 5, 7, ..., 35: mean 20; KV 2 * 2 * 20 * 8 = 640 floats; (9264 + 640) * 4 B = 39616
        CHECK(replay.bytes_per_step() == 39616);
        CHECK(replay.waits_per_step() == 11);  // 5 a layer and one after the classifier
        CHECK(replay.steps_per_s() > 0);
        CHECK(replay.waits_steps_per_s() > 0);
        std::size_t won = 0;
        for (std::size_t p = 0; p < kNumPatterns; ++p) won += replay.wins(p);
        CHECK(won == 1);
        CHECK(replay.samples.size() == 1);
    }
    SUBCASE("fewer steps than a sample holds: all of them") {
        DecodeReplay replay(cfg, w, 4, 5);
        CHECK(replay.sample_steps() == 5);
        // positions 4..8, keys 5..9: mean 7; KV 2 * 2 * 7 * 8 = 224 floats; (9264 + 224) * 4 B = 37952
        CHECK(replay.bytes_per_step() == 37952);
    }
    CHECK_THROWS_AS(DecodeReplay(cfg, w, 0, 0), Error);
}
