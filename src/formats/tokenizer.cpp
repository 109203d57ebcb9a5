#include "kvlab/formats/tokenizer.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <queue>
#include <utility>

#include <fmt/format.h>

#include "kvlab/core/error.hpp"
#include "kvlab/core/mapped_file.hpp"

static_assert(std::endian::native == std::endian::little, "tokenizer.bin is little-endian; so must the host be");

namespace kvlab {
namespace {

int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

// "<0xNN>" -> the byte NN, else -1.
int byte_piece_value(const std::string& piece) {
    if (piece.size() != 6 || piece.compare(0, 3, "<0x") != 0 || piece[5] != '>') return -1;
    const int hi = hex_value(piece[3]), lo = hex_value(piece[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

}  // namespace

Tokenizer::Tokenizer(std::vector<std::string> pieces, std::vector<float> scores, std::string where)
    : pieces_(std::move(pieces)), scores_(std::move(scores)), where_(std::move(where)) {
    if (pieces_.size() != scores_.size())
        throw FormatError(fmt::format("{}: {} pieces but {} scores", where_, pieces_.size(), scores_.size()));
    for (std::size_t i = 0; i < scores_.size(); ++i)
        if (std::isnan(scores_[i]))
            throw FormatError(fmt::format("{}: token {} has score NaN; expected a number (merge priority)", where_, i));
    ids_.reserve(pieces_.size());
    for (const auto& p : pieces_) max_piece_bytes_ = std::max(max_piece_bytes_, static_cast<std::int64_t>(p.size()));
    for (std::size_t i = 0; i < pieces_.size(); ++i) ids_.emplace(pieces_[i], static_cast<std::int32_t>(i));
}

Tokenizer Tokenizer::load(const std::filesystem::path& path, std::int64_t n_vocab) {
    const std::string where = path.string();
    if (n_vocab <= 0 || n_vocab > INT32_MAX)
        throw UsageError(fmt::format("{}: vocabulary size {} is not a positive int32", where, n_vocab));
    const MappedFile file(path, "tokenizer file");
    const std::byte* data = file.bytes().data();
    const std::uint64_t size = file.size_bytes();
    if (size < 4) throw FormatError(fmt::format("{}: truncated at offset 0: {} bytes, the 4-byte max_token_length header is missing", where, size));
    std::int32_t max_token_length = 0;  // an int in llama2.c's tokenizer.bin, as every field
    std::memcpy(&max_token_length, data, 4);
    if (max_token_length <= 0)
        throw FormatError(fmt::format("{}: max_token_length at offset 0 is {}; expected a positive token length", where, max_token_length));

    std::vector<std::string> pieces(static_cast<std::size_t>(n_vocab));
    std::vector<float> scores(static_cast<std::size_t>(n_vocab));
    std::uint64_t offset = 4;
    for (std::int64_t i = 0; i < n_vocab; ++i) {
        if (size - offset < 8)
            throw FormatError(fmt::format("{}: truncated at offset {}: token {} of {} needs an 8-byte score and length, {} bytes left",
                                          where, offset, i, n_vocab, size - offset));
        std::int32_t len = 0;
        std::memcpy(&scores[static_cast<std::size_t>(i)], data + offset, 4);
        std::memcpy(&len, data + offset + 4, 4);
        if (len <= 0 || len > max_token_length)
            throw FormatError(fmt::format("{}: token {} at offset {} has length {}; expected 1..{} (max_token_length)",
                                          where, i, offset + 4, len, max_token_length));
        offset += 8;
        if (size - offset < static_cast<std::uint64_t>(len))
            throw FormatError(fmt::format("{}: truncated at offset {}: token {} needs {} bytes, {} left", where, offset, i, len,
                                          size - offset));
        pieces[static_cast<std::size_t>(i)].assign(reinterpret_cast<const char*>(data + offset), static_cast<std::size_t>(len));
        offset += static_cast<std::uint64_t>(len);
    }
    if (offset != size)
        throw FormatError(fmt::format("{}: {} bytes remain after token {} at offset {}: the file holds more tokens than the model's vocabulary ({})",
                                      where, size - offset, n_vocab - 1, offset, n_vocab));
    return Tokenizer(std::move(pieces), std::move(scores), where);
}

std::int32_t Tokenizer::find(const std::string& piece) const {
    const auto it = ids_.find(piece);
    return it == ids_.end() ? -1 : it->second;
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view text, bool bos, bool eos) const {
    std::vector<std::int32_t> tokens;
    if (bos) tokens.push_back(bos_id);
    const std::vector<std::int32_t> work = merge_pairs(code_points(text));
    tokens.insert(tokens.end(), work.begin(), work.end());
    if (eos) tokens.push_back(eos_id);
    return tokens;
}

// The text as one token per UTF-8 code point (its bytes' fallback tokens when the code point is not one).
std::vector<std::int32_t> Tokenizer::code_points(std::string_view text) const {
    // SentencePiece's add_dummy_prefix: the text is read as if it began with a space.
    std::string padded;
    if (!text.empty()) {
        padded.reserve(text.size() + 1);
        padded.push_back(' ');
        padded.append(text);
    }

    // A code point is a lead byte plus the continuation bytes (10xxxxxx) after it, at most 4 bytes.
    std::vector<std::int32_t> work;
    for (std::size_t start = 0; start < padded.size();) {
        std::size_t end = start + 1;
        while (end < padded.size() && end - start < 4 && (static_cast<unsigned char>(padded[end]) & 0xC0u) == 0x80u) ++end;
        const std::string point = padded.substr(start, end - start);
        const std::int32_t id = find(point);
        if (id >= 0) {
            work.push_back(id);
        } else {
            for (const char c : point) {
                const std::int32_t byte_id = static_cast<std::int32_t>(static_cast<unsigned char>(c)) + byte_fallback_offset;
                if (byte_id >= n_vocab())
                    throw FormatError(fmt::format("{}: byte 0x{:02X} of the text is not in the vocabulary and its fallback token {} "
                                                  "is outside it ({} tokens)",
                                                  where_, static_cast<unsigned char>(c), byte_id, n_vocab()));
                work.push_back(byte_id);
            }
        }
        start = end;
    }

    return work;
}

std::vector<std::int32_t> Tokenizer::merge_pairs(std::vector<std::int32_t> work) const {
    // Merge the best-scoring adjacent pair (leftmost on ties) until no pair's concatenation is a token.
    // As llama2.c's loop, but a heap of candidate pairs replaces its rescan of the whole text after every
    // merge: O(n log n), not O(n^2). Symbols form a linked list; a candidate whose two symbols changed since
    // it was pushed is skipped when it comes up. Positions only grow along the list, so the smallest left
    // position among equal scores is the leftmost pair.
    struct Symbol {
        std::int32_t id;
        std::int64_t prev, next;  // -1 at either end
    };
    struct Candidate {
        float score;
        std::int64_t left, right;
        std::int32_t left_id, right_id, merged_id;
        bool operator<(const Candidate& o) const {  // the heap's top is the highest score, then the leftmost
            return score != o.score ? score < o.score : left > o.left;
        }
    };
    std::vector<Symbol> symbols(work.size());
    for (std::size_t i = 0; i < work.size(); ++i)
        symbols[i] = {work[i], static_cast<std::int64_t>(i) - 1, i + 1 < work.size() ? static_cast<std::int64_t>(i + 1) : -1};
    std::priority_queue<Candidate> heap;
    std::string merged;
    const auto push_pair = [&](std::int64_t left, std::int64_t right) {
        if (left < 0 || right < 0) return;
        const std::int32_t a = symbols[static_cast<std::size_t>(left)].id, b = symbols[static_cast<std::size_t>(right)].id;
        merged = pieces_[static_cast<std::size_t>(a)];
        merged += pieces_[static_cast<std::size_t>(b)];
        if (const std::int32_t id = find(merged); id >= 0) heap.push({scores_[static_cast<std::size_t>(id)], left, right, a, b, id});
    };
    for (std::size_t i = 0; i + 1 < symbols.size(); ++i) push_pair(static_cast<std::int64_t>(i), static_cast<std::int64_t>(i + 1));
    while (!heap.empty()) {
        const Candidate c = heap.top();
        heap.pop();
        Symbol& left = symbols[static_cast<std::size_t>(c.left)];
        const Symbol& right = symbols[static_cast<std::size_t>(c.right)];
        if (left.next != c.right || left.id != c.left_id || right.id != c.right_id) continue;  // stale
        left.id = c.merged_id;
        left.next = right.next;
        if (right.next >= 0) symbols[static_cast<std::size_t>(right.next)].prev = c.left;
        symbols[static_cast<std::size_t>(c.right)].id = -1;  // unlinked
        push_pair(left.prev, c.left);
        push_pair(c.left, left.next);
    }
    work.clear();
    for (std::int64_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[static_cast<std::size_t>(i)].next)
        work.push_back(symbols[static_cast<std::size_t>(i)].id);

    return work;
}

const std::string& Tokenizer::piece(std::int32_t token) const {
    if (token < 0 || token >= n_vocab())
        throw UsageError(fmt::format("{}: token id {} is outside the vocabulary (0..{})", where_, token, n_vocab() - 1));
    return pieces_[static_cast<std::size_t>(token)];
}

float Tokenizer::score(std::int32_t token) const {
    piece(token);  // range check
    return scores_[static_cast<std::size_t>(token)];
}

std::string Tokenizer::decode(std::int32_t prev_token, std::int32_t token) const {
    const std::string& text = piece(token);
    const int byte = byte_piece_value(text);
    if (byte >= 0) return std::string(1, static_cast<char>(byte));
    // SentencePiece strips the dummy-prefix space from the first piece after BOS.
    if (prev_token == bos_id && !text.empty() && text[0] == ' ') return text.substr(1);
    return text;
}

namespace {

// The bytes a UTF-8 sequence starting with `lead` has in all (0: `lead` cannot start one), and the range
// its second byte must fall in (Unicode 15, Table 3-7: no overlong forms, surrogates or code points
// above U+10FFFF).
struct Utf8Lead {
    int length = 0;
    unsigned char second_lo = 0x80, second_hi = 0xBF;
};
Utf8Lead utf8_lead(unsigned char lead) {
    if (lead < 0x80) return {1};
    if (lead >= 0xC2 && lead <= 0xDF) return {2};
    if (lead == 0xE0) return {3, 0xA0, 0xBF};
    if (lead == 0xED) return {3, 0x80, 0x9F};
    if (lead >= 0xE1 && lead <= 0xEF) return {3};
    if (lead == 0xF0) return {4, 0x90, 0xBF};
    if (lead >= 0xF1 && lead <= 0xF3) return {4};
    if (lead == 0xF4) return {4, 0x80, 0x8F};
    return {};
}

constexpr std::string_view replacement_character = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

std::string Utf8Stream::put(std::string_view bytes) {
    pending_.append(bytes);
    std::string out;
    std::size_t i = 0;
    while (i < pending_.size()) {
        const Utf8Lead lead = utf8_lead(static_cast<unsigned char>(pending_[i]));
        if (lead.length == 0) {  // a continuation byte or a byte no sequence starts with
            out += replacement_character;
            ++i;
            continue;
        }
        // the longest valid prefix of the sequence (its "maximal subpart", replaced by one U+FFFD if cut short)
        std::size_t n = 1;
        while (n < static_cast<std::size_t>(lead.length) && i + n < pending_.size()) {
            const auto c = static_cast<unsigned char>(pending_[i + n]);
            const bool ok = n == 1 ? c >= lead.second_lo && c <= lead.second_hi : c >= 0x80 && c <= 0xBF;
            if (!ok) break;
            ++n;
        }
        if (n == static_cast<std::size_t>(lead.length)) {
            out.append(pending_, i, n);
        } else if (i + n == pending_.size()) {
            break;  // valid so far: the next token may complete it
        } else {
            out += replacement_character;
        }
        i += n;
    }
    pending_.erase(0, i);
    return out;
}

std::string Utf8Stream::finish() {
    const bool cut = !pending_.empty();
    pending_.clear();
    return cut ? std::string(replacement_character) : std::string();
}

std::string TextDecoder::next(std::int32_t token) {
    const std::int32_t prev = prev_;
    prev_ = token;
    if (prev < 0 && token == Tokenizer::bos_id) {
        tokenizer_.piece(token);  // range check
        return {};
    }
    return utf8_.put(printable_piece(tokenizer_.decode(prev, token)));
}

std::string TextDecoder::finish() { return utf8_.finish(); }

std::string printable_piece(std::string piece) {
    if (piece.size() != 1) return piece;
    const auto c = static_cast<unsigned char>(piece[0]);
    const bool whitespace = c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
    if ((c < 0x20 && !whitespace) || c == 0x7F) return {};
    return piece;
}

}  // namespace kvlab
