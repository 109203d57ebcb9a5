#include <doctest/doctest.h>

#include <string>

#include "core/error.hpp"
#include "calc/param_count.hpp"
#include "test_support.hpp"

using namespace kvlab;

TEST_CASE("Every preset loads and validates") {
    const auto names = preset_names();
    CHECK(names.size() >= 18);
    for (const auto& name : names) {
        CAPTURE(name);
        const auto cfg = load_preset(name);
        CHECK(cfg.n_layer > 0);
        CHECK(cfg.n_head % cfg.n_head_kv == 0);
        CHECK(!cfg.source.empty());
        CHECK(!cfg.preset_family.empty());
    }
}

TEST_CASE("Preset shapes match the published configs") {
    struct Row { const char* name; std::int64_t layers, heads, kv_heads, head_dim, ctx; };
    // From each model's config.json (shared/reference/models.md).
    const Row rows[] = {{"llama-2-13b", 40, 40, 40, 128, 4096}, {"llama-3-70b", 80, 64, 8, 128, 8192},
                        {"llama-3.1-405b", 126, 128, 8, 128, 131072}, {"llama-3.2-1b", 16, 32, 8, 64, 131072},
                        {"llama-3.2-3b", 28, 24, 8, 128, 131072}, {"codellama-34b", 48, 64, 8, 128, 16384},
                        {"gpt2", 12, 12, 12, 64, 1024}, {"stories260k", 5, 8, 4, 8, 512}, {"stories110m", 12, 12, 12, 64, 1024}};
    for (const auto& r : rows) {
        CAPTURE(r.name);
        const auto cfg = load_preset(r.name);
        CHECK(cfg.n_layer == r.layers);
        CHECK(cfg.n_head == r.heads);
        CHECK(cfg.n_head_kv == r.kv_heads);
        CHECK(cfg.d_head == r.head_dim);
        CHECK(cfg.n_ctx_max == r.ctx);
    }
}

TEST_CASE("Parameter counts computed from configs match the published totals") {
    CHECK(count_params(load_preset("stories15m")).total() == 15191712);    // llama2.c README
    CHECK(count_params(load_preset("stories42m")).total() == 41689600);
    CHECK(count_params(load_preset("stories110m")).total() == 109529856);
    // Llama-2-7B: 2 x 32000 x 4096 embeddings + 32 x (4 x 4096^2 + 3 x 4096 x 11008 + 2 x 4096) + 4096
    CHECK(count_params(load_preset("llama-2-7b")).total() == 2ull * 32000 * 4096 + 32ull * (4ull * 4096 * 4096 + 3ull * 4096 * 11008 + 2 * 4096) + 4096);
    // GPT-2 124M: wte 50257x768 + wpe 1024x768 + 12 x (12 x 768^2 + 13 x 768) + ln_f 2 x 768 = 124439808
    CHECK(count_params(load_preset("gpt2")).total() == 124439808);
    // Mixtral: every expert counted, 2 of 8 active per token
    const auto mix = count_params(load_preset("mixtral-8x7b"));
    CHECK(mix.total() > 46000000000ull);
    CHECK(mix.active_per_token < 13000000000ull);
}

TEST_CASE("An explicit head_dim wins over hidden_size / heads") {
    const auto cfg = test::data_config("explicit-head-dim.json");  // 5120 / 32 = 160, but head_dim = 128
    CHECK(cfg.d_head == 128);
    CHECK(cfg.head_dim_rule.find("explicit") != std::string::npos);
}

TEST_CASE("A config without num_key_value_heads is MHA") {
    const auto cfg = test::data_config("no-kv-heads.json");
    CHECK(cfg.n_head_kv == cfg.n_head);
    CHECK(cfg.attention_kind() == "MHA");
    CHECK(cfg.kv_heads_rule.find("absent") != std::string::npos);
}

TEST_CASE("Falcon-style multi_query means one KV head whatever num_kv_heads says") {
    const auto cfg = test::data_config("falcon-mq.json");
    CHECK(cfg.n_head_kv == 1);
    CHECK(cfg.d_head == 64);  // 4544 / 71
}

TEST_CASE("A multimodal config is read from its text_config") {
    const auto cfg = test::data_config("multimodal-text-config.json");
    CHECK(cfg.n_layer == 32);
    CHECK(cfg.d_head == 128);
}

TEST_CASE("use_sliding_window false disables the window") {
    const auto cfg = test::data_config("qwen2-window-off.json");
    CHECK_FALSE(cfg.sliding_window.has_value());
    CHECK(cfg.window_rule.find("use_sliding_window is false") != std::string::npos);
}

TEST_CASE("DeepSeek-style MLA is recognised") {
    const auto cfg = test::data_config("deepseek-mla.json");
    REQUIRE(cfg.mla.has_value());
    CHECK(cfg.attention_kind() == "MLA");
    CHECK(cfg.mla->kv_lora_rank == 512);
}

TEST_CASE("A directory holding config.json loads like the file") {
    const auto cfg = load_model_config(std::string(KVLAB_TEST_DATA_DIR) + "/hf-dir");
    CHECK(cfg.name == "hf-dir");
    CHECK(cfg.n_layer == 4);
}

TEST_CASE("Bad configs fail with one line naming file, field and value") {
    struct Case { const char* file; const char* needle; };
    const Case cases[] = {{"bad/malformed.json", "not valid JSON at line 1, column 47: the text ends early"},
                          {"bad/missing-layers.json", "missing required field num_hidden_layers"},
                          {"bad/zero-layers.json", "num_hidden_layers = 0"},
                          {"bad/negative-layers.json", "num_hidden_layers = -2"},
                          {"bad/fractional-layers.json", "num_hidden_layers = 32.5"},
                          {"bad/heads-not-divisible.json", "not a multiple of num_key_value_heads (5)"},
                          {"bad/string-hidden.json", "hidden_size = \"4096\""}};
    for (const auto& c : cases) {
        CAPTURE(c.file);
        try {
            test::data_config(c.file);
            FAIL("expected an InputError");
        } catch (const InputError& e) {
            const std::string msg = e.what();
            CHECK(msg.find(c.file) != std::string::npos);
            CHECK(msg.find(c.needle) != std::string::npos);
            CHECK(msg.find('\n') == std::string::npos);
            CHECK(e.exit_code() == 2);
        }
    }
}

TEST_CASE("An unknown preset suggests the closest names") {
    try {
        load_preset("llama-2-7");
        FAIL("expected a UsageError");
    } catch (const UsageError& e) {
        CHECK(std::string(e.what()).find("did you mean: llama-2-7b") != std::string::npos);
    }
}

TEST_CASE("tie_word_embeddings defaults follow the model class: false for Llama, true for GPT-2") {
    CHECK_FALSE(test::data_config("no-kv-heads.json").tied_embeddings);  // LlamaConfig default
    CHECK(load_preset("gpt2").tied_embeddings);
}
