// Real-weight runs: a model built in memory from known numbers, written here in each checkpoint
// format (by this test's own writers, following formats.md), loaded back and run: the logits must
// be those of the in-memory model. Also the tokenizer's text rendering for streamed output.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvlab/formats/checkpoint.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/core/text.hpp"
#include "kvlab/kv/kv_cache.hpp"
#include "formats/llama2c_checkpoint.hpp"
#include "kvlab/calc/presets.hpp"
#include "kvlab/weights/random_weights.hpp"
#include "kvlab/sim/simulator.hpp"
#include "kvlab/formats/tokenizer.hpp"
#include "kvlab/model/transformer.hpp"
#include "sim_configs.hpp"
#include "test_files.hpp"

namespace fs = std::filesystem;
using namespace kvlab;

namespace {

// A scratch directory per test, removed at the end.
struct ScratchDir : kvlab::test::TempDir {
    ScratchDir() : kvlab::test::TempDir("kvlab-test-ckpt") {}
};

struct Out {
    std::string bytes;
    template <typename T>
    void put(T value) {
        char raw[sizeof(T)];
        std::memcpy(raw, &value, sizeof(T));
        bytes.append(raw, sizeof(T));
    }
    void floats(const float* data, std::int64_t n) { bytes.append(reinterpret_cast<const char*>(data), static_cast<std::size_t>(n) * 4); }
    void mat(const MatrixRM& m) { floats(m.data(), m.size()); }
    void vec(const VectorF& v) { floats(v.data(), v.size()); }
};

void write_file(const fs::path& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    REQUIRE(out.good());
}

// Tiny GQA Llama: d 24, 3 query heads, 1 KV head, D 8, f 40, V 50, 64 positions, 2 layers.
// Random matrices with a large sigma, and norm weights that are not all 1, so every tensor matters.
Weights known_llama_weights(const ModelConfig& cfg, std::uint64_t seed) {
    Weights w = random_weights(cfg, seed, 0.3f);
    for (std::size_t l = 0; l < w.layers.size(); ++l)
        for (std::int64_t i = 0; i < cfg.d_model; ++i) {
            w.layers[l].attn_norm[i] = 1.0f + 0.25f * std::sin(static_cast<float>(i + 7 * l));
            w.layers[l].mlp_norm[i] = 1.0f + 0.25f * std::cos(static_cast<float>(i + 3 * l));
        }
    for (std::int64_t i = 0; i < cfg.d_model; ++i) w.final_norm[i] = 1.0f - 0.125f * std::sin(static_cast<float>(i));
    return w;
}

ModelConfig llama_config(bool tied) {
    ModelConfig c = kvlab::test::tiny_config(Family::llama, 3, 1);
    c.tied_embeddings = tied;
    return c;
}

// v0: 7 int32 (negative vocab = untied), tensors for all layers in turn, final norm, two RoPE tables
// (zeros: readers skip them), classifier when untied.
std::string llama2c_v0_bytes(const ModelConfig& c, const Weights& w) {
    const bool tied = w.lm_head.size() == 0;
    Out o;
    for (const std::int64_t v : {c.d_model, c.d_ff, c.n_layer, c.n_head, c.n_head_kv, tied ? c.n_vocab : -c.n_vocab, c.n_ctx_max})
        o.put(static_cast<std::int32_t>(v));
    o.mat(w.tok_embed.map());
    for (const auto& l : w.layers) o.vec(l.attn_norm);
    for (const auto& l : w.layers) o.mat(l.wq.map());
    for (const auto& l : w.layers) o.mat(l.wk.map());
    for (const auto& l : w.layers) o.mat(l.wv.map());
    for (const auto& l : w.layers) o.mat(l.wo.map());
    for (const auto& l : w.layers) o.vec(l.mlp_norm);
    for (const auto& l : w.layers) o.mat(l.w1.map());
    for (const auto& l : w.layers) o.mat(l.w2.map());
    for (const auto& l : w.layers) o.mat(l.w3.map());
    o.vec(w.final_norm);
    o.bytes.append(static_cast<std::size_t>(2 * c.n_ctx_max * (c.d_head / 2) * 4), '\0');
    if (!tied) o.mat(w.lm_head.map());
    return o.bytes;
}

// v1: "ak42", version 1, 7 int32, shared-classifier byte, zero padding to 256; norms first.
std::string llama2c_v1_bytes(const ModelConfig& c, const Weights& w) {
    const bool tied = w.lm_head.size() == 0;
    Out o;
    o.put(std::uint32_t{0x616b3432});
    o.put(std::int32_t{1});
    for (const std::int64_t v : {c.d_model, c.d_ff, c.n_layer, c.n_head, c.n_head_kv, c.n_vocab, c.n_ctx_max})
        o.put(static_cast<std::int32_t>(v));
    o.bytes.push_back(tied ? 1 : 0);
    o.bytes.resize(256, '\0');
    for (const auto& l : w.layers) o.vec(l.attn_norm);
    for (const auto& l : w.layers) o.vec(l.mlp_norm);
    o.vec(w.final_norm);
    o.mat(w.tok_embed.map());
    for (const auto& l : w.layers) o.mat(l.wq.map());
    for (const auto& l : w.layers) o.mat(l.wk.map());
    for (const auto& l : w.layers) o.mat(l.wv.map());
    for (const auto& l : w.layers) o.mat(l.wo.map());
    for (const auto& l : w.layers) o.mat(l.w1.map());
    for (const auto& l : w.layers) o.mat(l.w2.map());
    for (const auto& l : w.layers) o.mat(l.w3.map());
    if (!tied) o.mat(w.lm_head.map());
    return o.bytes;
}

struct StTensor {
    std::string name;
    std::vector<std::int64_t> shape;
    std::string data;  // F32 little-endian
};

StTensor st_mat(const std::string& name, const MatrixRM& m) {
    Out o;
    o.mat(m);
    return {name, {m.rows(), m.cols()}, o.bytes};
}
StTensor st_vec(const std::string& name, const VectorF& v) {
    Out o;
    o.vec(v);
    return {name, {v.size()}, o.bytes};
}

std::string safetensors_bytes(const std::vector<StTensor>& tensors) {
    nlohmann::json header = nlohmann::json::object();
    std::string buffer;
    for (const auto& t : tensors) {
        header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {buffer.size(), buffer.size() + t.data.size()}}};
        buffer += t.data;
    }
    // padded with spaces to a multiple of 8 bytes, as huggingface/safetensors writes it: the F32 data then
    // starts on a float and is read in place under WeightPlacement::mapped_file
    std::string text = header.dump();
    text.resize((text.size() + 7) / 8 * 8, ' ');
    Out o;
    o.put(static_cast<std::uint64_t>(text.size()));
    return o.bytes + text + buffer;
}

