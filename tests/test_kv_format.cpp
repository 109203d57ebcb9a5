// The KV storage formats against hand-computed codes (docs/kv-precision.md derives each).
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <numeric>
#include <utility>
#include <vector>

#include "kvlab/kv/kv_format.hpp"

using namespace kvlab;

TEST_CASE("fp8 e4m3: round to nearest even, subnormals, saturation at 448, signed zero, NaN") {
    CHECK(fp8_e4m3_encode(448.0f) == 0x7E);   // 1.75 x 2^8: exponent 15, mantissa 110
    CHECK(fp8_e4m3_encode(464.0f) == 0x7E);   // halfway between 448 and 480 (not finite): ties to the even mantissa 110
    CHECK(fp8_e4m3_encode(465.0f) == 0x7E);   // past it: saturates (PyTorch's scalar cast would give NaN)
    CHECK(fp8_e4m3_encode(1e6f) == 0x7E);
    CHECK(fp8_e4m3_encode(INFINITY) == 0x7E);
    CHECK(fp8_e4m3_encode(-300.0f) == 0xF9);  // 300 / 256 x 8 = 9.375 -> 9: 1.125 x 2^8 = 288, exponent 8 + 7 = 15
    CHECK(fp8_e4m3_decode(0xF9) == -288.0f);
    CHECK(fp8_e4m3_encode(1.0625f) == 0x38);  // 8.5 steps of 1/8 -> 8 (even): 1.0
    CHECK(fp8_e4m3_encode(1.1875f) == 0x3A);  // 9.5 -> 10 (even): 1.25
    CHECK(fp8_e4m3_decode(0x3A) == 1.25f);
    CHECK(fp8_e4m3_encode(0.015625f) == 0x08);      // 2^-6, the smallest normal
    CHECK(fp8_e4m3_encode(0.001f) == 0x01);         // 0.001 x 2^9 = 0.512 -> 1: the smallest subnormal 2^-9
    CHECK(fp8_e4m3_encode(std::ldexp(1.0f, -10)) == 0x00);  // half of 2^-9: ties to 0
    CHECK(fp8_e4m3_encode(std::ldexp(3.0f, -10)) == 0x02);  // 1.5 steps: ties to 2
    CHECK(fp8_e4m3_decode(0x07) == std::ldexp(7.0f, -9));   // largest subnormal
    CHECK(fp8_e4m3_encode(-0.0f) == 0x80);
    CHECK(std::signbit(fp8_e4m3_decode(0x80)));
    CHECK(fp8_e4m3_encode(NAN) == 0x7F);
    CHECK(std::isnan(fp8_e4m3_decode(0x7F)));
    CHECK(std::isnan(fp8_e4m3_decode(0xFF)));
    // every finite code survives a round trip (253 distinct finite values: 254 codes, +0 and -0)
    for (int c = 0; c < 256; ++c) {
        if ((c & 0x7F) == 0x7F) continue;
        CAPTURE(c);
        CHECK(fp8_e4m3_encode(fp8_e4m3_decode(static_cast<std::uint8_t>(c))) == c);
    }
}

TEST_CASE("fp8 e5m2: the upper byte of an fp16, max 57344, infinity kept apart from saturation") {
    CHECK(fp8_e5m2_encode(57344.0f) == 0x7B);  // 1.75 x 2^15
    CHECK(fp8_e5m2_encode(61440.0f) == 0x7B);  // halfway to 65536: ties to even would round up past the max: saturates
    CHECK(fp8_e5m2_encode(1e9f) == 0x7B);
    CHECK(fp8_e5m2_encode(1.0f) == 0x3C);      // fp16 1.0 is 0x3C00
    CHECK(fp8_e5m2_encode(3.0f) == 0x42);      // fp16 3.0 is 0x4200
    CHECK(fp8_e5m2_encode(std::ldexp(1.0f, -16)) == 0x01);  // smallest subnormal
    CHECK(fp8_e5m2_encode(std::ldexp(1.0f, -14)) == 0x04);  // smallest normal
    CHECK(std::isinf(fp8_e5m2_decode(0x7C)));
    CHECK(fp8_e5m2_decode(0xFC) < 0.0f);
    CHECK(std::isnan(fp8_e5m2_decode(0x7D)));
    for (int c = 0; c < 256; ++c) {
        if ((c & 0x7C) == 0x7C) continue;
        CAPTURE(c);
        CHECK(fp8_e5m2_encode(fp8_e5m2_decode(static_cast<std::uint8_t>(c))) == c);
        CHECK(fp8_e5m2_decode(static_cast<std::uint8_t>(c)) == fp16_decode(static_cast<std::uint16_t>(c << 8)));
    }
}

TEST_CASE("fp16 and bf16 round to nearest even; int8 rounds to even and clamps to +-127") {
    CHECK(fp16_encode(1.0f / 3.0f) == 0x3555);
    CHECK(fp16_encode(65504.0f) == 0x7BFF);
    CHECK(bf16_encode(1.0f / 3.0f) == 0x3EAB);  // fp32 0x3EAAAAAB: the dropped 0xAAAB is over half, so 0x3EAA + 1
    CHECK(bf16_decode(0x3F80) == 1.0f);
    CHECK(int8_encode(1.5f) == 2);
    CHECK(int8_encode(2.5f) == 2);
    CHECK(int8_encode(-2.5f) == -2);
    CHECK(int8_encode(127.4f) == 127);
    CHECK(int8_encode(-200.0f) == -127);
}

