// Loaders: llama2.c checkpoints, tokenizer.bin, safetensors and HF directories, fp16/bf16 widening.
// Every file is built here, in a temporary directory, from numbers the checks then expect back.
#include <doctest/doctest.h>

#include <optional>
#include <Eigen/Core>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvlab/formats/checkpoint.hpp"
#include "kvlab/core/error.hpp"
#include "formats/hf_checkpoint.hpp"
#include "formats/llama2c_checkpoint.hpp"
#include "kvlab/core/huge_pages.hpp"
#include "kvlab/core/mapped_file.hpp"
#include "formats/safetensors.hpp"
#include "kvlab/formats/tokenizer.hpp"
#include "test_files.hpp"

namespace fs = std::filesystem;
using namespace kvlab;

namespace {

// A scratch directory per test, removed at the end.
struct TempDir : kvlab::test::TempDir {
    TempDir() : kvlab::test::TempDir("kvlab-test-loaders") {}
};

// Little-endian byte building (the test host is little-endian, as the loaders require).
struct Bytes {
    std::string data;
    template <typename T>
    void put(T value) {
        char raw[sizeof(T)];
        std::memcpy(raw, &value, sizeof(T));
        data.append(raw, sizeof(T));
    }
    void i32(std::int32_t v) { put(v); }
    void u32(std::uint32_t v) { put(v); }
    void f32(float v) { put(v); }
    void u16(std::uint16_t v) { put(v); }
    void u64(std::uint64_t v) { put(v); }
};

void write_file(const fs::path& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    REQUIRE(out.good());
}

std::string read_file(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

bool contains(const std::string& haystack, const std::string& needle) { return haystack.find(needle) != std::string::npos; }

// The FormatError message `f` throws, or a marker that makes the caller's CHECKs fail.
std::string format_error(const std::function<void()>& f) {
    try {
        f();
    } catch (const FormatError& e) {
        return e.what();
    }
    return "<no FormatError thrown>";
}

// ---------------------------------------------------------------- llama2.c

// Tiny llama2.c shape: d 8, f 12, L 2, H 2, Hkv 1 (D 4, d_kv 4), V 10, seq_len 4.
struct TinyDims {
    std::int32_t dim = 8, hidden = 12, layers = 2, heads = 2, kv_heads = 1, vocab = 10, seq_len = 4;
};

// Each tensor gets a tag; element i of tensor `tag` holds tag + i/1024 (exact in fp32 for these sizes).
enum Kind { k_embed, k_attn_norm, k_wq, k_wk, k_wv, k_wo, k_mlp_norm, k_w1, k_w2, k_w3, k_final, k_rope, k_cls };
int tag_of(Kind kind, int layer = 0) { return static_cast<int>(kind) * 4 + layer + 1; }
float tagged(int tag, std::int64_t i) { return static_cast<float>(tag) + static_cast<float>(i) / 1024.0f; }

void put_tensor(Bytes& b, Kind kind, int layer, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) b.f32(tagged(tag_of(kind, layer), i));
}

void put_per_layer(Bytes& b, const TinyDims& t, Kind kind, std::int64_t n) {
    for (int l = 0; l < t.layers; ++l) put_tensor(b, kind, l, n);
}

std::int64_t tensor_size(const TinyDims& t, Kind kind) {
    const std::int64_t d = t.dim, kv = t.dim / t.heads * t.kv_heads, f = t.hidden;
    switch (kind) {
        case k_embed: case k_cls: return t.vocab * d;
        case k_attn_norm: case k_mlp_norm: case k_final: return d;
        case k_wq: case k_wo: return d * d;
        case k_wk: case k_wv: return kv * d;
        case k_w1: case k_w2: case k_w3: return f * d;
        case k_rope: return t.seq_len * (t.dim / t.heads) / 2;
    }
    return 0;
}

// Writes the v0 layout from formats.md: header, then each tensor for all layers in turn.
std::string tiny_v0(const TinyDims& t, bool tied) {
    Bytes b;
    for (std::int32_t v : {t.dim, t.hidden, t.layers, t.heads, t.kv_heads, tied ? t.vocab : -t.vocab, t.seq_len}) b.i32(v);
    put_tensor(b, k_embed, 0, tensor_size(t, k_embed));
    for (Kind k : {k_attn_norm, k_wq, k_wk, k_wv, k_wo, k_mlp_norm, k_w1, k_w2, k_w3}) put_per_layer(b, t, k, tensor_size(t, k));
    put_tensor(b, k_final, 0, tensor_size(t, k_final));
    put_tensor(b, k_rope, 0, tensor_size(t, k_rope));  // freq_cis_real
    put_tensor(b, k_rope, 1, tensor_size(t, k_rope));  // freq_cis_imag
    if (!tied) put_tensor(b, k_cls, 0, tensor_size(t, k_cls));
    return b.data;
}

// Writes the v1 layout: 256-byte header, norms first, then embeddings and matrices.
std::string tiny_v1(const TinyDims& t, bool tied) {
    Bytes b;
    b.u32(0x616b3432);
    b.i32(1);
    for (std::int32_t v : {t.dim, t.hidden, t.layers, t.heads, t.kv_heads, t.vocab, t.seq_len}) b.i32(v);
    b.data.push_back(tied ? 1 : 0);
    b.data.resize(256, '\0');
    put_per_layer(b, t, k_attn_norm, tensor_size(t, k_attn_norm));
    put_per_layer(b, t, k_mlp_norm, tensor_size(t, k_mlp_norm));
    put_tensor(b, k_final, 0, tensor_size(t, k_final));
    put_tensor(b, k_embed, 0, tensor_size(t, k_embed));
    for (Kind k : {k_wq, k_wk, k_wv, k_wo, k_w1, k_w2, k_w3}) put_per_layer(b, t, k, tensor_size(t, k));
    if (!tied) put_tensor(b, k_cls, 0, tensor_size(t, k_cls));
    return b.data;
}

// Every element of `m` (row-major) equals tagged(tag, i), and the shape is (rows, cols).
bool holds_tag(const WeightMatrix& m, int tag, std::int64_t rows, std::int64_t cols) {
    if (m.rows() != rows || m.cols() != cols) return false;
    for (std::int64_t i = 0; i < m.size(); ++i)
        if (m.data()[i] != tagged(tag, i)) return false;
    return true;
}
bool holds_tag(const VectorF& v, int tag, std::int64_t n) {
    if (v.size() != n) return false;
    for (std::int64_t i = 0; i < n; ++i)
        if (v[i] != tagged(tag, i)) return false;
    return true;
}

void check_tiny(const LoadedModel& m, const TinyDims& t, bool tied) {
    const ModelConfig& c = m.config;
    CHECK(c.family == Family::llama);
    CHECK(c.model_type == "llama");
    CHECK(c.n_layer == 2);
    CHECK(c.d_model == 8);
    CHECK(c.n_head == 2);
    CHECK(c.n_head_kv == 1);
    CHECK(c.d_head == 4);  // 8 / 2
    CHECK(c.d_ff == 12);
    CHECK(c.n_vocab == 10);
    CHECK(c.n_ctx_max == 4);
    CHECK(c.rope_theta == 10000.0);
    CHECK(c.norm_eps == 1e-5);
    CHECK(c.tied_embeddings == tied);
    const Weights& w = m.weights;
    CHECK(w.rope_pairing == RopePairing::neighbours);
    CHECK(holds_tag(w.tok_embed, tag_of(k_embed), 10, 8));
    REQUIRE(w.layers.size() == 2);
    for (int l = 0; l < 2; ++l) {
        const LayerWeights& lw = w.layers[static_cast<std::size_t>(l)];
        CHECK(holds_tag(lw.attn_norm, tag_of(k_attn_norm, l), 8));
        CHECK(holds_tag(lw.wq, tag_of(k_wq, l), 8, 8));
        CHECK(holds_tag(lw.wk, tag_of(k_wk, l), 4, 8));
        CHECK(holds_tag(lw.wv, tag_of(k_wv, l), 4, 8));
        CHECK(holds_tag(lw.wo, tag_of(k_wo, l), 8, 8));
        CHECK(holds_tag(lw.mlp_norm, tag_of(k_mlp_norm, l), 8));
        CHECK(holds_tag(lw.w1, tag_of(k_w1, l), 12, 8));
        CHECK(holds_tag(lw.w2, tag_of(k_w2, l), 8, 12));
        CHECK(holds_tag(lw.w3, tag_of(k_w3, l), 12, 8));
        CHECK(lw.bq.size() == 0);
    }
    CHECK(holds_tag(w.final_norm, tag_of(k_final), 8));
    if (tied) {
        CHECK(w.lm_head.size() == 0);
        CHECK(&w.classifier() == &w.tok_embed);
    } else {
        CHECK(holds_tag(w.lm_head, tag_of(k_cls), 10, 8));
    }
    CHECK(t.dim == 8);
}

bool same_weights(const Weights& a, const Weights& b) {
    const auto eq = [](const auto& x, const auto& y) {
        return x.rows() == y.rows() && x.cols() == y.cols() &&
               (x.size() == 0 || std::memcmp(x.data(), y.data(), static_cast<std::size_t>(x.size()) * sizeof(float)) == 0);
    };
    if (!eq(a.tok_embed, b.tok_embed) || !eq(a.final_norm, b.final_norm) || !eq(a.lm_head, b.lm_head)) return false;
    if (a.layers.size() != b.layers.size()) return false;
    for (std::size_t i = 0; i < a.layers.size(); ++i) {
        const LayerWeights &x = a.layers[i], &y = b.layers[i];
        if (!eq(x.attn_norm, y.attn_norm) || !eq(x.wq, y.wq) || !eq(x.wk, y.wk) || !eq(x.wv, y.wv) || !eq(x.wo, y.wo) ||
            !eq(x.mlp_norm, y.mlp_norm) || !eq(x.w1, y.w1) || !eq(x.w2, y.w2) || !eq(x.w3, y.w3))
            return false;
    }
    return true;
}

}  // namespace

