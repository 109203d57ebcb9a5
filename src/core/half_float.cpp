#include "core/half_float.hpp"

#include <bit>

namespace kvlab {

// fp16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. fp32: 1, 8 (bias 127), 23.
float fp16_to_fp32(std::uint16_t bits) {
    const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
    const std::uint32_t exponent = (bits >> 10) & 0x1fu;
    std::uint32_t mantissa = bits & 0x3ffu;
    std::uint32_t out = 0;
    if (exponent == 0x1fu) {
        out = sign | 0x7f800000u | (mantissa << 13);  // inf, or NaN with its payload (quiet bit stays the top bit)
    } else if (exponent != 0) {
        out = sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13);
    } else if (mantissa == 0) {
        out = sign;  // +-0
    } else {
        // Subnormal: value = mantissa * 2^-24. Shift until the implicit bit (bit 10) appears;
        // each shift lowers the exponent by one from that of the smallest normal (2^-14).
        int shifts = 0;
        while ((mantissa & 0x400u) == 0) {
            mantissa <<= 1;
            ++shifts;
        }
        const std::uint32_t exponent32 = static_cast<std::uint32_t>(127 - 14 - shifts);
        out = sign | (exponent32 << 23) | ((mantissa & 0x3ffu) << 13);
    }
    return std::bit_cast<float>(out);
}

// bf16 is the top half of an fp32.
float bf16_to_fp32(std::uint16_t bits) { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }

}  // namespace kvlab
