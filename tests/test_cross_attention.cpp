// Encoder-decoder configs in kvcalc: the decoder's self-attention cache (grows with generated tokens) and its
// cross-attention cache (encoder length x decoder layers, written once) sized separately. The fixtures in
// tests/data are the published config.json values of t5-small, google/byt5-small, facebook/bart-large and
// openai/whisper-large-v3 (Hugging Face Hub), trimmed to the keys that matter; every figure is worked by hand.
#include <doctest/doctest.h>

#include <string>

#include "kvlab/core/error.hpp"
#include "kvlab/calc/kv_memory.hpp"
#include "kvlab/calc/model_config.hpp"
#include "test_paths.hpp"

using namespace kvlab;

namespace {
ModelConfig fixture(const char* file) { return load_model_config(std::string(kvlab::test::test_data_dir) + "/" + file); }
}  // namespace

TEST_CASE("t5-small: 12 KiB per generated token, 6 MiB of cross-attention for its 512-token input (FP16)") {
    const ModelConfig cfg = fixture("t5-small.json");
    REQUIRE(cfg.cross);
    // no num_decoder_layers: T5Config's None means num_layers = 6; attention num_heads 8 x d_kv 64
    CHECK(cfg.n_layer == 6);
    CHECK(cfg.cross->n_layer_encoder == 6);
    CHECK(cfg.n_head_kv == 8);
    CHECK(cfg.d_head == 64);
    CHECK(cfg.cross->encoder_len == 512);  // n_positions
    // self: 2 (K, V) x 6 layers x 8 heads x 64 x 2 B = 12288 B = 12 KiB per generated token
    CHECK(kv_bytes_per_token(cfg, DType::fp16).total() == 12288);
    // cross: 512 rows x 6 decoder layers x 2 x 8 x 64 x 2 B = 6291456 B = 6 MiB, whatever T is
    CHECK(kv_bytes_cross(cfg, DType::fp16).total() == 6291456);
    // a sequence of 100 generated tokens holds both: 100 x 12288 + 6291456 = 7520256
    CHECK(kv_bytes_sequence(cfg, DType::fp16, 100, WindowMode::cap).total() == 7520256);
    CHECK(kv_bytes_sequence(cfg, DType::fp16, 1, WindowMode::cap).total() == 12288 + 6291456);
}

TEST_CASE("byt5-small: cross-attention counts the 4 decoder layers, not the 12 encoder layers") {
    ModelConfig cfg = fixture("byt5-small.json");
    REQUIRE(cfg.cross);
    CHECK(cfg.n_layer == 4);
    CHECK(cfg.cross->n_layer_encoder == 12);
    CHECK(cfg.d_head == 64);  // d_kv, not d_model 1472 / 6 heads
    // no n_positions: the encoder length is the user's
    CHECK(cfg.cross->encoder_len == 0);
    CHECK_THROWS_AS(kv_bytes_cross(cfg, DType::fp16), UsageError);
    cfg.cross->encoder_len = 2048;
    // self: 2 x 4 layers x 6 heads x 64 x 2 B = 6144 B per token; cross: 2048 x 4 x 2 x 6 x 64 x 2 B = 12582912 B = 12 MiB
    CHECK(kv_bytes_per_token(cfg, DType::fp16).total() == 6144);
    CHECK(kv_bytes_cross(cfg, DType::fp16).total() == 12582912);
}

TEST_CASE("facebook/bart-large: 48 KiB per generated token, 48 MiB of cross-attention at 1024 input tokens (FP16)") {
    const ModelConfig cfg = fixture("bart-large.json");
    REQUIRE(cfg.cross);
    // decoder_layers 12, decoder_attention_heads 16, head dim d_model 1024 / 16 = 64 (num_hidden_layers is the encoder's)
    CHECK(cfg.n_layer == 12);
    CHECK(cfg.d_head == 64);
    CHECK(cfg.cross->encoder_len == 1024);  // max_position_embeddings
    CHECK(kv_bytes_per_token(cfg, DType::fp16).total() == 49152);  // 2 x 12 x 16 x 64 x 2
    CHECK(kv_bytes_cross(cfg, DType::fp16).total() == 50331648);   // 1024 x 12 x 2 x 16 x 64 x 2 = 48 MiB
    CHECK(kv_bytes_cross(cfg, DType::fp8_e4m3).total() == 25165824);  // 1 B per value: half
}

TEST_CASE("openai/whisper-large-v3: 160 KiB per generated token, 234.375 MiB of cross-attention over its 1500 frames (FP16)") {
    const ModelConfig cfg = fixture("whisper-large-v3.json");
    REQUIRE(cfg.cross);
    CHECK(cfg.n_layer == 32);
    CHECK(cfg.d_head == 64);                // 1280 / 20
    CHECK(cfg.n_ctx_max == 448);            // max_target_positions: the decoder's tokens
    CHECK(cfg.cross->encoder_len == 1500);  // max_source_positions: 30 s of audio, 3000 mel frames / 2
    CHECK(kv_bytes_per_token(cfg, DType::fp16).total() == 163840);  // 2 x 32 x 20 x 64 x 2
    // 1500 x 32 x 5120 B = 245760000 B = 234.375 MiB, more than its full 448-token self-attention cache:
    CHECK(kv_bytes_cross(cfg, DType::fp16).total() == 245760000);
    CHECK(kv_bytes_sequence(cfg, DType::fp16, 448, WindowMode::cap).total() == 448ull * 163840 + 245760000);  // 319160320
    // paged in blocks of 16: 1500 rows take 94 blocks = 1504 rows: 1504 x 32 x 5120 = 246415360
    CHECK(kv_bytes_cross(cfg, DType::fp16, 16).total() == 246415360);
    CHECK(kv_bytes_sequence_paged(cfg, DType::fp16, 448, WindowMode::cap, 16).total() == 448ull * 163840 + 246415360);
}

TEST_CASE("a decoder-only config has no cross-attention cache") {
    const ModelConfig cfg = fixture("falcon-7b.json");
    CHECK_FALSE(cfg.cross);
    CHECK(kv_bytes_cross(cfg, DType::fp16).total() == 0);
}

TEST_CASE("an encoder-decoder config missing its decoder's layers is refused naming the key") {
    nlohmann::json j = {{"model_type", "bart"}, {"d_model", 1024}, {"encoder_layers", 12}, {"decoder_attention_heads", 16}, {"vocab_size", 50265}};
    CHECK_THROWS_WITH_AS(parse_model_config(j, "bart.json", "bart"), doctest::Contains("decoder_layers"), ConfigError);
}