TEST_CASE("The llama2.c size function reproduces the stories15M file size") {
    ModelConfig c;
    c.n_layer = 6, c.d_model = 288, c.n_head = 6, c.n_head_kv = 6, c.d_head = 48, c.d_ff = 768, c.n_vocab = 32000;
    c.n_ctx_max = 256, c.tied_embeddings = true;
    // 28 + 4*(15,191,712 params + two RoPE tables of 256*48/2) = 60,816,028 (formats.md)
    CHECK(llama2c_file_bytes(c, Llama2cVersion::v0) == 60816028ull);
    // v1: 256-byte header and no RoPE tables: 256 + 4*15,191,712 = 60,767,104
    CHECK(llama2c_file_bytes(c, Llama2cVersion::v1) == 60767104ull);
}

TEST_CASE("A tied llama2.c v0 checkpoint loads every tensor as written") {
    TempDir dir;
    const TinyDims t;
    const fs::path path = dir / "tiny.bin";
    write_file(path, tiny_v0(t, true));
    const LoadedModel m = load_llama2c_checkpoint(path);
    check_tiny(m, t, true);
    CHECK(m.config.name == "tiny");
    CHECK(fs::file_size(path) == llama2c_file_bytes(m.config, Llama2cVersion::v0));
}

namespace {

// The matrices of a two-layer model placed in one huge-page arena the weights keep: views, in forward
// order (tok_embed, then layer 0's wq wk wv wo w1 w3 w2, then layer 1's, then the classifier), each
// right after the last one's footprint, the first on a huge-page boundary.
void check_forward_arena(const Weights& w) {
    REQUIRE(w.backing != nullptr);
    const LayerWeights& l0 = w.layers[0];
    const LayerWeights& l1 = w.layers[1];
    for (const WeightMatrix* x : {&w.tok_embed, &l0.wq, &l1.w2, &w.lm_head}) CHECK(x->is_view());
    auto at = [](const WeightMatrix& m) { return reinterpret_cast<std::uintptr_t>(m.data()); };
    auto after = [&](const WeightMatrix& prev) { return at(prev) + HugeArena::footprint(static_cast<std::size_t>(prev.size()) * sizeof(float)); };
    CHECK(at(w.tok_embed) % huge_page_bytes == 0);
    CHECK(at(l0.wq) == after(w.tok_embed));
    CHECK(at(l0.wk) == after(l0.wq));
    CHECK(at(l0.wv) == after(l0.wk));
    CHECK(at(l0.wo) == after(l0.wv));
    CHECK(at(l0.w1) == after(l0.wo));
    CHECK(at(l0.w3) == after(l0.w1));
    CHECK(at(l0.w2) == after(l0.w3));
    CHECK(at(l1.wq) == after(l0.w2));
    CHECK(at(w.lm_head) == after(l1.w2));
}

}  // namespace

TEST_CASE("A llama2.c checkpoint's matrices are copied into one huge-page arena, in forward order, kept by the weights") {
    TempDir dir;
    const TinyDims t;
    const fs::path path = dir / "tiny.bin";
    write_file(path, tiny_v0(t, false));
    const Weights w = load_llama2c_checkpoint(path).weights;
    check_forward_arena(w);  // forward order, whatever the file's (v0 stores each tensor for all layers in turn)
    const LayerWeights& l1 = w.layers[1];
    // a copy, not a view of the file: the values stay when the file's bytes change (the same size, so a
    // mapping of it would show the new bytes)
    const std::string original = read_file(path);
    write_file(path, std::string(original.size(), '\0'));
    CHECK(holds_tag(w.tok_embed, tag_of(k_embed), 10, 8));
    CHECK(holds_tag(l1.w2, tag_of(k_w2, 1), 8, 12));
    CHECK(holds_tag(w.lm_head, tag_of(k_cls), 10, 8));
}

TEST_CASE("WeightPlacement::mapped_file uses a llama2.c checkpoint's matrices in place, views into the mapping the weights keep") {
    TempDir dir;
    const TinyDims t;
    const fs::path path = dir / "tiny.bin";
    write_file(path, tiny_v0(t, false));
    std::optional<LoadedModel> m;
    m.emplace(load_llama2c_checkpoint(path, std::nullopt, WeightPlacement::mapped_file));
    const Weights w = m->weights;  // a copy shares the mapping
    m.reset();
    REQUIRE(w.mapped.size() == 1);
    CHECK(w.backing == nullptr);
    for (const WeightMatrix* x : {&w.tok_embed, &w.layers[0].wq, &w.layers[1].w2, &w.lm_head}) CHECK(x->is_view());
    // where the file has them: layer 0's wq after the 28-byte v0 header, tok_embed (10 x 8 floats) and both
    // layers' attn_norm (2 x 8): 28 + 4 * (80 + 16) = 412 bytes in
    const std::shared_ptr<const MappedFile> file = w.mapped.front();
    CHECK(reinterpret_cast<const std::byte*>(w.layers[0].wq.data()) == file->bytes().data() + 412);
    CHECK(holds_tag(w.tok_embed, tag_of(k_embed), 10, 8));
    CHECK(holds_tag(w.lm_head, tag_of(k_cls), 10, 8));
    // written to: a view becomes its own copy, the file untouched
    Weights changed = w;
    changed.layers[0].wq(0, 0) = 42.0f;
    CHECK_FALSE(changed.layers[0].wq.is_view());
    CHECK(w.layers[0].wq(0, 0) != 42.0f);
    // both placements hold the file's values
    const Weights copied = load_llama2c_checkpoint(path).weights;
    CHECK(copied.layers[0].wq == w.layers[0].wq);
    CHECK(copied.layers[1].w3 == w.layers[1].w3);
}

TEST_CASE("copy_mapped_matrices moves a checkpoint read in place into a huge-page arena and releases the mapping") {
    TempDir dir;
    const TinyDims t;
    const fs::path path = dir / "tiny.bin";
    write_file(path, tiny_v0(t, false));
    LoadedModel m = load_llama2c_checkpoint(path, std::nullopt, WeightPlacement::mapped_file);
    REQUIRE(m.weights.mapped.size() == 1);
    const std::weak_ptr<const MappedFile> file = m.weights.mapped.front();
    const float* wq_in_file = m.weights.layers[0].wq.data();
    copy_mapped_matrices(m.config, m.weights);
    CHECK(file.expired());  // nothing holds the mapping any more
    CHECK(m.weights.mapped.empty());
    CHECK(m.weights.layers[0].wq.data() != wq_in_file);
    check_forward_arena(m.weights);  // where WeightPlacement::huge_pages puts them
    // the file's values, no longer read from it
    write_file(path, std::string(fs::file_size(path), '\0'));
    CHECK(holds_tag(m.weights.tok_embed, tag_of(k_embed), 10, 8));
    CHECK(holds_tag(m.weights.layers[1].w2, tag_of(k_w2, 1), 8, 12));
    CHECK(holds_tag(m.weights.lm_head, tag_of(k_cls), 10, 8));
    // once moved, nothing is left to move
    const float* wq_in_arena = m.weights.layers[0].wq.data();
    copy_mapped_matrices(m.config, m.weights);
    CHECK(m.weights.layers[0].wq.data() == wq_in_arena);
}

TEST_CASE("An untied llama2.c v0 checkpoint (negative vocab_size) loads its separate classifier") {
    TempDir dir;
    const TinyDims t;
    const fs::path path = dir / "untied.bin";
    write_file(path, tiny_v0(t, false));
    check_tiny(load_llama2c_checkpoint(path), t, false);
}

TEST_CASE("llama2.c v1 ak42 checkpoints load, tied and untied") {
    TempDir dir;
    const TinyDims t;
    for (const bool tied : {true, false}) {
        CAPTURE(tied);
        const fs::path path = dir / (tied ? "v1tied.bin" : "v1untied.bin");
        write_file(path, tiny_v1(t, tied));
        const LoadedModel m = load_llama2c_checkpoint(path);
        check_tiny(m, t, tied);
        CHECK(fs::file_size(path) == llama2c_file_bytes(m.config, Llama2cVersion::v1));
    }
}

