// Engine rules checked against hand arithmetic from each engine's source (the real log lines they
// reproduce are in tests/cli/engines.cmake).
#include <doctest/doctest.h>

#include <fmt/format.h>

#include "calc/engine_cmd.hpp"
#include "kvlab/calc/engine.hpp"
#include "kvlab/calc/gpu_specs.hpp"
#include "kvlab/calc/kv_memory.hpp"
#include "kvlab/core/error.hpp"
#include "test_support.hpp"

using namespace kvlab;

namespace {

EngineAnswer ask(Engine e, const ModelConfig& cfg, DType dtype, std::uint64_t context, std::optional<std::uint64_t> budget,
                 const EngineSettings& s = {}, std::uint64_t batch = 1, std::uint64_t tp = 1) {
    EngineCase c;
    c.model = &cfg;
    c.dtype = dtype;
    c.context = context;
    c.batch = batch;
    c.tp = tp;
    c.kv_budget = budget;
    return engine_answer(e, c, s);
}

}  // namespace

TEST_CASE("vLLM sizes the published Gemma-3-4B-it with its hybrid allocator: 5 full layers, 29 sliding, 7 groups of 5") {
    const auto cfg = test::data_config("gemma-3-4b-it.json");
    EngineSettings s;
    s.max_num_batched_tokens = 8192;
    const auto a = ask(Engine::vllm, cfg, DType::bf16, 131072, std::uint64_t{40} << 30, s);
    // page = 2 x 16 x 4 KV heads x 256 x 2 B = 65,536 B; groups of min(5, 29) = 5 layers: 1 full + ceil(29 / 5) = 6 sliding.
    // blocks = 40 GiB / 65536 / 5 = 131,072; tokens = 131072 // 7 x 16 = 299,584.
    REQUIRE(a.token_capacity);
    CHECK(*a.token_capacity == 299584);
    // a request: 1 full group x cdiv(131072, 16) + 6 sliding groups x (cdiv(min(1023 + 8192, 131072), 16) + 1)
    // = 8192 + 6 x 577 = 11,654 blocks; 131072 / 11654 = 11.247
    REQUIRE(a.concurrency);
    CHECK(*a.concurrency == doctest::Approx(131072.0 / 11654.0));
    // vLLM's order: the worker's budget line, then the engine core's grouping
    REQUIRE(a.log_lines.size() == 4);
    CHECK(a.log_lines[0] == "Available KV cache memory: 40.00 GiB");
    CHECK(a.log_lines[1] == "Add 1 padding layers, may waste at most 3.45% KV cache memory");  // 1 of 29 sliding layers
    CHECK(a.log_lines.back() == "Maximum concurrency for 131,072 tokens per request: 11.25x");
}

TEST_CASE("vLLM sizes the published Falcon-7B as one KV head (multi_query)") {
    const auto cfg = test::data_config("falcon-7b.json");
    const auto a = ask(Engine::vllm, cfg, DType::bf16, 2048, std::uint64_t{1} << 30);
    // page = 2 x 16 x 1 x 64 x 2 B = 4096 B; 1 GiB / 4096 / 32 layers = 8192 blocks = 131,072 tokens; 8192 / 128 = 64x
    CHECK(*a.token_capacity == 131072);
    CHECK(*a.concurrency == doctest::Approx(64.0));
}

TEST_CASE("llama.cpp: a unified cache holds -c cells in one stream, and the SWA cache grows with the sequences") {
    const auto cfg = load_preset("gemma-2-9b");  // 42 layers: 21 sliding (window 4096), 21 full; 8 KV heads x 256
    EngineSettings s;
    s.kv_unified = true;
    const auto a = ask(Engine::llamacpp, cfg, DType::fp16, 2048, std::nullopt, s, 4);
    // -c 8192 -np 4 -kvu: 8192 cells, 1 stream; SWA cells = PAD(min(8192, 4096 x 4 + 512), 256) = 8192
    REQUIRE(a.log_lines.size() == 4);
    CHECK(a.log_lines[0] == "llama_kv_cache_iswa: creating non-SWA KV cache, size = 8192 cells");
    CHECK(a.log_lines[2] == "llama_kv_cache_iswa: creating     SWA KV cache, size = 8192 cells");
    // 21 layers x 8192 cells x 2048 x 2 B = 672 MiB of K per cache
    CHECK(a.log_lines[1] == "llama_kv_cache: size = 1344.00 MiB (  8192 cells,  21 layers,  4/1 seqs), K (f16):  672.00 MiB, V (f16):  672.00 MiB");
    // without -kvu: 4 streams of 2048 cells, and each stream's SWA cache PAD(min(2048, 4096 + 512), 256) = 2048
    const auto b = ask(Engine::llamacpp, cfg, DType::fp16, 2048, std::nullopt, {}, 4);
    CHECK(b.log_lines[2] == "llama_kv_cache_iswa: creating     SWA KV cache, size = 2048 cells");
    // padding: -c 1000 is 1024 cells (PAD to 256)
    const auto c = ask(Engine::llamacpp, load_preset("llama-3-8b"), DType::fp16, 1000, std::nullopt);
    CHECK(*c.token_capacity == 1024);
}