using kvlab::test::neighbours_to_halves;

void write_hf_llama(const fs::path& dir, const ModelConfig& c, const Weights& w) {
    fs::create_directories(dir);
    const bool tied = w.lm_head.size() == 0;
    write_file(dir / "config.json",
               nlohmann::json{{"model_type", "llama"}, {"hidden_size", c.d_model}, {"intermediate_size", c.d_ff},
                              {"num_hidden_layers", c.n_layer}, {"num_attention_heads", c.n_head},
                              {"num_key_value_heads", c.n_head_kv}, {"vocab_size", c.n_vocab},
                              {"max_position_embeddings", c.n_ctx_max}, {"rms_norm_eps", 1e-5}, {"rope_theta", 10000.0},
                              {"tie_word_embeddings", tied}}
                   .dump());
    std::vector<StTensor> t = {st_mat("model.embed_tokens.weight", w.tok_embed.map()), st_vec("model.norm.weight", w.final_norm)};
    for (std::size_t l = 0; l < w.layers.size(); ++l) {
        const LayerWeights& lw = w.layers[l];
        const std::string p = fmt::format("model.layers.{}.", l);
        t.push_back(st_vec(p + "input_layernorm.weight", lw.attn_norm));
        t.push_back(st_mat(p + "self_attn.q_proj.weight", neighbours_to_halves(lw.wq.map(), c.d_head)));
        t.push_back(st_mat(p + "self_attn.k_proj.weight", neighbours_to_halves(lw.wk.map(), c.d_head)));
        t.push_back(st_mat(p + "self_attn.v_proj.weight", lw.wv.map()));
        t.push_back(st_mat(p + "self_attn.o_proj.weight", lw.wo.map()));
        t.push_back(st_vec(p + "post_attention_layernorm.weight", lw.mlp_norm));
        t.push_back(st_mat(p + "mlp.gate_proj.weight", lw.w1.map()));
        t.push_back(st_mat(p + "mlp.up_proj.weight", lw.w3.map()));
        t.push_back(st_mat(p + "mlp.down_proj.weight", lw.w2.map()));
    }
    if (!tied) t.push_back(st_mat("lm_head.weight", w.lm_head.map()));
    write_file(dir / "model.safetensors", safetensors_bytes(t));
}

