#include "kvlab/core/units.hpp"

#include <cctype>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "kvlab/core/checked.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/core/text.hpp"

namespace kvlab {
namespace {

std::string trim(std::string_view s) {
    std::size_t b = 0, e = s.size();
    while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
    while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
    return std::string(s.substr(b, e - b));
}

std::string lower(std::string s) {
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

// Splits "3.8125GiB" into the number text and the suffix text.
void split_number(const std::string& s, std::string& number, std::string& suffix) {
    std::size_t i = 0;
    while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.' || s[i] == 'e' || s[i] == 'E' ||
                            ((s[i] == '+' || s[i] == '-') && i > 0 && (s[i - 1] == 'e' || s[i - 1] == 'E')))) {
        // stop at an 'e' that starts a suffix rather than an exponent (none of ours do, but keep "e" only before digits)
        if ((s[i] == 'e' || s[i] == 'E') && !(i + 1 < s.size() && (std::isdigit(static_cast<unsigned char>(s[i + 1])) || s[i + 1] == '+' || s[i + 1] == '-'))) break;
        ++i;
    }
    number = s.substr(0, i);
    suffix = trim(s.substr(i));
}

// number * multiplier as an exact integer; fractional results are an error (bytes and counts are whole).
// With floor_fraction, a fractional result is rounded down (a printed "11.12GiB" is not a whole byte count).
std::uint64_t scaled(const std::string& number, long double multiplier, std::string_view text, std::string_view flag, std::string_view expected,
                     bool floor_fraction = false) {
    if (number.empty() || number[0] == '-' || number[0] == '+')
        throw UsageError(fmt::format("{}: {} is not valid; expected {}", flag, quote(text), expected));
    std::size_t used = 0;
    long double x = 0;
    try {
        x = std::stold(number, &used);
    } catch (const std::exception&) {
        throw UsageError(fmt::format("{}: {} is not valid; expected {}", flag, quote(text), expected));
    }
    if (used != number.size() || !std::isfinite(static_cast<double>(x)))
        throw UsageError(fmt::format("{}: {} is not valid; expected {}", flag, quote(text), expected));
    const long double v = x * multiplier;
    if (v >= 18446744073709551615.0L)
        throw OverflowError(fmt::format("{}: {} overflows 64-bit arithmetic; expected {}", flag, quote(text), expected));
    if (floor_fraction && multiplier > 1) return static_cast<std::uint64_t>(std::floor(v));
    if (v != std::floor(v))
        throw UsageError(fmt::format("{}: {} is not a whole number; expected {}", flag, quote(text), expected));
    return static_cast<std::uint64_t>(v);
}

}  // namespace

