// Overflow-checked unsigned arithmetic for every size computed from user numbers.
#pragma once
#include <cstdint>
#include <string_view>

namespace kvlab {

// a * b, or throw OverflowError naming `what` (e.g. "bytes per batch").
std::uint64_t checked_mul(std::uint64_t a, std::uint64_t b, std::string_view what);
std::uint64_t checked_add(std::uint64_t a, std::uint64_t b, std::string_view what);
// ceil(a / b) for b > 0.
std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b);

}  // namespace kvlab
