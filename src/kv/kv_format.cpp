#include "kvlab/kv/kv_format.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include <Eigen/Core>

namespace kvlab {
namespace {

// A minifloat with `ebits` exponent and `mbits` mantissa bits and the given bias, encoded with round
// to nearest even and saturation to `max_code` (the largest finite code, sign excluded).
std::uint8_t minifloat_encode(float x, int mbits, int bias, std::uint8_t max_code, std::uint8_t nan_code) {
    const std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
    if (std::isnan(x)) return sign | nan_code;
    const float a = std::fabs(x);
    const int min_exp = 1 - bias;  // exponent of the smallest normal
    std::uint32_t code = 0;
    if (a < std::ldexp(1.0f, min_exp)) {
        // subnormal: a multiple of 2^(min_exp - mbits); rounding up to 2^mbits steps lands on the smallest normal's code
        code = static_cast<std::uint32_t>(std::nearbyint(std::ldexp(a, mbits - min_exp)));
    } else if (std::isinf(a)) {
        code = max_code;
    } else {
        int e = std::ilogb(a);  // a in [2^e, 2^(e+1))
        auto m = static_cast<std::uint32_t>(std::nearbyint(std::ldexp(a, mbits - e)));  // in [2^mbits, 2^(mbits+1)]
        if (m == 2u << mbits) {  // rounded up to the next power of two
            m = 1u << mbits;
            ++e;
        }
        const long long biased = static_cast<long long>(e) + bias;
        code = biased > (max_code >> mbits) ? max_code : static_cast<std::uint32_t>(biased << mbits) | (m - (1u << mbits));
    }
    return sign | static_cast<std::uint8_t>(std::min<std::uint32_t>(code, max_code));
}

float minifloat_decode(std::uint8_t code, int ebits, int mbits, int bias) {
    const float sign = (code & 0x80) ? -1.0f : 1.0f;
    const int e = (code >> mbits) & ((1 << ebits) - 1);
    const int m = code & ((1 << mbits) - 1);
    if (e == 0) return sign * std::ldexp(static_cast<float>(m), 1 - bias - mbits);
    return sign * std::ldexp(static_cast<float>((1 << mbits) + m), e - bias - mbits);
}

}  // namespace

namespace {

// every code decoded once: attention decodes each held value every step
std::array<float, 256> e4m3_table() {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c)
        t[static_cast<std::size_t>(c)] = (c & 0x7F) == 0x7F ? std::numeric_limits<float>::quiet_NaN() : minifloat_decode(static_cast<std::uint8_t>(c), 4, 3, 7);
    return t;
}

std::array<float, 256> e5m2_table() {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c)
        t[static_cast<std::size_t>(c)] = (c & 0x7C) != 0x7C ? minifloat_decode(static_cast<std::uint8_t>(c), 5, 2, 15)
                                         : (c & 0x03)      ? std::numeric_limits<float>::quiet_NaN()
                                         : (c & 0x80)      ? -std::numeric_limits<float>::infinity()
                                                           : std::numeric_limits<float>::infinity();
    return t;
}

const std::array<float, 256> e4m3_values = e4m3_table();
const std::array<float, 256> e5m2_values = e5m2_table();

}  // namespace

// e4m3fn: 0x7E = 1.75 x 2^8 = 448 is the largest finite code; 0x7F is NaN (no infinity)
std::uint8_t fp8_e4m3_encode(float x) { return minifloat_encode(x, 3, 7, 0x7E, 0x7F); }
float fp8_e4m3_decode(std::uint8_t code) { return e4m3_values[code]; }
const float* fp8_e4m3_values() { return e4m3_values.data(); }

// e5m2: 0x7B = 1.75 x 2^15 = 57344 is the largest finite code; 0x7C infinity, 0x7D..0x7F NaN
std::uint8_t fp8_e5m2_encode(float x) { return minifloat_encode(x, 2, 15, 0x7B, 0x7F); }
float fp8_e5m2_decode(std::uint8_t code) { return e5m2_values[code]; }
const float* fp8_e5m2_values() { return e5m2_values.data(); }

