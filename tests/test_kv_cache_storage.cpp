// The cache stored narrow: its bytes are kvcalc's bytes for the dtype, the counted KV traffic is at the
// stored width, and the decoded rows move the logits by about the format's rounding.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include <omp.h>

#include "kvlab/calc/kv_memory.hpp"
#include "kvlab/model/cost.hpp"
#include "kvlab/kv/kv_cache.hpp"
#include "kvlab/model/ops.hpp"
#include "kvlab/weights/random_weights.hpp"
#include "kvlab/model/transformer.hpp"
#include "sim_configs.hpp"

using namespace kvlab;
using kvlab::test::tiny_config;

namespace {

// Logits after a prefill of 5 tokens and 10 decode steps, through a cache stored as `storage`.
std::vector<VectorF> run(const ModelConfig& cfg, const Weights& w, const KvStorage& storage, StepCost* last_step = nullptr) {
    Transformer t(cfg, w, 16);
    KvCache cache(cfg, 16, storage);
    std::vector<TokenId> prompt{1, 7, 3, 9, 4};
    std::vector<VectorF> out{t.forward_cached(prompt, 0, cache, nullptr)};
    for (std::int64_t pos = 5; pos < 15; ++pos) {
        const TokenId next = static_cast<TokenId>((pos * 7) % cfg.n_vocab);  // fixed tokens: every storage sees the same inputs
        const std::array<TokenId, 1> one{next};
        out.push_back(t.forward_cached(one, pos, cache, pos == 14 ? last_step : nullptr));
    }
    return out;
}

float max_diff(const std::vector<VectorF>& a, const std::vector<VectorF>& b) {
    float worst = 0.0f;
    for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, (a[i] - b[i]).cwiseAbs().maxCoeff());
    return worst;
}

}  // namespace

TEST_CASE("A narrow cache holds kvcalc's bytes for its dtype, plus its scales") {
    const auto cfg = tiny_config(Family::llama, 4, 4, 2, 6);  // 2 layers, 4 KV heads x 8 = 32 values per row, window 6
    for (const DType d : {DType::fp32, DType::fp16, DType::bf16, DType::fp8_e4m3, DType::fp8_e5m2, DType::int8, DType::q8_0, DType::q4_0}) {
        CAPTURE(dtype_name(d));
        const KvCache tensor(cfg, 40, {d, KvScale::tensor});
        const std::uint64_t kvcalc = kv_bytes_sequence(cfg, d, 40, WindowMode::cap).total();
        const bool scaled = d == DType::fp8_e4m3 || d == DType::fp8_e5m2 || d == DType::int8;
        // per-tensor: one fp32 scale for K and one for V per layer (2 layers x 2 x 4 B = 16 B)
        CHECK(tensor.bytes() == kvcalc + (scaled ? 16 : 0));
        // per token per KV head: 4 heads x 4 B per stored row; each layer holds min(6, 40) = 6 rows, K and V
        const KvCache token_head(cfg, 40, {d, KvScale::token_head});
        CHECK(token_head.bytes() == kvcalc + (scaled ? 2 * 2 * 6 * 4 * 4 : 0));
    }
    CHECK_THROWS_AS(KvCache(cfg, 8, {DType::int4, KvScale::tensor}), UsageError);
    CHECK_THROWS_AS(KvCache(tiny_config(Family::llama, 4, 2), 8, {DType::q8_0, KvScale::tensor}), UsageError);  // 16 values a row
}

TEST_CASE("Counted KV traffic is at the stored width and equals the closed form with the stored row") {
    const auto cfg = tiny_config(Family::llama, 4, 4);
    const Weights w = random_weights(cfg, 3, 0.2f);
    for (const DType d : {DType::fp16, DType::fp8_e4m3, DType::q8_0, DType::q4_0}) {
        CAPTURE(dtype_name(d));
        const KvStorage storage{d, KvScale::tensor};
        StepCost step;
        run(cfg, w, storage, &step);
        const std::uint64_t row = kv_stored_row_bytes(storage, cfg.n_head_kv, cfg.d_head);
        // q8_0: 32 values = one 34 B block; q4_0: 18 B; fp8: 32 B; fp16: 64 B
        CHECK(row == row_bytes(d, 32));
        // the step at position 14 writes one K and one V row per layer and reads 15 rows of K and of V per layer
        const auto total = step.total();
        CHECK(total.bytes_kv_written == 2 * 2 * row);
        CHECK(total.bytes_kv_read == 2 * 2 * 15 * row);
        CHECK(step == closed_form_step_cost(cfg, StepMode::cached, 14, 1, row));
        // per token, K and V over the layers: kvcalc's bytes per token for the dtype
        CHECK(total.bytes_kv_written == kv_bytes_per_token(cfg, d).total());
    }
}

