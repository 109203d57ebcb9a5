#include "kvlab/core/text.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

namespace kvlab {

namespace {

// Length of the valid UTF-8 sequence starting at text[i] (1..4), or 0 if none starts there: no
// overlong forms, no surrogates, nothing past U+10FFFF.
std::size_t utf8_sequence(std::string_view text, std::size_t i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) return 1;
    std::size_t n = 0;
    std::uint32_t cp = 0, min_cp = 0;
    if ((c & 0xE0) == 0xC0) n = 2, cp = c & 0x1Fu, min_cp = 0x80;
    else if ((c & 0xF0) == 0xE0) n = 3, cp = c & 0x0Fu, min_cp = 0x800;
    else if ((c & 0xF8) == 0xF0) n = 4, cp = c & 0x07u, min_cp = 0x10000;
    else return 0;
    if (i + n > text.size()) return 0;
    for (std::size_t k = 1; k < n; ++k) {
        const auto cc = static_cast<unsigned char>(text[i + k]);
        if ((cc & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (cc & 0x3Fu);
    }
    return cp >= min_cp && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF) ? n : 0;
}

}  // namespace

namespace {

// Appends text[0, max_bytes) to out with control bytes and invalid UTF-8 escaped (and ' and \ when
// `quotes`); returns how many bytes of text were consumed.
std::size_t escape_into(std::string& out, std::string_view text, std::size_t max_bytes, bool quotes) {
    std::size_t i = 0;
    while (i < text.size() && i < max_bytes) {
        const auto c = static_cast<unsigned char>(text[i]);
        const std::size_t n = utf8_sequence(text, i);
        if (c == '\n') out += "\\n";
        else if (c == '\t') out += "\\t";
        else if (c == '\r') out += "\\r";
        else if (quotes && c == '\\') out += "\\\\";
        else if (quotes && c == '\'') out += "\\'";
        else if (c >= 0x20 && c < 0x7F) out += static_cast<char>(c);
        else if (c >= 0x80 && n > 0 && !(n == 2 && c == 0xC2 && static_cast<unsigned char>(text[i + 1]) < 0xA0)) {
            // any valid UTF-8 but the C1 controls U+0080..U+009F (U+009B is CSI to some terminals)
            out.append(text.substr(i, n));
            i += n;
            continue;
        } else {
            out += fmt::format("\\x{:02X}", c);
        }
        ++i;
    }
    return i;
}

}  // namespace

std::string quote(std::string_view text, std::size_t max_bytes) {
    std::string out = "'";
    const std::size_t used = escape_into(out, text, max_bytes, true);
    out += "'";
    if (used < text.size()) out += fmt::format(" (cut; {} bytes in all)", text.size());
    return out;
}

std::string printable(std::string_view text) {
    std::string out;
    escape_into(out, text, text.size(), false);
    return out;
}

std::string one_line(std::string_view text, std::size_t max_bytes) {
    std::string out;
    const std::size_t used = escape_into(out, text, max_bytes, false);
    if (used == text.size() && out.size() <= max_bytes) return out;
    // escaping may have grown it (\xNN is 4 bytes): cut the escaped text, at the start of a character
    std::size_t cut = std::min(out.size(), max_bytes);
    while (cut > 0 && cut < out.size() && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80) --cut;
    out.resize(cut);
    return out + fmt::format("... (cut; {} bytes in all)", text.size());
}

std::string to_valid_utf8(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (std::size_t i = 0; i < text.size();) {
        if (const std::size_t n = utf8_sequence(text, i); n > 0) {
            out.append(text.substr(i, n));
            i += n;
        } else {
            out += "\xEF\xBF\xBD";  // U+FFFD
            ++i;
        }
    }
    return out;
}

bool is_valid_utf8(std::string_view text) {
    for (std::size_t i = 0; i < text.size();) {
        const std::size_t n = utf8_sequence(text, i);
        if (n == 0) return false;
        i += n;
    }
    return true;
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
    std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
        cur[0] = i;
        for (std::size_t j = 1; j <= b.size(); ++j)
            cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
        std::swap(prev, cur);
    }
    return prev[b.size()];
}

std::vector<std::string> split_fields(std::string_view line, char sep) {
    std::vector<std::string> fields;
    std::size_t pos = 0;
    while (true) {
        const auto end = line.find(sep, pos);
        fields.emplace_back(line.substr(pos, end == std::string_view::npos ? std::string_view::npos : end - pos));
        if (end == std::string_view::npos) return fields;
        pos = end + 1;
    }
}

std::string counted(long long n, std::string_view noun) { return fmt::format("{} {}{}", n, noun, n == 1 ? "" : "s"); }

}  // namespace kvlab
