// The samplers and the stop-string matcher. The llama2c rule is checked against llama2.c's run.c itself:
// token ids it printed for the trained tiny-llama, written here with the command that produced them.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "kvlab/core/error.hpp"
#include "kvlab/formats/checkpoint.hpp"
#include "kvlab/sim/sampler.hpp"
#include "kvlab/sim/simulator.hpp"
#include "kvlab/sim/stop.hpp"
#include "test_paths.hpp"

using namespace kvlab;
namespace fs = std::filesystem;

TEST_CASE("llama2.c's generator: xorshift64* values of run.c's random_u32 and random_f32") {
    // run.c's random_u32 / random_f32 compiled as they are (gcc -O2) from state 42 print 1456360119,
    // 3359763283, 3393612768 and 0.339085221, 0.782255828, 0.790136993 (= (u32 >> 8) / 2^24)
    XorShiftRng rng(42);
    CHECK(rng.next_u32() == 1456360119u);
    CHECK(rng.next_u32() == 3359763283u);
    CHECK(rng.next_u32() == 3393612768u);
    XorShiftRng f(42);
    CHECK(f.next_f32() == static_cast<float>(1456360119u >> 8) / 16777216.0f);  // 0.339085221
    CHECK(f.next_f32() == doctest::Approx(0.782255828));
}

TEST_CASE("the llama2c rule refuses what run.c cannot do: top-k, and seed 0 when sampling") {
    CHECK_THROWS_WITH_AS(Sampler({0.8, 40, 0.9, 42, SamplerRule::llama2c}, 10), doctest::Contains("--top-k"), UsageError);
    CHECK_THROWS_WITH_AS(Sampler({0.8, 0, 0.9, 0, SamplerRule::llama2c}, 10), doctest::Contains("--seed: 0"), UsageError);
    CHECK_NOTHROW(Sampler({0.0, 0, 1.0, 0, SamplerRule::llama2c}, 10));  // greedy draws no coin
}

TEST_CASE("the llama2c rule picks run.c's tokens for the same logits and coin") {
    // probabilities 0.5, 0.3, 0.2 (logits log p, T = 1); coin 0.339085221 (seed 42's first)
    VectorF logits(3);
    logits << std::log(0.5f), std::log(0.3f), std::log(0.2f);
    // multinomial over ids in order: cdf 0.5 > 0.339 -> id 0
    CHECK(Sampler({1.0, 0, 1.0, 42, SamplerRule::llama2c}, 3).sample(logits) == 0);
    // p = 0.2, 0.3, 0.5 for ids 0, 1, 2. Top-p 0.6: sorted 0.5 (id 2), 0.3 (id 1); the running sum first exceeds
    // 0.6 at 0.8, so the nucleus is {2, 1} and r = 0.339 x 0.8 = 0.271 < 0.5 -> id 2
    VectorF rev(3);
    rev << std::log(0.2f), std::log(0.3f), std::log(0.5f);
    CHECK(Sampler({1.0, 0, 0.6, 42, SamplerRule::llama2c}, 3).sample(rev) == 2);   // the most likely first
    CHECK(Sampler({1.0, 0, 1.0, 42, SamplerRule::llama2c}, 3).sample(rev) == 1);   // id order: cdf 0.2, 0.5 > 0.339 -> id 1
}

namespace {

// run.c's sampled ids after the prompt, as kvlab simulate --sampler llama2c produces them.
std::vector<TokenId> sampled(double t, double p, std::uint64_t seed, std::int64_t steps, bool stop_at_eos = false) {
    static const LoadedModel model = load_checkpoint(fs::path(test::models_dir) / "tiny-llama" / "model.bin");
    SimulateOptions o;
    o.mode = SimMode::cached;
    o.prompt_ids = {1, 453, 456, 261, 455};  // "Once upon a time" with BOS, as run.c encodes it (models/reference.json)
    o.n_steps = steps;
    o.sampler = {t, 0, p, seed, SamplerRule::llama2c};
    if (stop_at_eos) o.end_tokens = {1, 2};
    return run_simulation(model.config, model.weights, o).generated;
}

}  // namespace