TEST_CASE("Narrow caches move the logits by about their rounding; q4_0 most, fp16 least") {
    const auto cfg = tiny_config(Family::llama, 4, 4);
    const Weights w = random_weights(cfg, 11, 0.2f);
    const auto ref = run(cfg, w, {});
    const float fp16 = max_diff(ref, run(cfg, w, {DType::fp16, KvScale::tensor}));
    const float bf16 = max_diff(ref, run(cfg, w, {DType::bf16, KvScale::tensor}));
    const float e4m3 = max_diff(ref, run(cfg, w, {DType::fp8_e4m3, KvScale::token_head}));
    const float q4 = max_diff(ref, run(cfg, w, {DType::q4_0, KvScale::tensor}));
    MESSAGE("max |delta logit| vs fp32: fp16 ", fp16, ", bf16 ", bf16, ", fp8 e4m3 ", e4m3, ", q4_0 ", q4);
    // each format's worst relative rounding: fp16 2^-11, bf16 2^-8 (8x fp16's), e4m3 2^-4, q4_0 up to 1/8 of a block's peak
    CHECK(fp16 > 0.0f);  // the values really were rounded
    CHECK(bf16 > 2.0f * fp16);
    CHECK(e4m3 > 2.0f * bf16);
    CHECK(q4 > bf16);
    CHECK(std::isfinite(q4));
}

TEST_CASE("Per-token-head scales keep a quiet head that a per-tensor scale set by an outlier head crushes") {
    // two KV heads of 8: the first row written (the calibration) has an outlier of 1000 in head 0
    KvRowStore tensor({DType::fp8_e4m3, KvScale::tensor}, 2, 2, 8), token({DType::fp8_e4m3, KvScale::token_head}, 2, 2, 8);
    MatrixRM first = MatrixRM::Zero(1, 16);
    first(0, 0) = 1000.0f;
    tensor.calibrate(first, 1);  // scale 1000 / 448 = 2.23
    token.calibrate(first, 1);
    std::vector<float> row(16, 0.0f), back(16);
    for (int i = 0; i < 8; ++i) row[static_cast<std::size_t>(8 + i)] = 0.01f + 0.001f * static_cast<float>(i);  // the quiet head
    auto worst_relative = [&](KvRowStore& s) {
        s.write(1, row.data());
        s.read(1, back.data());
        float worst = 0.0f;
        for (int i = 8; i < 16; ++i) worst = std::max(worst, std::fabs(back[static_cast<std::size_t>(i)] - row[static_cast<std::size_t>(i)]) / row[static_cast<std::size_t>(i)]);
        return worst;
    };
    // per tensor: values land among fp8's subnormals (step 2^-9 = 0.00195): 0.011 / 2.2321 = 0.004928 = 2.52 steps
    // -> 3 steps = 0.005859 x 2.2321 = 0.013079, 18.9 % too large
    CHECK(worst_relative(tensor) == doctest::Approx(0.189).epsilon(0.01));
    // per token and head: scale 0.017 / 448, every value a normal: at most half a step of 2^-3 relative (6.25 %)
    CHECK(worst_relative(token) <= 0.0625f);
}

TEST_CASE("A window of 6 with 2 sinks attends positions 0, 1 and the newest 4, as plain-loop attention over exactly those") {
    // 2 query heads sharing 1 KV head of 4 values; K, V and q of each position from a formula
    const AttentionShape shape{2, 1, 4};
    const std::int64_t W = 6, S = 2, T = 15;
    MatrixRM kc = MatrixRM::Zero(W, 4), vc = MatrixRM::Zero(W, 4);
    const KvView kv{.k = &kc, .v = &vc, .n_rows = W, .n_sink = S};
    MatrixRM scores = MatrixRM::Zero(omp_get_max_threads(), 16), gemm;
    const OpScratch scratch{&gemm, &scores};
    OpRecorder rec(nullptr);
    auto value = [](std::int64_t pos, int i, float salt) { return std::sin(0.7f * static_cast<float>(pos) + static_cast<float>(i) + salt); };
    MatrixRM all_k(T, 4), all_v(T, 4);
    for (std::int64_t pos = 0; pos < T; ++pos) {
        MatrixRM k_new(1, 4), v_new(1, 4), q(1, 8), out(1, 8);
        for (int i = 0; i < 4; ++i) {
            all_k(pos, i) = k_new(0, i) = value(pos, i, 0.1f);
            all_v(pos, i) = v_new(0, i) = value(pos, i, 2.0f);
        }
        for (int i = 0; i < 8; ++i) q(0, i) = value(pos, i, 5.0f);
        attention(out, q, k_new, v_new, 1, pos, kv, shape, W, scratch, rec);
        // the positions a sink-and-window cache keeps: 0 and 1, and pos-3 .. pos (each once, in any order)
        std::vector<std::int64_t> kept;
        for (std::int64_t p = 0; p <= pos; ++p)
            if (p < S || p > pos - (W - S)) kept.push_back(p);
        CHECK(static_cast<std::int64_t>(kept.size()) == std::min<std::int64_t>(W, pos + 1));
        MatrixRM k_sel(static_cast<Eigen::Index>(kept.size()), 4), v_sel(static_cast<Eigen::Index>(kept.size()), 4);
        for (std::size_t j = 0; j < kept.size(); ++j) {
            k_sel.row(static_cast<Eigen::Index>(j)) = all_k.row(kept[j]);
            v_sel.row(static_cast<Eigen::Index>(j)) = all_v.row(kept[j]);
        }
        MatrixRM expect(1, 8);
        std::vector<float> s(kept.size());
        attention_decode_ref(shape, q.row(0).data(), k_sel.data(), v_sel.data(), static_cast<std::int64_t>(kept.size()), expect.data(), s.data());
        CAPTURE(pos);
        CHECK((out - expect).cwiseAbs().maxCoeff() < 1e-5f);
    }
    // the ring: positions 2.. cycle through rows 2..5, the sinks never move
    CHECK(kv_ring_row(0, W, S) == 0);
    CHECK(kv_ring_row(5, W, S) == 5);
    CHECK(kv_ring_row(6, W, S) == 2);   // 2 + (6 - 2) % 4
    CHECK(kv_ring_row(14, W, S) == 2);  // 2 + 12 % 4
    CHECK(kv_ring_row(13, W, S) == 5);
}