TEST_CASE("llama.cpp stores DeepSeek's MLA latent as K only; SGLang and TensorRT-LLM keep one latent per token") {
    const auto cfg = load_preset("deepseek-v3");  // 61 layers, kv_lora_rank 512 + rope 64
    const auto l = ask(Engine::llamacpp, cfg, DType::fp16, 4096, std::nullopt);
    // K = 61 x 4096 x 576 x 2 B = 274.5 MiB; V none (b7832+)
    CHECK(l.log_lines.at(0) == "llama_kv_cache: size =  274.50 MiB (  4096 cells,  61 layers,  1/1 seqs), K (f16):  274.50 MiB, V (f16):    0.00 MiB");
    EngineSettings s;
    s.kv_tokens = 100000;
    const auto g = ask(Engine::sglang, cfg, DType::bf16, 4096, std::nullopt, s, 1, 8);
    // (100000 + 1) x 576 x 61 x 2 B = 7,027,270,272 B = 6.54 x 2^30 ("GB"); TP does not split the latent
    CHECK(g.log_lines.at(0) == "KV Cache is allocated. #tokens: 100000, KV size: 6.54 GB");
}

TEST_CASE("TensorRT-LLM rounds KV heads per GPU up, SGLang and vLLM down (at least 1)") {
    ModelConfig cfg = load_preset("llama-3-8b");  // 8 KV heads
    CHECK(kv_heads_per_rank(cfg, 3, true) == 3);   // ceil(8 / 3)
    CHECK(kv_heads_per_rank(cfg, 3, false) == 2);  // floor(8 / 3)
    CHECK(kv_heads_per_rank(cfg, 16, false) == 1);
    CHECK(with_thousands(1234567) == "1,234,567");
    CHECK(with_thousands(999) == "999");
}

TEST_CASE("vLLM's default step: 2048 tokens on an A100 or a GPU under 70 GiB, 8192 on the rest, 8192 when the GPU is unknown") {
    const auto cfg = load_preset("mistral-7b-v0.1");  // 32 layers, all sliding (window 4096), 8 KV heads x 128
    auto concurrency = [&](std::uint64_t gpu_memory, bool a100) {
        EngineCase c;
        c.model = &cfg;
        c.dtype = DType::bf16;
        c.context = 32768;
        c.kv_budget = std::uint64_t{10} << 30;
        c.gpu_memory = gpu_memory;
        c.gpu_is_a100 = a100;
        return *engine_answer(Engine::vllm, c, {}).concurrency;
    };
    // page 2 x 16 x 8 x 128 x 2 B = 65536 B; 10 GiB / 65536 / 32 = 5120 blocks; a request: cdiv(min(4095 + step, 32768), 16) + 1
    CHECK(concurrency(0, false) == doctest::Approx(5120.0 / 769.0));                       // step 8192: 768 + 1
    CHECK(concurrency(std::uint64_t{80} << 30, false) == doctest::Approx(5120.0 / 769.0));  // H100-like
    CHECK(concurrency(std::uint64_t{80} << 30, true) == doctest::Approx(5120.0 / 385.0));   // A100 80 GB, step 2048: 384 + 1
    CHECK(concurrency(std::uint64_t{24} << 30, false) == doctest::Approx(5120.0 / 385.0));  // under 70 GiB
    GpuSpec g;
    g.name = "a100-sxm-80gb";
    CHECK(gpu_is_a100(g));
    g.name = "h100-sxm-80gb";
    g.display_name = "NVIDIA A100-SXM4-80GB";  // the device name torch reports, in any case
    CHECK(gpu_is_a100(g));
    g.display_name = "NVIDIA H100 SXM 80GB";
    CHECK_FALSE(gpu_is_a100(g));
}

TEST_CASE("vLLM with num_gpu_blocks_override still logs the worker's budget first") {
    const auto cfg = load_preset("llama-3-8b");
    EngineSettings s;
    s.kv_tokens = 16000;
    const auto a = ask(Engine::vllm, cfg, DType::bf16, 8192, std::uint64_t{20} << 30, s);
    // page 2 x 16 x 8 x 128 x 2 B = 65536 B: 20 GiB / 65536 / 32 = 10240 blocks from memory, overridden by 16000 / 16 = 1000
    REQUIRE(a.log_lines.size() == 4);
    CHECK(a.log_lines[0] == "Available KV cache memory: 20.00 GiB");
    CHECK(a.log_lines[1] == "Overriding num_gpu_blocks=10240 with num_gpu_blocks_override=1000");
    CHECK(a.log_lines[2] == "GPU KV cache size: 16,000 tokens");
    CHECK(a.log_lines[3] == "Maximum concurrency for 8,192 tokens per request: 1.95x");  // 1000 / 512
}

TEST_CASE("TensorRT-LLM 1.2 logs the primary blocks in its per-window line, then the two pool lines") {
    const auto cfg = load_preset("llama-3-8b");
    const auto a = ask(Engine::trtllm, cfg, DType::bf16, 8192, std::uint64_t{20} << 30);
    // 2 x 32 layers x 8 x 128 x 2 B = 131072 B a token: 20 GiB / 131072 = 163840 tokens = 5120 blocks of 32;
    // a sequence: 8192 + 1 tokens (the overlap scheduler's extra one, on by default) = ceil(8193 / 32) = 257 blocks
    REQUIRE(a.log_lines.size() == 3);
    CHECK(a.log_lines[0] == "[TensorRT-LLM][INFO] Max KV cache blocks per sequence: 257 [window size=8193], tokens per block=32, "
                            "primary blocks=5120, secondary blocks=0, max sequence length=8193");
    CHECK(a.log_lines[1] == "[TensorRT-LLM][INFO] Number of tokens per block: 32.");
    CHECK(a.log_lines[2] == "[TensorRT-LLM][INFO] [MemUsageChange] Allocated 20.00 GiB for max tokens in paged KV cache (163840).");
}