// Produced with llama2.c at commit 350e04fe35433e6d2941dce5a1f53308f87058eb (karpathy/llama2.c), run.c built
// with `gcc -O3 -fopenmp run.c -lm` and one line added to print each sampled id (fprintf(stderr, "%d,", next)
// where generate() prints a piece after the prompt), then
//   ./run models/tiny-llama/model.bin -z models/tokenizer.bin -t T -p P -s SEED -i "Once upon a time" -n 40
// -n 40 positions = the 5 prompt tokens + 36 sampled - 1 (run.c never feeds the last one back): kvlab's -n 36.
// The unmodified run.c prints the same text ("-t 0.8 -p 0.9 -s 42": "...there was a kind girl named Zoe...").
TEST_CASE("--sampler llama2c writes run.c's tokens: top-p, multinomial (top-p 1) and temperature-only runs") {
    struct Case {
        double t, p;
        std::uint64_t seed;
        std::vector<TokenId> ids;
    };
    const std::vector<Case> cases = {
        {0.8, 0.9, 42, {477, 405, 310, 261, 461, 481, 441, 284, 442, 472, 354, 461, 507, 375, 473, 345, 351, 290,
                        261, 380, 417, 446, 265, 268, 469, 282, 473, 461, 507, 375, 352, 313, 272, 472, 445, 277}},
        {1.0, 1.0, 7, {477, 405, 310, 261, 287, 475, 302, 276, 471, 439, 474, 354, 359, 469, 463, 473, 346, 351,
                       290, 261, 380, 417, 446, 265, 342, 463, 479, 468, 473, 359, 469, 463, 352, 288, 344, 320}},
        {0.5, 0.95, 123, {477, 290, 261, 380, 461, 485, 469, 374, 435, 477, 405, 351, 261, 465, 297, 334, 439, 474,
                          354, 288, 344, 473, 346, 351, 381, 325, 398, 267, 437, 290, 261, 408, 417, 473, 346, 348}},
        {1.2, 0.8, 2024, {477, 290, 261, 380, 461, 485, 469, 374, 435, 477, 405, 351, 261, 406, 474, 439, 474, 354,
                          337, 463, 367, 473, 346, 351, 290, 261, 380, 417, 446, 265, 284, 274, 467, 318, 473, 346}},
        {0.9, 1.0, 99, {477, 405, 310, 261, 287, 475, 302, 276, 471, 277, 339, 481, 354, 359, 469, 463, 473, 345,
                        351, 272, 474, 261, 461, 511, 475, 469, 291, 303, 466, 263, 473, 359, 469, 463, 352, 313}},
    };
    for (const Case& c : cases) {
        CAPTURE(c.t);
        CAPTURE(c.p);
        CAPTURE(c.seed);
        CHECK(sampled(c.t, c.p, c.seed, 36) == c.ids);
    }
}

// run.c stops when it samples BOS (id 1; `if (next == 1) break;`): with -t 0.8 -p 0.9 -s 1 -n 256 it printed 228
// sampled ids, the last four 391, 285, 312, 473 (" ...storms do not last forever."), then sampled BOS.
TEST_CASE("--sampler llama2c stops where run.c does: the story ends with BOS after 228 sampled tokens") {
    const std::vector<TokenId> ids = sampled(0.8, 0.9, 1, 252, true);  // run.c's -n 256 = 252 kvlab steps
    REQUIRE(ids.size() == 229);
    CHECK(ids.back() == 1);
    CHECK(std::vector<TokenId>(ids.end() - 5, ids.end() - 1) == std::vector<TokenId>{391, 285, 312, 473});
}

TEST_CASE("StopMatcher: a stop string spanning tokens is caught, the text before it printed, the stop string not") {
    StopMatcher m({"The end"});
    // "the" could not start "The end": printed at once; "The" could: held
    auto s = m.push("Then the");
    CHECK(s.text == "Then the");
    CHECK_FALSE(s.stopped);
    s = m.push(" cat. The");
    CHECK(s.text == " cat. ");  // "The" held back
    s = m.push(" e");
    CHECK(s.text.empty());  // "The e" held
    s = m.push("nd!");
    CHECK(s.stopped);
    CHECK(s.text.empty());
    CHECK(m.matched() == "The end");
    CHECK(m.push("more").stopped);  // stays stopped
    CHECK(m.finish().empty());
}

TEST_CASE("StopMatcher: held text that turns out plain is printed; the earliest of several stop strings wins") {
    StopMatcher m({"STOP", "xyz"});
    CHECK(m.push("ST").text.empty());
    CHECK(m.push("ay").text == "STay");
    CHECK(m.push("ab ST").text == "ab ");
    CHECK(m.finish() == "ST");  // the end of the generation: nothing more can complete it
    StopMatcher two({"b c", "a b"});
    const auto s = two.push("x a b c");
    CHECK(s.stopped);
    CHECK(s.text == "x ");  // "a b" starts first
    CHECK(two.matched() == "a b");
    CHECK_THROWS_WITH_AS(StopMatcher({""}), doctest::Contains("--stop"), UsageError);
}