TEST_CASE("Every stored format returns each value within its rounding bound") {
    // one row of 2 KV heads x 32 values in [-3, 3], calibrated on itself (per tensor: scale = amax / format max)
    std::vector<float> x(64), back(64);
    for (int i = 0; i < 64; ++i) x[static_cast<std::size_t>(i)] = 3.0f * std::sin(1.3f * static_cast<float>(i) + 0.2f);
    float amax = 0.0f;
    for (const float v : x) amax = std::max(amax, std::fabs(v));
    MatrixRM row(1, 64);
    for (int i = 0; i < 64; ++i) row(0, i) = x[static_cast<std::size_t>(i)];
    struct Case { DType dtype; float relative, absolute; };
    const Case cases[] = {
        {DType::fp16, std::ldexp(1.0f, -11), 0.0f},                     // half a step of 10 mantissa bits
        {DType::bf16, std::ldexp(1.0f, -8), 0.0f},                      // of 7 bits
        {DType::fp8_e4m3, std::ldexp(1.0f, -4), std::ldexp(amax / 448.0f, -10)},  // 3 bits; subnormal step 2^-9 x scale
        {DType::fp8_e5m2, std::ldexp(1.0f, -3), std::ldexp(amax / 57344.0f, -17)},
        {DType::int8, 0.0f, amax / 127.0f / 2.0f},                      // half of scale = amax / 127
        {DType::q8_0, 0.0f, amax / 127.0f / 2.0f + amax * std::ldexp(1.0f, -11)},  // + d rounded to fp16
        {DType::q4_0, 0.0f, amax / 8.0f},                               // d = amax / 8; an opposite-sign peak clamps a full step
    };
    for (const Case& c : cases) {
        CAPTURE(dtype_name(c.dtype));
        KvRowStore store({c.dtype, KvScale::tensor}, 1, 2, 32);
        store.calibrate(row, 1);
        store.write(0, x.data());
        store.read(0, back.data());
        for (int i = 0; i < 64; ++i) {
            const float v = x[static_cast<std::size_t>(i)], err = std::fabs(back[static_cast<std::size_t>(i)] - v);
            CAPTURE(i);
            CHECK(err <= c.relative * std::fabs(v) + c.absolute + 1e-7f);
        }
    }
}

TEST_CASE("An fp8 e4m3 cache that stored a NaN reads it back as NaN; its other values are unchanged") {
    // the fast e4m3 reader assumes no NaN code; a store that wrote one must take the exact reader
    KvRowStore store({DType::fp8_e4m3, KvScale::tensor}, 2, 1, 32);
    std::vector<float> row(32), back(32);
    for (int i = 0; i < 32; ++i) row[static_cast<std::size_t>(i)] = 0.25f * static_cast<float>(i - 16);  // -4 .. 3.75: exact in e4m3
    store.write(0, row.data());
    store.read(0, back.data());
    CHECK(back == row);
    row[5] = NAN;
    store.write(1, row.data());
    store.read(1, back.data());
    CHECK(std::isnan(back[5]));
    CHECK(back[6] == row[6]);
    store.read(0, back.data());  // the first row again, through the exact reader
    CHECK(back[5] == 0.25f * (5 - 16));
}