TEST_CASE("q8_0: d = amax / 127 stored as fp16, values rounded half away from zero") {
    std::array<float, 32> x{};
    for (int j = 0; j < 32; ++j) x[static_cast<std::size_t>(j)] = static_cast<float>(j - 16);  // -16 .. 15
    const BlockQ8_0 b = quantize_q8_0(x);
    // d = 16 / 127 = 0.125984..., as fp16 1.0078125 x 2^-3 = 0.1259765625 (exponent 12, mantissa 8): 0x3008
    CHECK(b.d == 0x3008);
    CHECK(b.qs[0] == -127);   // -16 x 127 / 16
    CHECK(b.qs[16] == 0);
    CHECK(b.qs[17] == 8);     // 1 x 7.9375 = 7.9375 -> 8
    CHECK(b.qs[31] == 119);   // 15 x 7.9375 = 119.06 -> 119
    std::array<float, 32> y{};
    dequantize_q8_0(b, y);
    CHECK(y[0] == -127.0f * 0.1259765625f);  // the fp16 d dequantizes: -15.9990234375
    CHECK(y[17] == 8.0f * 0.1259765625f);
}

TEST_CASE("q8_0 rounds halves away from zero and just-below-halves toward it, as roundf") {
    // amax = 127 makes d = 1 and x / d = x exactly, so each code is the rounding of x itself
    std::array<float, 32> x{};
    x[0] = 127.0f;
    const float below_half = std::nextafter(0.5f, 0.0f), below_1_5 = std::nextafter(1.5f, 0.0f);
    const std::pair<float, int> cases[] = {{0.5f, 1},  {-0.5f, -1},   {2.5f, 3},   {-2.5f, -3},     {below_half, 0}, {-below_half, 0},
                                           {126.5f, 127}, {-126.5f, -127}, {below_1_5, 1}, {-below_1_5, -1}, {1.5f, 2}, {-0.0f, 0},
                                           {std::nextafter(126.5f, 0.0f), 126}};
    for (std::size_t i = 0; i < std::size(cases); ++i) x[i + 1] = cases[i].first;
    const BlockQ8_0 b = quantize_q8_0(x);
    CHECK(b.d == fp16_encode(1.0f));
    CHECK(b.qs[0] == 127);
    for (std::size_t i = 0; i < std::size(cases); ++i) {
        CAPTURE(cases[i].first);
        CHECK(b.qs[i + 1] == cases[i].second);
    }
}

TEST_CASE("q8_0 codes equal libm's roundf across the range a code can take") {
    // d = 1 again (x[0] = 127), and 31 values per block from a stride through the bit patterns of the
    // floats in [0, 127], both signs: every code must be (int) roundf(x), the C library's own rounding
    std::uint32_t top = 0;
    const float limit = 127.0f;
    std::memcpy(&top, &limit, 4);
    std::array<float, 32> x{};
    x[0] = 127.0f;
    std::size_t k = 1;
    std::int64_t checked = 0, wrong = 0;
    auto flush = [&] {
        const BlockQ8_0 b = quantize_q8_0(x);
        for (std::size_t j = 1; j < k; ++j, ++checked) wrong += b.qs[j] != static_cast<std::int8_t>(std::roundf(x[j]));
        k = 1;
    };
    for (std::uint32_t u = 0; u <= top; u += 997) {  // ~1.07 M patterns
        float v = 0.0f;
        std::memcpy(&v, &u, 4);
        x[k++] = (u / 997) % 2 ? -v : v;
        if (k == 32) flush();
    }
    flush();
    CHECK(checked > 1000000);
    CHECK(wrong == 0);
}

TEST_CASE("q4_0: the largest-magnitude value maps to -8, nibbles pair j with j + 16, an opposite-sign peak clamps to 7/8") {
    std::array<float, 32> x{};
    for (int j = 0; j < 32; ++j) x[static_cast<std::size_t>(j)] = static_cast<float>(j - 16);
    const BlockQ4_0 b = quantize_q4_0(x);
    // max = -16 (x[0]); d = -16 / -8 = 2; q = min(15, (int8)(x / 2 + 8.5)): -16 -> 0, 0 -> 8, 15 -> 16 -> 15, 1 -> 9, 2 -> 9
    CHECK(b.d == fp16_encode(2.0f));
    CHECK(b.qs[0] == (0 | (8 << 4)));      // x[0] = -16 low, x[16] = 0 high
    CHECK(b.qs[15] == (8 | (15 << 4)));    // x[15] = -1 -> -0.5 + 8.5 = 8 low; x[31] = 15 -> 16 -> 15 high
    std::array<float, 32> y{};
    dequantize_q4_0(b, y);
    CHECK(y[0] == -16.0f);
    CHECK(y[31] == 14.0f);  // 15 -> code 15 -> (15 - 8) x 2
    CHECK(y[17] == 2.0f);   // 1 -> 9.0 -> 9
    CHECK(y[18] == 2.0f);   // 2 -> 9.5 -> 9 (truncation after + 8.5)
    // one peak of -1 and a +1: d = 0.125, +1 -> 16.5 -> 15 -> 0.875
    std::array<float, 32> z{};
    z[0] = -1.0f;
    z[1] = 1.0f;
    std::array<float, 32> w{};
    dequantize_q4_0(quantize_q4_0(z), w);
    CHECK(w[0] == -1.0f);
    CHECK(w[1] == 0.875f);
}

