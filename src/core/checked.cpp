#include "kvlab/core/checked.hpp"

#include <fmt/format.h>

#include "kvlab/core/error.hpp"

namespace kvlab {

std::uint64_t checked_mul(std::uint64_t a, std::uint64_t b, std::string_view what) {
    std::uint64_t r = 0;
    if (__builtin_mul_overflow(a, b, &r))
        throw OverflowError(fmt::format("{} overflows 64-bit bytes: {} x {} exceeds 2^64-1; use smaller inputs", what, a, b));
    return r;
}

std::uint64_t checked_add(std::uint64_t a, std::uint64_t b, std::string_view what) {
    std::uint64_t r = 0;
    if (__builtin_add_overflow(a, b, &r))
        throw OverflowError(fmt::format("{} overflows 64-bit bytes: {} + {} exceeds 2^64-1; use smaller inputs", what, a, b));
    return r;
}

std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

}  // namespace kvlab