// GPT-2 stores Conv1D weights as (in, out) and q, k, v as one c_attn of (d, 3d).
void write_hf_gpt2(const fs::path& dir, const ModelConfig& c, const Weights& w) {
    fs::create_directories(dir);
    write_file(dir / "config.json",
               nlohmann::json{{"model_type", "gpt2"}, {"n_embd", c.d_model}, {"n_head", c.n_head}, {"n_layer", c.n_layer},
                              {"n_positions", c.n_ctx_max}, {"n_inner", c.d_ff}, {"vocab_size", c.n_vocab},
                              {"layer_norm_epsilon", c.norm_eps}}
                   .dump());
    std::vector<StTensor> t = {st_mat("wte.weight", w.tok_embed.map()), st_mat("wpe.weight", w.pos_embed.map()),
                               st_vec("ln_f.weight", w.final_norm), st_vec("ln_f.bias", w.final_norm_bias)};
    for (std::size_t l = 0; l < w.layers.size(); ++l) {
        const LayerWeights& lw = w.layers[l];
        const std::string p = fmt::format("h.{}.", l);
        MatrixRM qkv(3 * c.d_model, c.d_model);  // (3d, d) as kvlab keeps it: q rows, k rows, v rows
        qkv << lw.wq.map(), lw.wk.map(), lw.wv.map();
        VectorF qkv_bias(3 * c.d_model);
        qkv_bias << lw.bq, lw.bk, lw.bv;
        t.push_back(st_vec(p + "ln_1.weight", lw.attn_norm));
        t.push_back(st_vec(p + "ln_1.bias", lw.attn_norm_bias));
        t.push_back(st_mat(p + "attn.c_attn.weight", qkv.transpose()));
        t.push_back(st_vec(p + "attn.c_attn.bias", qkv_bias));
        t.push_back(st_mat(p + "attn.c_proj.weight", lw.wo.map().transpose()));
        t.push_back(st_vec(p + "attn.c_proj.bias", lw.bo));
        t.push_back(st_vec(p + "ln_2.weight", lw.mlp_norm));
        t.push_back(st_vec(p + "ln_2.bias", lw.mlp_norm_bias));
        t.push_back(st_mat(p + "mlp.c_fc.weight", lw.w1.map().transpose()));
        t.push_back(st_vec(p + "mlp.c_fc.bias", lw.b1));
        t.push_back(st_mat(p + "mlp.c_proj.weight", lw.w2.map().transpose()));
        t.push_back(st_vec(p + "mlp.c_proj.bias", lw.b2));
    }
    write_file(dir / "model.safetensors", safetensors_bytes(t));
}

const std::vector<TokenId> k_tokens = {1, 7, 42, 3, 19, 0, 49, 25};

// Logits of the last position: uncached over all tokens, and cached after a prefill of all but the
// last token plus one decode step. Returns both, uncached first.
std::pair<VectorF, VectorF> run_logits(const ModelConfig& cfg, const Weights& w) {
    Transformer model(cfg, w, static_cast<std::int64_t>(k_tokens.size()));
    const VectorF uncached = model.forward_uncached(k_tokens, nullptr);
    KvCache cache(cfg, static_cast<std::int64_t>(k_tokens.size()));
    const std::span<const TokenId> all(k_tokens);
    model.forward_cached(all.first(all.size() - 1), 0, cache, nullptr);
    const VectorF cached = model.forward_cached(all.last(1), static_cast<std::int64_t>(all.size()) - 1, cache, nullptr);
    return {uncached, cached};
}

