// Text from outside kvlab (file contents, names, flags) made safe to show or to put in JSON.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace kvlab {

// A value from user input, as an error message shows it: in single quotes, control bytes and bytes that
// are not UTF-8 written as \n, \t or \xNN, cut after `max_bytes` bytes with the total length named, so a
// message never carries megabytes of input or raw terminal controls. quote("a\nb") == "'a\\nb'".
std::string quote(std::string_view text, std::size_t max_bytes = 80);
// Levenshtein distance (insertions, deletions, substitutions), for "did you mean" hints.
std::size_t edit_distance(std::string_view a, std::string_view b);

// `text` for a terminal or a one-line field (a table title, a CSV comment): control bytes and invalid
// UTF-8 escaped as quote() does, nothing cut, no quotes added. printable("a\nb") == "a\\nb".
std::string printable(std::string_view text);

// A message for one stderr line: control bytes and invalid UTF-8 escaped as printable() does, cut to at
// most `max_bytes` bytes (escapes included) with the total length named. main() passes every error through it, so no message
// reaches the terminal raw or unbounded even where a value skipped quote().
std::string one_line(std::string_view text, std::size_t max_bytes = 2000);

// `text` with every byte that does not start a valid UTF-8 sequence replaced by U+FFFD (what JSON needs).
std::string to_valid_utf8(std::string_view text);

bool is_valid_utf8(std::string_view text);

// Every field of `line` between `sep`s, empty ones included: "a,,b" -> {"a", "", "b"} (the rows of kvlab's
// CSV traces, whose values never hold the separator).
std::vector<std::string> split_fields(std::string_view line, char sep);

// A count and its noun, the noun plural unless the count is 1: counted(1, "step") == "1 step",
// counted(3, "token") == "3 tokens" (English nouns that take an -s).
std::string counted(long long n, std::string_view noun);

}  // namespace kvlab
