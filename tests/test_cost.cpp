#include <doctest/doctest.h>

#include <vector>

#include "kvlab/model/cost.hpp"
#include "kvlab/kv/kv_cache.hpp"
#include "kvlab/weights/random_weights.hpp"
#include "kvlab/model/transformer.hpp"
#include "sim_configs.hpp"
#include "test_support.hpp"

using namespace kvlab;
using kvlab::test::tiny_config;

namespace {

std::uint64_t matmul_and_attention_matmuls(const StepCost& s) {
    return s.flops(OpCategory::matmul) + s.at(Op::qk).flops + s.at(Op::av).flops;
}

std::vector<TokenId> tokens_for(std::int64_t n, std::int64_t n_vocab) {
    std::vector<TokenId> t;
    for (std::int64_t i = 0; i < n; ++i) t.push_back(static_cast<TokenId>((7 * i + 3) % n_vocab));
    return t;
}

void check_equal_per_op(const StepCost& counted, const StepCost& closed) {
    for (int i = 0; i < n_ops; ++i) {
        INFO("op ", op_name(static_cast<Op>(i)));
        CHECK(counted.ops[static_cast<std::size_t>(i)] == closed.ops[static_cast<std::size_t>(i)]);
    }
}

}  // namespace

TEST_CASE("stories15M's cached step at T=1 costs 30,382,848 matmul and attention FLOPs") {
    const auto cfg = load_preset("stories15m");
    // W = 2d^2 + 2 d d_kv + 3 d f = 2*288^2 + 2*288*288 + 3*288*768 = 995,328 per layer
    // 2 (L W + d V) = 2 (6*995,328 + 288*32,000) = 30,375,936; attention 4 L H D T = 4*6*6*48*1 = 6,912
    const auto step = closed_form_step_cost(cfg, StepMode::cached, 0, 1);
    CHECK(step.flops(OpCategory::matmul) == 30375936);
    CHECK(matmul_and_attention_matmuls(step) == 30382848);
}

TEST_CASE("stories15M's cached step at T=256 costs 32,145,408 and the uncached step 3,303,456,768 FLOPs") {
    const auto cfg = load_preset("stories15m");
    // cached: 30,375,936 + 4*6*6*48*256 = 30,375,936 + 1,769,472 = 32,145,408
    CHECK(matmul_and_attention_matmuls(closed_form_step_cost(cfg, StepMode::cached, 255, 1)) == 32145408);
    // uncached: 2 L W T + 2 d V = 2*5,971,968*256 + 2*288*32,000 = 3,076,079,616;
    // causal attention 2 L H D T (T+1) = 2*6*6*48*256*257 = 227,377,152
    const auto uncached = closed_form_step_cost(cfg, StepMode::uncached, 0, 256);
    CHECK(matmul_and_attention_matmuls(uncached) == 3303456768ull);
    // KV traffic of the cached step: read 2 L T d_kv 4 B, write 2 L d_kv 4 B
    const auto cached = closed_form_step_cost(cfg, StepMode::cached, 255, 1).total();
    CHECK(cached.bytes_kv_read == 2ull * 6 * 256 * 288 * 4);  // = 3,538,944
    CHECK(cached.bytes_kv_written == 2ull * 6 * 288 * 4);     // = 13,824
    CHECK(uncached.total().bytes_kv_read == 0);
}

TEST_CASE("Keys attended sum the causal triangle, capped by the window") {
    CHECK(sum_keys_attended(0, 4, 0) == 10);  // 1+2+3+4
    CHECK(sum_keys_attended(0, 4, 2) == 7);   // 1+2+2+2
    CHECK(sum_keys_attended(5, 1, 3) == 3);   // the window
    CHECK(sum_keys_attended(1, 3, 3) == 8);   // 2+3+3
    CHECK(sum_keys_attended(2, 1, 0) == 3);   // position 2 sees 3 keys
    CHECK(sum_keys_attended(0, 256, 0) == 256 * 257 / 2);
}

TEST_CASE("Counted costs equal the closed form for every family, attention layout, phase and mode") {
    struct Case { const char* what; ModelConfig cfg; };
    const std::vector<Case> cases = {
        {"llama MHA", tiny_config(Family::llama, 3, 3)},
        {"llama GQA", tiny_config(Family::llama, 4, 2)},
        {"llama MQA", tiny_config(Family::llama, 4, 1, 3)},
        {"gpt2 MHA", tiny_config(Family::gpt2, 3, 3)},
        {"llama sliding window 4", tiny_config(Family::llama, 4, 2, 2, 4)},
        {"gpt2 sliding window 3", tiny_config(Family::gpt2, 3, 3, 1, 3)},
        {"llama with q/k/v biases", [] { auto c = tiny_config(Family::llama, 4, 2); c.attention_bias = true; return c; }()},
    };
    for (const auto& c : cases) {
        INFO(c.what);
        const Weights w = random_weights(c.cfg, 1);
        const std::int64_t n_prompt = 5, n_total = 12;
        Transformer model(c.cfg, w, n_total);
        KvCache cache(c.cfg, n_total);
        const auto tokens = tokens_for(n_total, c.cfg.n_vocab);
        // prefill
        StepCost counted;
        model.forward_cached(std::span(tokens).first(n_prompt), 0, cache, &counted);
        check_equal_per_op(counted, closed_form_step_cost(c.cfg, StepMode::cached, 0, n_prompt));
        // decode steps
        for (std::int64_t pos = n_prompt; pos < n_total; ++pos) {
            StepCost step;
            model.forward_cached(std::span(tokens).subspan(pos, 1), pos, cache, &step);
            check_equal_per_op(step, closed_form_step_cost(c.cfg, StepMode::cached, pos, 1));
        }
        // uncached at several lengths
        for (const std::int64_t T : {1, 2, 5, 12}) {
            StepCost step;
            model.forward_uncached(std::span(tokens).first(T), &step);
            check_equal_per_op(step, closed_form_step_cost(c.cfg, StepMode::uncached, 0, T));
        }
    }
}

