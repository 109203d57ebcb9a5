// The narrow number formats a KV cache can store, one value (or one block of 32) at a time: encode
// from fp32 and decode back. The rules, with their sources, are in docs/kv-precision.md:
//   fp16, bf16      IEEE half / bfloat16, round to nearest even (Eigen::half, Eigen::bfloat16)
//   fp8 e4m3 (fn)   1-4-3, bias 7, max 448, no infinity, NaN = S.1111.111 (OCP FP8, arXiv 2209.05433)
//   fp8 e5m2        1-5-2, bias 15, max 57344, infinity S.11111.00 (the upper byte of an fp16)
//   int8            symmetric: round(x / scale) to nearest even, clamped to [-127, 127]
//   q8_0, q4_0      llama.cpp's blocks of 32 values with one fp16 scale (ggml-quants.c, the _ref paths)
// fp8 and int8 encoders saturate: a value past the largest finite one becomes that value, as vLLM's and
// TensorRT-LLM's kernels do (__NV_SATFINITE), never NaN or infinity. Scaling is the caller's: the cache
// stores encode(x / scale) and reads decode(b) x scale.
#pragma once
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#if defined(__F16C__) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define KVLAB_F16C 1  // F16C, AVX2 and FMA: every x86 CPU with AVX2 since 2013 has all three
#endif

namespace kvlab {

inline constexpr float fp8_e4m3_max = 448.0f;
inline constexpr float fp8_e5m2_max = 57344.0f;
inline constexpr float int8_max = 127.0f;

std::uint8_t fp8_e4m3_encode(float x);
float fp8_e4m3_decode(std::uint8_t code);
std::uint8_t fp8_e5m2_encode(float x);
float fp8_e5m2_decode(std::uint8_t code);
// The value of every code (256 floats): what fp8_*_decode returns, for loops that decode many.
const float* fp8_e4m3_values();
const float* fp8_e5m2_values();
std::uint16_t fp16_encode(float x);
float fp16_decode(std::uint16_t code);
std::uint16_t bf16_encode(float x);
float bf16_decode(std::uint16_t code);
std::int8_t int8_encode(float x_over_scale);
inline float int8_decode(std::int8_t code) { return static_cast<float>(code); }


// llama.cpp's blocks (ggml-common.h): 32 values and their fp16 scale d.
inline constexpr int kv_block_values = 32;
struct BlockQ8_0 {
    std::uint16_t d;          // fp16: max |x| / 127
    std::int8_t qs[32];       // round(x / d), half away from zero (roundf)
};
struct BlockQ4_0 {
    std::uint16_t d;          // fp16: the signed value of largest magnitude / -8
    std::uint8_t qs[16];      // value j in the low nibble of qs[j], value j + 16 in the high nibble; code = q + 8
};
static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_0) == 18, "llama.cpp's block sizes");

// x has 32 values.
BlockQ8_0 quantize_q8_0(std::span<const float, 32> x);
void dequantize_q8_0(const BlockQ8_0& block, std::span<float, 32> out);
BlockQ4_0 quantize_q4_0(std::span<const float, 32> x);
void dequantize_q4_0(const BlockQ4_0& block, std::span<float, 32> out);

// n values at once, as attention reads them (8 per instruction with F16C/AVX2, where the CPU has them;
// inline, since attention calls them for every row of D values): out[i] = decode(in[i]) x scale. Equal
// to the one-value decoders for every code.
// fp16 -> fp32 is one instruction for 8 values with F16C. The fp8 formats widen to an fp16 bit pattern
// first: e5m2 is an fp16's upper byte (code << 8, infinities and NaNs included); e4m3's exponent and
// mantissa, placed at fp16's (bits 14..7 <- 6..0), read as an fp16 with bias 15 instead of 7, so the
// value is that fp16 x 2^8 (subnormals too); its one NaN pattern (S.1111.111) is set apart.
inline void fp16_decode_n(const std::uint16_t* in, float* out, std::int64_t n) {
    std::int64_t i = 0;
#ifdef KVLAB_F16C
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
#endif
    for (; i < n; ++i) out[i] = fp16_decode(in[i]);
}

// A bf16 is the top half of an fp32: widening is a 16-bit shift (vectorized by the compiler).
inline void bf16_decode_n(const std::uint16_t* in, float* out, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(static_cast<std::uint32_t>(in[i]) << 16);
}

