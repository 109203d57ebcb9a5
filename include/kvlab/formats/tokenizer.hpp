// The llama2.c tokenizer (tokenizer.bin): byte-pair merges ranked by score, with byte fallback.
// Encodes a prompt into token ids and decodes ids into text pieces. Non-goal: training, SentencePiece .model files.
#pragma once
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvlab {

class Tokenizer {
public:
    static constexpr std::int32_t bos_id = 1;
    static constexpr std::int32_t eos_id = 2;
    static constexpr std::int32_t byte_fallback_offset = 3;  // byte b is token b + 3 ("<0xNN>")

    // Reads tokenizer.bin holding exactly n_vocab tokens (the count comes from the model).
    // Throws FormatError naming the file and byte offset of the problem; IoError if unreadable.
    static Tokenizer load(const std::filesystem::path& path, std::int64_t n_vocab);
    // From pieces and scores already in memory (same validation, `where` names the source in errors).
    Tokenizer(std::vector<std::string> pieces, std::vector<float> scores, std::string where);

    // Dummy-prefix space (non-empty text), one token per UTF-8 code point found in the vocabulary,
    // else one per byte (byte + 3), then repeatedly merge the adjacent pair whose concatenation is in
    // the vocabulary with the highest score (leftmost on ties). bos/eos add ids 1 / 2.
    // Throws FormatError when a byte needs a fallback id the vocabulary does not have.
    std::vector<std::int32_t> encode(std::string_view text, bool bos = true, bool eos = false) const;
    // The bytes token `token` stands for after `prev_token`: leading space dropped right after BOS,
    // "<0xNN>" pieces become the raw byte. Throws UsageError for ids outside the vocabulary.
    std::string decode(std::int32_t prev_token, std::int32_t token) const;

    std::int64_t n_vocab() const { return static_cast<std::int64_t>(pieces_.size()); }
    // Fewest tokens encode() can return for `text_bytes` bytes of text: each token spells at most
    // max_piece_bytes bytes (the dummy space and BOS included). Lets a caller refuse a prompt too long
    // for the context before encoding it.
    std::int64_t max_piece_bytes() const { return max_piece_bytes_; }
    std::int64_t min_tokens(std::uint64_t text_bytes, bool bos) const {
        if (text_bytes == 0) return bos ? 1 : 0;
        const auto per = static_cast<std::uint64_t>(std::max<std::int64_t>(max_piece_bytes_, 1));
        return static_cast<std::int64_t>((text_bytes + 1 + per - 1) / per) + (bos ? 1 : 0);
    }
    const std::string& piece(std::int32_t token) const;
    float score(std::int32_t token) const;

private:
    std::int32_t find(const std::string& piece) const;  // -1 when absent
    std::vector<std::int32_t> code_points(std::string_view text) const;       // encode, step 1
    std::vector<std::int32_t> merge_pairs(std::vector<std::int32_t> work) const;  // encode, step 2

    std::vector<std::string> pieces_;  // (V) raw bytes of each token
    std::vector<float> scores_;        // (V) merge priority; higher merges first
    std::unordered_map<std::string, std::int32_t> ids_;  // piece -> first id holding it
    std::string where_;
    std::int64_t max_piece_bytes_ = 0;
};

// Bytes in, valid UTF-8 out, as a stream: a sequence cut at the end of one put() is held until the next
// completes it; bytes that cannot be part of a valid sequence come out as U+FFFD, one per maximal
// subpart (Unicode 15, section 3.9, "U+FFFD Substitution of Maximal Subparts"), as browsers decode.
class Utf8Stream {
public:
    std::string put(std::string_view bytes);
    std::string finish();  // a sequence still cut short: U+FFFD; then empty

private:
    std::string pending_;  // at most 3 bytes: the start of a sequence not yet complete
};

// Turns a stream of ids into printable text one id at a time, as generation produces them: a BOS
// opening the stream prints nothing; every other id adds printable_piece(decode(previous id, id)) to a
// Utf8Stream, so the text is always valid UTF-8 (byte-fallback tokens that spell one character
// together print it once complete; bytes that spell none print U+FFFD).
class TextDecoder {
public:
    explicit TextDecoder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
    std::string next(std::int32_t token);  // throws UsageError for ids outside the vocabulary
    std::string finish();                  // at the end of the stream: U+FFFD for a sequence left incomplete

private:
    const Tokenizer& tokenizer_;
    std::int32_t prev_ = -1;  // -1: nothing decoded yet
    Utf8Stream utf8_;
};

// What to print for a decoded piece: "" for a single byte that is a control character other than
// whitespace (as llama2.c's safe printing); bytes >= 0x80 are kept, as parts of UTF-8 sequences that
// byte-fallback tokens spell one byte at a time (run.c drops them: docs/cli-simulate.md).
std::string printable_piece(std::string piece);

}  // namespace kvlab
