#include <doctest/doctest.h>

#include <string>

#include "kvlab/core/error.hpp"
#include "kvlab/calc/kv_memory.hpp"
#include "kvlab/calc/param_count.hpp"
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
                        {"gpt2", 12, 12, 12, 64, 1024}, {"stories260k", 5, 8, 4, 8, 512}, {"stories110m", 12, 12, 12, 64, 1024},
                        // the copies cited in each preset's source (maxtext / litgpt / aiconfigurator agree on these shapes)
                        {"qwen2.5-7b", 28, 28, 4, 128, 32768}, {"qwen3-235b-a22b", 94, 64, 4, 128, 40960},
                        {"gemma-2-27b", 46, 32, 16, 128, 8192}, {"gemma-3-27b", 62, 32, 16, 128, 131072},
                        {"gpt-oss-20b", 24, 64, 8, 64, 131072}, {"mistral-small-24b", 40, 32, 8, 128, 32768},
                        {"phi-3-mini-4k", 32, 32, 32, 96, 4096}};
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
    const auto cfg = load_model_config(std::string(kvlab::test::test_data_dir) + "/hf-dir");
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

// google/gemma-3-4b-it's published config.json (tests/data/gemma-3-4b-it.json, copied verbatim from the
// mlx-community/gemma-3-4b-it-bf16 mirror of it; three test fixtures elsewhere that reproduce the original
// agree): its text_config says only hidden_size 2560, intermediate_size 10240, 34 layers and window 1024.
// Everything else is Gemma3TextConfig's default in transformers v4.57.1 configuration_gemma3.py:
// 8 heads, 4 KV heads, head_dim 256, vocab 262208, 131072 positions, and layer i global when (i + 1) % 6 == 0.
TEST_CASE("Gemma-3-4B-it's text_config takes the omitted values from Gemma3TextConfig") {
    const auto cfg = test::data_config("gemma-3-4b-it.json");
    CHECK(cfg.model_type == "gemma3_text");
    CHECK(cfg.n_layer == 34);
    CHECK(cfg.n_head == 8);
    CHECK(cfg.n_head_kv == 4);
    CHECK(cfg.d_head == 256);
    CHECK(cfg.n_vocab == 262208);
    CHECK(cfg.n_ctx_max == 131072);
    CHECK(cfg.tied_embeddings);
    REQUIRE(cfg.sliding_window == 1024);
    // global layers 5, 11, 17, 23, 29: five of 34, the other 29 hold at most 1024 positions
    std::vector<std::int64_t> global;
    for (std::int64_t l = 0; l < cfg.n_layer; ++l)
        if (cfg.layer_window(l) == 0) global.push_back(l);
    CHECK(global == std::vector<std::int64_t>{5, 11, 17, 23, 29});
    REQUIRE(cfg.defaults.size() == 1);
    for (const char* key : {"num_attention_heads 8", "num_key_value_heads 4", "head_dim 256", "sliding_window_pattern 6", "vocab_size 262208"}) {
        CAPTURE(key);
        CHECK(cfg.defaults[0].find(key) != std::string::npos);
    }
    CHECK(cfg.defaults[0].find("Gemma3TextConfig") != std::string::npos);
    // at 131072 tokens in bf16: 4 KV heads x 256 x 2 (K, V) x 2 B = 4096 B per token per layer;
    // 5 x 131072 x 4096 + 29 x 1024 x 4096 = 2,684,354,560 + 121,634,816 = 2,805,989,376 B
    // (windowing every layer would give 34 x 1024 x 4096 = 142,606,336 B, 19.7x too little)
    CHECK(kv_bytes_sequence(cfg, DType::bf16, 131072, WindowMode::cap).total() == 2805989376ull);
}

TEST_CASE("A key present as null keeps its null; an absent key takes the class default") {
    nlohmann::json j = {{"model_type", "mistral"}, {"hidden_size", 4096}, {"num_hidden_layers", 2}, {"num_attention_heads", 32},
                        {"vocab_size", 32000}, {"intermediate_size", 14336}};
    // MistralConfig's sliding_window default is 4096 (every layer); Mistral-7B-v0.2+ configs say null to turn it off
    const auto windowed = parse_model_config(j, "absent.json", "absent");
    CHECK(windowed.sliding_window == 4096);
    CHECK(windowed.n_head_kv == 8);  // MistralConfig num_key_value_heads = 8
    j["sliding_window"] = nullptr;
    j["num_key_value_heads"] = nullptr;  // None: MHA
    const auto plain = parse_model_config(j, "null.json", "null");
    CHECK_FALSE(plain.sliding_window.has_value());
    CHECK(plain.n_head_kv == 32);
}