TEST_CASE("vLLM refusing to start prints no padding line: the memory check comes before the grouping") {
    const auto cfg = test::data_config("gemma-3-4b-it.json");  // 1 padding layer when it starts
    EngineSettings s;
    s.max_num_batched_tokens = 8192;
    const auto a = ask(Engine::vllm, cfg, DType::bf16, 131072, std::uint64_t{1} << 30, s);  // 1 GiB: far too little for 128k tokens
    REQUIRE(a.log_lines.size() == 2);
    CHECK(a.log_lines[0] == "Available KV cache memory: 1.00 GiB");
    CHECK(a.log_lines[1].rfind("ValueError: To serve at least one request", 0) == 0);
}

TEST_CASE("pipeline stages: vLLM's get_pp_indices gives the remainder to the stages before the last, TensorRT-LLM to the first") {
    // vllm/distributed/utils.py: partitions = [n // pp] * pp; for i in range(2, rest + 2): partitions[-i] += 1
    CHECK(pp_layer_split(Engine::vllm, 27, 2) == std::vector<std::uint64_t>{14, 13});
    CHECK(pp_layer_split(Engine::vllm, 10, 4) == std::vector<std::uint64_t>{2, 3, 3, 2});  // 10 // 4 = 2, rest 2: [-2] and [-3]
    CHECK(pp_layer_split(Engine::vllm, 32, 2) == std::vector<std::uint64_t>{16, 16});
    CHECK(pp_layer_split(Engine::sglang, 27, 2) == std::vector<std::uint64_t>{14, 13});
    // tensorrt_llm/mapping.py pp_layers: torch.tensor_split(range(10), 4) = [3, 3, 2, 2]
    CHECK(pp_layer_split(Engine::trtllm, 10, 4) == std::vector<std::uint64_t>{3, 3, 2, 2});
    // llama.cpp -sm layer, equal -ts over 2 devices, 32 layers + the output layer: il / 33 < 0.5 for il <= 16: 17 and 15
    CHECK(pp_layer_split(Engine::llamacpp, 32, 2) == std::vector<std::uint64_t>{17, 15});
    CHECK_THROWS_AS(pp_layer_split(Engine::vllm, 2, 3), UsageError);
}

TEST_CASE("SGLang v0.5.2 gives a speculative draft its own pool of the target's #tokens, the speculative headroom included") {
    // model_runner.py init_memory_pool: target #tokens = rest // cell + R x steps x topk + R x draft tokens + 100, and the draft
    // worker's pool takes the same #tokens (draft_runner_cache_size) with the draft's own layers and heads
    const auto cfg = load_preset("llama-3.1-8b");  // 32 layers x 8 KV heads x 128
    const auto eagle = test::data_config("engines/eagle-llama3.1-8b.json");  // one layer of the same shape
    EngineSettings s;
    s.draft = &eagle;
    const std::uint64_t budget = 55436216631;  // 51.629 GiB
    const auto a = ask(Engine::sglang, cfg, DType::bf16, 8192, budget, s);
    // cell = 8 x 128 x 32 layers x 2 (K, V) x 2 B = 131,072 B; 55,436,216,631 // 131072 = 422,944 tokens from the budget;
    // headroom with SGLang's defaults for Llama (R 48 from server_args.py; steps 5, topk 4, draft tokens 8 from
    // auto_choose_speculative_params) = 48 x (5 x 4 + 8) + 100 = 1,444: 424,388
    REQUIRE(a.token_capacity);
    CHECK(*a.token_capacity == 424388);
    REQUIRE(a.log_lines.size() == 2);
    // target K: (424,388 + 1 padding row) x 8 x 128 x 32 x 2 B = 27,812,757,504 B = 25.90 GiB
    CHECK(a.log_lines[0] == "KV Cache is allocated. #tokens: 424388, K size: 25.90 GB, V size: 25.90 GB");
    // draft K: 424,389 x 8 x 128 x 1 layer x 2 B = 869,148,672 B = 0.81 GiB
    CHECK(a.log_lines[1] == "KV Cache is allocated. #tokens: 424388, K size: 0.81 GB, V size: 0.81 GB");
    CHECK(*a.bytes_allocated == 2 * 27812757504ULL + 2 * 869148672ULL);
    // --max-total-tokens caps both pools after the headroom is added; the user's R, steps and topk (topk 1: draft tokens = steps + 1)
    s.kv_tokens = 400000;
    CHECK(*ask(Engine::sglang, cfg, DType::bf16, 8192, budget, s).token_capacity == 400000);
    s.kv_tokens.reset();
    s.max_running_requests = 32, s.spec_steps = 3, s.spec_topk = 1, s.spec_draft_tokens = 8;
    CHECK(*ask(Engine::sglang, cfg, DType::bf16, 8192, budget, s).token_capacity == 422944 + 32 * (3 * 1 + 4) + 100);
    // DeepSeek-V3's MTP layer (NEXTN): defaults (3, 1, 4): 48 x (3 + 4) + 100 = 436 more. MLA cell 576 x 61 x 2 B = 70,272 B at TP 8
    // (the latent is whole on every GPU); 20 GiB // 70272 = 305,595; + 436 = 306,031; the MTP pool: 306,032 x 576 x 2 B = 0.33 GiB
    const auto ds = load_preset("deepseek-v3");
    ModelConfig mtp = ds;
    mtp.n_layer = 1;
    mtp.layer_windowed.assign(1, false);
    EngineSettings m;
    m.draft = &mtp;
    const auto d = ask(Engine::sglang, ds, DType::bf16, 32768, std::uint64_t{20} << 30, m, 1, 8);
    CHECK(*d.token_capacity == 306031);
    CHECK(d.log_lines.at(1) == "KV Cache is allocated. #tokens: 306031, KV size: 0.33 GB");
}