double max_abs_diff(const VectorF& a, const VectorF& b) {
    REQUIRE(a.size() == b.size());
    return static_cast<double>((a - b).cwiseAbs().maxCoeff());
}

// Loaded model vs in-memory model: same logits in both modes, to `tolerance` (0: bit-exact).
void check_same_logits(const ModelConfig& cfg, const Weights& w, const LoadedModel& loaded, double tolerance) {
    const auto [ref_uncached, ref_cached] = run_logits(cfg, w);
    const auto [got_uncached, got_cached] = run_logits(loaded.config, loaded.weights);
    // the logits are not trivially small: a wrong tensor would show
    CHECK(ref_uncached.cwiseAbs().maxCoeff() > 0.1f);
    CHECK(max_abs_diff(ref_uncached, got_uncached) <= tolerance);
    CHECK(max_abs_diff(ref_cached, got_cached) <= tolerance);
    CHECK(argmax(ref_uncached) == argmax(got_uncached));
}

}  // namespace

TEST_CASE("llama2.c v0 and v1 files written from known weights give bit-identical logits, tied and untied") {
    ScratchDir dir;
    for (const bool tied : {true, false}) {
        CAPTURE(tied);
        const ModelConfig cfg = llama_config(tied);
        const Weights w = known_llama_weights(cfg, 11);
        REQUIRE((w.lm_head.size() == 0) == tied);
        write_file(dir / "v0.bin", llama2c_v0_bytes(cfg, w));
        write_file(dir / "v1.bin", llama2c_v1_bytes(cfg, w));
        // same weights, same pairing, same arithmetic: bit-exact
        check_same_logits(cfg, w, load_checkpoint(dir / "v0.bin"), 0.0);
        check_same_logits(cfg, w, load_checkpoint(dir / "v1.bin"), 0.0);
        CHECK(load_checkpoint(dir / "v0.bin").config.tied_embeddings == tied);
    }
}

TEST_CASE("A Hugging Face Llama directory (rotate-half rows) gives the logits of the same model in llama2.c form") {
    ScratchDir dir;
    for (const bool tied : {true, false}) {
        CAPTURE(tied);
        const ModelConfig cfg = llama_config(tied);
        const Weights w = known_llama_weights(cfg, 12);
        write_hf_llama(dir / (tied ? "hf_tied" : "hf_untied"), cfg, w);
        const LoadedModel hf = load_checkpoint(dir / (tied ? "hf_tied" : "hf_untied"));
        REQUIRE(hf.weights.rope_pairing == RopePairing::halves);
        // Permuted rows change the order of each q.k sum, so equal up to float rounding, not bit-exact.
        check_same_logits(cfg, w, hf, 1e-5);
        // read in place (as simulate reads it): the same logits
        const LoadedModel in_place = load_checkpoint(dir / (tied ? "hf_tied" : "hf_untied"), std::nullopt, WeightPlacement::mapped_file);
        REQUIRE(in_place.weights.mapped.size() == 1);
        CHECK(in_place.weights.layers[0].wq.is_view());
        check_same_logits(cfg, w, in_place, 1e-5);

        // Without the pairing switch (halves rows rotated as neighbours) the model is a different one:
        // the check above can fail.
        LoadedModel wrong = hf;
        wrong.weights.rope_pairing = RopePairing::neighbours;
        const auto [ref, ref_cached] = run_logits(cfg, w);
        const auto [bad, bad_cached] = run_logits(wrong.config, wrong.weights);
        CHECK(max_abs_diff(ref, bad) > 1e-3);

        // Saved as llama2.c v0 (rows permuted back to neighbours), it is bit-identical to the original.
        save_llama2c_v0(dir / "converted.bin", hf.config, hf.weights);
        check_same_logits(cfg, w, load_checkpoint(dir / "converted.bin"), 0.0);
    }
}

