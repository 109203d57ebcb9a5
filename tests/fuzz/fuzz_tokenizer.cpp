// Fuzz target: llama2.c tokenizer.bin, and encoding text with it. Input layout (this target's own):
// uint16 vocabulary size, uint16 text length, the text, then the tokenizer.bin bytes. Besides the
// sanitizers it checks the O(n log n) encoder against llama2.c's quadratic loop written out plainly
// here (merge the best-scoring adjacent pair, leftmost on ties, until none is a token): same ids.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.hpp"
#include "kvlab/formats/tokenizer.hpp"

namespace {

// The reference: encode()'s merge loop as llama2.c writes it, on the ids encode() starts from.
std::vector<std::int32_t> merge_quadratic(const kvlab::Tokenizer& tok, std::vector<std::int32_t> work) {
    while (true) {
        std::int32_t best_id = -1;
        std::size_t best_at = 0;
        for (std::size_t i = 0; i + 1 < work.size(); ++i) {
            const std::string merged = tok.piece(work[i]) + tok.piece(work[i + 1]);
            std::int32_t id = -1;  // first id holding the piece, as the tokenizer's map keeps
            for (std::int32_t t = 0; t < tok.n_vocab() && id < 0; ++t)
                if (tok.piece(t) == merged) id = t;
            if (id >= 0 && (best_id < 0 || tok.score(id) > tok.score(best_id))) best_id = id, best_at = i;
        }
        if (best_id < 0) return work;
        work[best_at] = best_id;
        work.erase(work.begin() + static_cast<std::ptrdiff_t>(best_at) + 1);
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 4) return 0;
    std::uint16_t n_vocab = 0, text_len = 0;
    std::memcpy(&n_vocab, data, 2);
    std::memcpy(&text_len, data + 2, 2);
    if (text_len > size - 4 || text_len > 512) return 0;  // the quadratic reference is O(n^2 V): keep it fast
    const std::string text(reinterpret_cast<const char*>(data + 4), text_len);
    const auto path = kvlab::fuzz::write_scratch(
        "tokenizer.bin", std::string_view(reinterpret_cast<const char*>(data + 4 + text_len), size - 4 - text_len));
    kvlab::fuzz::expect_kvlab_errors_only([&] {
        const kvlab::Tokenizer tok = kvlab::Tokenizer::load(path, n_vocab);
        const std::vector<std::int32_t> ids = tok.encode(text, true, false);
        // the reference's starting ids, as encode() documents them: a dummy space, then one id per UTF-8
        // code point found in the vocabulary, else one per byte (byte + 3)
        std::vector<std::int32_t> start;
        const std::string padded = text.empty() ? std::string() : " " + text;
        for (std::size_t s = 0; s < padded.size();) {
            std::size_t e = s + 1;
            while (e < padded.size() && e - s < 4 && (static_cast<unsigned char>(padded[e]) & 0xC0u) == 0x80u) ++e;
            const std::string point = padded.substr(s, e - s);
            std::int32_t id = -1;
            for (std::int32_t t = 0; t < tok.n_vocab() && id < 0; ++t)
                if (tok.piece(t) == point) id = t;
            if (id >= 0) start.push_back(id);
            else
                for (const char c : point) start.push_back(static_cast<unsigned char>(c) + kvlab::Tokenizer::byte_fallback_offset);
            s = e;
        }
        std::vector<std::int32_t> expected = {kvlab::Tokenizer::bos_id};
        const auto merged = merge_quadratic(tok, start);
        expected.insert(expected.end(), merged.begin(), merged.end());
        if (ids != expected) kvlab::fuzz::finding("encode differs from the quadratic reference", text.c_str());
        if (static_cast<std::int64_t>(ids.size()) < tok.min_tokens(text.size(), true))
            kvlab::fuzz::finding("encode returned fewer tokens than min_tokens() promises", text.c_str());
    });
    return 0;
}