TEST_CASE("SGLang pipeline stages all size from the smallest GPU budget; the stage with the most layers decides") {
    // model_runner.py profile_max_num_token: get_available_gpu_memory(distributed=True) takes the all_reduce MIN of free memory
    // over every GPU; the ranks then keep the fewest tokens (all_reduce MIN, sglang PR #10214)
    const auto cfg = load_preset("llama-3-8b");  // 32 layers, pp 3: get_pp_indices 11, 11, 10
    EngineSettings s;
    s.pp = 3;
    s.stage_budgets = {std::uint64_t{20} << 30, std::uint64_t{20} << 30, std::uint64_t{10} << 30};
    // 10 GiB for every stage; 11 layers x 8 x 128 x 2 x 2 B = 45,056 B a token: 10,737,418,240 // 45056 = 238,312
    // (each stage on its own budget would give the 10-layer stage 262,144 and the others 476,625: 262,144)
    CHECK(*ask(Engine::sglang, cfg, DType::bf16, 8192, std::nullopt, s).token_capacity == 238312);
}

TEST_CASE("llama-server -md: each slot's draft context is the target's context per sequence, all -c cells with -kvu (b6975 on)") {
    // tools/server/server-context.cpp: params_dft.n_ctx = llama_n_ctx_seq(ctx) (-cd unset); src/llama-context.cpp:
    // n_ctx_seq = n_ctx with -kvu, else PAD(n_ctx / n_seq_max, 256)
    const auto cfg = load_preset("llama-3.1-8b");
    const auto draft = load_preset("llama-3.2-1b");  // 16 layers x 8 KV heads x 64: 16 x 512 x 2 B = 16 KiB of K a cell
    EngineSettings s;
    s.draft = &draft;
    s.kv_unified = true;
    s.n_ctx = 8192;
    const auto a = ask(Engine::llamacpp, cfg, DType::fp16, 4096, std::nullopt, s, 2);
    // -c 8192 -np 2 -kvu: every slot's draft holds 8192 cells: 8192 x 16 KiB = 128 MiB of K, 256 MiB a slot, 512 MiB for both
    CHECK(a.log_lines.back() == "llama_kv_cache: size =  256.00 MiB (  8192 cells,  16 layers,  1/1 seqs), K (f16):  128.00 MiB, V (f16):  128.00 MiB");
    // before (older tools/server/server.cpp): -c / -np = 4096 cells whatever -kvu says; b6081 prints "llama_kv_cache_unified"
    s.version = 6081;
    CHECK(ask(Engine::llamacpp, cfg, DType::fp16, 4096, std::nullopt, s, 2).log_lines.back().find("(  4096 cells,  16 layers,") != std::string::npos);
}

TEST_CASE("--engine NAME@VERSION: a known release answers as itself, an unknown one by the nearest known, with a note") {
    const auto a = parse_engine_spec("llama.cpp@b5913");
    CHECK(a.engine == Engine::llamacpp);
    CHECK(a.version == 5913);
    CHECK(a.note.empty());
    const auto b = parse_engine_spec("vllm@0.8.5");  // 0.8.5 -> 8005: 0.8.0 (8000) is 5 away, 0.10.0 (10000) 1995
    CHECK(b.version == 8000);
    CHECK(b.note.find("the nearest it knows, vLLM v0.8.0, answers") != std::string::npos);
    // b6500 is 173 builds from b6327 and 286 from b6786: b6327 answers (the llama_kv_cache prefix, -fa auto)
    CHECK(parse_engine_spec("llama.cpp@b6500").version == 6327);
    CHECK(parse_engine_spec("vllm").version == 10002);  // no version: the pinned v0.10.2
    CHECK(parse_engine_spec("trtllm@1.2.0rc2").version == 1002000);
    CHECK(engine_release_name(Engine::vllm, 7003) == "vLLM v0.7.3");
    CHECK_THROWS_AS(parse_engine_spec("vllm@0.8"), UsageError);     // two parts
    CHECK_THROWS_AS(parse_engine_spec("llama.cpp@0.8.0"), UsageError);  // not a build
    CHECK_THROWS_AS(parse_engine_spec("exact@1.0.0"), UsageError);
}

TEST_CASE("vLLM releases print the budget as they formatted it: %.2f up to v0.10.2, format_gib's rounded float from v0.15.2") {
    const auto cfg = load_preset("llama-3-8b");
    EngineSettings s;
    s.version = 15002;
    // 4.5 GiB: "4.5" (Python prints round(4.5, 2) as 4.5); v0.10.2 prints "4.50"
    CHECK(ask(Engine::vllm, cfg, DType::bf16, 8192, std::uint64_t{9} << 29, s).log_lines.at(0) == "Available KV cache memory: 4.5 GiB");
    s.version = 10002;
    CHECK(ask(Engine::vllm, cfg, DType::bf16, 8192, std::uint64_t{9} << 29, s).log_lines.at(0) == "Available KV cache memory: 4.50 GiB");
    s.version = 8000;  // no budget line before v0.10.0 in the logs kvlab knows
    CHECK(ask(Engine::vllm, cfg, DType::bf16, 8192, std::uint64_t{9} << 29, s).log_lines.at(0).rfind("GPU KV cache size", 0) == 0);
}

