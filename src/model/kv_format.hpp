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
#include <cstdint>
#include <span>

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

}  // namespace kvlab
