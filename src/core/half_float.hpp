// 16-bit floats widened to fp32 by bit manipulation: IEEE binary16 (fp16) and bfloat16 (bf16).
// Exact for every input (both are subsets of fp32), NaN payloads and signed zeros kept. Non-goal: narrowing.
#pragma once
#include <cstdint>

namespace kvlab {

float fp16_to_fp32(std::uint16_t bits);
float bf16_to_fp32(std::uint16_t bits);

}  // namespace kvlab