TEST_CASE("llama.cpp before KV streams (b5913) keeps one cache of -c cells for all sequences, and says so as '%2u seqs'") {
    const auto cfg = load_preset("llama-3-8b");
    EngineSettings s;
    s.version = 5600;
    const auto a = ask(Engine::llamacpp, cfg, DType::fp16, 2048, std::nullopt, s, 4);
    // -c 8192 -np 4: 8192 cells shared (no streams): 32 x 8192 x 1024 x 2 B = 512 MiB of K
    CHECK(a.log_lines.at(0) == "llama_kv_cache_unified: size = 1024.00 MiB (  8192 cells,  32 layers,  4 seqs), K (f16):  512.00 MiB, V (f16):  512.00 MiB");
    // -c stated directly (--engine-cmd): -c 32768 -np 10 is 32768 cells, not 10 x PAD(3277)
    EngineSettings t;
    t.n_ctx = 32768;
    t.kv_unified = true;
    CHECK(*ask(Engine::llamacpp, load_preset("llama-2-7b"), DType::fp16, 3276, std::nullopt, t, 10).token_capacity == 32768);
}

TEST_CASE("--engine-cmd reads each engine's own flags, quoted values and JSON, and names the flag it does not know") {
    const auto v = parse_engine_command(
        "VLLM_USE_V1=1 vllm serve meta-llama/Llama-3.1-8B-Instruct --max-model-len=16384 -tp 2 --kv-cache-dtype fp8 \
"
        "  --speculative-config '{\"method\": \"eagle\", \"model\": \"yuhuili/EAGLE-LLaMA3.1-Instruct-8B\", \"num_speculative_tokens\": 3}' "
        "--num-gpu-blocks-override 1000 --block-size 32 --port 8000");
    CHECK(v.engine == Engine::vllm);
    CHECK(v.model == "meta-llama/Llama-3.1-8B-Instruct");
    CHECK(*v.context == 16384);
    CHECK(*v.tp == 2);
    CHECK(*v.dtype == "fp8");
    CHECK(v.draft == "yuhuili/EAGLE-LLaMA3.1-Instruct-8B");
    CHECK(*v.kv_tokens == 32000);  // 1000 blocks x --block-size 32
    CHECK(v.ignored == std::vector<std::string>{"--port"});
    const auto l = parse_engine_command("llama-server -m m.gguf -c 8192 -np 2 -b 128 -ctk q8_0 -ctv q8_0 -kvu -fa on --jinja");
    CHECK(l.engine == Engine::llamacpp);
    CHECK(*l.n_ctx == 8192);
    CHECK(*l.ubatch == 128);  // n_ubatch = min(-ub 512, -b 128)
    CHECK(*l.dtype == "q8_0");
    CHECK(l.kv_unified);
    CHECK(l.flash_attn == FlashAttn::on);
    // -fa: bare (older builds), or on|off|auto and their aliases 1|0|-1 (common/arg.cpp, PR #15746)
    CHECK(parse_engine_command("llama-cli -m m.gguf -fa").flash_attn == FlashAttn::on);
    CHECK(parse_engine_command("llama-cli -m m.gguf -fa 0").flash_attn == FlashAttn::off);
    CHECK(parse_engine_command("llama-cli -m m.gguf --flash-attn=auto").flash_attn == FlashAttn::automatic);
    CHECK(parse_engine_command("llama-cli -m m.gguf -fa -1 -c 4096").flash_attn == FlashAttn::automatic);
    CHECK(parse_engine_command("llama-cli -m m.gguf").flash_attn == FlashAttn::unset);
    CHECK_THROWS_AS(parse_engine_command("llama-cli -m m.gguf --flash-attn=maybe"), UsageError);
    const auto g = parse_engine_command("python3 -m sglang.launch_server --model-path Qwen/Qwen2.5-7B-Instruct --mem-fraction-static 0.8 --pp-size 2");
    CHECK(g.engine == Engine::sglang);
    CHECK(*g.mem_util == doctest::Approx(0.8));
    CHECK(*g.pp == 2);
    // SGLang's speculative flags: NEXTN without a draft path is the model's own MTP layer; the headroom's R, steps, topk, draft tokens
    const auto n = parse_engine_command("python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp 8 --speculative-algorithm NEXTN "
                                        "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 --max-running-requests 32");
    CHECK(n.draft == "mtp:1");
    CHECK(*n.spec_steps == 3);
    CHECK(*n.spec_topk == 1);
    CHECK(*n.spec_draft_tokens == 4);
    CHECK(*n.max_running_requests == 32);
    CHECK(*n.batch == 32);
    CHECK(parse_engine_command("python -m sglang.launch_server --model-path m --speculative-algorithm EAGLE3 --speculative-draft-model-path d").draft == "d");
    CHECK(parse_engine_command("python -m sglang.launch_server --model-path m --speculative-algorithm NGRAM").draft.empty());
    CHECK_THROWS_AS(parse_engine_command("python -m sglang.launch_server --model-path m --speculative-algorithm MEDUSA"), UsageError);
    const auto t = parse_engine_command("trtllm-serve serve meta-llama/Llama-3.1-8B --tp_size 4 --kv_cache_free_gpu_memory_fraction 0.85");
    CHECK(t.engine == Engine::trtllm);
    CHECK(t.model == "meta-llama/Llama-3.1-8B");
    CHECK(*t.tp == 4);
    CHECK_THROWS_WITH_AS(parse_engine_command("llama-server -ctk q8_0 -ctv f16"), doctest::Contains("-ctk and -ctv differ"), UsageError);
    CHECK_THROWS_WITH_AS(parse_engine_command("vllm serve m --bogus"), doctest::Contains("'--bogus' is no vllm flag"), UsageError);
    CHECK_THROWS_WITH_AS(parse_engine_command("vllm serve m --max-model-len"), doctest::Contains("needs a value"), UsageError);
    CHECK_THROWS_AS(split_command_line("vllm serve 'm"), UsageError);
    // as a POSIX shell splits: "…" keeps \" as ", '…' keeps everything, a backslash-newline joins lines
    CHECK(split_command_line("a \"{\\\"m\\\": 1}\" 'x \\y' \\\nz") == std::vector<std::string>{"a", "{\"m\": 1}", "x \\y", "z"});
}