TEST_CASE("load_checkpoint dispatches a .bin file to the llama2.c reader and rejects a missing path") {
    TempDir dir;
    write_file(dir / "m.bin", tiny_v0(TinyDims{}, true));
    check_tiny(load_checkpoint(dir / "m.bin"), TinyDims{}, true);
    CHECK_THROWS_AS(load_checkpoint(dir / "absent.bin"), UsageError);
}

TEST_CASE("Saving llama2.c v0 and loading it back is bit-exact, and saving again gives the same bytes") {
    TempDir dir;
    const TinyDims t;
    for (const bool tied : {true, false}) {
        CAPTURE(tied);
        write_file(dir / "src.bin", tiny_v0(t, tied));
        const LoadedModel original = load_llama2c_checkpoint(dir / "src.bin");
        save_llama2c_v0(dir / "a.bin", original.config, original.weights);
        const LoadedModel again = load_llama2c_checkpoint(dir / "a.bin");
        CHECK(same_weights(original.weights, again.weights));
        CHECK(again.config.tied_embeddings == tied);
        CHECK(fs::file_size(dir / "a.bin") == llama2c_file_bytes(original.config, Llama2cVersion::v0));
        save_llama2c_v0(dir / "b.bin", again.config, again.weights);
        CHECK(read_file(dir / "a.bin") == read_file(dir / "b.bin"));
    }
    // The temporary files were renamed away: only the three files remain.
    int n_files = 0;
    for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir.path())) ++n_files;
    CHECK(n_files == 3);
}

TEST_CASE("Saving writes the legacy RoPE tables as cos and sin of pos * 10000^(-2i/D)") {
    TempDir dir;
    write_file(dir / "src.bin", tiny_v0(TinyDims{}, true));
    const LoadedModel m = load_llama2c_checkpoint(dir / "src.bin");
    save_llama2c_v0(dir / "out.bin", m.config, m.weights);
    const std::string bytes = read_file(dir / "out.bin");
    // The tables sit before the end of a tied file: (seq_len 4) x (D/2 = 2) floats each, cos then sin.
    const std::size_t table_floats = 4 * 2;
    const std::size_t cos_at = bytes.size() - 2 * table_floats * 4;
    const auto at = [&](std::size_t offset) {
        float v = 0;
        std::memcpy(&v, bytes.data() + offset, 4);
        return v;
    };
    // pos 3, i 1: angle = 3 * 10000^(-2/4) = 0.03
    CHECK(at(cos_at + (3 * 2 + 1) * 4) == static_cast<float>(std::cos(0.03)));
    CHECK(at(cos_at + table_floats * 4 + (3 * 2 + 1) * 4) == static_cast<float>(std::sin(0.03)));
}

TEST_CASE("Saving refuses models the llama2.c format cannot express") {
    TempDir dir;
    write_file(dir / "src.bin", tiny_v0(TinyDims{}, true));
    const LoadedModel m = load_llama2c_checkpoint(dir / "src.bin");
    ModelConfig other_theta = m.config;
    other_theta.rope_theta = 500000.0;
    CHECK_THROWS_AS(save_llama2c_v0(dir / "x.bin", other_theta, m.weights), ConfigError);
    ModelConfig gpt2 = m.config;
    gpt2.family = Family::gpt2;
    CHECK_THROWS_AS(save_llama2c_v0(dir / "x.bin", gpt2, m.weights), ConfigError);
    Weights biased = m.weights;
    biased.layers[1].bq = VectorF::Zero(8);
    CHECK_THROWS_AS(save_llama2c_v0(dir / "x.bin", m.config, biased), ConfigError);
    Weights short_layers = m.weights;
    short_layers.layers.pop_back();
    CHECK_THROWS_AS(save_llama2c_v0(dir / "x.bin", m.config, short_layers), ConfigError);
    CHECK_FALSE(fs::exists(dir / "x.bin"));
}

TEST_CASE("A llama2.c file whose size disagrees with its header is one FormatError naming file and sizes") {
    TempDir dir;
    const TinyDims t;
    const std::string good = tiny_v0(t, true);
    const fs::path path = dir / "bad.bin";

    write_file(path, good.substr(0, good.size() - 4));  // truncated by one float
    std::string msg = format_error([&] { load_llama2c_checkpoint(path); });
    CHECK(contains(msg, path.string()));
    CHECK(contains(msg, fmt::format("implies {} bytes, but the file has {} bytes", good.size(), good.size() - 4)));

    write_file(path, good + std::string(4, '\0'));  // trailing bytes
    msg = format_error([&] { load_llama2c_checkpoint(path); });
    CHECK(contains(msg, fmt::format("but the file has {} bytes", good.size() + 4)));

    // A positive vocab_size on a file that carries a classifier: the size fits the untied layout.
    std::string untied = tiny_v0(t, false);
    const std::int32_t positive_vocab = 10;
    std::memcpy(untied.data() + 5 * 4, &positive_vocab, 4);
    write_file(path, untied);
    msg = format_error([&] { load_llama2c_checkpoint(path); });
    CHECK(contains(msg, "untied"));

    write_file(path, good.substr(0, 20));  // shorter than the 28-byte header
    CHECK(contains(format_error([&] { load_llama2c_checkpoint(path); }), path.string()));
    write_file(path, "");
    CHECK(contains(format_error([&] { load_llama2c_checkpoint(path); }), "28-byte header"));

    const std::string v1 = tiny_v1(t, true);
    write_file(path, v1.substr(0, v1.size() - 1));
    CHECK(contains(format_error([&] { load_llama2c_checkpoint(path); }), "llama2.c v1"));
    write_file(path, v1.substr(0, 100));  // magic present, header cut short
    CHECK(contains(format_error([&] { load_llama2c_checkpoint(path); }), "256-byte header"));
}

TEST_CASE("llama2.c headers with absurd dimensions are FormatErrors, not allocations") {
    TempDir dir;
    const fs::path path = dir / "absurd.bin";
    const auto header_error = [&](TinyDims t, bool tied) {
        std::string bytes = tiny_v0(TinyDims{}, true);
        const std::int32_t values[7] = {t.dim, t.hidden, t.layers, t.heads, t.kv_heads, tied ? t.vocab : -t.vocab, t.seq_len};
        std::memcpy(bytes.data(), values, sizeof(values));
        write_file(path, bytes);
        return format_error([&] { load_llama2c_checkpoint(path); });
    };
    TinyDims t;
    t.dim = 0;
    CHECK(contains(header_error(t, true), "dim is 0"));
    t = TinyDims{};
    t.heads = 3;  // 8 % 3 != 0
    CHECK(contains(header_error(t, true), "n_heads (3) does not divide dim (8)"));
    t = TinyDims{};
    t.kv_heads = 3;
    CHECK(contains(header_error(t, true), "n_kv_heads (3) does not divide n_heads (2)"));
    t = TinyDims{};
    t.dim = 6;  // head size 3 is odd
    CHECK(contains(header_error(t, true), "odd"));
    t = TinyDims{};
    t.layers = -5;
    CHECK(contains(header_error(t, true), "n_layers is -5"));
    t = TinyDims{};
    t.vocab = std::numeric_limits<std::int32_t>::min();
    CHECK(contains(header_error(t, true), path.string()));
    t = TinyDims{};
    t.dim = 1 << 30, t.hidden = 1 << 30, t.layers = 1 << 16;  // 2^16 layers x 3 x 2^60 floats overflows 2^64
    CHECK(contains(header_error(t, true), "larger than 2^64 bytes"));
    t = TinyDims{};
    t.layers = std::numeric_limits<std::int32_t>::max();  // refused before a per-layer table of 2^31 entries is sized
    CHECK(contains(header_error(t, true), "n_layers is 2147483647; kvlab reads at most 65536 layers"));
    t = TinyDims{};
    t.hidden = 1 << 20;  // plausible dims, but the file is far too small
    CHECK(contains(header_error(t, true), "implies"));

    // v1 only reads version 1, and its shared-classifier flag is 0 or 1.
    std::string v1 = tiny_v1(TinyDims{}, true);
    v1[4] = 2;
    write_file(path, v1);
    CHECK(contains(format_error([&] { load_llama2c_checkpoint(path); }), "version 2"));
    v1 = tiny_v1(TinyDims{}, true);
    v1[36] = 7;
    write_file(path, v1);
    CHECK(contains(format_error([&] { load_llama2c_checkpoint(path); }), "shared_classifier byte is 7"));
}

// ---------------------------------------------------------------- fp16 / bf16

namespace {
// The widening the safetensors reader uses (Eigen 3.4's 16-bit floats).
float fp16_to_fp32(std::uint16_t bits) { return static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(bits)); }
float bf16_to_fp32(std::uint16_t bits) { return static_cast<float>(Eigen::numext::bit_cast<Eigen::bfloat16>(bits)); }
}  // namespace

