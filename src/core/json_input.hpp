// JSON from files a user hands kvlab (config.json, safetensors headers, shard indexes, traces): parsed
// with the nesting capped, so a hostile file cannot exhaust the stack, and every error a FormatError
// naming the file, line and column. Writers dump through json_dump, which never throws on text that is
// not UTF-8 (it writes U+FFFD).
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kvlab/core/error.hpp"

namespace kvlab {

// Deepest nesting kvlab reads. Its own files nest at most 4 levels (Perfetto: document, traceEvents,
// event, args); Hugging Face configs about 3. nlohmann_json parses deeper documents without recursion,
// but copying or printing one recurses once per level.
inline constexpr int max_json_depth = 64;

// A syntax error: `byte` is the offset where parsing stopped, `at_end` whether the text ended first
// (a truncated file).
class JsonSyntaxError : public FormatError {
public:
    JsonSyntaxError(const std::string& message, std::size_t byte, bool at_end)
        : FormatError(message), byte(byte), at_end(at_end) {}
    std::size_t byte;
    bool at_end;
};

// Parses `text`. Throws JsonSyntaxError "WHERE: not valid JSON at line L, column C: reason", or a
// FormatError when the document nests deeper than max_json_depth.
// Keys: a repeated key in one object keeps the last value, as Python's json and transformers read a
// config; `Keys::unique` refuses it instead (FormatError), for files kvlab writes, where a repeat means an edit.
enum class Keys { last_wins, unique };
nlohmann::json parse_json(std::string_view text, std::string_view where, Keys keys = Keys::last_wins);

// A value as an error message shows it: compact JSON, control bytes escaped, cut after `max_bytes` with
// the whole length named (never value.dump() in a message: a 100 KB value is a 100 KB line).
std::string json_excerpt(const nlohmann::json& value, std::size_t max_bytes = 80);

// value.dump(indent) for output files and stdout; invalid UTF-8 in strings becomes U+FFFD.
std::string json_dump(const nlohmann::json& value, int indent = -1);

}  // namespace kvlab