TEST_CASE("A GPT-2 safetensors directory (Conv1D, fused c_attn) gives the logits of the in-memory model") {
    ScratchDir dir;
    ModelConfig cfg = kvlab::test::tiny_config(Family::gpt2, 3, 3);
    cfg.tied_embeddings = true;
    Weights w = random_weights(cfg, 13, 0.3f);
    // non-zero biases and norm weights, so a misplaced one shows
    for (auto& l : w.layers)
        for (VectorF* v : {&l.attn_norm_bias, &l.bq, &l.bk, &l.bv, &l.bo, &l.mlp_norm_bias, &l.b1, &l.b2})
            for (std::int64_t i = 0; i < v->size(); ++i) (*v)[i] = 0.05f * std::sin(static_cast<float>(i + v->size()));
    for (std::int64_t i = 0; i < cfg.d_model; ++i) w.final_norm_bias[i] = 0.1f * std::cos(static_cast<float>(i));
    write_hf_gpt2(dir / "gpt2", cfg, w);
    const LoadedModel loaded = load_checkpoint(dir / "gpt2");
    REQUIRE(loaded.config.family == Family::gpt2);
    check_same_logits(cfg, w, loaded, 0.0);
    // read in place: the embeddings are views into the file (the rest transposed or sliced, so copied)
    const LoadedModel in_place = load_checkpoint(dir / "gpt2", std::nullopt, WeightPlacement::mapped_file);
    REQUIRE(in_place.weights.mapped.size() == 1);
    CHECK(in_place.weights.tok_embed.is_view());
    CHECK(in_place.weights.pos_embed.is_view());
    CHECK_FALSE(in_place.weights.layers[0].wq.is_view());
    // rows off a 64-byte line may be summed in another order (kernels/matmul.hpp): equal up to rounding
    check_same_logits(cfg, w, in_place, 1e-5);
}

TEST_CASE("Random-weight stories models saved as llama2.c v0 run identically from the file") {
    ScratchDir dir;
    // every stories preset is expressible: rope_theta 10000, eps 1e-5, n_head x d_head = d_model, no biases
    for (const char* name : {"stories260k", "stories15m", "stories42m", "stories110m"}) {
        CAPTURE(name);
        CHECK_NOTHROW(check_llama2c_v0_config(dir / "x.bin", load_model(name)));
    }
    // llama-3-8b's rope_theta 500000 has no field in v0: refused, naming the reason
    CHECK_THROWS_WITH_AS(check_llama2c_v0_config(dir / "x.bin", load_model("llama-3-8b")),
                         doctest::Contains("rope_theta is 500000"), ConfigError);

    // full stories260k, and stories15m cut to one layer (its 32000 x 288 embedding stays)
    for (const auto& model : {std::pair<const char*, std::int64_t>{"stories260k", 5}, {"stories15m", 1}}) {
        const char* name = model.first;  // not a structured binding: clang 14 cannot capture those (CAPTURE)
        const std::int64_t layers = model.second;
        CAPTURE(name);
        const ModelConfig cfg = simulation_config(load_model(name), layers);
        const Weights w = random_weights(cfg, 42);
        save_llama2c_v0(dir / "m.bin", cfg, w);
        CHECK(fs::file_size(dir / "m.bin") == llama2c_file_bytes(cfg, Llama2cVersion::v0));
        const LoadedModel loaded = load_checkpoint(dir / "m.bin");
        CHECK(loaded.config.n_layer == layers);
        check_same_logits(cfg, w, loaded, 0.0);

        SimulateOptions o;
        o.n_prompt = 4;
        o.n_steps = 6;
        const SimulationResult a = run_simulation(cfg, w, o);
        const SimulationResult b = run_simulation(loaded.config, loaded.weights, o);
        CHECK(a.prompt == b.prompt);
        CHECK(a.generated == b.generated);
        CHECK(b.max_abs_dlogit < 1e-3);  // cached and uncached agree on the loaded weights too
        CHECK_FALSE(b.first_divergent_step.has_value());

        // as simulate runs a checkpoint: read in place, every row 28 bytes past a cache line (the v0 header),
        // which the GEMV reads in aligned chunks, its sums in another order: the same tokens, the logits
        // within rounding of the copy's
        const LoadedModel in_place = load_checkpoint(dir / "m.bin", std::nullopt, WeightPlacement::mapped_file);
        REQUIRE(in_place.weights.mapped.size() == 1);
        CHECK(reinterpret_cast<std::uintptr_t>(in_place.weights.layers[0].wq.data()) % 64 == 28);
        const SimulationResult c = run_simulation(in_place.config, in_place.weights, o);
        CHECK(c.generated == a.generated);
        CHECK(c.max_abs_dlogit < 1e-3);
        check_same_logits(cfg, w, in_place, 1e-4);
    }
}

