// Human units: bytes as KiB/MiB/GiB (2^10..) or KB/MB/GB (10^3..), and parsing of sizes and counts.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvlab/core/choice.hpp"

namespace kvlab {

enum class UnitSystem { iec, si };  // --units
inline constexpr std::array<Choice<UnitSystem>, 2> unit_system_choices{{{"iec", UnitSystem::iec}, {"si", UnitSystem::si}}};

// "512.00 KiB", "1.25 GiB", "2.15 GB"; below 1 KiB/KB: "40 B".
std::string format_bytes(std::uint64_t bytes, UnitSystem units);
// A memory bandwidth as datasheets print it, decimal: "1.555 TB/s", "3.35 TB/s", "300 GB/s", "40 B/s": the
// largest SI unit that keeps the value at least 1, up to three decimals without trailing zeros, rounded in
// integers (a double holds 1.555 as 1.55499..., which "{:.2f}" prints as 1.55).
std::string format_rate(std::uint64_t bytes_per_s);
// Parse "80GiB", "40 GB", "3.8125GiB", "1073741824B" (bytes). A number without a unit is refused. Throws
// UsageError naming `flag`.
std::uint64_t parse_size(std::string_view text, std::string_view flag);
// Parse a positive count: "4096", "4k" (=4096), "128K", "1m" (=1048576), "1e15". Throws UsageError / OverflowError.
std::uint64_t parse_count(std::string_view text, std::string_view flag);
// Comma-separated list of counts ("4k,32k,128k"); each item as parse_count.
std::vector<std::uint64_t> parse_count_list(std::string_view text, std::string_view flag);
std::vector<std::string> split_list(std::string_view text);

}  // namespace kvlab