// Each llama.cpp boundary kvlab dates by tags: the last tag seen with the old form and the first with the new one are both
// known releases, so each prints its own form. The tags' sources are the llama.cpp files vendored in mybigday/llama.rn at its
// "sync llama.cpp to bNNNN" commits (engine_versions.cpp names each commit).
TEST_CASE("llama.cpp releases on both sides of each dated change print their own size line") {
    const auto cfg = load_preset("llama-3-8b");
    EngineSettings s;
    s.kv_unified = true;
    auto line = [&](std::uint64_t version) {
        s.version = version;
        return ask(Engine::llamacpp, cfg, DType::fp16, 2048, std::nullopt, s, 4).log_lines.at(0);
    };
    // -c 8192 -np 4 -kvu: 8192 cells (a multiple of 32 and of 256), 32 x 8192 x 1024 x 2 B = 512 MiB of K
    const std::string tail = " 8192 cells,  32 layers,  4%s seqs), K (f16):  512.00 MiB, V (f16):  512.00 MiB";
    auto want = [&](std::string_view prefix, std::string_view seqs) {
        std::string t = tail;
        t.replace(t.find("%s"), 2, seqs);
        return fmt::format("{}: size = 1024.00 MiB ( {}", prefix, t);
    };
    CHECK(line(5902) == want("llama_kv_cache_unified", ""));       // "%2u seqs" (b5902, 4a4f4269)
    CHECK(line(5913) == want("llama_kv_cache_unified", "/ 1"));    // "%2u/%2u seqs" (PR #14363, b5913)
    CHECK(line(6018) == want("llama_kv_cache_unified", "/ 1"));    // still %2u/%2u (b6018, bda62193)
    CHECK(line(6081) == want("llama_kv_cache_unified", "/1"));     // "%2u/%u" (b6081, d31192b4)
    CHECK(line(6218) == want("llama_kv_cache_unified", "/1"));     // the class not yet renamed (b6218, 13aeb7ae)
    CHECK(line(6250) == want("llama_kv_cache", "/1"));             // PR #15467's llama_kv_cache (b6250, e92734d5)
}

TEST_CASE("llama.cpp's cache padding by release and flash attention: 32 or 256 until b6851, none b6870-b6974, 256 from b6975") {
    // gpt-oss-20b's SWA cache at -c 4096, -np 1, -ub 512: n_swa 128 x 1 + 512 = 640 cells wanted
    const auto cfg = load_preset("gpt-oss-20b");
    EngineSettings s;
    auto swa_cells = [&](std::uint64_t version, FlashAttn fa) {
        s.version = version;
        s.flash_attn = fa;
        const auto a = ask(Engine::llamacpp, cfg, DType::fp16, 4096, std::nullopt, s, 1);
        return a.log_lines.at(2);
    };
    const std::string c640 = "llama_kv_cache_unified_iswa: creating     SWA KV cache, size = 640 cells";
    const std::string c768 = "llama_kv_cache_unified_iswa: creating     SWA KV cache, size = 768 cells";
    // b6218: -fa not given is off (default before b6327): PAD(640, 32) = 640 (llama.cpp issue #16188's b6182 log); -fa: PAD(640, 256) = 768
    CHECK(swa_cells(6218, FlashAttn::unset) == c640);
    CHECK(swa_cells(6218, FlashAttn::on) == c768);
    CHECK(swa_cells(6218, FlashAttn::off) == c640);
    // b6318 still defaults to off; b6327 (PR #15434) defaults to auto, and the cache is made before auto resolves: 256
    CHECK(swa_cells(6318, FlashAttn::unset) == "llama_kv_cache_iswa: creating     SWA KV cache, size = 640 cells");
    CHECK(swa_cells(6327, FlashAttn::unset) == "llama_kv_cache_iswa: creating     SWA KV cache, size = 768 cells");
    CHECK(swa_cells(6327, FlashAttn::off) == "llama_kv_cache_iswa: creating     SWA KV cache, size = 640 cells");
    // b6851 pads by get_padding; b6870 (PR #16812) pads nothing: -ub 500 wants 628 cells, kept as 628, where b6851 off gives 640
    s.ubatch = 500;
    CHECK(swa_cells(6851, FlashAttn::off) == "llama_kv_cache_iswa: creating     SWA KV cache, size = 640 cells");
    CHECK(swa_cells(6870, FlashAttn::off) == "llama_kv_cache_iswa: creating     SWA KV cache, size = 628 cells");
    CHECK(swa_cells(6870, FlashAttn::on) == "llama_kv_cache_iswa: creating     SWA KV cache, size = 628 cells");
    CHECK(swa_cells(6975, FlashAttn::off) == "llama_kv_cache_iswa: creating     SWA KV cache, size = 768 cells");  // PR #17046: 256
    // streams before b6870: each of -np 3 gets PAD(ceil(4100 / 3), 32) = PAD(1367, 32) = 1376 cells (create_memory), -fa off
    EngineSettings t;
    t.version = 6851;
    t.flash_attn = FlashAttn::off;
    t.n_ctx = 4100;
    CHECK(*ask(Engine::llamacpp, load_preset("llama-3-8b"), DType::fp16, 1366, std::nullopt, t, 3).token_capacity == 3 * 1376);
    t.flash_attn = FlashAttn::on;  // PAD(1367, 256) = 1536
    CHECK(*ask(Engine::llamacpp, load_preset("llama-3-8b"), DType::fp16, 1366, std::nullopt, t, 3).token_capacity == 3 * 1536);
}