#ifdef KVLAB_F16C
// 16 fp8 codes at a time: widened to 16-bit lanes, turned into fp16 bit patterns by `to_half`,
// converted 8 by 8 and multiplied by s. The scalar tail reads the code's value from `values`.
template <typename ToHalf>
inline std::int64_t fp8_decode16(const std::uint8_t* in, float* out, std::int64_t n, __m256 s, ToHalf to_half) {
    std::int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256i h = to_half(_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), s));
        _mm256_storeu_ps(out + i + 8, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), s));
    }
    return i;
}
#endif

// e5m2 is an fp16's upper byte: code << 8.
inline void fp8_e5m2_decode_n(const std::uint8_t* in, float* out, std::int64_t n, float scale) {
    std::int64_t i = 0;
#ifdef KVLAB_F16C
    i = fp8_decode16(in, out, n, _mm256_set1_ps(scale), [](__m256i w) { return _mm256_slli_epi16(w, 8); });
#endif
    for (; i < n; ++i) out[i] = fp8_e5m2_values()[in[i]] * scale;
}

// e4m3 without its NaN pattern: for codes known to hold none (a cache that never stored a NaN), the same
// values with three instructions fewer per 16. The sign moves from bit 7 to 15 and the rest from 6..0
// to 13..7 by one shift left by 8, one arithmetic shift right by 1 and clearing bit 14; x 2^8 turns
// fp16's bias 15 into e4m3's 7.
inline void fp8_e4m3_decode_n_finite(const std::uint8_t* in, float* out, std::int64_t n, float scale) {
    std::int64_t i = 0;
#ifdef KVLAB_F16C
    const __m256i clear14 = _mm256_set1_epi16(static_cast<std::int16_t>(0xBFFF));
    i = fp8_decode16(in, out, n, _mm256_set1_ps(scale * 256.0f),
                     [&](__m256i w) { return _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(w, 8), 1), clear14); });
#endif
    for (; i < n; ++i) out[i] = fp8_e4m3_values()[in[i]] * scale;
}

inline void fp8_e4m3_decode_n(const std::uint8_t* in, float* out, std::int64_t n, float scale) {
    std::int64_t i = 0;
#ifdef KVLAB_F16C
    const __m256i low7 = _mm256_set1_epi16(0x7F), sign = _mm256_set1_epi16(0x80), fp16_nan = _mm256_set1_epi16(0x7FFF);
    i = fp8_decode16(in, out, n, _mm256_set1_ps(scale * 256.0f), [&](__m256i w) {
        const __m256i mag = _mm256_and_si256(w, low7);
        const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, sign), 8), _mm256_slli_epi16(mag, 7));
        return _mm256_blendv_epi8(h, fp16_nan, _mm256_cmpeq_epi16(mag, low7));  // S.1111.111 -> an fp16 NaN
    });
#endif
    for (; i < n; ++i) out[i] = fp8_e4m3_values()[in[i]] * scale;
}

// One q8_0 / q4_0 block as stored (fp16 d, then the codes) into 32 floats: the dequantize_* above, 8
// values per instruction with AVX2.
inline void q8_0_decode_block(const std::uint8_t* block, float* out) {
    std::uint16_t dc;
    std::memcpy(&dc, block, 2);
    const float d = fp16_decode(dc);
    const auto* qs = reinterpret_cast<const std::int8_t*>(block + 2);
#ifdef KVLAB_F16C
    const __m256 dv = _mm256_set1_ps(d);
    for (int j = 0; j < 32; j += 8)
        _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + j)))), dv));
#else
    for (int j = 0; j < 32; ++j) out[j] = static_cast<float>(qs[j]) * d;
#endif
}

inline void q4_0_decode_block(const std::uint8_t* block, float* out) {
    std::uint16_t dc;
    std::memcpy(&dc, block, 2);
    const float d = fp16_decode(dc);
    const std::uint8_t* qs = block + 2;  // value j in the low nibble of byte j, value j + 16 in its high nibble
#ifdef KVLAB_F16C
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m128i mask = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    // the codes minus 8 as int8 (-8..7), then times d: the same products as the loop below, an
    // infinite d included
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(bytes, mask), eight), hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask), eight);
    const __m256 dv = _mm256_set1_ps(d);
    auto put = [&](__m128i q, float* o) {  // 8 values in the low bytes
        _mm256_storeu_ps(o, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), dv));
    };
    put(lo, out);
    put(_mm_srli_si128(lo, 8), out + 8);
    put(hi, out + 16);
    put(_mm_srli_si128(hi, 8), out + 24);
#else
    for (int j = 0; j < 16; ++j) {
        out[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
        out[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
#endif
}

}  // namespace kvlab