TEST_CASE("A Gemma-3 wrapper without text_config is a default Gemma3TextConfig; GGUF metadata takes no class defaults") {
    const auto cfg = parse_model_config({{"model_type", "gemma3"}}, "bare.json", "bare");
    CHECK(cfg.n_layer == 26);  // Gemma3TextConfig: 26 layers of 2304, 8 heads, 4 KV heads of 256, window 4096
    CHECK(cfg.d_model == 2304);
    CHECK(cfg.sliding_window == 4096);
    CHECK_THROWS_AS(parse_model_config({{"model_type", "gemma3_text"}}, "meta.gguf", "meta", /*class_defaults=*/false), ConfigError);
}

TEST_CASE("qwen3_moe has no head_dim default: hidden / heads applies, as transformers' modeling code does") {
    const auto cfg = parse_model_config({{"model_type", "qwen3_moe"}}, "q.json", "q");
    CHECK(cfg.d_head == 64);  // 2048 / 32
    CHECK(cfg.n_head_kv == 4);
    CHECK(cfg.n_expert == 128);
    CHECK(cfg.n_expert_active == 8);
    CHECK_FALSE(cfg.sliding_window.has_value());  // use_sliding_window false
}

TEST_CASE("The max context is vLLM's max_model_len: the smallest length key, model_max_length, rope_scaling") {
    auto ctx = [](nlohmann::json extra) {
        nlohmann::json j = {{"model_type", "qwen2"}, {"num_hidden_layers", 28}, {"hidden_size", 3584}, {"num_attention_heads", 28},
                            {"num_key_value_heads", 4}, {"intermediate_size", 18944}, {"vocab_size", 152064}};
        j.update(extra);
        return parse_model_config(j, "test.json", "test").n_ctx_max;
    };
    // Qwen2.5-7B-Instruct: max_position_embeddings 32768; its model card's YaRN block (factor 4 over 32768) gives 131072
    CHECK(ctx({{"max_position_embeddings", 32768}}) == 32768);
    CHECK(ctx({{"max_position_embeddings", 32768},
               {"rope_scaling", {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}}}}) == 131072);
    // linear and dynamic stretch the length itself: 4096 x 2.5 = 10240
    CHECK(ctx({{"max_position_embeddings", 4096}, {"rope_scaling", {{"rope_type", "linear"}, {"factor", 2.5}}}}) == 10240);
    CHECK(ctx({{"max_position_embeddings", 4096}, {"rope_scaling", {{"type", "dynamic"}, {"factor", 2.0}}}}) == 8192);
    // Llama 3.1's llama3 scaling and Phi-3's longrope already give the long length
    CHECK(ctx({{"max_position_embeddings", 131072}, {"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}}}}) == 131072);
    CHECK(ctx({{"max_position_embeddings", 131072}, {"rope_scaling", {{"type", "longrope"}, {"factor", 32.0}}}}) == 131072);
    // the smallest key wins (vLLM's min), and model_max_length overrides it (Command-R v01: 8192 and 131072)
    CHECK(ctx({{"max_position_embeddings", 8192}, {"seq_length", 4096}}) == 4096);
    CHECK(ctx({{"max_position_embeddings", 8192}, {"model_max_length", 131072}}) == 131072);
    CHECK_THROWS_AS(ctx({{"max_position_embeddings", 4096}, {"rope_scaling", {{"type", "yarn"}, {"factor", 4.0}}}}), ConfigError);
    // an integral float is that length, as vLLM's min() reads it; a fractional one is refused
    CHECK(ctx({{"max_position_embeddings", 32768.0}}) == 32768);
    CHECK_THROWS_AS(ctx({{"max_position_embeddings", 4096.5}}), ConfigError);
    // rope_type wins over the old type (and the note says so); rope_scaling without either is refused
    CHECK(ctx({{"max_position_embeddings", 4096}, {"rope_scaling", {{"rope_type", "linear"}, {"type", "dynamic"}, {"factor", 2.0}}}}) == 8192);
    CHECK_THROWS_AS(ctx({{"max_position_embeddings", 4096}, {"rope_scaling", {{"factor", 2.0}}}}), ConfigError);
    // a tokenizer's no-limit sentinel is no length: left out (with a note), not refused
    CHECK(ctx({{"max_position_embeddings", 4096}, {"model_max_length", 1e30}}) == 4096);
    CHECK(ctx({{"max_position_embeddings", 4096}, {"rope_scaling", {{"rope_type", "linear"}, {"factor", 2}}}}) == 8192);  // an integer factor
}

TEST_CASE("Only DeepSeek-family model types cache the MLA latent; MiniCPM3's same projections cache every head") {
    // openbmb/MiniCPM3-4B's config.json (its shape fields): 62 layers, 40 heads, kv_lora_rank 256, q/k heads 64 + 32 wide
    const nlohmann::json minicpm3 = {{"model_type", "minicpm3"}, {"hidden_size", 2560}, {"num_hidden_layers", 62}, {"num_attention_heads", 40},
                                     {"num_key_value_heads", 40}, {"intermediate_size", 6400}, {"vocab_size", 73448}, {"q_lora_rank", 768},
                                     {"kv_lora_rank", 256}, {"qk_nope_head_dim", 64}, {"qk_rope_head_dim", 32}, {"v_head_dim", 64},
                                     {"max_position_embeddings", 32768}};
    const auto m = parse_model_config(minicpm3, "minicpm3.json", "minicpm3");
    CHECK_FALSE(m.mla.has_value());
    CHECK(m.lora_attention.has_value());
    // vLLM: Attention(40 heads, qk_head_dim 96, num_kv_heads 40), V padded to 96: 2 x 62 x 40 x 96 x 2 B = 952,320 B a token
    CHECK(kv_bytes_per_token(m, DType::bf16).total() == 952320);
    // the same fields under model_type deepseek_v2 cache one latent: 62 x (256 + 32) x 2 B = 35,712 B
    nlohmann::json ds = minicpm3;
    ds["model_type"] = "deepseek_v2";
    const auto d = parse_model_config(ds, "ds.json", "ds");
    REQUIRE(d.mla.has_value());
    CHECK(kv_bytes_per_token(d, DType::bf16).total() == 35712);
    // the weights are counted with the low-rank projections either way: q_a 2560 x 768 + its norm 768 + q_b 768 x 40 x 96,
    // kv_a 2560 x 288 + its norm 256, kv_b 256 x 40 x (64 + 64), o 40 x 64 x 2560 = 13,517,824 a layer
    CHECK(count_params(m).attention == 62ull * 13517824);
    CHECK(count_params(d).attention == 62ull * 13517824);
}

TEST_CASE("Parameter counts per family: norms, biases, MLP form, shared experts, interleaved MoE") {
    // Published totals (safetensors / GGUF general.parameter_count, as listed by e.g. keras-hub and Ollama):
    CHECK(count_params(load_preset("gemma-2-9b")).total() == 9241705984ull);     // 4 norms a layer
    CHECK(count_params(load_preset("gemma-2-27b")).total() == 27227128320ull);
    CHECK(count_params(load_preset("qwen3-8b")).total() == 8190735360ull);       // q_norm, k_norm: 36 x 2 x 128
    CHECK(count_params(load_preset("gpt-oss-120b")).total() == 116829156672ull); // o, router and expert biases, sinks
    // Gemma 3 (Gemma3ForConditionalGeneration: sum of parameters() as published for google/gemma-3-{4b,12b,27b}-it) counts its
    // SigLIP tower: patches 3 x 14^2 x 1152 + 1152, positions 64^2 x 1152, 27 x (4 x (1152^2 + 1152) + 4 x 1152 + 2 x 1152 x 4304
    // + 4304 + 1152), post-norm 2 x 1152 = 416,866,032; projector 1152 x hidden + 1152
    const auto g3 = load_preset("gemma-3-27b");
    CHECK(g3.vision_params == 416866032ull + 1152ull * 5376 + 1152);
    CHECK(count_params(load_preset("gemma-3-4b")).total() == 4300079472ull);
    CHECK(count_params(load_preset("gemma-3-12b")).total() == 12187325040ull);
    CHECK(count_params(g3).total() == 27432406640ull);
    CHECK(count_params(g3).vision == g3.vision_params);
    CHECK(decode_params_read(g3, 1) == doctest::Approx(static_cast<double>(27432406640ull - g3.vision_params)));  // decode skips it
    auto count = [](nlohmann::json j) { return count_params(parse_model_config(j, "test.json", "test")).total(); };
    // EleutherAI/pythia-6.9b (published 6,857,302,016): GELU MLP of 2 matrices with biases, LayerNorms with biases,
    // q/k/v/o biases: 32 x (4 x 4096^2 + 4 x 4096 + 2 x 4096 x 16384 + 16384 + 4096 + 4 x 4096) + 2 x 4096 + 2 x 50432 x 4096
    CHECK(count({{"model_type", "gpt_neox"}, {"hidden_size", 4096}, {"num_hidden_layers", 32}, {"num_attention_heads", 32},
                 {"intermediate_size", 16384}, {"vocab_size", 50432}, {"max_position_embeddings", 2048}, {"tie_word_embeddings", false}}) ==
          6857302016ull);
    // microsoft/phi-2 (published 2,779,683,840): one LayerNorm a layer, lm_head with a bias:
    // 32 x (4 x 2560^2 + 4 x 2560 + 2 x 2560 x 10240 + 10240 + 2560 + 2 x 2560) + 2 x 2560 + 2 x 51200 x 2560 + 51200
    CHECK(count({{"model_type", "phi"}, {"hidden_size", 2560}, {"num_hidden_layers", 32}, {"num_attention_heads", 32},
                 {"intermediate_size", 10240}, {"vocab_size", 51200}, {"max_position_embeddings", 2048}, {"tie_word_embeddings", false}}) ==
          2779683840ull);
    // GPT-BigCode multi_query: c_attn is (d, d + 2 x 128): 6144 x 6400 + 6400 + 6144^2 + 6144 = 77,082,880 a layer, not 4d^2 + 4d
    const nlohmann::json bigcode = {{"model_type", "gpt_bigcode"}, {"n_embd", 6144}, {"n_layer", 2}, {"n_head", 48}, {"multi_query", true},
                                    {"n_positions", 8192}, {"vocab_size", 49152}, {"n_inner", 24576}};
    const auto bc = parse_model_config(bigcode, "bc.json", "bc");
    CHECK(count_params(bc).attention == 2ull * 77082880);
    // Llama 4 Maverick's layout, 4 layers: MoE every 2nd layer (1 and 3) with 128 routed experts + 1 shared, 8192 wide, router
    // 5120 x 128; dense layers 16384 wide. MLP = 2 x 3 x 5120 x 16384 + 2 x (129 x 3 x 5120 x 8192 + 5120 x 128)
    const nlohmann::json maverick = {{"model_type", "llama4_text"}, {"hidden_size", 5120}, {"num_hidden_layers", 4}, {"num_attention_heads", 40},
                                     {"num_key_value_heads", 8}, {"head_dim", 128}, {"intermediate_size", 8192}, {"intermediate_size_mlp", 16384},
                                     {"num_local_experts", 128}, {"num_experts_per_tok", 1}, {"interleave_moe_layer_step", 2}, {"vocab_size", 202048}};
    const auto mv = count_params(parse_model_config(maverick, "mv.json", "mv"));
    CHECK(mv.mlp == 2ull * 3 * 5120 * 16384 + 2ull * (129ull * 3 * 5120 * 8192 + 5120ull * 128));
    CHECK(mv.n_moe_layer == 2);
    // Qwen1.5-MoE's shared expert (shared_expert_intermediate_size 5632) and its (1, d) gate, one MoE layer of 60 experts 1408 wide:
    // 60 x 3 x 2048 x 1408 + 3 x 2048 x 5632 + 2048 x 60 (router) + 2048 (gate)
    const nlohmann::json qmoe = {{"model_type", "qwen2_moe"}, {"hidden_size", 2048}, {"num_hidden_layers", 1}, {"num_attention_heads", 16},
                                 {"num_key_value_heads", 16}, {"intermediate_size", 5632}, {"moe_intermediate_size", 1408},
                                 {"shared_expert_intermediate_size", 5632}, {"num_experts", 60}, {"num_experts_per_tok", 4}, {"vocab_size", 151936}};
    CHECK(count_params(parse_model_config(qmoe, "q.json", "q")).mlp == 60ull * 3 * 2048 * 1408 + 3ull * 2048 * 5632 + 2048ull * 60 + 2048);
    // Cohere ties its embedding by default (CohereConfig tie_word_embeddings=True)
    const nlohmann::json cohere = {{"model_type", "cohere"}, {"hidden_size", 8192}, {"num_hidden_layers", 40}, {"num_attention_heads", 64},
                                   {"intermediate_size", 22528}, {"vocab_size", 256000}, {"max_position_embeddings", 8192}};
    CHECK(parse_model_config(cohere, "c.json", "c").tied_embeddings);
}

TEST_CASE("Llama 4's chunked attention is sized as full attention, and the rule says so") {
    const nlohmann::json scout = {{"model_type", "llama4_text"}, {"hidden_size", 5120}, {"num_hidden_layers", 48}, {"num_attention_heads", 40},
                                  {"num_key_value_heads", 8}, {"head_dim", 128}, {"intermediate_size", 8192}, {"vocab_size", 202048},
                                  {"attention_chunk_size", 8192}, {"max_position_embeddings", 10485760}};
    const auto cfg = parse_model_config(scout, "scout.json", "scout");
    CHECK_FALSE(cfg.sliding_window.has_value());
    CHECK(cfg.window_rule.find("attention_chunk_size 8192 sized as full attention") != std::string::npos);
    // 2 x 48 x 8 x 128 x 2 B = 196,608 B a token on every layer, whatever the chunk
    CHECK(kv_bytes_sequence(cfg, DType::bf16, 16384, WindowMode::cap).total() == 16384ull * 196608);
}

TEST_CASE("Qwen2.5-VL counts its vision transformer and patch merger: the published 8,292,166,656 of Qwen2.5-VL-7B") {
    // Qwen/Qwen2.5-VL-7B-Instruct's config.json (the fields the count reads), text at the top level as published
    const nlohmann::json vl = nlohmann::json::parse(R"({"architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "model_type": "qwen2_5_vl", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
        "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 128000,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "use_sliding_window": false,
        "tie_word_embeddings": false, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
                          "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2,
                          "spatial_patch_size": 14, "window_size": 112, "temporal_patch_size": 2}})");
    const auto cfg = parse_model_config(vl, "qwen2.5-vl-7b.json", "qwen2.5-vl-7b");
    // patches 3 x 2 x 14^2 x 1280 = 1,505,280; 32 blocks x (4 x 1280^2 + 3 x 1280 x 3420 + 7 x 1280 + 2 x 3420) = 32 x 19,702,200;
    // merger 1280 + 5120^2 + 5120 + 5120 x 3584 + 3584 = 44,574,464: 676,550,144 (the model's `visual` module)
    CHECK(cfg.vision_params == 676550144ull);
    CHECK(count_params(cfg).total() == 8292166656ull);  // = Qwen2.5-7B's 7,615,616,512 + the vision side
    CHECK(cfg.attention_bias);                           // the text model is Qwen2's: q/k/v biases
    // a vision_config without its depth is named, not counted
    nlohmann::json partial = vl;
    partial["vision_config"].erase("depth");
    const auto p = parse_model_config(partial, "p.json", "p");
    CHECK(p.vision_params == 0);
    CHECK(p.vision_rule.find("has no depth") != std::string::npos);
}

TEST_CASE("A vision tower kvcalc cannot count is named, not guessed") {
    // a LLaVA-style config: CLIP vision tower around a Llama text model
    const nlohmann::json llava = {{"model_type", "llava"},
                                  {"text_config", {{"model_type", "llama"}, {"hidden_size", 4096}, {"num_hidden_layers", 32},
                                                   {"num_attention_heads", 32}, {"intermediate_size", 11008}, {"vocab_size", 32064},
                                                   {"max_position_embeddings", 4096}}},
                                  {"vision_config", {{"model_type", "clip_vision_model"}, {"hidden_size", 1024}}}};
    const auto cfg = parse_model_config(llava, "llava.json", "llava");
    CHECK(cfg.vision_params == 0);
    CHECK(cfg.vision_rule.find("'clip_vision_model') is not counted") != std::string::npos);
    CHECK(count_params(cfg).vision == 0);
    // Gemma 3's SigLIP with its pooling head on is not the published layout: named, not counted
    nlohmann::json g3 = nlohmann::json::parse(R"({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text",
        "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34},
        "vision_config": {"model_type": "siglip_vision_model", "vision_use_head": true}})");
    CHECK(parse_model_config(g3, "g3.json", "g3").vision_params == 0);
    // sizes whose products pass 64 bits are a config error naming the file, not a wrapped count
    nlohmann::json huge = g3;
    huge["vision_config"] = {{"model_type", "siglip_vision_model"}, {"image_size", 1ll << 40}, {"patch_size", 1}, {"vision_use_head", false}};
    CHECK_THROWS_WITH_AS(parse_model_config(huge, "huge.json", "huge"), doctest::Contains("huge.json: vision_config:"), ConfigError);
    // a text-only config has neither
    g3.erase("vision_config");
    const auto text_only = parse_model_config(g3, "g3.json", "g3");
    CHECK(text_only.vision_params == 0);
    CHECK(text_only.vision_rule.empty());
}