// PR #14363 ("llama : add high-throughput mode") brought KV streams and the seqs column "%2u/%2u". Its merge commit 225e7a14 is
// build 5913 (llama.cpp issue #14724 reports "version: 5913 (225e7a14)"; app.semanticdiff.com shows 225e7a14 as the PR's squash
// commit), so build 5912 (ab140198, which issue #14847 runs without the streams code's assert) is the last with one shared cache.
TEST_CASE("llama.cpp's KV streams are pinned to build 5913: b5912 and the builds before it share one cache and print '%2u seqs'") {
    const auto cfg = load_preset("llama-3-8b");
    auto first_line = [&](const std::string& build) {
        EngineSettings s;
        s.version = parse_engine_spec("llama.cpp@" + build).version;
        return ask(Engine::llamacpp, cfg, DType::fp16, 2048, std::nullopt, s, 4).log_lines.at(0);
    };
    // -c 8192 -np 4, no -kvu. Shared: one cache of 8192 cells, 32 layers x 8192 x 1024 (8 KV heads x 128) x 2 B = 512 MiB of K.
    const std::string shared = "llama_kv_cache_unified: size = 1024.00 MiB (  8192 cells,  32 layers,  4 seqs), K (f16):  512.00 MiB, V (f16):  512.00 MiB";
    // Streams: 4 of PAD(ceil(8192 / 4), 32) = 2048 cells (-fa off by default then), 4 x 32 x 2048 x 1024 x 2 B = 512 MiB of K.
    const std::string streams = "llama_kv_cache_unified: size = 1024.00 MiB (  2048 cells,  32 layers,  4/ 4 seqs), K (f16):  512.00 MiB, V (f16):  512.00 MiB";
    CHECK(first_line("b5912") == shared);
    CHECK(first_line("b5910") == shared);  // not a known build: b5912 (2 builds away) answers, not b5913 (3)
    CHECK(first_line("b5913") == streams);
    CHECK(parse_engine_spec("llama.cpp@b5912").note.empty());
    CHECK(parse_engine_spec("llama.cpp@b5908").version == 5912);
}

TEST_CASE("SGLang v0.5.2 refuses pipeline parallel with speculative decoding: no pool, the assert's line") {
    // server_args.py check_server_args: with pp_size > 1 it asserts no overlap schedule, no speculative algorithm and no mixed
    // chunked prefill, with this message (the same in snapshots before and after v0.5.2); it runs before any pool exists
    const auto cfg = load_preset("llama-3.1-8b");
    const auto eagle = test::data_config("engines/eagle-llama3.1-8b.json");
    const std::string refusal = "AssertionError: Pipeline parallelism is not compatible with overlap schedule, speculative decoding, mixed chunked prefill.";
    EngineSettings s;
    s.draft = &eagle;
    s.pp = 2;
    const auto a = ask(Engine::sglang, cfg, DType::bf16, 8192, std::uint64_t{55436216631}, s);
    CHECK(a.log_lines == std::vector<std::string>{refusal});
    CHECK_FALSE(a.token_capacity);
    CHECK_FALSE(a.bytes_allocated);
    CHECK_FALSE(a.concurrency);
    // NGRAM keeps no draft KV but is speculative decoding all the same; a token cap changes nothing
    EngineSettings n;
    n.speculative = true;
    n.pp = 4;
    n.kv_tokens = 100000;
    CHECK(ask(Engine::sglang, cfg, DType::bf16, 8192, std::nullopt, n).log_lines == std::vector<std::string>{refusal});
    // one stage with the draft, or two stages without one, size pools as before (424,388 tokens: the test above)
    s.pp = 1;
    CHECK(*ask(Engine::sglang, cfg, DType::bf16, 8192, std::uint64_t{55436216631}, s).token_capacity == 424388);
    n.speculative = false;
    CHECK(*ask(Engine::sglang, cfg, DType::bf16, 8192, std::nullopt, n).token_capacity == 100000);
}

TEST_CASE("SGLang's default speculative tree for gpt-oss is DeepSeek's (3, 1, 4), not Llama's (5, 4, 8)") {
    // server_args.py auto_choose_speculative_params returns (3, 1, 4) for DeepseekV3/V2 and GptOssForCausalLM, in snapshots from
    // before v0.5.2 (reflectionai/sglang 444f5d21) and after it
    const auto cfg = load_preset("gpt-oss-20b");  // 24 layers x 8 KV heads x 64; SGLang v0.5.2 sizes every layer full for gpt-oss
    ModelConfig head = cfg;
    head.n_layer = 1;
    head.layer_windowed.assign(1, false);
    EngineSettings s;
    s.draft = &head;
    // cell 24 x 2 x 8 x 64 x 2 B = 49,152 B; 10 GiB // 49152 = 218,453; headroom 48 x (3 x 1 + 4) + 100 = 436 (Llama's: 1,444)
    CHECK(*ask(Engine::sglang, cfg, DType::bf16, 8192, std::uint64_t{10} << 30, s).token_capacity == 218453 + 436);
}

