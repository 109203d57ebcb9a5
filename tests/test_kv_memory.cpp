#include <doctest/doctest.h>

#include "kvlab/core/error.hpp"
#include "kvlab/calc/kv_memory.hpp"
#include "kvlab/calc/model_config.hpp"
#include "test_support.hpp"

using namespace kvlab;

TEST_CASE("Llama-2-7B in FP16 caches 512 KiB per token and 2 GiB at 4096 tokens") {
    const auto cfg = load_preset("llama-2-7b");
    CHECK(kv_bytes_per_token(cfg, DType::fp16).total() == 2ull * 32 * 32 * 128 * 2);  // K+V x 32 layers x 32 heads x 128 x 2 B = 524288
    CHECK(kv_bytes_per_token(cfg, DType::fp16).total() == 524288);
    CHECK(kv_bytes_sequence(cfg, DType::fp16, 4096, WindowMode::cap).total() == 524288ull * 4096);  // = 2 GiB
    CHECK(kv_bytes_sequence(cfg, DType::fp16, 4096, WindowMode::cap).total() == (2ull << 30));
}

TEST_CASE("Llama-2-70B with GQA-8 caches 320 KiB per token in FP16 and half that in FP8") {
    const auto cfg = load_preset("llama-2-70b");
    CHECK(kv_bytes_per_token(cfg, DType::fp16).total() == 2ull * 80 * 8 * 128 * 2);  // = 327680
    CHECK(kv_bytes_per_token(cfg, DType::fp16).total() == 327680);
    CHECK(kv_bytes_sequence(cfg, DType::fp16, 4096, WindowMode::cap).total() == 327680ull * 4096);  // 1.25 GiB
    CHECK(kv_bytes_sequence(cfg, DType::fp16, 4096, WindowMode::cap).total() == (5ull << 30) / 4);
    CHECK(kv_bytes_per_token(cfg, DType::fp8_e4m3).total() == 2ull * 80 * 8 * 128 * 1);  // = 163840
}

TEST_CASE("Llama-2-70B as MHA would cache 2.5 MiB per token and as MQA 40 KiB") {
    const auto cfg = load_preset("llama-2-70b");
    CHECK(kv_bytes_per_token(with_kv_heads(cfg, 64), DType::fp16).total() == 2ull * 80 * 64 * 128 * 2);  // = 2621440
    CHECK(kv_bytes_per_token(with_kv_heads(cfg, 64), DType::fp16).total() == 2621440);
    CHECK(kv_bytes_per_token(with_kv_heads(cfg, 1), DType::fp16).total() == 2ull * 80 * 1 * 128 * 2);  // = 40960 = 40 KiB
}

TEST_CASE("Llama-3-8B caches 128 KiB per token, four times below its MHA variant") {
    const auto cfg = load_preset("llama-3-8b");
    const auto gqa = kv_bytes_per_token(cfg, DType::fp16).total();
    const auto mha = kv_bytes_per_token(with_kv_heads(cfg, cfg.n_head), DType::fp16).total();
    CHECK(gqa == 2ull * 32 * 8 * 128 * 2);  // = 131072
    CHECK(mha == 4 * gqa);                  // 32 / 8 KV heads
}

TEST_CASE("llama.cpp's printed cache sizes are reproduced exactly for f16 and q8_0") {
    const auto cfg = test::data_config("llamacpp-36l.json");
    // f16: 2 x 36 layers x 1024 values x 2 B x 8192 tokens = 1207959552 B = 1152.00 MiB
    CHECK(kv_bytes_sequence(cfg, DType::fp16, 8192, WindowMode::cap).total() == 1152ull << 20);
    // q8_0: 1024 values = 32 blocks x 34 B = 1088 B per row; 2 x 36 x 1088 x 8192 = 612.00 MiB
    CHECK(kv_bytes_sequence(cfg, DType::q8_0, 8192, WindowMode::cap).total() == 612ull << 20);
    // q4_0: 32 blocks x 18 B = 576 B per row; 2 x 36 x 576 x 8192 = 324 MiB
    CHECK(kv_bytes_sequence(cfg, DType::q4_0, 8192, WindowMode::cap).total() == 324ull << 20);
}

TEST_CASE("int4 packs two values per byte and rounds an odd row up") {
    CHECK(row_bytes(DType::int4, 1024) == 512);
    CHECK(row_bytes(DType::int4, 7) == 4);   // ceil(7/2)
    CHECK(row_bytes(DType::q8_0, 33) == 68); // two 32-value blocks of 34 B
}

