// A closed set of names for an enum (--format, --units, --mode, --window-mode): one table per option
// grammar. The CLI's one_of (cli/options.hpp) refuses anything else and lists them in
// --help; code that reads a name from elsewhere (a trace, a test) parses it with the same table.
#pragma once
#include <array>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "kvlab/core/error.hpp"
#include "kvlab/core/text.hpp"

namespace kvlab {

template <class E>
struct Choice {
    std::string_view name;
    E value;
};

template <class E, std::size_t N>
std::vector<std::string> choice_names(const std::array<Choice<E>, N>& table) {
    std::vector<std::string> names;
    for (const Choice<E>& c : table) names.emplace_back(c.name);
    return names;
}

template <class E, std::size_t N>
std::string_view choice_name(const std::array<Choice<E>, N>& table, E value) {
    for (const Choice<E>& c : table)
        if (c.value == value) return c.name;
    throw std::logic_error("choice_name: value missing from its table");
}

// "'x' not in {iec,si}": the value escaped and cut (quote), then the names it may take.
template <class E, std::size_t N>
std::string not_a_choice(const std::array<Choice<E>, N>& table, std::string_view text) {
    std::string set;
    for (const Choice<E>& c : table) set += (set.empty() ? "" : ",") + std::string(c.name);
    return quote(text) + " not in {" + set + "}";
}

// Throws UsageError "--units: 'x' not in {iec,si}".
template <class E, std::size_t N>
E parse_choice(const std::array<Choice<E>, N>& table, std::string_view text, std::string_view flag) {
    for (const Choice<E>& c : table)
        if (c.name == text) return c.value;
    throw UsageError(std::string(flag) + ": " + not_a_choice(table, text));
}

}  // namespace kvlab