std::uint16_t fp16_encode(float x) { return Eigen::numext::bit_cast<std::uint16_t>(Eigen::half(x)); }
float fp16_decode(std::uint16_t code) { return static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(code)); }
std::uint16_t bf16_encode(float x) { return Eigen::numext::bit_cast<std::uint16_t>(Eigen::bfloat16(x)); }
float bf16_decode(std::uint16_t code) { return static_cast<float>(Eigen::numext::bit_cast<Eigen::bfloat16>(code)); }

std::int8_t int8_encode(float x_over_scale) {
    if (std::isnan(x_over_scale)) return 0;
    return static_cast<std::int8_t>(std::clamp(std::nearbyint(x_over_scale), -int8_max, int8_max));
}

// ggml-quants.c quantize_row_q8_0_ref: d = amax / 127, q = roundf(x / d) (half away from zero); the
// fp32 d quantizes, the fp16-rounded d dequantizes.
BlockQ8_0 quantize_q8_0(std::span<const float, 32> x) {
    float lane[8] = {};  // eight running maxima, so the loop vectorizes (max is exact in any order)
    for (int j = 0; j < kv_block_values; ++j) {
        const float a = std::fabs(x[static_cast<std::size_t>(j)]);
        lane[j % 8] = a > lane[j % 8] ? a : lane[j % 8];
    }
    float amax = 0.0f;
    for (const float m : lane) amax = std::max(amax, m);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ8_0 b{};
    b.d = fp16_encode(d);
    // roundf (half away from zero, as ggml's reference) as a conversion that vectorizes: add the largest
    // float below 0.5 with the value's sign, then truncate. Equal to roundf for every float in [-128, 128]
    // (checked exhaustively; |v| is 127 plus a few ulps at most here), tested in tests/test_kv_format.cpp.
    // It relies on v being rounded to float before the add (a tie then rounds to even, up to the next
    // integer): a fused multiply-add of x * id and the half would not be the same.
    for (int j = 0; j < kv_block_values; ++j) {
        const float v = x[static_cast<std::size_t>(j)] * id;
        b.qs[j] = static_cast<std::int8_t>(static_cast<int>(v + std::copysign(0.49999997f, v)));
    }
    return b;
}

void dequantize_q8_0(const BlockQ8_0& b, std::span<float, 32> out) {
    const float d = fp16_decode(b.d);
    for (int j = 0; j < kv_block_values; ++j) out[static_cast<std::size_t>(j)] = static_cast<float>(b.qs[j]) * d;
}

// ggml-quants.c quantize_row_q4_0_ref: the value of largest magnitude (the first such, sign kept) maps
// to -8; q = min(15, (int8)(x / d + 8.5)), i.e. x / d rounded half up, plus 8.
BlockQ4_0 quantize_q4_0(std::span<const float, 32> x) {
    float amax = 0.0f, max = 0.0f;
    for (const float v : x)
        if (amax < std::fabs(v)) {
            amax = std::fabs(v);
            max = v;
        }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ4_0 b{};
    b.d = fp16_encode(d);
    for (int j = 0; j < kv_block_values / 2; ++j) {
        const auto q0 = static_cast<std::uint8_t>(std::min<int>(15, static_cast<std::int8_t>(x[static_cast<std::size_t>(j)] * id + 8.5f)));
        const auto q1 = static_cast<std::uint8_t>(std::min<int>(15, static_cast<std::int8_t>(x[static_cast<std::size_t>(j + 16)] * id + 8.5f)));
        b.qs[j] = static_cast<std::uint8_t>(q0 | (q1 << 4));
    }
    return b;
}

void dequantize_q4_0(const BlockQ4_0& b, std::span<float, 32> out) {
    const float d = fp16_decode(b.d);
    for (int j = 0; j < kv_block_values / 2; ++j) {
        out[static_cast<std::size_t>(j)] = static_cast<float>((b.qs[j] & 0x0F) - 8) * d;
        out[static_cast<std::size_t>(j + 16)] = static_cast<float>((b.qs[j] >> 4) - 8) * d;
    }
}

}  // namespace kvlab
