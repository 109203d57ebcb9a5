// Writers of the small files tests and fuzz targets run kvlab's readers on: a 512-token tokenizer.bin,
// a tiny Llama as llama2.c v0 and as a Hugging Face directory (safetensors), from random weights.
// Used by kvlab_make_fixtures (CLI tests, fuzz seeds) and the shard-index fuzz target. Test-only.
#pragma once
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvlab/calc/model_config.hpp"
#include "kvlab/weights/weights.hpp"
#include "test_files.hpp"

namespace kvlab::fixtures {

namespace fs = std::filesystem;


template <typename T>
inline void put(std::string& out, T value) {
    char raw[sizeof(T)];
    std::memcpy(raw, &value, sizeof(T));
    out.append(raw, sizeof(T));
}

inline void write_file(const fs::path& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) throw std::runtime_error("cannot write " + path.string());
}

// 512 tokens: 0 <unk>, 1 BOS, 2 EOS, 3..258 <0x00>..<0xFF>, 259 " ", 260..285 a..z, 286 "hi" (-1),
// 287 " hi" (-2), then filler pieces "#288".."#511" that no merge of letters can form.
inline std::string tokenizer_512() {
    std::vector<std::pair<std::string, float>> vocab = {{"<unk>", 0.0f}, {"\n<s>\n", 0.0f}, {"\n</s>\n", 0.0f}};
    for (int b = 0; b < 256; ++b) vocab.emplace_back(fmt::format("<0x{:02X}>", b), 0.0f);
    vocab.emplace_back(" ", 0.0f);
    for (char c = 'a'; c <= 'z'; ++c) vocab.emplace_back(std::string(1, c), 0.0f);
    vocab.emplace_back("hi", -1.0f);
    vocab.emplace_back(" hi", -2.0f);
    while (vocab.size() < 512) vocab.emplace_back(fmt::format("#{}", vocab.size()), -100.0f);
    std::string out;
    put<std::uint32_t>(out, 7);
    for (const auto& [piece, score] : vocab) {
        put<float>(out, score);
        put<std::int32_t>(out, static_cast<std::int32_t>(piece.size()));
        out += piece;
    }
    return out;
}

// Tiny Llama with the tokenizer's vocabulary: d 16, f 24, 2 layers, 4 heads, 2 KV heads (D 4), 64 positions.
inline ModelConfig tiny_config() {
    ModelConfig c;
    c.name = c.display_name = "tiny";
    c.model_type = "llama";
    c.n_layer = 2, c.d_model = 16, c.n_head = 4, c.n_head_kv = 2, c.d_head = 4, c.d_ff = 24, c.n_vocab = 512;
    c.n_ctx_max = 64, c.tied_embeddings = true;
    c.layer_windowed.assign(2, false);
    return c;
}

inline std::string f32_bytes(const float* data, std::int64_t n) { return std::string(reinterpret_cast<const char*>(data), static_cast<std::size_t>(n) * 4); }

struct StTensor {
    std::string name;
    std::string dtype;
    std::vector<std::int64_t> shape;
    std::string data;
};

inline std::string safetensors(const std::vector<StTensor>& tensors) {
    nlohmann::json header = nlohmann::json::object();
    std::string buffer;
    for (const auto& t : tensors) {
        header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {buffer.size(), buffer.size() + t.data.size()}}};
        buffer += t.data;
    }
    const std::string text = header.dump();
    std::string out;
    put<std::uint64_t>(out, text.size());
    return out + text + buffer;
}