// The many-value decoders (SIMD where the CPU has F16C) return what the one-value decoders above,
// checked against hand-computed codes, return: every code, bit for bit, NaNs as NaNs, the sign of
// zero kept; 259 values so the 3 past the last 8 take the scalar tail.
TEST_CASE("The many-value fp16, bf16 and fp8 decoders equal the one-value decoders for every code") {
    const auto same = [](float a, float b) { return std::isnan(a) ? std::isnan(b) : a == b && std::signbit(a) == std::signbit(b); };
    std::array<std::uint8_t, 259> bytes{};
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::uint8_t>((i * 7) % 256);  // 7 is prime to 256: every code
    std::array<float, 259> out{};
    const float scale = 0.37f;
    fp8_e4m3_decode_n(bytes.data(), out.data(), 259, scale);
    for (std::size_t i = 0; i < bytes.size(); ++i) {
        CAPTURE(int(bytes[i]));
        CHECK(same(out[i], fp8_e4m3_decode(bytes[i]) * scale));
    }
    // the decoder for caches that never stored a NaN: the same for every other code
    fp8_e4m3_decode_n_finite(bytes.data(), out.data(), 259, scale);
    for (std::size_t i = 0; i < bytes.size(); ++i) {
        CAPTURE(int(bytes[i]));
        if ((bytes[i] & 0x7F) != 0x7F) CHECK(same(out[i], fp8_e4m3_decode(bytes[i]) * scale));
    }
    fp8_e5m2_decode_n(bytes.data(), out.data(), 259, scale);
    for (std::size_t i = 0; i < bytes.size(); ++i) {
        CAPTURE(int(bytes[i]));
        CHECK(same(out[i], fp8_e5m2_decode(bytes[i]) * scale));
    }
    std::vector<std::uint16_t> halves(65536 + 3);
    std::iota(halves.begin(), halves.end(), std::uint16_t{0});
    std::vector<float> wide(halves.size());
    fp16_decode_n(halves.data(), wide.data(), static_cast<std::int64_t>(halves.size()));
    int mismatches = 0;
    for (std::size_t i = 0; i < halves.size(); ++i) mismatches += same(wide[i], fp16_decode(halves[i])) ? 0 : 1;
    CHECK(mismatches == 0);
    CHECK(wide[0x3C00] == 1.0f);  // fp16 1.0
    bf16_decode_n(halves.data(), wide.data(), static_cast<std::int64_t>(halves.size()));
    mismatches = 0;
    for (std::size_t i = 0; i < halves.size(); ++i) mismatches += same(wide[i], bf16_decode(halves[i])) ? 0 : 1;
    CHECK(mismatches == 0);
    CHECK(wide[0x3F80] == 1.0f);  // bf16 1.0
}

// The block decoders attention and the narrow weights use (SIMD where the CPU has it) return what
// dequantize_q8_0 / dequantize_q4_0 return, an infinite block scale included.
TEST_CASE("The q8_0 and q4_0 block decoders equal the reference dequantizers") {
    const auto same = [](float a, float b) { return std::isnan(a) ? std::isnan(b) : a == b; };
    std::array<float, 32> x{};
    for (int j = 0; j < 32; ++j) x[static_cast<std::size_t>(j)] = 0.37f * static_cast<float>(j - 13);
    for (const std::uint16_t d : {std::uint16_t{0}, std::uint16_t{0x3C00}, std::uint16_t{0x7C00}, std::uint16_t{0xFC00}}) {  // d = 0, 1, +inf, -inf
        CAPTURE(d);
        BlockQ8_0 q8 = quantize_q8_0(x);
        BlockQ4_0 q4 = quantize_q4_0(x);
        if (d != 0) q8.d = q4.d = d;
        std::array<float, 32> ref{}, got{};
        std::array<std::uint8_t, sizeof(BlockQ8_0)> b8{};
        std::memcpy(b8.data(), &q8, sizeof q8);
        dequantize_q8_0(q8, ref);
        q8_0_decode_block(b8.data(), got.data());
        for (std::size_t j = 0; j < 32; ++j) CHECK(same(got[j], ref[j]));
        std::array<std::uint8_t, sizeof(BlockQ4_0)> b4{};
        std::memcpy(b4.data(), &q4, sizeof q4);
        dequantize_q4_0(q4, ref);
        q4_0_decode_block(b4.data(), got.data());
        for (std::size_t j = 0; j < 32; ++j) CHECK(same(got[j], ref[j]));
    }
}