TEST_CASE("The config alone is read from a checkpoint without its tensors, with the same checks") {
    ScratchDir dir;
    const ModelConfig cfg = llama_config(false);
    const std::string bytes = llama2c_v0_bytes(cfg, known_llama_weights(cfg, 14));
    write_file(dir / "m.bin", bytes);
    const ModelConfig read = load_checkpoint_config(dir / "m.bin");
    CHECK(read.d_model == 24);
    CHECK(read.n_head_kv == 1);
    CHECK_FALSE(read.tied_embeddings);
    write_file(dir / "short.bin", bytes.substr(0, bytes.size() - 4));
    CHECK_THROWS_WITH_AS(load_checkpoint_config(dir / "short.bin"), doctest::Contains("but the file has"), FormatError);
    write_hf_llama(dir / "hf", cfg, known_llama_weights(cfg, 14));
    CHECK(load_checkpoint_config(dir / "hf").n_vocab == 50);
}

TEST_CASE("Streamed text drops an opening BOS, the space after BOS and control bytes, and keeps UTF-8 bytes") {
    // 0 <unk>, 1 BOS, 2 EOS, 3.. bytes 0x00..0xFF, 259 " hi", 260 " there"
    std::vector<std::string> pieces = {"<unk>", "\n<s>\n", "\n</s>\n"};
    for (int b = 0; b < 256; ++b) pieces.push_back(fmt::format("<0x{:02X}>", b));
    pieces.push_back(" hi");
    pieces.push_back(" there");
    const Tokenizer tok(pieces, std::vector<float>(pieces.size(), 0.0f), "tiny");
    TextDecoder d(tok);
    std::string text;
    // BOS, " hi" (space dropped after BOS), " there", <0x07> (bell: dropped), <0x0A> newline (kept),
    // <0xC3><0xA9> (é spelled byte by byte: kept)
    for (const TokenId id : {1, 259, 260, 3 + 0x07, 3 + 0x0A, 3 + 0xC3, 3 + 0xA9}) text += d.next(id);
    CHECK(text == "hi there\n\xC3\xA9");
    // a BOS later in the stream is an ordinary piece
    CHECK(d.next(1) == "\n<s>\n");
    CHECK(d.next(259) == "hi");
    CHECK_THROWS_AS(d.next(261), UsageError);

    CHECK(printable_piece("\x1b") == "");
    CHECK(printable_piece("\x7f") == "");
    CHECK(printable_piece("\t") == "\t");
    CHECK(printable_piece("\x1b[") == "\x1b[");  // only single bytes are filtered, as llama2.c does
}

