#include "core/json_input.hpp"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kvlab/core/text.hpp"

namespace kvlab {

namespace {

struct TooDeep {};

// 1-based line and column of `byte` in `text`.
std::pair<std::size_t, std::size_t> line_column(std::string_view text, std::size_t byte) {
    byte = std::min(byte, text.size());
    const std::string_view before = text.substr(0, byte);
    const std::size_t line = 1 + static_cast<std::size_t>(std::count(before.begin(), before.end(), '\n'));
    const std::size_t last_newline = before.rfind('\n');
    return {line, last_newline == std::string_view::npos ? byte + 1 : byte - last_newline};
}

}  // namespace

nlohmann::json parse_json(std::string_view text, std::string_view where, Keys keys) {
    // depth is the number of containers open before the event: the 65th nested '[' or '{' arrives at 64
    std::vector<std::set<std::string>> open_objects;  // Keys::unique: the keys seen in each object being read
    const auto cap = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        using E = nlohmann::json::parse_event_t;
        if ((event == E::object_start || event == E::array_start) && depth >= max_json_depth) throw TooDeep{};
        if (keys == Keys::unique) {
            if (event == E::object_start) open_objects.emplace_back();
            else if (event == E::object_end) open_objects.pop_back();
            else if (event == E::key && !open_objects.back().insert(parsed.get<std::string>()).second)
                throw FormatError(fmt::format("{}: key {} appears twice in one object; the file was edited", where,
                                              quote(parsed.get<std::string>(), 60)));
        }
        return true;
    };
    try {
        return nlohmann::json::parse(text.begin(), text.end(), cap);
    } catch (const TooDeep&) {
        throw FormatError(fmt::format("{}: JSON nested more than {} levels deep; expected a flat document (a config, "
                                      "header or trace nests at most a few levels)",
                                      where, max_json_depth));
    } catch (const nlohmann::json::parse_error& e) {
        // e.byte counts from 1 and points one past the character that failed
        const std::size_t byte = e.byte == 0 ? 0 : e.byte - 1;
        const bool at_end = e.byte >= text.size() + 1 || byte >= text.size();
        const auto [line, column] = line_column(text, byte);
        std::string reason = e.what();
        // "[json.exception.parse_error.101] parse error at line 1, column 5: syntax error ...": keep the reason
        if (const auto colon = reason.find(": ", reason.find("column")); colon != std::string::npos) reason = reason.substr(colon + 2);
        throw JsonSyntaxError(fmt::format("{}: not valid JSON at line {}, column {}: {}", where, line, column,
                                          at_end ? std::string("the text ends early (truncated?)") : quote(reason, 120)),
                              byte, at_end);
    } catch (const nlohmann::json::exception& e) {  // e.g. out_of_range.406: a number too large for a double
        throw FormatError(fmt::format("{}: JSON not read: {}", where, quote(e.what(), 160)));
    }
}

std::string json_excerpt(const nlohmann::json& value, std::size_t max_bytes) {
    const std::string text = json_dump(value);  // JSON escapes C0 controls; printable() the rest (DEL, C1, a cut sequence)
    if (text.size() <= max_bytes) return printable(text);
    return fmt::format("{}... ({} bytes)", printable(text.substr(0, max_bytes)), text.size());
}

std::string json_dump(const nlohmann::json& value, int indent) {
    return value.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace kvlab