std::string format_bytes(std::uint64_t bytes, UnitSystem units) {
    static const char* iec[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    static const char* si[] = {"B", "KB", "MB", "GB", "TB", "PB", "EB"};
    const long double base = units == UnitSystem::iec ? 1024.0L : 1000.0L;
    const char* const* names = units == UnitSystem::iec ? iec : si;
    if (bytes < base) return fmt::format("{} B", bytes);
    long double v = static_cast<long double>(bytes);
    int i = 0;
    // a value that rounds up to the base prints in the next unit: 1048575 B is 1.00 MiB, not 1024.00 KiB
    while (v >= base - 0.005L && i < 6) {
        v /= base;
        ++i;
    }
    return fmt::format("{:.2f} {}", static_cast<double>(v), names[i]);
}

std::string format_rate(std::uint64_t bytes_per_s) {
    static const char* si[] = {"B/s", "KB/s", "MB/s", "GB/s", "TB/s", "PB/s", "EB/s"};
    std::uint64_t unit = 1;
    int i = 0;
    while (i < 6 && bytes_per_s / unit >= 1000) {
        unit *= 1000;
        ++i;
    }
    // thousandths of the unit, rounded half up; unit / 1000 divides exactly for every unit above bytes
    const std::uint64_t step = unit / 1000;
    std::uint64_t whole = bytes_per_s / unit;
    std::uint64_t milli = step == 0 ? 0 : (bytes_per_s % unit + step / 2) / step;
    if (milli == 1000) {  // 1.9996 TB/s is 2 TB/s; 999.9996 GB/s is 1 TB/s
        ++whole;
        milli = 0;
        if (whole == 1000 && i < 6) {
            whole = 1;
            ++i;
        }
    }
    std::string text = fmt::format("{}.{:03d}", whole, milli);
    while (text.back() == '0') text.pop_back();
    if (text.back() == '.') text.pop_back();
    return fmt::format("{} {}", text, si[i]);
}

std::uint64_t parse_size(std::string_view text, std::string_view flag) {
    const std::string s = trim(text);
    if (!s.empty() && s[0] == '-')
        throw UsageError(fmt::format("{}: {} is negative; expected a positive {}", flag, quote(text, 40), "size such as 8GiB"));
    std::string number, suffix;
    split_number(s, number, suffix);
    const std::string u = lower(suffix);
    long double m = 0;
    // a size without its unit is ambiguous (bytes? GiB, as engines print?): `--kv-budget 40` read as 40
    // bytes gave a pool of 0 blocks and exit 0
    // (0 aside: zero is zero in any unit, and no size here may be zero)
    if (u.empty() && number.find_first_not_of("0.") == std::string::npos && number.find('0') != std::string::npos)
        throw UsageError(fmt::format("{}: {} is zero; expected a positive size", flag, quote(text)));
    if (u.empty())
        throw UsageError(fmt::format("{}: {} has no unit; expected {}GiB or {}GB (2^30 or 10^9 bytes each), or {}B for bytes", flag, quote(text),
                                     number, number, number));
    if (u == "b") m = 1;
    else if (u == "kib") m = 1024.0L;
    else if (u == "mib") m = 1024.0L * 1024;
    else if (u == "gib") m = 1024.0L * 1024 * 1024;
    else if (u == "tib") m = 1024.0L * 1024 * 1024 * 1024;
    else if (u == "kb") m = 1e3L;
    else if (u == "mb") m = 1e6L;
    else if (u == "gb") m = 1e9L;
    else if (u == "tb") m = 1e12L;
    else
        throw UsageError(fmt::format("{}: unknown unit {} in {}; expected B, KiB, MiB, GiB, TiB (2^10 steps) or KB, MB, GB, TB (10^3 steps)", flag, quote(suffix, 20), quote(text)));
    const std::uint64_t bytes = scaled(number, m, text, flag, "a size such as 80GiB, 40GB or 1073741824B", true);
    if (bytes == 0) throw UsageError(fmt::format("{}: {} is zero; expected a positive size", flag, quote(text)));
    return bytes;
}

std::uint64_t parse_count(std::string_view text, std::string_view flag) {
    const std::string s = trim(text);
    if (!s.empty() && s[0] == '-')
        throw UsageError(fmt::format("{}: {} is negative; expected a positive {}", flag, quote(text, 40), "count such as 4096 or 4k"));
    std::string number, suffix;
    split_number(s, number, suffix);
    const std::string u = lower(suffix);
    long double m = 0;
    if (u.empty()) m = 1;
    else if (u == "k") m = 1024.0L;  // 4k context = 4096 tokens, as model cards use it
    else if (u == "m") m = 1024.0L * 1024;
    else
        throw UsageError(fmt::format("{}: {} is not a count; expected a positive integer such as 4096, 4k (=4096) or 1m (=1048576)", flag, quote(text)));
    const std::uint64_t n = scaled(number, m, text, flag, "a positive integer such as 4096, 4k (=4096) or 1m (=1048576)");
    if (n == 0) throw UsageError(fmt::format("{}: {} is zero; expected a positive integer", flag, quote(text)));
    return n;
}

std::vector<std::string> split_list(std::string_view text) {
    std::vector<std::string> out;
    std::size_t start = 0;
    while (start <= text.size()) {
        const auto comma = text.find(',', start);
        const auto end = comma == std::string_view::npos ? text.size() : comma;
        out.push_back(trim(text.substr(start, end - start)));
        if (comma == std::string_view::npos) break;
        start = comma + 1;
    }
    return out;
}

std::vector<std::uint64_t> parse_count_list(std::string_view text, std::string_view flag) {
    std::vector<std::uint64_t> out;
    for (const auto& item : split_list(text)) out.push_back(parse_count(item, flag));
    return out;
}

}  // namespace kvlab