TEST_CASE("fp16 widening (Eigen::half) gives the IEEE binary16 values, subnormals and specials included") {
    CHECK(fp16_to_fp32(0x3C00) == 1.0f);
    CHECK(fp16_to_fp32(0xC000) == -2.0f);
    CHECK(fp16_to_fp32(0x7BFF) == 65504.0f);                     // largest finite: (2 - 2^-10) * 2^15
    CHECK(fp16_to_fp32(0x3555) == 0.333251953125f);              // (1 + 341/1024) / 4
    CHECK(fp16_to_fp32(0x0400) == std::ldexp(1.0f, -14));        // smallest normal
    CHECK(fp16_to_fp32(0x0001) == std::ldexp(1.0f, -24));        // smallest subnormal
    CHECK(fp16_to_fp32(0x03FF) == std::ldexp(1023.0f, -24));     // largest subnormal
    CHECK(std::signbit(fp16_to_fp32(0x8000)));
    CHECK(fp16_to_fp32(0x8000) == 0.0f);
    CHECK(fp16_to_fp32(0x7C00) == std::numeric_limits<float>::infinity());
    CHECK(fp16_to_fp32(0xFC00) == -std::numeric_limits<float>::infinity());
    CHECK(std::isnan(fp16_to_fp32(0x7E00)));
    // Every finite pattern against sign * significand * 2^exponent computed with ldexp.
    int mismatches = 0;
    for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
        const std::uint32_t e = (bits >> 10) & 0x1f, m = bits & 0x3ff;
        if (e == 0x1f) continue;
        float want = e == 0 ? std::ldexp(static_cast<float>(m), -24) : std::ldexp(static_cast<float>(1024 + m), static_cast<int>(e) - 25);
        if (bits & 0x8000) want = -want;
        if (std::bit_cast<std::uint32_t>(fp16_to_fp32(static_cast<std::uint16_t>(bits))) != std::bit_cast<std::uint32_t>(want)) ++mismatches;
    }
    CHECK(mismatches == 0);
}

TEST_CASE("bf16 widening (Eigen::bfloat16) is the top half of an fp32") {
    CHECK(bf16_to_fp32(0x3F80) == 1.0f);
    CHECK(bf16_to_fp32(0x4049) == 3.140625f);  // pi truncated to 8 significant bits
    CHECK(bf16_to_fp32(0xC2F7) == -123.5f);
    CHECK(bf16_to_fp32(0x0001) == std::ldexp(1.0f, -133));  // smallest subnormal: 2^-126 * 2^-7
    CHECK(bf16_to_fp32(0xFF80) == -std::numeric_limits<float>::infinity());
    CHECK(std::isnan(bf16_to_fp32(0x7FC0)));
}

// ---------------------------------------------------------------- tokenizer

namespace {

// Tiny vocabulary: 0 <unk>, 1 BOS, 2 EOS, 3..258 the byte pieces <0x00>..<0xFF>, then
// 259 " ", 260 "a", 261 "b", 262 "c", 263 "ab" (-1), 264 " a" (-2), 265 "abc" (-1.5), 266 " ab" (-3), 267 "é",
// 268 "x", 269 "y", 270 "xy" (-1), 271 "yx" (-1).
// Scores in parentheses; the rest score 0 (only merged pieces' scores matter).
std::vector<std::pair<std::string, float>> tiny_vocab() {
    std::vector<std::pair<std::string, float>> v = {{"<unk>", 0.0f}, {"\n<s>\n", 0.0f}, {"\n</s>\n", 0.0f}};
    for (int b = 0; b < 256; ++b) v.emplace_back(fmt::format("<0x{:02X}>", b), 0.0f);
    for (const auto& [piece, score] : std::vector<std::pair<std::string, float>>{
             {" ", 0.0f}, {"a", 0.0f}, {"b", 0.0f}, {"c", 0.0f}, {"ab", -1.0f}, {" a", -2.0f}, {"abc", -1.5f}, {" ab", -3.0f},
             {"\xC3\xA9", 0.0f}, {"x", 0.0f}, {"y", 0.0f}, {"xy", -1.0f}, {"yx", -1.0f}})
        v.emplace_back(piece, score);
    return v;
}

std::string tokenizer_bytes(const std::vector<std::pair<std::string, float>>& vocab, std::uint32_t max_len) {
    Bytes b;
    b.u32(max_len);
    for (const auto& [piece, score] : vocab) {
        b.f32(score);
        b.i32(static_cast<std::int32_t>(piece.size()));
        b.data += piece;
    }
    return b.data;
}

}  // namespace

TEST_CASE("The tokenizer encodes by score-ordered merges, with dummy prefix, BOS and byte fallback") {
    TempDir dir;
    const auto vocab = tiny_vocab();
    write_file(dir / "tok.bin", tokenizer_bytes(vocab, 7));  // longest piece "\n</s>\n" / "<0x00>": 6, 7 allowed
    const Tokenizer tok = Tokenizer::load(dir / "tok.bin", static_cast<std::int64_t>(vocab.size()));
    REQUIRE(tok.n_vocab() == 272);
    CHECK(tok.piece(265) == "abc");
    CHECK(tok.score(264) == -2.0f);

    // "abc" -> " abc" -> [" ", a, b, c]; candidate pairs " a" (-2), "ab" (-1): merge "ab" -> [" ", ab, c];
    // pairs " ab" (-3), "abc" (-1.5): merge "abc" -> [" ", abc]; " abc" is no token: done.
    CHECK(tok.encode("abc") == std::vector<std::int32_t>{1, 259, 265});
    // "a ab" -> [" ", a, " ", a, b]; best "ab" (-1) at the end -> [" ", a, " ", ab];
    // then " a" (-2) beats " ab" (-3) -> [" a", " ", ab]; then " ab" -> [" a", " ab"].
    CHECK(tok.encode("a ab") == std::vector<std::int32_t>{1, 264, 266});
    // No pair of " ", b, a is a token.
    CHECK(tok.encode("ba", false) == std::vector<std::int32_t>{259, 261, 260});
    // "é" (C3 A9) is a token; "ñ" (C3 B1) is not, so its bytes fall back to 0xC3+3 = 198 and 0xB1+3 = 180.
    CHECK(tok.encode("\xC3\xA9\xC3\xB1") == std::vector<std::int32_t>{1, 259, 267, 198, 180});
    CHECK(tok.encode("", true) == std::vector<std::int32_t>{1});  // no dummy prefix for empty text
    CHECK(tok.encode("", false).empty());
    // "xyx" -> [" ", x, y, x]: "xy" and "yx" tie at -1; the leftmost pair merges -> [" ", xy, x].
    CHECK(tok.encode("xyx") == std::vector<std::int32_t>{1, 259, 270, 268});
    CHECK(tok.encode("c", true, true) == std::vector<std::int32_t>{1, 259, 262, 2});
}

TEST_CASE("The tokenizer decodes byte pieces to bytes and drops the leading space after BOS") {
    TempDir dir;
    const auto vocab = tiny_vocab();
    write_file(dir / "tok.bin", tokenizer_bytes(vocab, 7));
    const Tokenizer tok = Tokenizer::load(dir / "tok.bin", static_cast<std::int64_t>(vocab.size()));
    CHECK(tok.decode(1, 264) == "a");     // " a" right after BOS
    CHECK(tok.decode(260, 264) == " a");  // elsewhere the space stays
    CHECK(tok.decode(1, 3 + 0x41) == "A");  // <0x41>
    CHECK(tok.decode(5, 198) == "\xC3");    // <0xC3>: one raw byte
    CHECK(tok.decode(1, 0) == "<unk>");
    // Decoding what encode produced gives the text back (the dummy prefix is removed after BOS).
    const std::string text = "a ab\xC3\xA9\xC3\xB1 bc";
    const std::vector<std::int32_t> ids = tok.encode(text);
    std::string round_trip;
    for (std::size_t i = 1; i < ids.size(); ++i) round_trip += tok.decode(ids[i - 1], ids[i]);
    CHECK(round_trip == text);
    CHECK_THROWS_AS(tok.decode(1, 272), UsageError);
    CHECK_THROWS_AS(tok.decode(1, -1), UsageError);
}

TEST_CASE("Broken tokenizer files are FormatErrors naming the file and the offset") {
    TempDir dir;
    const auto vocab = tiny_vocab();
    const std::int64_t n = static_cast<std::int64_t>(vocab.size());
    const std::string good = tokenizer_bytes(vocab, 7);
    const fs::path path = dir / "tok.bin";

    write_file(path, good.substr(0, good.size() - 1));  // last token ("yx", 2 bytes) cut short
    std::string msg = format_error([&] { Tokenizer::load(path, n); });
    CHECK(contains(msg, path.string()));
    CHECK(contains(msg, fmt::format("truncated at offset {}", good.size() - 2)));

    write_file(path, good.substr(0, 2));
    CHECK(contains(format_error([&] { Tokenizer::load(path, n); }), "offset 0"));

    write_file(path, tokenizer_bytes(vocab, 5));  // "<unk>" fits in 5, "\n<s>\n" (5) too, "\n</s>\n" (6) does not
    msg = format_error([&] { Tokenizer::load(path, n); });
    CHECK(contains(msg, "token 2 at offset"));
    CHECK(contains(msg, "length 6; expected 1..5"));

    std::string zero_len = good;
    const std::int32_t zero = 0;
    std::memcpy(zero_len.data() + 4 + 4, &zero, 4);  // token 0's length field
    write_file(path, zero_len);
    CHECK(contains(format_error([&] { Tokenizer::load(path, n); }), "token 0 at offset 8 has length 0"));

    // max_token_length is an int: -1 was read as 2^32 - 1 (every length passed) and 0 gave "expected 1..0"
    for (const std::int32_t bad : {-1, 0}) {
        std::string header = good;
        std::memcpy(header.data(), &bad, 4);
        write_file(path, header);
        CHECK(contains(format_error([&] { Tokenizer::load(path, n); }), fmt::format("max_token_length at offset 0 is {}; expected a positive", bad)));
    }

    write_file(path, good);  // a model with a smaller vocabulary than the file
    CHECK(contains(format_error([&] { Tokenizer::load(path, n - 1); }), "more tokens than the model's vocabulary (271)"));
    CHECK(contains(format_error([&] { Tokenizer::load(path, n + 1); }), "truncated"));
}

