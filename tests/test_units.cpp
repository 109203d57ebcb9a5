#include <doctest/doctest.h>

#include "kvlab/core/text.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/core/printer.hpp"
#include "kvlab/core/units.hpp"

using namespace kvlab;

TEST_CASE("Bytes print with IEC units for 2^10 steps and SI units for 10^3 steps") {
    CHECK(format_bytes(524288, UnitSystem::iec) == "512.00 KiB");
    CHECK(format_bytes(2147483648ull, UnitSystem::iec) == "2.00 GiB");
    CHECK(format_bytes(2147483648ull, UnitSystem::si) == "2.15 GB");  // 2^31 / 10^9
    CHECK(format_bytes(40, UnitSystem::iec) == "40 B");
    // a value that would round up to the base is printed in the next unit
    CHECK(format_bytes(1048575, UnitSystem::iec) == "1.00 MiB");       // 1023.999 KiB
    CHECK(format_bytes(1048570, UnitSystem::iec) == "1023.99 KiB");    // 1048570 / 1024 = 1023.994: stays
    CHECK(format_bytes(999999, UnitSystem::si) == "1.00 MB");
    CHECK(count_cell(999999999, "FLOP").text == "1.00 GFLOP");
    CHECK(count_cell(999994999, "FLOP").text == "999.99 MFLOP");
    CHECK(count_cell(999, "FLOP").text == "999 FLOP");
    CHECK(counted(1, "step") == "1 step");
    CHECK(counted(0, "step") == "0 steps");
    CHECK(counted(12, "token") == "12 tokens");
}

TEST_CASE("Sizes parse with explicit binary or decimal units") {
    CHECK(parse_size("80GiB", "--gpu-mem") == 80ull << 30);
    CHECK(parse_size("40 GB", "--gpu-mem") == 40000000000ull);
    CHECK(parse_size("3.8125GiB", "--kv-budget") == 4093640704ull);  // 3.8125 x 2^30
    CHECK(parse_size("1073741824B", "--gpu-mem") == 1073741824ull);
    CHECK(parse_size("40b", "--kv-budget") == 40);  // units in any letter case
    // a number without a unit: 40 bytes or 40 GiB? refused, never guessed
    // a bare 0 is zero in any unit: the message says what is wrong with it (zero), not that a unit is missing
    CHECK_THROWS_WITH_AS(parse_size("0", "--kv-budget"), "--kv-budget: '0' is zero; expected a positive size", UsageError);
    CHECK_THROWS_WITH_AS(parse_size("40", "--kv-budget"), "--kv-budget: '40' has no unit; expected 40GiB or 40GB (2^30 or 10^9 bytes each), or 40B for bytes",
                         UsageError);
    CHECK_THROWS_AS(parse_size("80 gigs", "--gpu-mem"), UsageError);
    CHECK_THROWS_AS(parse_size("-1GiB", "--gpu-mem"), UsageError);
    CHECK_THROWS_AS(parse_size("1.5B", "--gpu-mem"), UsageError);  // half a byte
    CHECK(parse_size("11.12GiB", "--kv-budget") == 11940009082ull);  // floor(11.12 x 2^30 = 11940009082.88): unit sizes round down to whole bytes
}

TEST_CASE("Counts accept k and m suffixes and reject zero, negatives and fractions") {
    CHECK(parse_count("4k", "--context") == 4096);
    CHECK(parse_count("128K", "--context") == 131072);
    CHECK(parse_count("1e3", "--batch") == 1000);
    CHECK(parse_count_list("4k,32k,128k", "--context") == std::vector<std::uint64_t>{4096, 32768, 131072});
    CHECK_THROWS_AS(parse_count("0", "--batch"), UsageError);
    CHECK_THROWS_AS(parse_count("-3", "--batch"), UsageError);
    CHECK_THROWS_AS(parse_count("2.5", "--batch"), UsageError);
    CHECK_THROWS_AS(parse_count("1e30", "--batch"), OverflowError);
}

TEST_CASE("split_fields keeps empty fields, as a CSV row needs") {
    CHECK(split_fields("a,,b", ',') == std::vector<std::string>{"a", "", "b"});
    CHECK(split_fields("", ',') == std::vector<std::string>{""});
    CHECK(split_fields("x,", ',') == std::vector<std::string>{"x", ""});
}

TEST_CASE("A percentage strictly between 0 and 100 never prints as either end") {
    CHECK(percent_cell(94.737).text == "94.7%");
    CHECK(percent_cell(100.0).text == "100.0%");
    CHECK(percent_cell(0.0).text == "0.0%");
    // 3081 of 3082 predictions agree: 99.9676%, which one decimal would print as 100.0%
    CHECK(percent_cell(100.0 * 3081 / 3082).text == "99.97%");
    CHECK(percent_cell(0.03).text == "0.03%");
    CHECK(percent_cell(99.9999).text == "99.9999%");
    CHECK(percent_cell(99.94).text == "99.9%");
    CHECK(percent_cell(100.0 * 3081 / 3082).value.get<double>() == doctest::Approx(99.9675535));
}

TEST_CASE("A change that is not zero never prints as +0.000%") {
    CHECK(change_percent_cell(0.189).text == "+0.189%");
    CHECK(change_percent_cell(-0.0104).text == "-0.010%");
    CHECK(change_percent_cell(0.0).text == "+0.000%");
    CHECK(change_percent_cell(0.00034).text == "+0.0003%");   // bf16 weights: perplexity 1.191794 over 1.191790
    CHECK(change_percent_cell(-0.000041).text == "-0.00004%");
}

TEST_CASE("Bandwidths print as the datasheets do: decimal units, up to three decimals, rounded exactly") {
    CHECK(format_rate(1555000000000ull) == "1.555 TB/s");  // A100 40GB: 1,555 GB/s (a double's 1.555 is 1.55499...)
    CHECK(format_rate(3350000000000ull) == "3.35 TB/s");   // H100 SXM: trailing zero dropped
    CHECK(format_rate(4800000000000ull) == "4.8 TB/s");
    CHECK(format_rate(300000000000ull) == "300 GB/s");     // L4
    CHECK(format_rate(2039000000000ull) == "2.039 TB/s");  // A100 80GB
    CHECK(format_rate(1008000000000ull) == "1.008 TB/s");
    CHECK(format_rate(1234567ull) == "1.235 MB/s");        // 1.234567 rounds half up to 1.235
    CHECK(format_rate(1999600000000ull) == "2 TB/s");      // 1.9996 rounds to 2.000
    CHECK(format_rate(999999600ull) == "1 GB/s");          // 999.9996 MB/s carries into the next unit
    CHECK(format_rate(999ull) == "999 B/s");
    CHECK(format_rate(0) == "0 B/s");
}