// The tiny model as a Hugging Face directory (F32), the same function as tiny.bin; `edit` may break
// the tensor list.
inline void write_hf(const fs::path& dir, const Weights& w, const std::function<void(std::vector<StTensor>&)>& edit) {
    fs::create_directories(dir);
    const nlohmann::json config = {{"model_type", "llama"}, {"hidden_size", 16}, {"intermediate_size", 24},
                                   {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                                   {"vocab_size", 512}, {"max_position_embeddings", 64}, {"rms_norm_eps", 1e-5},
                                   {"rope_theta", 10000.0}, {"tie_word_embeddings", true}};
    write_file(dir / "config.json", config.dump(2));
    std::vector<StTensor> t;
    const auto mat = [&](const std::string& name, const WeightMatrix& m) {
        t.push_back({name, "F32", {m.rows(), m.cols()}, f32_bytes(m.data(), m.size())});
    };
    const auto vec = [&](const std::string& name, const VectorF& v) { t.push_back({name, "F32", {v.size()}, f32_bytes(v.data(), v.size())}); };
    mat("model.embed_tokens.weight", w.tok_embed);
    for (std::size_t l = 0; l < w.layers.size(); ++l) {
        const LayerWeights& lw = w.layers[l];
        const std::string p = fmt::format("model.layers.{}.", l);
        vec(p + "input_layernorm.weight", lw.attn_norm);
        mat(p + "self_attn.q_proj.weight", kvlab::test::neighbours_to_halves(lw.wq.map(), 4));
        mat(p + "self_attn.k_proj.weight", kvlab::test::neighbours_to_halves(lw.wk.map(), 4));
        mat(p + "self_attn.v_proj.weight", lw.wv);
        mat(p + "self_attn.o_proj.weight", lw.wo);
        vec(p + "post_attention_layernorm.weight", lw.mlp_norm);
        mat(p + "mlp.gate_proj.weight", lw.w1);
        mat(p + "mlp.up_proj.weight", lw.w3);
        mat(p + "mlp.down_proj.weight", lw.w2);
    }
    vec("model.norm.weight", w.final_norm);
    edit(t);
    write_file(dir / "model.safetensors", safetensors(t));
}

// The shard index of a directory whose one shard is `shard` (a safetensors file's bytes), named
// model-00001-of-00001.safetensors as transformers names shards.
inline std::string shard_index_json(const std::string& shard) {
    std::uint64_t header_bytes = 0;
    std::memcpy(&header_bytes, shard.data(), 8);
    const nlohmann::json header = nlohmann::json::parse(shard.substr(8, header_bytes));
    nlohmann::json index = {{"metadata", {{"total_size", shard.size() - 8 - header_bytes}}}, {"weight_map", nlohmann::json::object()}};
    for (const auto& [name, entry] : header.items()) index["weight_map"][name] = "model-00001-of-00001.safetensors";
    return index.dump(2);
}

// A Hugging Face directory of the tiny model split as one shard plus an index (the index as given).
inline fs::path write_sharded_hf(const fs::path& dir, const Weights& w) {
    write_hf(dir, w, [](std::vector<StTensor>&) {});
    fs::rename(dir / "model.safetensors", dir / "model-00001-of-00001.safetensors");
    return dir;
}

// GGUF metadata, spelled from the spec (ggml-org/ggml docs/gguf.md) independently of kvlab's reader:
// "GGUF", version u32, tensor count u64, key/value count u64, then per pair a string key (u64 length +
// bytes), a u32 value type (4 u32, 5 i32, 7 bool, 8 string, 9 array, 10 u64) and the value. No tensors.
class GgufWriter {
public:
    GgufWriter& u32(const std::string& key, std::uint32_t v) { return kv(key, 4, [&] { put(body_, v); }); }
    GgufWriter& u64(const std::string& key, std::uint64_t v) { return kv(key, 10, [&] { put(body_, v); }); }
    GgufWriter& str(const std::string& key, const std::string& v) { return kv(key, 8, [&] { text(v); }); }
    GgufWriter& i32_array(const std::string& key, const std::vector<std::int32_t>& v) {
        return kv(key, 9, [&] {
            put<std::uint32_t>(body_, 5);
            put<std::uint64_t>(body_, v.size());
            for (const auto x : v) put(body_, x);
        });
    }
    GgufWriter& bool_array(const std::string& key, const std::vector<bool>& v) {
        return kv(key, 9, [&] {
            put<std::uint32_t>(body_, 7);
            put<std::uint64_t>(body_, v.size());
            for (const bool x : v) put<std::uint8_t>(body_, x ? 1 : 0);
        });
    }
    GgufWriter& str_array(const std::string& key, std::size_t n) {  // n strings "t0", "t1", ... (a vocabulary)
        return kv(key, 9, [&] {
            put<std::uint32_t>(body_, 8);
            put<std::uint64_t>(body_, n);
            for (std::size_t i = 0; i < n; ++i) text("t" + std::to_string(i));
        });
    }
    // a tensor info (name, shape, type) whose data is data_bytes zero bytes, each tensor's data aligned to 32
    // (offset: written instead of the real one, for broken files)
    GgufWriter& tensor(const std::string& name, const std::vector<std::uint64_t>& dims, std::uint32_t type, std::uint64_t data_bytes,
                       std::optional<std::uint64_t> offset = std::nullopt) {
        tensors_.push_back({name, dims, type, data_bytes, offset});
        return *this;
    }
    std::string bytes(std::uint32_t version = 3) const {
        std::string out = "GGUF";
        put(out, version);
        put<std::uint64_t>(out, tensors_.size());
        put<std::uint64_t>(out, n_kv_);
        out += body_;
        auto pad = [](std::uint64_t n) { return (32 - n % 32) % 32; };
        std::uint64_t offset = 0;
        for (const auto& t : tensors_) {
            put<std::uint64_t>(out, t.name.size());
            out += t.name;
            put<std::uint32_t>(out, static_cast<std::uint32_t>(t.dims.size()));
            for (const auto d : t.dims) put<std::uint64_t>(out, d);
            put<std::uint32_t>(out, t.type);
            put<std::uint64_t>(out, t.offset.value_or(offset));
            offset += t.data_bytes + pad(t.data_bytes);
        }
        if (!tensors_.empty()) out.append(pad(out.size()), '\0');
        for (const auto& t : tensors_) out.append(t.data_bytes + pad(t.data_bytes), '\0');
        return out;
    }

private:
    struct Tensor {
        std::string name;
        std::vector<std::uint64_t> dims;
        std::uint32_t type;
        std::uint64_t data_bytes;
        std::optional<std::uint64_t> offset;
    };
    std::vector<Tensor> tensors_;
    template <typename F>
    GgufWriter& kv(const std::string& key, std::uint32_t type, F value) {
        text(key);
        put(body_, type);
        value();
        ++n_kv_;
        return *this;
    }
    void text(const std::string& s) {
        put<std::uint64_t>(body_, s.size());
        body_ += s;
    }
    std::string body_;
    std::uint64_t n_kv_ = 0;
};

// Llama-3-8B's shape as llama.cpp's convert_hf_to_gguf.py writes it (metadata only).
inline std::string gguf_llama3_8b() {
    return GgufWriter()
        .str("general.architecture", "llama")
        .str("general.name", "Meta Llama 3 8B")
        .u32("llama.block_count", 32)
        .u32("llama.context_length", 8192)
        .u32("llama.embedding_length", 4096)
        .u32("llama.feed_forward_length", 14336)
        .u32("llama.attention.head_count", 32)
        .u32("llama.attention.head_count_kv", 8)
        .u32("llama.vocab_size", 128256)
        .bytes();
}

}  // namespace kvlab::fixtures
