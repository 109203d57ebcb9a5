// Options that take one name from a closed set (core/choice.hpp): one_of refuses any other value
// ("--units: 'x' not in {iec,si}") and --help lists the names; the option sets the enum directly.
// The two every report-printing subcommand shares, --format and --units, are added by one line each.
#pragma once
#include <array>
#include <charconv>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kvlab/core/choice.hpp"
#include "kvlab/core/printer.hpp"
#include "kvlab/core/text.hpp"
#include "kvlab/core/units.hpp"

namespace kvlab::cli {

// Options that name files a command reads or writes. main.cpp checks, before any command runs, that no
// output names one of the inputs (core/file_roles.hpp): mark every such option with one of these.
enum class FileRole { input, output };
inline std::map<const CLI::Option*, FileRole>& file_roles() {
    static std::map<const CLI::Option*, FileRole> roles;
    return roles;
}
inline CLI::Option* input_file(CLI::Option* opt) {
    file_roles()[opt] = FileRole::input;
    return opt;
}
inline CLI::Option* output_file(CLI::Option* opt) {
    file_roles()[opt] = FileRole::output;
    return opt;
}

// Refuses any value but `names`, with the value escaped and cut ("'x' not in {iec,si}"); not CLI11's
// IsMember, whose message echoes the value raw and whole. The description "{iec,si}" is what --help
// shows and what the completion script reads the names from.
inline CLI::Validator one_of(std::vector<std::string> names) {
    const std::string set = fmt::format("{}", fmt::join(names, ","));
    return CLI::Validator(
        [names, set](std::string& value) -> std::string {
            for (const std::string& n : names)
                if (n == value) return {};
            return quote(value) + " not in {" + set + "}";
        },
        "{" + set + "}");
}

// `table` must outlive the parse (the tables are constexpr globals).
template <class E, std::size_t N>
CLI::Option* add_choice(CLI::App* cmd, const std::string& flags, E& target, const std::array<Choice<E>, N>& table,
                        const std::string& help) {
    CLI::Option* opt = cmd->add_option_function<std::string>(
        flags, [&target, &table](const std::string& name) { target = parse_choice(table, name, ""); }, help);
    opt->check(one_of(choice_names(table)));
    opt->default_str(std::string(choice_name(table, target)));
    return opt;
}

inline CLI::Option* add_format_option(CLI::App* cmd, Format& target) {
    return add_choice(cmd, "-f,--format", target, format_choices, "Output: an aligned table, or csv, json, markdown for tools");
}

inline CLI::Option* add_units_option(CLI::App* cmd, UnitSystem& target) {
    return add_choice(cmd, "--units", target, unit_system_choices, "Byte units: iec (KiB/MiB/GiB = 2^10..) or si (KB/MB/GB = 10^3..)");
}

// For an integer option whose default 0 means "not given" (--window, --kv-blocks): 0 given on the
// command line is refused, not read as the default. main's strict decimal reading (a transform, which
// CLI11 runs before checks) has already made the text canonical ("000" -> "0").
inline CLI::Validator given_nonzero(std::string expected) {
    return CLI::Validator(
        [expected](std::string& text) -> std::string {
            return text == "0" ? text + "; " + expected : "";
        },
        "");
}

// A short message in place of CLI11's PositiveNumber / NonNegativeNumber ("Value 0 not in range
// 0.000000 to 1797...", 400 bytes): the text is main's canonical decimal by the time it runs.
inline CLI::Validator at_least(std::int64_t least) {
    return CLI::Validator(
        [least](std::string& text) -> std::string {
            std::int64_t v = 0;
            const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
            const bool below = ec == std::errc() && end == text.data() + text.size() && v < least;
            return below ? fmt::format("{}; expected an integer >= {}", text, least) : "";
        },
        "");
}

}  // namespace kvlab::cli