TEST_CASE("A prefill in one batch and token by token count the same FLOPs") {
    const auto cfg = tiny_config(Family::llama, 4, 2, 2, 3);
    StepCost batched = closed_form_step_cost(cfg, StepMode::cached, 0, 6);
    StepCost one_by_one;
    for (std::int64_t pos = 0; pos < 6; ++pos) {
        const auto s = closed_form_step_cost(cfg, StepMode::cached, pos, 1);
        for (int i = 0; i < n_ops; ++i) {
            // lm_head and final norm run once per call: only the batch's last position needs logits
            const Op op = static_cast<Op>(i);
            if (op != Op::lm_head && op != Op::final_norm) one_by_one.add(op, s.at(op));
        }
    }
    CHECK(batched.at(Op::qk).flops == one_by_one.at(Op::qk).flops);
    CHECK(batched.flops(OpCategory::attention) == one_by_one.flops(OpCategory::attention));
    CHECK(batched.at(Op::q_proj).flops == one_by_one.at(Op::q_proj).flops);
    // weights are read once per call, not once per token
    CHECK(one_by_one.at(Op::q_proj).bytes_weights_read == 6 * batched.at(Op::q_proj).bytes_weights_read);
}

TEST_CASE("The uncached step at T=1 equals the cached step, counted and in closed form") {
    for (const auto& cfg : {tiny_config(Family::llama, 4, 2), tiny_config(Family::gpt2, 3, 3), load_preset("stories15m")}) {
        INFO(cfg.name);
        const auto cached = closed_form_step_cost(cfg, StepMode::cached, 0, 1);
        const auto uncached = closed_form_step_cost(cfg, StepMode::uncached, 0, 1);
        for (int i = 0; i < n_ops; ++i) {
            const auto& a = cached.ops[static_cast<std::size_t>(i)];
            const auto& b = uncached.ops[static_cast<std::size_t>(i)];
            INFO("op ", op_name(static_cast<Op>(i)));
            CHECK(a.flops == b.flops);
            CHECK(a.transcendentals == b.transcendentals);
            CHECK(a.bytes_weights_read == b.bytes_weights_read);
            CHECK(a.bytes_read() == b.bytes_read());
            CHECK(a.bytes_written() == b.bytes_written());
        }
        // the only difference: K and V live in the cache instead of activations
        CHECK(cached.total().bytes_kv_written == 2ull * static_cast<std::uint64_t>(cfg.n_layer * cfg.d_kv()) * 4);
        CHECK(uncached.total().bytes_kv_written == 0);
    }
    // and the forward pass counts the same
    const auto cfg = tiny_config(Family::llama, 4, 1);
    const Weights w = random_weights(cfg, 3);
    Transformer model(cfg, w, 4);
    KvCache cache(cfg, 4);
    const std::vector<TokenId> token = {7};
    StepCost cached, uncached;
    model.forward_cached(token, 0, cache, &cached);
    model.forward_uncached(token, &uncached);
    CHECK(cached.total().flops == uncached.total().flops);
    CHECK(cached.total().bytes_total() == uncached.total().bytes_total());
}

TEST_CASE("Uncached per-step FLOPs grow linearly in T and their total quadratically") {
    const auto cfg = load_preset("stories15m");
    const auto at = [&](std::int64_t T) { return closed_form_step_cost(cfg, StepMode::uncached, 0, T).flops(OpCategory::matmul); };
    // matmul FLOPs are affine in T: f(T) = a T + b (b = lm_head for the last position only)
    CHECK(at(3) - at(2) == at(2) - at(1));
    CHECK(at(200) - at(100) == 100 * (at(2) - at(1)));
    // the cached step's matmul work does not depend on T
    CHECK(closed_form_step_cost(cfg, StepMode::cached, 0, 1).flops(OpCategory::matmul) ==
          closed_form_step_cost(cfg, StepMode::cached, 200, 1).flops(OpCategory::matmul));
}

TEST_CASE("A matmul counts 2 m n k FLOPs and reads its weights once per call") {
    const auto c = cost_matmul(3, 5, 7, false);
    CHECK(c.flops == 2 * 3 * 5 * 7);
    CHECK(c.bytes_weights_read == 5 * 7 * 4);
    CHECK(c.bytes_act_read == 3 * 5 * 4);
    CHECK(c.bytes_act_written == 3 * 7 * 4);
    const auto b = cost_matmul(3, 5, 7, true);
    CHECK(b.flops == 2 * 3 * 5 * 7 + 3 * 7);       // + one add per output value
    CHECK(b.bytes_weights_read == (5 * 7 + 7) * 4);  // + the bias vector
}