TEST_CASE("Byte fallback outside a small vocabulary is a FormatError, not an out-of-range id") {
    const Tokenizer tok({"<unk>", "<s>", "</s>", " ", "x"}, {0, 0, 0, 0, 0}, "tiny");
    CHECK(tok.encode("x") == std::vector<std::int32_t>{1, 3, 4});
    CHECK(contains(format_error([&] { tok.encode("y"); }), "byte 0x79"));
}

// ---------------------------------------------------------------- safetensors

namespace {

struct StTensor {
    std::string name;
    std::string dtype;
    std::vector<std::int64_t> shape;
    std::string data;  // raw little-endian bytes
};

// 8-byte length, JSON header padded with spaces to a multiple of 8, tensors back to back.
std::string safetensors_bytes(const std::vector<StTensor>& tensors, const nlohmann::json& extra = nlohmann::json::object()) {
    nlohmann::json header = extra;
    std::string buffer;
    for (const auto& t : tensors) {
        header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {buffer.size(), buffer.size() + t.data.size()}}};
        buffer += t.data;
    }
    std::string text = header.dump();
    text.resize((text.size() + 7) / 8 * 8, ' ');
    Bytes b;
    b.u64(text.size());
    return b.data + text + buffer;
}

std::string raw_safetensors(const std::string& header, const std::string& buffer) {
    Bytes b;
    b.u64(header.size());
    return b.data + header + buffer;
}

// Values with at most 8 significant bits, so fp16 and bf16 hold them exactly; sign and value vary
// with the position, so a transposed or shifted read shows.
float hf_value(int tag, std::int64_t i) {
    const float v = static_cast<float>(tag) + static_cast<float>(i % 8) * 0.125f;
    return (i / 8) % 2 ? -v : v;
}

std::uint16_t to_bf16_exact(float v) {
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(v);
    REQUIRE((bits & 0xffffu) == 0);
    return static_cast<std::uint16_t>(bits >> 16);
}

// Normal numbers and zero only, with the low 13 mantissa bits zero: exact in fp16.
std::uint16_t to_fp16_exact(float v) {
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(v);
    const std::uint32_t sign = (bits >> 16) & 0x8000u;
    if ((bits & 0x7fffffffu) == 0) return static_cast<std::uint16_t>(sign);
    const int exponent = static_cast<int>((bits >> 23) & 0xffu) - 127 + 15;
    REQUIRE(exponent > 0);
    REQUIRE(exponent < 31);
    REQUIRE((bits & 0x1fffu) == 0);
    return static_cast<std::uint16_t>(sign | (static_cast<std::uint32_t>(exponent) << 10) | ((bits >> 13) & 0x3ffu));
}

StTensor make_tensor(const std::string& name, const std::string& dtype, std::vector<std::int64_t> shape, int tag) {
    std::int64_t n = 1;
    for (auto s : shape) n *= s;
    Bytes b;
    for (std::int64_t i = 0; i < n; ++i) {
        const float v = hf_value(tag, i);
        if (dtype == "F32") b.f32(v);
        else if (dtype == "BF16") b.u16(to_bf16_exact(v));
        else b.u16(to_fp16_exact(v));
    }
    return {name, dtype, std::move(shape), b.data};
}

bool holds_hf(const WeightMatrix& m, int tag, std::int64_t rows, std::int64_t cols) {
    if (m.rows() != rows || m.cols() != cols) return false;
    for (std::int64_t i = 0; i < m.size(); ++i)
        if (m.data()[i] != hf_value(tag, i)) return false;
    return true;
}
bool holds_hf(const VectorF& v, int tag, std::int64_t n) {
    if (v.size() != n) return false;
    for (std::int64_t i = 0; i < n; ++i)
        if (v[i] != hf_value(tag, i)) return false;
    return true;
}

// Tiny HF Llama: hidden 8, intermediate 12, 2 layers, 2 heads, 1 KV head (D 4), vocab 10.
void write_llama_config(const fs::path& dir, bool tied) {
    const nlohmann::json config = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"hidden_size", 8},
                                   {"intermediate_size", 12}, {"num_hidden_layers", 2}, {"num_attention_heads", 2},
                                   {"num_key_value_heads", 1}, {"vocab_size", 10}, {"max_position_embeddings", 16},
                                   {"rms_norm_eps", 1e-5}, {"rope_theta", 10000.0}, {"tie_word_embeddings", tied}};
    write_file(dir / "config.json", config.dump(2));
}

// All tensors of the tiny Llama, dtype per tensor chosen by `dtype_of(index)`; tags are 1, 2, 3, ... in this order.
std::vector<StTensor> llama_tensors(bool with_lm_head, const std::function<std::string(int)>& dtype_of) {
    std::vector<StTensor> out;
    int tag = 1;
    const auto add = [&](const std::string& name, std::vector<std::int64_t> shape) {
        out.push_back(make_tensor(name, dtype_of(tag), std::move(shape), tag));
        ++tag;
    };
    add("model.embed_tokens.weight", {10, 8});
    for (int l = 0; l < 2; ++l) {
        const std::string p = fmt::format("model.layers.{}.", l);
        add(p + "input_layernorm.weight", {8});
        add(p + "self_attn.q_proj.weight", {8, 8});
        add(p + "self_attn.k_proj.weight", {4, 8});
        add(p + "self_attn.v_proj.weight", {4, 8});
        add(p + "self_attn.o_proj.weight", {8, 8});
        add(p + "post_attention_layernorm.weight", {8});
        add(p + "mlp.gate_proj.weight", {12, 8});
        add(p + "mlp.up_proj.weight", {12, 8});
        add(p + "mlp.down_proj.weight", {8, 12});
    }
    add("model.norm.weight", {8});
    if (with_lm_head) add("lm_head.weight", {10, 8});
    return out;
}

void check_llama_weights(const LoadedModel& m, bool tied) {
    const Weights& w = m.weights;
    CHECK(m.config.family == Family::llama);
    CHECK(w.rope_pairing == RopePairing::halves);
    CHECK(holds_hf(w.tok_embed, 1, 10, 8));
    REQUIRE(w.layers.size() == 2);
    for (int l = 0; l < 2; ++l) {
        const LayerWeights& lw = w.layers[static_cast<std::size_t>(l)];
        const int base = 2 + 9 * l;  // tags follow llama_tensors' order
        CHECK(holds_hf(lw.attn_norm, base + 0, 8));
        CHECK(holds_hf(lw.wq, base + 1, 8, 8));
        CHECK(holds_hf(lw.wk, base + 2, 4, 8));
        CHECK(holds_hf(lw.wv, base + 3, 4, 8));
        CHECK(holds_hf(lw.wo, base + 4, 8, 8));
        CHECK(holds_hf(lw.mlp_norm, base + 5, 8));
        CHECK(holds_hf(lw.w1, base + 6, 12, 8));
        CHECK(holds_hf(lw.w3, base + 7, 12, 8));
        CHECK(holds_hf(lw.w2, base + 8, 8, 12));
    }
    CHECK(holds_hf(w.final_norm, 20, 8));
    if (tied) CHECK(w.lm_head.size() == 0);
    else CHECK(holds_hf(w.lm_head, 21, 10, 8));
}

}  // namespace

TEST_CASE("A safetensors file reads F32, F16 and BF16 tensors as the fp32 values written") {
    TempDir dir;
    const fs::path path = dir / "t.safetensors";
    write_file(path, safetensors_bytes({make_tensor("a", "F32", {2, 3}, 1), make_tensor("b", "F16", {3, 2}, 2),
                                        make_tensor("c", "BF16", {12}, 3), StTensor{"ids", "I64", {2}, std::string(16, '\0')}},
                                       {{"__metadata__", {{"format", "pt"}}}}));
    const SafetensorsFile file(path);
    CHECK(file.tensors().size() == 4);  // __metadata__ is not a tensor
    CHECK(holds_hf(file.read_matrix("a", 2, 3), 1, 2, 3));
    CHECK(holds_hf(file.read_matrix("b", 3, 2), 2, 3, 2));
    CHECK(holds_hf(file.read_vector("c", 12), 3, 12));
    CHECK(file.read_vector("c", 12)[9] == -3.125f);  // element 9: tag 3 + (9 % 8) * 0.125, negated for 8 <= i < 16
    CHECK(file.find("ids")->dtype == "I64");
    CHECK(contains(format_error([&] { file.read_vector("ids", 2); }), "has dtype 'I64'"));
    CHECK(contains(format_error([&] { file.read_matrix("a", 3, 2); }), "tensor 'a' has shape [2, 3]; expected [3, 2]"));
    CHECK(contains(format_error([&] { file.read_vector("zz", 4); }), "tensor 'zz' is missing"));
}