TEST_CASE("vLLM refuses pipeline parallel with a speculative draft in every release kvlab knows: no pool, the draft check's line") {
    // SpeculativeConfig._verify_args runs ModelConfig.verify_with_parallel_config on the draft with a parallel config that copies the
    // target's pipeline_parallel_size (create_draft_parallel_config); an EAGLE head fails supports_pp (V0's EAGLE has no SupportsPP,
    // V1's EagleLlamaForCausalLM.forward takes no intermediate_tensors), so the engine stops before any pool (vllm sources near
    // v0.8.5 and v0.10.2; vLLM's docs: "not composable with speculative decoding as of vllm<=0.15.0")
    const auto cfg = load_preset("llama-3.1-8b");
    const auto eagle = test::data_config("engines/eagle-llama3.1-8b.json");
    const std::string refusal =
        "NotImplementedError: Pipeline parallelism is not supported for this model. Supported models implement the `SupportsPP` interface.";
    for (const std::uint64_t v : {7003, 8000, 10000, 10002, 15002}) {
        CAPTURE(v);
        EngineSettings s;
        s.version = v;
        s.draft = &eagle;
        s.pp = 2;
        const auto a = ask(Engine::vllm, cfg, DType::bf16, 8192, std::uint64_t{55436216631}, s);  // 51.629 GiB
        CHECK(a.log_lines == std::vector<std::string>{refusal});
        CHECK_FALSE(a.token_capacity);
        CHECK_FALSE(a.bytes_allocated);
        CHECK_FALSE(a.concurrency);
        s.kv_tokens = 100000;  // --num-gpu-blocks-override changes nothing: the check comes first
        CHECK(ask(Engine::vllm, cfg, DType::bf16, 8192, std::nullopt, s).log_lines == std::vector<std::string>{refusal});
    }
    // one stage with the draft sizes as before: 55,436,216,631 // (16 x 8 x 128 x 2 x 2 B = 65,536 B) // 33 layers = 25,633 blocks
    // = 410,128 tokens; two stages without a draft: 16 layers each, 845,890 pages // 16 = 52,868 blocks = 845,888 tokens
    EngineSettings one;
    one.draft = &eagle;
    CHECK(*ask(Engine::vllm, cfg, DType::bf16, 8192, std::uint64_t{55436216631}, one).token_capacity == 410128);
    EngineSettings two;
    two.pp = 2;
    CHECK(*ask(Engine::vllm, cfg, DType::bf16, 8192, std::uint64_t{55436216631}, two).token_capacity == 845888);
}

TEST_CASE("vLLM v0.10.x refuses a separate draft model (not an EAGLE head, not MTP); v0.7.3, v0.8.0 and v0.15.2 size it") {
    // SpeculativeConfig.__post_init__: "method" as given, else from the draft's name ("eagle-" -> eagle, "eagle3" -> eagle3; the
    // medusa / mlp_speculator / *_mtp model types), else "draft_model", which v0.10.x's V1 engine refuses with this line
    CHECK(vllm_draft_kind("", "yuhuili/EAGLE-LLaMA3.1-Instruct-8B") == DraftKind::eagle);
    CHECK(vllm_draft_kind("", "AngelSlim/Qwen3-8B_eagle3") == DraftKind::eagle);
    CHECK(vllm_draft_kind("", "meta-llama/Llama-3.2-1B-Instruct") == DraftKind::draft_model);
    CHECK(vllm_draft_kind("draft_model", "yuhuili/EAGLE-LLaMA3.1-Instruct-8B") == DraftKind::draft_model);
    CHECK(vllm_draft_kind("eagle3", "my-head") == DraftKind::eagle);
    CHECK(vllm_draft_kind("deepseek_mtp", "mtp:1") == DraftKind::mtp);
    CHECK(vllm_draft_kind("ngram", "") == DraftKind::unset);
    CHECK(parse_engine_command("vllm serve facebook/opt-6.7b --speculative-config '{\"model\": \"facebook/opt-125m\", \"num_speculative_tokens\": 5}'")
              .draft_kind == DraftKind::draft_model);
    CHECK(parse_engine_command("vllm serve m --speculative-config '{\"method\": \"eagle\", \"model\": \"d\"}'").draft_kind == DraftKind::eagle);
    // --draft CONFIG: the EAGLE head's one layer (and its name) vs Llama 3.2 1B's 16 layers
    const auto cfg = load_preset("llama-3.1-8b");
    const auto eagle = test::data_config("engines/eagle-llama3.1-8b.json");
    const auto small = load_preset("llama-3.2-1b");
    CHECK(draft_kind_of(eagle) == DraftKind::eagle);
    CHECK(draft_kind_of(small) == DraftKind::draft_model);
    const std::string refusal = "NotImplementedError: Speculative decoding with draft model is not supported yet. Please consider using "
                                "other speculative decoding methods such as ngram, medusa, eagle, or deepseek_mtp.";
    EngineSettings s;
    s.draft = &small;
    s.draft_kind = DraftKind::draft_model;
    for (const std::uint64_t v : {10000, 10002}) {
        CAPTURE(v);
        s.version = v;
        const auto a = ask(Engine::vllm, cfg, DType::bf16, 8192, std::uint64_t{55436216631}, s);  // 51.629 GiB
        CHECK(a.log_lines == std::vector<std::string>{refusal});
        CHECK_FALSE(a.token_capacity);
        CHECK_FALSE(a.bytes_allocated);
    }
    // v0.15.2 (and V0 in v0.7.3 / v0.8.0): the draft's 16 layers join the pool with the target's page (65,536 B > the draft's
    // 16 x 8 x 64 x 2 x 2 B = 32,768 B): 55,436,216,631 // 65,536 = 845,889 pages // 48 layers = 17,622 blocks x 16 = 281,952 tokens
    for (const std::uint64_t v : {7003, 8000, 15002}) {
        CAPTURE(v);
        s.version = v;
        CHECK(*ask(Engine::vllm, cfg, DType::bf16, 8192, std::uint64_t{55436216631}, s).token_capacity == 281952);
    }
    // an EAGLE head in v0.10.2 sizes as before (410,128 tokens: the test above)
    s.version = 10002, s.draft = &eagle, s.draft_kind = DraftKind::eagle;
    CHECK(*ask(Engine::vllm, cfg, DType::bf16, 8192, std::uint64_t{55436216631}, s).token_capacity == 410128);
}