TEST_CASE("Streamed text is always valid UTF-8: a character cut across tokens waits, stray bytes print U+FFFD") {
    // 0 <unk>, 1 BOS, 2 EOS, 3.. bytes 0x00..0xFF, 259 " hi"
    std::vector<std::string> pieces = {"<unk>", "\n<s>\n", "\n</s>\n"};
    for (int b = 0; b < 256; ++b) pieces.push_back(fmt::format("<0x{:02X}>", b));
    pieces.push_back(" hi");
    const Tokenizer tok(pieces, std::vector<float>(pieces.size(), 0.0f), "tiny");
    const std::string fffd = "\xEF\xBF\xBD";
    auto byte = [](int b) { return static_cast<TokenId>(3 + b); };
    TextDecoder d(tok);
    CHECK(d.next(1).empty());
    // U+0160 (Š) is C5 A0: nothing prints until its second byte comes
    CHECK(d.next(byte(0xC5)).empty());
    CHECK(d.next(byte(0xA0)) == "\xC5\xA0");
    // the stream <0xC5><0xC5>: the first lead byte is cut short by the second (one U+FFFD), which
    // then waits for a continuation that never comes: finish() prints its U+FFFD (not "\xc5\xc5")
    CHECK(d.next(byte(0xC5)).empty());
    CHECK(d.next(byte(0xC5)) == fffd);
    CHECK(d.next(259) == fffd + " hi");
    CHECK(d.finish().empty());
    // a lone continuation byte, and bytes no sequence starts with (C0, F5..FF): one U+FFFD each
    CHECK(d.next(byte(0x80)) == fffd);
    CHECK(d.next(byte(0xFF)) == fffd);
    // a 4-byte character (U+1F600, F0 9F 98 80) spelled over four tokens
    std::string text;
    for (const int b : {0xF0, 0x9F, 0x98, 0x80}) text += d.next(byte(b));
    CHECK(text == "\xF0\x9F\x98\x80");
    // E0 80 is an overlong start (E0 must be followed by A0..BF): U+FFFD for E0, U+FFFD for 80
    CHECK(d.next(byte(0xE0)).empty());
    CHECK(d.next(byte(0x80)) == fffd + fffd);
    // a cut-short sequence at the end of the stream
    CHECK(d.next(byte(0xE2)).empty());
    CHECK(d.next(byte(0x82)).empty());
    CHECK(d.finish() == fffd);
    CHECK(d.finish().empty());

    Utf8Stream u;
    CHECK(u.put("a\xC3") == "a");
    CHECK(u.put("\xA9" "b\xED\xA0\x80") == "\xC3\xA9" "b" + fffd + fffd + fffd);  // ED A0..: a surrogate, never valid
    CHECK(is_valid_utf8(u.put("\xF4\x90\x80\x80")));  // above U+10FFFF: replaced, valid output
}

TEST_CASE("Text for JSON keeps valid UTF-8 and replaces each stray byte with U+FFFD") {
    CHECK(to_valid_utf8("plain") == "plain");
    CHECK(to_valid_utf8("caf\xC3\xA9 \xF0\x9F\x98\x80") == "caf\xC3\xA9 \xF0\x9F\x98\x80");  // é, 😀
    CHECK(to_valid_utf8("a\xC3") == "a\xEF\xBF\xBD");                       // cut sequence
    CHECK(to_valid_utf8("\xA9z") == "\xEF\xBF\xBDz");                       // lone continuation byte
    CHECK(to_valid_utf8("\xC0\xAF") == "\xEF\xBF\xBD\xEF\xBF\xBD");         // overlong '/'
    CHECK(to_valid_utf8("\xED\xA0\x80") == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate U+D800
    CHECK(nlohmann::json(to_valid_utf8("x\xFFy")).dump() == "\"x\xEF\xBF\xBDy\"");
}

TEST_CASE("Loading the first N layers reads those layers and skips the rest, in every format") {
    ScratchDir dir;
    const ModelConfig cfg = llama_config(false);  // 2 layers, untied: the classifier comes after the skipped layer
    const Weights w = known_llama_weights(cfg, 15);
    write_file(dir / "v0.bin", llama2c_v0_bytes(cfg, w));
    write_file(dir / "v1.bin", llama2c_v1_bytes(cfg, w));
    write_hf_llama(dir / "hf", cfg, w);
    for (const char* name : {"v0.bin", "v1.bin", "hf"}) {
        CAPTURE(name);
        const LoadedModel one = load_checkpoint(dir / name, 1);
        CHECK(one.config.n_layer == 2);  // the config still describes the whole model
        REQUIRE(one.weights.layers.size() == 1);
        // the one-layer model built in memory from the same numbers: same logits
        const ModelConfig cfg1 = simulation_config(cfg, 1);
        Weights w1 = w;
        w1.layers.resize(1);
        ModelConfig loaded1 = one.config;
        loaded1.n_layer = 1;
        loaded1.layer_windowed.resize(1);
        const LoadedModel as_one{loaded1, one.weights};
        check_same_logits(cfg1, w1, as_one, std::string(name) == "hf" ? 1e-5 : 0.0);
        CHECK(one.weights.lm_head == w.lm_head);
        CHECK(one.weights.final_norm == w.final_norm);
        CHECK_THROWS_WITH_AS(load_checkpoint(dir / name, 3), doctest::Contains("--layers: 3; expected 1..2"), UsageError);
        CHECK_THROWS_AS(load_checkpoint(dir / name, 0), UsageError);
    }
}