TEST_CASE("Malformed safetensors headers are FormatErrors naming the file") {
    TempDir dir;
    const fs::path path = dir / "bad.safetensors";
    const auto error_for = [&](const std::string& bytes) {
        write_file(path, bytes);
        const std::string msg = format_error([&] { SafetensorsFile file(path); });
        CHECK(contains(msg, path.string()));
        return msg;
    };
    const std::string buf16(16, '\0');
    CHECK(contains(error_for("abc"), "8-byte header length"));
    Bytes huge;
    huge.u64(1000);
    CHECK(contains(error_for(huge.data + "{}"), "header length is 1000 bytes, but only 2 bytes follow"));
    CHECK(contains(error_for(raw_safetensors("{\"a\": ", buf16)), "not valid JSON"));
    CHECK(contains(error_for(raw_safetensors("[1, 2]", buf16)), "not an object"));
    CHECK(contains(error_for(raw_safetensors(R"({"a":{"dtype":"F7","shape":[4],"data_offsets":[0,16]}})", buf16)),
                   "unknown dtype 'F7'"));
    CHECK(contains(error_for(raw_safetensors(R"({"a":{"dtype":"F32","shape":[5],"data_offsets":[0,16]}})", buf16)),
                   "needs 5 x 4 bytes"));
    CHECK(contains(error_for(raw_safetensors(R"({"a":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})", buf16)),
                   "inside the 16-byte data buffer"));
    CHECK(contains(error_for(raw_safetensors(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", buf16)),
                   "not an ordered range"));
    CHECK(contains(error_for(raw_safetensors(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", buf16)),
                   "not a non-negative integer"));
    CHECK(contains(error_for(raw_safetensors(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                                             buf16)),
                   "overlap"));
    CHECK(contains(error_for(raw_safetensors(R"({"a":{"dtype":"F32","shape":[4]}})", buf16)), "data_offsets"));
    CHECK(contains(error_for(raw_safetensors(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}})", buf16)),
                   "more than 2^64 values"));
}

TEST_CASE("A Hugging Face Llama directory with one F32 model.safetensors loads every tensor") {
    TempDir dir;
    write_llama_config(dir.path(), false);
    write_file(dir / "model.safetensors", safetensors_bytes(llama_tensors(true, [](int) { return "F32"; })));
    const LoadedModel m = load_hf_checkpoint(dir.path());
    CHECK(m.config.n_head_kv == 1);
    check_llama_weights(m, false);
    // F32 in kvlab's layout: the matrices are copied into one huge-page arena, as llama2.c checkpoints are
    check_forward_arena(m.weights);
    // a copy, not a view of the file: the values stay when the file's bytes change (the same size, so a
    // mapping of it would show the new bytes)
    const fs::path file = dir / "model.safetensors";
    const std::string original = read_file(file);
    write_file(file, std::string(original.size(), '\0'));
    check_llama_weights(m, false);
    write_file(file, original);
    check_llama_weights(load_checkpoint(dir.path()), false);  // the generic entry point picks the HF reader
    check_llama_weights(load_checkpoint(dir / "model.safetensors"), false);
}

namespace {

// Where a tensor's first byte lies in a safetensors file, read from the file as the format defines it:
// 8 bytes of header length n, n bytes of JSON, then the buffer its data_offsets index.
std::uint64_t st_offset(const fs::path& file, const std::string& name) {
    const std::string bytes = read_file(file);
    std::uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
    return 8 + n + header.at(name).at("data_offsets").at(0).get<std::uint64_t>();
}

}  // namespace

TEST_CASE("WeightPlacement::mapped_file reads a safetensors checkpoint's F32 matrices in place, across shards") {
    TempDir dir;
    write_llama_config(dir.path(), false);
    // shard 1: a 2-byte F16 tensor first, so the F32 embeddings start 2 bytes past a float (copied, not
    // read as floats there), another after them to bring layer 0's F32 matrices back onto 4-byte offsets
    // (views); shard 2: layer 1 and the rest, its up_proj BF16 (widened into a matrix of its own)
    const auto tensors = llama_tensors(true, [](int tag) { return tag == 18 ? "BF16" : "F32"; });  // 18: layer 1's up_proj (base 11 + 7)
    std::vector<StTensor> first = {make_tensor("pad.a", "F16", {1}, 30)}, second;
    nlohmann::json weight_map = nlohmann::json::object();
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        const bool in_first = i < 10;  // embeddings and layer 0
        (in_first ? first : second).push_back(tensors[i]);
        if (i == 0) first.push_back(make_tensor("pad.b", "F16", {1}, 31));
        weight_map[tensors[i].name] = in_first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    }
    const fs::path shard1 = dir / "model-00001-of-00002.safetensors", shard2 = dir / "model-00002-of-00002.safetensors";
    write_file(shard1, safetensors_bytes(first));
    write_file(shard2, safetensors_bytes(second));
    write_file(dir / "model.safetensors.index.json", nlohmann::json{{"weight_map", weight_map}}.dump());
    REQUIRE(st_offset(shard1, "model.embed_tokens.weight") % 4 == 2);
    REQUIRE(st_offset(shard1, "model.layers.0.self_attn.q_proj.weight") % 4 == 0);

    LoadedModel m = load_hf_checkpoint(dir.path(), std::nullopt, WeightPlacement::mapped_file);
    check_llama_weights(m, false);
    const Weights& w = m.weights;
    REQUIRE(w.mapped.size() == 2);  // both shards hold matrices read in place
    CHECK(w.mapped[0]->path() == shard1);
    CHECK(w.mapped[1]->path() == shard2);
    CHECK_FALSE(w.tok_embed.is_view());      // 2 bytes off a float
    CHECK_FALSE(w.layers[1].w3.is_view());   // BF16
    const auto in_file = [](const WeightMatrix& m, const MappedFile& f, std::uint64_t offset) {
        return m.is_view() && reinterpret_cast<const std::byte*>(m.data()) == f.bytes().data() + offset;
    };
    CHECK(in_file(w.layers[0].wq, *w.mapped[0], st_offset(shard1, "model.layers.0.self_attn.q_proj.weight")));
    CHECK(in_file(w.layers[0].w2, *w.mapped[0], st_offset(shard1, "model.layers.0.mlp.down_proj.weight")));
    CHECK(in_file(w.layers[1].wk, *w.mapped[1], st_offset(shard2, "model.layers.1.self_attn.k_proj.weight")));
    CHECK(in_file(w.lm_head, *w.mapped[1], st_offset(shard2, "lm_head.weight")));

    // in place: the views show the file's bytes as they are now (the same size, rewritten)
    const std::string original = read_file(shard2);
    write_file(shard2, std::string(original.size(), '\0'));
    CHECK(w.layers[1].wk(0, 0) == 0.0f);
    CHECK(w.lm_head(0, 0) == 0.0f);
    CHECK(holds_hf(w.layers[1].w3, 18, 12, 8));  // the widened copy keeps its values
    write_file(shard2, original);
    check_llama_weights(m, false);

    // moved into huge pages: every mapping released, the values the file's, no longer read from it
    const std::weak_ptr<const MappedFile> file1 = w.mapped[0], file2 = w.mapped[1];
    copy_mapped_matrices(m.config, m.weights);
    CHECK(file1.expired());
    CHECK(file2.expired());
    CHECK(m.weights.mapped.empty());
    REQUIRE(m.weights.backing != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(m.weights.layers[0].wq.data()) % 64 == 0);  // arena pieces start on a line
    write_file(shard1, std::string(read_file(shard1).size(), '\0'));
    write_file(shard2, std::string(original.size(), '\0'));
    check_llama_weights(m, false);

    // the default placement copies them at load: nothing mapped kept
    write_file(shard1, safetensors_bytes(first));
    write_file(shard2, original);
    const LoadedModel copied = load_hf_checkpoint(dir.path());
    CHECK(copied.weights.mapped.empty());
    check_llama_weights(copied, false);
}

TEST_CASE("A sharded Hugging Face directory with BF16 and F16 shards loads through the index") {
    TempDir dir;
    write_llama_config(dir.path(), false);
    const auto tensors = llama_tensors(true, [](int tag) { return tag <= 10 ? "BF16" : "F16"; });
    std::vector<StTensor> first, second;
    nlohmann::json weight_map = nlohmann::json::object();
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        const bool in_first = i < 10;  // embeddings and layer 0 in shard 1
        (in_first ? first : second).push_back(tensors[i]);
        weight_map[tensors[i].name] = in_first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    }
    write_file(dir / "model-00001-of-00002.safetensors", safetensors_bytes(first));
    write_file(dir / "model-00002-of-00002.safetensors", safetensors_bytes(second));
    write_file(dir / "model.safetensors.index.json", nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump());
    check_llama_weights(load_hf_checkpoint(dir.path()), false);

    // An index naming a shard that is not there, or outside the directory.
    weight_map["model.norm.weight"] = "model-00003-of-00002.safetensors";
    write_file(dir / "model.safetensors.index.json", nlohmann::json{{"weight_map", weight_map}}.dump());
    CHECK(contains(format_error([&] { load_hf_checkpoint(dir.path()); }), "does not exist"));
    weight_map["model.norm.weight"] = "../model-00002-of-00002.safetensors";
    write_file(dir / "model.safetensors.index.json", nlohmann::json{{"weight_map", weight_map}}.dump());
    CHECK(contains(format_error([&] { load_hf_checkpoint(dir.path()); }), "expected a file name in the same directory"));
    weight_map["model.norm.weight"] = "model-00001-of-00002.safetensors";  // exists, but holds no such tensor
    write_file(dir / "model.safetensors.index.json", nlohmann::json{{"weight_map", weight_map}}.dump());
    CHECK(contains(format_error([&] { load_hf_checkpoint(dir.path()); }), "which has no such tensor"));
}

TEST_CASE("A tied Hugging Face Llama has no lm_head; an untied one without lm_head is an error") {
    TempDir dir;
    write_llama_config(dir.path(), true);
    write_file(dir / "model.safetensors", safetensors_bytes(llama_tensors(false, [](int) { return "F32"; })));
    check_llama_weights(load_hf_checkpoint(dir.path()), true);
    write_llama_config(dir.path(), false);
    const std::string msg = format_error([&] { load_hf_checkpoint(dir.path()); });
    CHECK(contains(msg, (dir / "model.safetensors").string()));
    CHECK(contains(msg, "'lm_head.weight' is missing (expected shape [10, 8])"));
}

TEST_CASE("Missing tensors and shape mismatches in a Hugging Face directory name tensor and shapes") {
    TempDir dir;
    write_llama_config(dir.path(), false);
    auto tensors = llama_tensors(true, [](int) { return "F32"; });
    std::erase_if(tensors, [](const StTensor& t) { return t.name == "model.layers.1.mlp.up_proj.weight"; });
    write_file(dir / "model.safetensors", safetensors_bytes(tensors));
    std::string msg = format_error([&] { load_hf_checkpoint(dir.path()); });
    CHECK(contains(msg, (dir / "model.safetensors").string()));
    CHECK(contains(msg, "tensor 'model.layers.1.mlp.up_proj.weight' is missing (expected shape [12, 8])"));

    tensors = llama_tensors(true, [](int) { return "F32"; });
    for (auto& t : tensors)
        if (t.name == "model.layers.0.self_attn.k_proj.weight") t = make_tensor(t.name, "F32", {8, 4}, 99);
    write_file(dir / "model.safetensors", safetensors_bytes(tensors));
    msg = format_error([&] { load_hf_checkpoint(dir.path()); });
    CHECK(contains(msg, "tensor 'model.layers.0.self_attn.k_proj.weight' has shape [8, 4]; expected [4, 8]"));

    fs::remove(dir / "model.safetensors");
    CHECK(contains(format_error([&] { load_hf_checkpoint(dir.path()); }), "no model.safetensors"));
}

TEST_CASE("Saving HF weights as llama2.c v0 permutes wq and wk rows from halves to neighbour pairs") {
    TempDir dir;
    write_llama_config(dir.path(), false);
    write_file(dir / "model.safetensors", safetensors_bytes(llama_tensors(true, [](int) { return "F32"; })));
    const LoadedModel hf = load_hf_checkpoint(dir.path());
    save_llama2c_v0(dir / "converted.bin", hf.config, hf.weights);
    const LoadedModel c = load_llama2c_checkpoint(dir / "converted.bin");
    CHECK(c.weights.rope_pairing == RopePairing::neighbours);
    // D = 4: neighbour row 2i+j of each head is halves row j*2+i: rows (0,1,2,3) <- (0,2,1,3).
    const std::int64_t from[4] = {0, 2, 1, 3};
    for (std::size_t l = 0; l < 2; ++l) {
        for (std::int64_t head = 0; head < 2; ++head)
            for (std::int64_t r = 0; r < 4; ++r)
                CHECK(c.weights.layers[l].wq.row(head * 4 + r) == hf.weights.layers[l].wq.row(head * 4 + from[r]));
        for (std::int64_t r = 0; r < 4; ++r) CHECK(c.weights.layers[l].wk.row(r) == hf.weights.layers[l].wk.row(from[r]));
        CHECK(c.weights.layers[l].wv == hf.weights.layers[l].wv);
        CHECK(c.weights.layers[l].w2 == hf.weights.layers[l].w2);
    }
    CHECK(c.weights.lm_head == hf.weights.lm_head);
}

TEST_CASE("A GPT-2 safetensors directory loads with Conv1D weights transposed and c_attn split into q, k, v") {
    TempDir dir;
    // n_inner absent: d_ff = 4 * 8 = 32; tie_word_embeddings absent: tied (HF default).
    write_file(dir / "config.json",
               nlohmann::json{{"model_type", "gpt2"}, {"n_embd", 8}, {"n_head", 2}, {"n_layer", 1}, {"n_positions", 4},
                              {"vocab_size", 10}, {"layer_norm_epsilon", 1e-5}}
                   .dump());
    write_file(dir / "model.safetensors",
               safetensors_bytes({make_tensor("wte.weight", "F32", {10, 8}, 1), make_tensor("wpe.weight", "F32", {4, 8}, 2),
                                  make_tensor("h.0.ln_1.weight", "F32", {8}, 3), make_tensor("h.0.ln_1.bias", "F32", {8}, 4),
                                  make_tensor("h.0.attn.c_attn.weight", "F32", {8, 24}, 5),
                                  make_tensor("h.0.attn.c_attn.bias", "F32", {24}, 6),
                                  make_tensor("h.0.attn.c_proj.weight", "F32", {8, 8}, 7),
                                  make_tensor("h.0.attn.c_proj.bias", "F32", {8}, 8), make_tensor("h.0.ln_2.weight", "F32", {8}, 9),
                                  make_tensor("h.0.ln_2.bias", "F32", {8}, 10), make_tensor("h.0.mlp.c_fc.weight", "F32", {8, 32}, 11),
                                  make_tensor("h.0.mlp.c_fc.bias", "F32", {32}, 12),
                                  make_tensor("h.0.mlp.c_proj.weight", "F32", {32, 8}, 13),
                                  make_tensor("h.0.mlp.c_proj.bias", "F32", {8}, 14), make_tensor("ln_f.weight", "F32", {8}, 15),
                                  make_tensor("ln_f.bias", "F32", {8}, 16)}));
    const LoadedModel m = load_hf_checkpoint(dir.path());
    CHECK(m.config.family == Family::gpt2);
    const Weights& w = m.weights;
    CHECK(holds_hf(w.tok_embed, 1, 10, 8));
    CHECK(holds_hf(w.pos_embed, 2, 4, 8));
    REQUIRE(w.layers.size() == 1);
    const LayerWeights& l = w.layers[0];
    CHECK(holds_hf(l.attn_norm, 3, 8));
    CHECK(holds_hf(l.attn_norm_bias, 4, 8));
    // c_attn (in 8, out 24) element (c, o) is value index c*24 + o; wq/wk/wv (r, c) are outputs r, 8+r, 16+r.
    bool qkv_ok = true;
    for (std::int64_t r = 0; r < 8; ++r)
        for (std::int64_t c = 0; c < 8; ++c)
            qkv_ok = qkv_ok && l.wq(r, c) == hf_value(5, c * 24 + r) && l.wk(r, c) == hf_value(5, c * 24 + 8 + r) &&
                     l.wv(r, c) == hf_value(5, c * 24 + 16 + r);
    CHECK(qkv_ok);
    CHECK(l.bq[3] == hf_value(6, 3));
    CHECK(l.bk[3] == hf_value(6, 11));
    CHECK(l.bv[3] == hf_value(6, 19));
    CHECK(l.wo(2, 5) == hf_value(7, 5 * 8 + 2));  // transposed
    CHECK(holds_hf(l.bo, 8, 8));
    CHECK(holds_hf(l.mlp_norm, 9, 8));
    CHECK(holds_hf(l.mlp_norm_bias, 10, 8));
    REQUIRE(l.w1.rows() == 32);
    REQUIRE(l.w1.cols() == 8);
    CHECK(l.w1(30, 7) == hf_value(11, 7 * 32 + 30));
    CHECK(holds_hf(l.b1, 12, 32));
    REQUIRE(l.w2.rows() == 8);
    REQUIRE(l.w2.cols() == 32);
    CHECK(l.w2(7, 30) == hf_value(13, 30 * 8 + 7));
    CHECK(holds_hf(l.b2, 14, 8));
    CHECK(l.w3.size() == 0);
    CHECK(holds_hf(w.final_norm, 15, 8));
    CHECK(holds_hf(w.final_norm_bias, 16, 8));
    CHECK(w.lm_head.size() == 0);
}

TEST_CASE("A mapped file's bytes read the same after their pages are given back") {
    TempDir dir;
    const fs::path path = dir.path() / "pages.bin";
    const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    std::vector<std::uint8_t> data(3 * page + 100);
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(i * 7 + 3);
    {
        std::ofstream out(path, std::ios::binary);
        out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
    }
    const MappedFile file(path);
    auto same = [&] {
        return std::memcmp(file.bytes().data(), data.data(), data.size()) == 0;
    };
    REQUIRE(same());
    file.drop_pages(10, page * 2);             // partial first page kept, one whole page dropped
    CHECK(same());
    file.drop_pages(0, data.size());           // every whole page, the tail page kept
    CHECK(same());
    file.drop_pages(data.size() + 5, 100);     // beyond the end: nothing to do
    file.drop_pages(page, ~std::uint64_t{0});  // a length past the end stops at the end
    CHECK(same());
}

TEST_CASE("copy_file_ranges copies each span with pread, and names the file when one runs past its end") {
    TempDir dir;
    const fs::path path = dir / "spans.bin";
    std::vector<std::uint8_t> data(5000);
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(i * 13 + 5);
    {
        std::ofstream out(path, std::ios::binary);
        out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
    }
    std::vector<std::byte> a(100), b(4000);
    const std::vector<FileCopy> copies = {{4900, 100, a.data()}, {7, 4000, b.data()}};  // the tail, then from byte 7
    copy_file_ranges(path, copies, "test file");
    CHECK(std::memcmp(a.data(), data.data() + 4900, 100) == 0);
    CHECK(std::memcmp(b.data(), data.data() + 7, 4000) == 0);
    // 200 bytes from 4900 of a 5000-byte file: the read comes up short, an error naming the file and offsets
    std::vector<std::byte> c(200);
    const std::vector<FileCopy> past = {{4900, 200, c.data()}};
    try {
        copy_file_ranges(path, past, "test file");
        FAIL("expected IoError");
    } catch (const IoError& e) {
        const std::string what = e.what();
        CHECK(what.find("spans.bin") != std::string::npos);
        CHECK(what.find("ended at offset 5000") != std::string::npos);
    }
    CHECK_THROWS_AS(copy_file_ranges(dir / "missing.bin", copies, "test file"), InputError);
}

TEST_CASE("split_copies cuts the bytes into equal parts, in order, splitting a copy at a cut") {
    std::vector<std::byte> a(100), b(4000);
    const std::vector<FileCopy> copies = {{4900, 100, a.data()}, {7, 4000, b.data()}};  // 4100 bytes
    // two parts of 4100 / 2 = 2050 bytes: all of `a` and the first 1950 of `b`; then b's other 2050
    const auto two = split_copies(copies, 2);
    REQUIRE(two.size() == 2);
    REQUIRE(two[0].size() == 2);
    CHECK((two[0][0].offset == 4900 && two[0][0].bytes == 100 && two[0][0].dst == a.data()));
    CHECK((two[0][1].offset == 7 && two[0][1].bytes == 1950 && two[0][1].dst == b.data()));
    REQUIRE(two[1].size() == 1);
    CHECK((two[1][0].offset == 7 + 1950 && two[1][0].bytes == 2050 && two[1][0].dst == b.data() + 1950));
    // three parts: 4100 / 3 = 1366 bytes each, the last also the remainder 2 (1368)
    const auto three = split_copies(copies, 3);
    REQUIRE(three.size() == 3);
    std::vector<std::uint64_t> sizes;
    for (const auto& part : three) {
        std::uint64_t n = 0;
        for (const FileCopy& c : part) n += c.bytes;
        sizes.push_back(n);
    }
    CHECK(sizes == std::vector<std::uint64_t>{1366, 1366, 1368});
    CHECK((three[2].back().offset + three[2].back().bytes == 4007 && three[2].back().dst + three[2].back().bytes == b.data() + 4000));
    // one part is the list itself; more parts than bytes give one byte each; no bytes, no parts
    CHECK(split_copies(copies, 1).front().size() == 2);
    const std::vector<FileCopy> tiny = {{0, 3, a.data()}};
    CHECK(split_copies(tiny, 8).size() == 3);
    CHECK(split_copies(std::span<const FileCopy>(), 4).empty());
}

TEST_CASE("A mapped file is consumed in 1 MiB spans, in order, each readable while it is handed out") {
    TempDir dir;
    const fs::path path = dir.path() / "spans.bin";
    std::vector<std::uint8_t> data((5u << 19) + 300);  // 2.5 MiB + 300 B
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(i * 13 + 1);
    {
        std::ofstream out(path, std::ios::binary);
        out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
    }
    const MappedFile file(path);
    // bytes [100, 100 + 2.5 MiB): spans of 1 MiB, 1 MiB and 0.5 MiB starting 0, 1 MiB and 2 MiB in
    std::vector<std::uint8_t> copy;
    std::vector<std::uint64_t> starts, sizes;
    file.consume(100, 5u << 19, [&](std::uint64_t done, std::span<const std::byte> chunk) {
        starts.push_back(done);
        sizes.push_back(chunk.size());
        const auto* b = reinterpret_cast<const std::uint8_t*>(chunk.data());
        copy.insert(copy.end(), b, b + chunk.size());
    });
    CHECK(starts == std::vector<std::uint64_t>{0, 1u << 20, 2u << 20});
    CHECK(sizes == std::vector<std::uint64_t>{1u << 20, 1u << 20, 1u << 19});
    CHECK(std::equal(copy.begin(), copy.end(), data.begin() + 100));
    CHECK(std::memcmp(file.bytes().data(), data.data(), data.size()) == 0);  // still readable after the drops
}

TEST_CASE("llama2.c v2 (runq.c's int8 file): header, sizes and two groups quantized by hand") {
    TempDir dir;
    write_file(dir / "src.bin", tiny_v0(TinyDims{}, true));
    LoadedModel m = load_llama2c_checkpoint(dir / "src.bin");
    // the group size halves from 64 until it divides dim 8 and hidden 12: 4. tok_embed row 0 holds the
    // first two groups.
    const std::array<float, 8> row{0.75f, -1.0f, 0.25f, 0.0f, 0.1f, 0.2f, 0.3f, 0.5f};
    for (int i = 0; i < 8; ++i) m.weights.tok_embed(0, i) = row[static_cast<std::size_t>(i)];
    save_llama2c_v2(dir / "q.bin", m.config, m.weights);
    const std::string bytes = read_file(dir / "q.bin");
    // 256 header + norms (2 layers x 8 + 2 x 8 + 8 = 40 floats) = 416; then int8 values + one fp32 scale
    // per 4: tok_embed 80 + 80; per layer wq 64 + 64, wk 32 + 32, wv 64, wo 128, w1/w2/w3 96 + 96 each = 960;
    // tied: no classifier. 416 + 160 + 2 x 960 = 2496
    CHECK(bytes.size() == 2496);
    auto i32 = [&](std::size_t at) {
        std::int32_t v = 0;
        std::memcpy(&v, bytes.data() + at, 4);
        return v;
    };
    auto f32 = [&](std::size_t at) {
        float v = 0;
        std::memcpy(&v, bytes.data() + at, 4);
        return v;
    };
    CHECK(static_cast<std::uint32_t>(i32(0)) == 0x616b3432u);  // "ak42"
    CHECK(i32(4) == 2);
    CHECK(i32(8) == 8);    // dim
    CHECK(i32(12) == 12);  // hidden_dim
    CHECK(i32(28) == 10);  // vocab
    CHECK(i32(32) == 4);   // seq_len
    CHECK(bytes[36] == 1);  // shared classifier
    CHECK(i32(37) == 4);    // group size
    // group 0: scale 1 / 127, q = round(w x 127): 95.25, -127, 31.75, 0;
    // group 1: scale 0.5 / 127, q = round(w x 254): 25.4, 50.8, 76.2, 127
    const std::array<int, 8> q{95, -127, 32, 0, 25, 51, 76, 127};
    for (int i = 0; i < 8; ++i) CHECK(static_cast<int>(static_cast<std::int8_t>(bytes[416 + static_cast<std::size_t>(i)])) == q[static_cast<std::size_t>(i)]);
    CHECK(f32(416 + 80) == 1.0f / 127.0f);  // the scales follow tok_embed's 80 int8 values
    CHECK(f32(416 + 84) == 0.5f / 127.0f);
    // a weight int8 cannot hold is refused, not converted
    m.weights.layers[1].w2(0, 0) = NAN;
    CHECK_THROWS_AS(save_llama2c_v2(dir / "nan.bin", m.config, m.weights), ConfigError);
    CHECK(!fs::exists(dir / "nan.bin"));
}
