// The llama2.c tokenizer (tokenizer.bin): byte-pair merges ranked by score, with byte fallback.
// Encodes a prompt into token ids and decodes ids into text pieces. Non-goal: training, SentencePiece .model files.
#pragma once
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
    const std::string& piece(std::int32_t token) const;
    float score(std::int32_t token) const;

private:
    std::int32_t find(const std::string& piece) const;  // -1 when absent

    std::vector<std::string> pieces_;  // (V) raw bytes of each token
    std::vector<float> scores_;        // (V) merge priority; higher merges first
    std::unordered_map<std::string, std::int32_t> ids_;  // piece -> first id holding it
    std::string where_;
};

}  // namespace kvlab
