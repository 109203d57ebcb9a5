// Writes the files the checkpoint CLI test runs kvlab on: a tiny tokenizer.bin, tiny llama2.c and
// Hugging Face checkpoints, and broken variants of each; or, with --fuzz-seeds, the seed corpora of the
// fuzz targets (tests/fuzz). Usage: kvlab_make_fixtures DIR | kvlab_make_fixtures --fuzz-seeds DIR. Test-only.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <fstream>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "formats/llama2c_checkpoint.hpp"
#include "fixture_writers.hpp"
#include "kvlab/weights/random_weights.hpp"
#include "report/simulation_report.hpp"
#include "kvlab/sim/simulator.hpp"
#include "trace/step_trace.hpp"
#include "trace/serve_trace.hpp"
#include "test_files.hpp"

namespace fs = std::filesystem;
using namespace kvlab;

using namespace kvlab::fixtures;

namespace {

std::string slurp_file(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

// One seed directory per fuzz target (tests/fuzz/CMakeLists.txt names them), each holding valid files
// of its format, so mutations start from something the reader accepts. Small: each seed is under 50 KB.
void write_fuzz_seeds(const fs::path& dir) {
    for (const char* d : {"llama2c", "tokenizer", "safetensors", "shard_index", "trace_csv", "trace_jsonl", "trace_perfetto", "gguf",
                          "serve_csv", "serve_jsonl"})
        fs::create_directories(dir / d);
    const ModelConfig cfg = tiny_config();
    const Weights w = random_weights(cfg, 7, 0.5f);

    // llama2.c v0 as kvlab saves it; v1: the 256-byte "ak42" header, then zero weights of the exact size
    save_llama2c_v0(dir / "llama2c" / "tiny_v0.bin", cfg, w);
    std::string v1;
    put<std::uint32_t>(v1, llama2c_v1_magic);
    put<std::int32_t>(v1, 1);
    for (const std::int64_t v : {cfg.d_model, cfg.d_ff, cfg.n_layer, cfg.n_head, cfg.n_head_kv, cfg.n_vocab, cfg.n_ctx_max})
        put<std::int32_t>(v1, static_cast<std::int32_t>(v));
    v1.push_back('\1');  // shared classifier
    v1.resize(llama2c_file_bytes(cfg, Llama2cVersion::v1), '\0');
    write_file(dir / "llama2c" / "tiny_v1.bin", v1);

    // the tokenizer target's layout: uint16 vocabulary size, uint16 text length, text, tokenizer.bin
    for (const std::string text : {"hi hi there", "a\xC3\xA9z \xF0\x9F\x99\x82 hihi", ""}) {
        std::string seed;
        put<std::uint16_t>(seed, 512);
        put<std::uint16_t>(seed, static_cast<std::uint16_t>(text.size()));
        seed += text + tokenizer_512();
        write_file(dir / "tokenizer" / fmt::format("tok512_{}.seed", text.size()), seed);
    }

    write_hf(dir / "hf", w, [](std::vector<StTensor>&) {});
    fs::rename(dir / "hf" / "model.safetensors", dir / "safetensors" / "tiny.safetensors");
    fs::remove_all(dir / "hf");
    write_file(dir / "shard_index" / "index.json", shard_index_json(slurp_file(dir / "safetensors" / "tiny.safetensors")));

    // a 3-step trace of a tiny model in each format
    SimulateOptions o;
    o.n_prompt = 2;
    o.n_steps = 3;
    const SimulationResult r = run_simulation(cfg, w, o);
    const nlohmann::json inputs = {{"model", "tiny"}, {"steps", 3}};
    write_step_trace(dir / "trace_csv" / "run.csv", run_summary(cfg, o, r), r.records, inputs, false);
    write_step_trace(dir / "trace_jsonl" / "run.jsonl", run_summary(cfg, o, r), r.records, inputs, true);
    write_step_trace(dir / "trace_perfetto" / "run.json", run_summary(cfg, o, r), r.records, inputs, false);
    write_file(dir / "gguf" / "llama3-8b.gguf", gguf_llama3_8b());
    // a serve trace of three requests through a paged and a contiguous pool, measured and deterministic
    {
        const std::vector<ServeRequest> requests{{{1, 2, 3}, 2, 0}, {{4, 5}, 3, 1}, {{6, 7, 8, 9}, 1, 1}};
        std::vector<ServeOptions> runs(2);
        std::vector<ServeResult> results;
        for (std::size_t i = 0; i < runs.size(); ++i) {
            runs[i].pool = {i == 0 ? KvLayout::paged : KvLayout::contiguous, 32, 4, false};
            runs[i].max_model_len = 16;
            results.push_back(run_serving(cfg, w, requests, runs[i]));
        }
        const nlohmann::json serve_inputs = {{"model", "tiny"}, {"requests", 3}};
        write_serve_trace(dir / "serve_csv" / "serve.csv", runs, results, serve_inputs, false);
        write_serve_trace(dir / "serve_jsonl" / "serve.jsonl", runs, results, serve_inputs, true);
    }
    write_file(dir / "gguf" / "windows.gguf", GgufWriter()
                                                  .str("general.architecture", "gemma3")
                                                  .u32("gemma3.block_count", 6)
                                                  .u32("gemma3.embedding_length", 64)
                                                  .i32_array("gemma3.attention.head_count", {4, 4, 4, 4, 4, 4})
                                                  .u32("gemma3.attention.head_count_kv", 2)
                                                  .u32("gemma3.attention.sliding_window", 16)
                                                  .bool_array("gemma3.attention.sliding_window_pattern", {true, true, true, true, true, false})
                                                  .str_array("tokenizer.ggml.tokens", 20)
                                                  .bytes());
    write_file(dir / "gguf" / "tensors.gguf", GgufWriter()  // tensor infos and data after the metadata
                                                  .str("general.architecture", "llama")
                                                  .u32("llama.block_count", 1)
                                                  .u32("llama.embedding_length", 64)
                                                  .u32("llama.feed_forward_length", 128)
                                                  .u32("llama.attention.head_count", 4)
                                                  .u32("llama.vocab_size", 16)
                                                  .tensor("token_embd.weight", {64, 16}, 8, 1088)
                                                  .tensor("output_norm.weight", {64}, 0, 256)
                                                  .bytes());
}

}  // namespace

int main(int argc, char** argv) {
    if (argc == 3 && std::string(argv[1]) == "--fuzz-seeds") {
        write_fuzz_seeds(argv[2]);
        return 0;
    }
    if (argc != 2) {
        std::cerr << "usage: kvlab_make_fixtures DIR | kvlab_make_fixtures --fuzz-seeds DIR\n";
        return 2;
    }
    const fs::path dir = argv[1];
    fs::create_directories(dir);

    const std::string tok = tokenizer_512();
    write_file(dir / "tok512.bin", tok);
    write_file(dir / "tok512_truncated.bin", tok.substr(0, tok.size() - 3));

    const ModelConfig cfg = tiny_config();
    const Weights w = random_weights(cfg, 7, 0.5f);
    save_llama2c_v0(dir / "tiny.bin", cfg, w);
    std::string bin;
    {
        std::ifstream in(dir / "tiny.bin", std::ios::binary);
        bin.assign(std::istreambuf_iterator<char>(in), {});
    }
    write_file(dir / "truncated.bin", bin.substr(0, bin.size() - 4));
    std::string v1_bad;
    put<std::uint32_t>(v1_bad, llama2c_v1_magic);  // "ak42" as export.py packs it: a little-endian uint32
    put<std::int32_t>(v1_bad, 7);                  // version 7
    v1_bad.resize(256, '\0');
    write_file(dir / "v1_version7.bin", v1_bad);
    write_file(dir / "text.bin", std::string("this is not a checkpoint, just some text padding it out\n"));
    // GGUF headers: Llama-3-8B's metadata; Gemma-2-style windows; broken variants
    const std::string gguf = gguf_llama3_8b();
    write_file(dir / "llama3-8b.gguf", gguf);
    write_file(dir / "gemma2.gguf", GgufWriter()
                                        .str("general.architecture", "gemma2")
                                        .u32("gemma2.block_count", 42)
                                        .u32("gemma2.context_length", 8192)
                                        .u32("gemma2.embedding_length", 3584)
                                        .u32("gemma2.feed_forward_length", 14336)
                                        .u32("gemma2.attention.head_count", 16)
                                        .u32("gemma2.attention.head_count_kv", 8)
                                        .u32("gemma2.attention.key_length", 256)
                                        .u32("gemma2.attention.value_length", 256)
                                        .u32("gemma2.attention.sliding_window", 4096)
                                        .str_array("tokenizer.ggml.tokens", 1000)
                                        .bytes());
    // DeepSeek-V2-Lite's attention (27 layers, 16 heads, kv_lora_rank 512, rope 64, nope 128, v 128) as two
    // converters wrote it: with llama.cpp's MLA split (b5137+: one KV head of 576 / 512) and without (16 heads of 192 / 128)
    auto deepseek = [](bool split) {
        GgufWriter w;
        w.str("general.architecture", "deepseek2")
            .u32("deepseek2.block_count", 27)
            .u32("deepseek2.context_length", 163840)
            .u32("deepseek2.embedding_length", 2048)
            .u32("deepseek2.attention.head_count", 16)
            .u32("deepseek2.attention.head_count_kv", split ? 1 : 16)
            .u32("deepseek2.attention.key_length", split ? 576 : 192)
            .u32("deepseek2.attention.value_length", split ? 512 : 128)
            .u32("deepseek2.attention.kv_lora_rank", 512)
            .u32("deepseek2.rope.dimension_count", 64);
        if (split) w.u32("deepseek2.attention.key_length_mla", 192).u32("deepseek2.attention.value_length_mla", 128);
        return w.bytes();
    };
    // gpt-oss-20b and Qwen3-30B-A3B as llama.cpp's converter writes them: experts sized by expert_feed_forward_length,
    // gpt-oss's window on every other layer from the first
    write_file(dir / "gpt-oss-20b.gguf", GgufWriter()
                                             .str("general.architecture", "gpt-oss")
                                             .u32("gpt-oss.block_count", 24)
                                             .u32("gpt-oss.context_length", 131072)
                                             .u32("gpt-oss.embedding_length", 2880)
                                             .u32("gpt-oss.feed_forward_length", 2880)
                                             .u32("gpt-oss.expert_feed_forward_length", 2880)
                                             .u32("gpt-oss.expert_count", 32)
                                             .u32("gpt-oss.expert_used_count", 4)
                                             .u32("gpt-oss.attention.head_count", 64)
                                             .u32("gpt-oss.attention.head_count_kv", 8)
                                             .u32("gpt-oss.attention.key_length", 64)
                                             .u32("gpt-oss.attention.value_length", 64)
                                             .u32("gpt-oss.attention.sliding_window", 128)
                                             .u32("gpt-oss.vocab_size", 201088)
                                             .bytes());
    // Qwen3-30B-A3B, and the same with no feed_forward_length: every layer is MoE, so the experts' width is the only one
    auto qwen3moe = [](bool with_ff) {
        GgufWriter w;
        w.str("general.architecture", "qwen3moe")
            .u32("qwen3moe.block_count", 48)
            .u32("qwen3moe.context_length", 40960)
            .u32("qwen3moe.embedding_length", 2048);
        if (with_ff) w.u32("qwen3moe.feed_forward_length", 6144);
        return w.u32("qwen3moe.expert_feed_forward_length", 768)
            .u32("qwen3moe.expert_count", 128)
            .u32("qwen3moe.expert_used_count", 8)
            .u32("qwen3moe.attention.head_count", 32)
            .u32("qwen3moe.attention.head_count_kv", 4)
            .u32("qwen3moe.attention.key_length", 128)
            .u32("qwen3moe.attention.value_length", 128)
            .u32("qwen3moe.vocab_size", 151936)
            .bytes();
    };
    write_file(dir / "qwen3moe.gguf", qwen3moe(true));
    write_file(dir / "qwen3moe-no-ff.gguf", qwen3moe(false));
    // per-layer arrays as llama.cpp's loader takes them (get_key_or_arr): one entry per layer, or a scalar for all;
    // a 1-entry array for 32 layers is refused there ("wrong array length; expected 32, got 1")
    auto per_layer_kv = [](std::vector<std::int32_t> kv) {
        return GgufWriter()
            .str("general.architecture", "llama")
            .u32("llama.block_count", 32)
            .u32("llama.context_length", 8192)
            .u32("llama.embedding_length", 4096)
            .u32("llama.feed_forward_length", 14336)
            .u32("llama.attention.head_count", 32)
            .i32_array("llama.attention.head_count_kv", kv)
            .u32("llama.vocab_size", 128256)
            .bytes();
    };
    write_file(dir / "kv-array-1.gguf", per_layer_kv({8}));
    write_file(dir / "kv-array-32.gguf", per_layer_kv(std::vector<std::int32_t>(32, 8)));
    // a Llama-shaped GGUF with tensors: the fit takes the bytes the file stores (4,915,200 + 1000 data bytes, each tensor's
    // data padded to 32: 4,915,200 + 1024 = 4,916,224 B), not parameters x --weights-dtype
    auto with_tensors = [](std::optional<std::uint64_t> bad_offset, std::size_t dims) {
        GgufWriter w;
        w.str("general.architecture", "llama")
            .u32("llama.block_count", 2)
            .u32("llama.context_length", 4096)
            .u32("llama.embedding_length", 256)
            .u32("llama.feed_forward_length", 512)
            .u32("llama.attention.head_count", 4)
            .u32("llama.attention.head_count_kv", 2)
            .u32("llama.vocab_size", 1000)
            .tensor("token_embd.weight", std::vector<std::uint64_t>(dims, 1), 12, 4915200)  // type 12: Q4_K
            .tensor("output_norm.weight", {256}, 0, 1000, bad_offset);
        return w.bytes();
    };
    write_file(dir / "llama-tensors.gguf", with_tensors(std::nullopt, 2));
    write_file(dir / "gguf_tensor_offset.gguf", with_tensors(std::uint64_t{1} << 40, 2));  // data past the end of the file
    write_file(dir / "gguf_tensor_dims.gguf", with_tensors(std::nullopt, 5));              // more dimensions than GGML has
    write_file(dir / "deepseek2-mla.gguf", deepseek(true));
    write_file(dir / "deepseek2-legacy.gguf", deepseek(false));
    // MiniCPM3-4B as llama.cpp's convert_hf_to_gguf.py writes it (MiniCPM3Model.set_gguf_parameters): key_length
    // qk_nope + qk_rope = 96 and no value_length, so llama.cpp's V head is embedding_length / head_count = 64
    write_file(dir / "minicpm3.gguf", GgufWriter()
                                          .str("general.architecture", "minicpm3")
                                          .u32("minicpm3.block_count", 62)
                                          .u32("minicpm3.context_length", 32768)
                                          .u32("minicpm3.embedding_length", 2560)
                                          .u32("minicpm3.feed_forward_length", 6400)
                                          .u32("minicpm3.attention.head_count", 40)
                                          .u32("minicpm3.attention.head_count_kv", 40)
                                          .u32("minicpm3.attention.q_lora_rank", 768)
                                          .u32("minicpm3.attention.kv_lora_rank", 256)
                                          .u32("minicpm3.attention.key_length", 96)
                                          .u32("minicpm3.rope.dimension_count", 32)
                                          .u32("minicpm3.vocab_size", 73448)
                                          .bytes());
    write_file(dir / "gguf_truncated.gguf", gguf.substr(0, gguf.size() - 5));
    std::string huge = gguf;
    std::memcpy(huge.data() + 16, "\xff\xff\xff\xff\xff\xff\xff\x0f", 8);  // a metadata count the file cannot hold
    write_file(dir / "gguf_huge_count.gguf", huge);
    write_file(dir / "gguf_v1.gguf", GgufWriter().str("general.architecture", "llama").bytes(1));

    // A quantized multimodal checkpoint's headers (only they are read for the fit): the text model packed in U8
    // (1000 B), the vision tower and projector kept in BF16 (200 + 100 B), as int4 Gemma 3 checkpoints store them
    {
        const fs::path mm = dir / "hf_gemma3_vision";
        fs::create_directories(mm);
        const nlohmann::json config = nlohmann::json::parse(R"({"model_type": "gemma3",
            "text_config": {"model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 100,
                            "max_position_embeddings": 256, "sliding_window": 64},
            "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 16, "intermediate_size": 32,
                              "num_hidden_layers": 1, "image_size": 28, "patch_size": 14, "vision_use_head": false}})");
        write_file(mm / "config.json", config.dump(2));
        write_file(mm / "model.safetensors",
                   safetensors({{"language_model.model.embed_tokens.weight", "U8", {1000}, std::string(1000, '\1')},
                                {"vision_tower.vision_model.embeddings.patch_embedding.weight", "BF16", {100}, std::string(200, '\0')},
                                {"multi_modal_projector.mm_input_projection_weight", "BF16", {50}, std::string(100, '\0')}}));
    }
    write_hf(dir / "hf_ok", w, [](std::vector<StTensor>&) {});
    write_hf(dir / "hf_missing", w, [](std::vector<StTensor>& t) { t.pop_back(); });  // model.norm.weight
    write_hf(dir / "hf_shape", w, [](std::vector<StTensor>& t) { t[3].shape = {16, 8}; });  // k_proj is (8, 16)
    write_hf(dir / "hf_dtype", w, [](std::vector<StTensor>& t) { t[1].dtype = "F7"; });
    write_hf(dir / "hf_ok_then_truncated", w, [](std::vector<StTensor>&) {});
    fs::resize_file(dir / "hf_ok_then_truncated" / "model.safetensors", fs::file_size(dir / "hf_ok_then_truncated" / "model.safetensors") - 8);
    return 0;
}