TEST_CASE("Sliding-window layers hold min(W, T) tokens in cap mode and T in ignore mode") {
    const auto cfg = load_preset("mistral-7b-v0.1");  // W = 4096 on all 32 layers
    const auto per_token = kv_bytes_per_token(cfg, DType::fp16).total();
    CHECK(kv_bytes_sequence(cfg, DType::fp16, 32768, WindowMode::cap).total() == per_token * 4096);
    CHECK(kv_bytes_sequence(cfg, DType::fp16, 32768, WindowMode::ignore).total() == per_token * 32768);
    CHECK(kv_bytes_sequence(cfg, DType::fp16, 1000, WindowMode::cap).total() == per_token * 1000);
}

TEST_CASE("In blocks, every layer's tokens are rounded up to whole blocks, a windowed layer's window too") {
    const auto phi = load_preset("phi-3-mini-4k");  // W = 2047 on all 32 layers
    // T = 3000: the window's 2047 tokens in a ring of ceil(2047 / 16) = 128 blocks = 2048 slots
    CHECK(kv_slots_held(phi, 0, 3000, WindowMode::cap, 16) == 128 * 16);
    // T = 2040 <= W: ceil(2040 / 16) = 128 blocks as well
    CHECK(kv_slots_held(phi, 0, 2040, WindowMode::cap, 16) == 128 * 16);
    CHECK(kv_slots_held(phi, 0, 3000, WindowMode::ignore, 16) == 188 * 16);  // ceil(3000 / 16) = 188
    CHECK(kv_slots_held(phi, 0, 3000, WindowMode::cap, 0) == 2047);          // no paging: min(W, T)
    const auto row = kv_bytes_per_token_layer(phi, DType::bf16).total();     // 2 x 32 heads x 96 x 2 B = 12288
    CHECK(row == 12288);
    // 32 x 2048 x 12288 = 805,306,368 B = 768.00 MiB: one slot a layer (384 KiB) more than the 2047 tokens
    CHECK(kv_bytes_sequence_paged(phi, DType::bf16, 3000, WindowMode::cap, 16).total() == 32ull * 2048 * 12288);
    // the count never falls as T grows (the fit tables search on it)
    std::uint64_t last = 0;
    for (std::uint64_t t = 1; t <= 4096; ++t) {
        const auto slots = kv_slots_held(phi, 0, t, WindowMode::cap, 16);
        REQUIRE(slots >= last);
        last = slots;
    }
    // StreamingLLM: sinks share the window's rows, so W = 64 with 4 sinks is still ceil(64 / 16) = 4 blocks
    auto sinks = load_preset("mistral-7b-v0.1");
    apply_window_policy(sinks, 64, 4);
    CHECK(kv_slots_held(sinks, 0, 100, WindowMode::cap, 16) == 4 * 16);
}

TEST_CASE("Gemma-2-style alternation windows only the even layers") {
    const auto cfg = test::data_config("gemma2-like.json");
    const auto row = kv_bytes_per_token_layer(cfg, DType::bf16).total();  // 2 x 4 heads x 256 x 2 B = 4096
    CHECK(row == 2ull * 4 * 256 * 2);
    // 13 local layers hold 4096, 13 global layers hold 8192
    CHECK(kv_bytes_sequence(cfg, DType::bf16, 8192, WindowMode::cap).total() == row * (13 * 4096 + 13 * 8192));
}

TEST_CASE("MLA caches one latent per token per layer with no factor two") {
    const auto cfg = test::data_config("deepseek-mla.json");
    // 61 layers x (512 + 64) x 2 B = 70272 B
    CHECK(kv_bytes_per_token(cfg, DType::bf16).total() == 61ull * (512 + 64) * 2);
    CHECK(kv_bytes_per_token(cfg, DType::bf16).v == 0);
}

TEST_CASE("A what-if KV head count must divide the query heads") {
    const auto cfg = load_preset("llama-2-7b");
    CHECK_THROWS_AS(with_kv_heads(cfg, 5), UsageError);
}

TEST_CASE("A sequence too large for 64-bit bytes raises an overflow error") {
    const auto cfg = load_preset("llama-3.1-405b");
    CHECK_THROWS_AS(kv_bytes_sequence(cfg, DType::fp32, 1ull << 62, WindowMode::cap), OverflowError);
}
