#include <doctest/doctest.h>

#include <sstream>

#include "kvlab/core/error.hpp"
#include "calc/kvcalc.hpp"
#include "kvlab/calc/gpu_specs.hpp"
#include "kvlab/calc/param_count.hpp"
#include "kvlab/core/units.hpp"
#include "test_support.hpp"

using namespace kvlab;

namespace {

const Table& table_named(const Report& r, const std::string& prefix) {
    for (const auto& t : r.tables)
        if (t.title.rfind(prefix, 0) == 0) return t;
    FAIL("no table " << prefix);
    return r.tables.front();
}

const nlohmann::json& cell(const Table& t, std::size_t row, const std::string& key) {
    for (std::size_t c = 0; c < t.columns.size(); ++c)
        if (t.columns[c].key == key) return t.rows.at(row)[c].value;
    FAIL("no column " << key);
    return t.rows.at(row)[0].value;
}

// One model at one dtype and 8192 tokens on a GPU of `memory` bytes and `bandwidth` B/s, 90% usable.
KvcalcRequest gpu_request(const char* preset, const char* gpu_name, std::uint64_t memory, std::uint64_t bandwidth) {
    KvcalcRequest r;
    r.models = {load_preset(preset)};
    r.dtypes = {DType::fp16};
    r.contexts = {8192};
    r.batches = {1};
    GpuSpec g;
    g.name = g.display_name = gpu_name;
    g.memory_bytes = memory;
    g.bandwidth_bytes_per_s = bandwidth;
    r.gpu = g;
    r.mem_util = 0.9;
    return r;
}

}  // namespace

TEST_CASE("vLLM's block count for Llama-3.1-8B at a 3.8125 GiB budget is reproduced exactly") {
    // 3.8125 GiB / (16 tokens x 131072 B) = 4093640704 / 2097152 = 1952 blocks (vLLM issue #10517)
    const auto fit = fit_budget(parse_size("3.8125GiB", "--kv-budget"), 131072, 16);
    CHECK(fit.n_blocks == 1952);
    CHECK(fit.n_tokens == 1952 * 16);
    KvcalcRequest r;
    r.models = {load_preset("llama-3.1-8b")};
    r.dtypes = {DType::bf16};
    r.contexts = {20000};
    r.kv_budget = parse_size("3.8125GiB", "--kv-budget");
    const auto report = run_kvcalc(r);
    const auto& t = table_named(report, "KV budget");
    CHECK(cell(t, 0, "gpu_blocks") == 1952);
    CHECK(t.rows[0][7].text == "1.56x");  // 1952 / ceil(20000 / 16) = 1952 / 1250 = 1.5616, printed like vLLM
}

TEST_CASE("The budget's concurrency counts a request's whole blocks, and a window's cap") {
    KvcalcRequest r;
    r.models = {load_preset("llama-3.1-8b")};
    r.dtypes = {DType::bf16};
    r.contexts = {1000};
    r.kv_budget = parse_size("3.8125GiB", "--kv-budget");
    // 1000 tokens hold ceil(1000 / 16) = 63 blocks: 1952 / 63 = 30.98x, as vLLM v0.10.2 divides (not 31232 / 1000 = 31.23x)
    CHECK(table_named(run_kvcalc(r), "KV budget").rows[0][7].text == "30.98x");
    // Mistral-7B-v0.1: every layer slides over 4096 tokens; 2 x 32 x 8 x 128 x 2 B = 131072 B a token.
    // 10 GiB / (16 x 131072 B) = 5120 blocks; a 32768-token request holds ceil(4096 / 16) = 256 of them: 20.00x
    // (all 32768 tokens would be 2.50x; --window-mode ignore keeps that)
    r.models = {load_preset("mistral-7b-v0.1")};
    r.contexts = {32768};
    r.kv_budget = std::uint64_t{10} << 30;
    const auto windowed = run_kvcalc(r);
    CHECK(table_named(windowed, "KV budget").rows[0][7].text == "20.00x");
    CHECK(std::any_of(windowed.notes.begin(), windowed.notes.end(), [](const std::string& n) { return n.find("--engine vllm gives its figure") != std::string::npos; }));
    r.window_mode = WindowMode::ignore;
    CHECK(table_named(run_kvcalc(r), "KV budget").rows[0][7].text == "2.50x");
}

TEST_CASE("vLLM's Llama-3-8B figures (11.12GiB, 5691 blocks, 11.12x at 8192) agree within the budget's rounding") {
    const auto per_token = kv_bytes_per_token(load_preset("llama-3-8b"), DType::bf16).total();  // 131072
    // The printed budget is rounded to 2 decimals, so the true one lies in [11.115, 11.125) GiB.
    const auto lo = fit_budget(parse_size("11.115GiB", "--kv-budget"), per_token, 16).n_blocks;
    const auto hi = fit_budget(parse_size("11.125GiB", "--kv-budget"), per_token, 16).n_blocks;
    CHECK(lo <= 5691);
    CHECK(5691 <= hi);
    // 5691 blocks x 16 tokens / 8192 tokens per request = 11.115... printed as 11.12x (vLLM issue #12330)
    CHECK(5691.0 * 16 / 8192 == doctest::Approx(11.115).epsilon(1e-4));
}

TEST_CASE("Paged allocation rounds each sequence up to whole blocks and reports the waste") {
    KvcalcRequest r;
    r.models = {load_preset("llama-2-7b")};
    r.dtypes = {DType::fp16};
    r.contexts = {1000};
    r.batches = {8};
    r.block_size = 16;
    const auto report = run_kvcalc(r);
    const auto& t = table_named(report, "KV cache per sequence");
    CHECK(cell(t, 0, "blocks_per_sequence") == 63);                              // ceil(1000 / 16)
    CHECK(cell(t, 0, "bytes_per_sequence") == 63ull * 16 * 524288);              // 1008 tokens x 512 KiB
    CHECK(cell(t, 0, "bytes_paging_waste_per_batch") == 8ull * 8 * 524288);      // 8 unused slots x 8 sequences
}

TEST_CASE("Tensor parallelism splits KV heads and replicates them when TP exceeds them") {
    const auto cfg = load_preset("llama-2-70b");  // 8 KV heads
    CHECK(per_gpu_config(cfg, 4).n_head_kv == 2);
    CHECK(per_gpu_config(cfg, 16).n_head_kv == 1);  // 16 GPUs share 8 heads: each GPU holds one, replicated twice
    CHECK_THROWS_AS(per_gpu_config(cfg, 3), UsageError);
}

TEST_CASE("GPU fit subtracts the weights from usable memory and divides by bytes per token") {
    const auto report = run_kvcalc(gpu_request("llama-3-8b", "test", 80ull << 30, 2000000000000ull));
    const auto& t = table_named(report, "Does it fit on");
    const std::uint64_t weights = 8030261248ull * 2;                               // computed parameters x 2 B (bf16)
    const std::uint64_t usable = static_cast<std::uint64_t>((80ull << 30) * 0.9);  // 77309411328
    CHECK(cell(t, 0, "bytes_weights_per_gpu") == weights);
    CHECK(cell(t, 0, "bytes_kv_budget_per_gpu") == usable - weights);
    CHECK(cell(t, 0, "max_tokens") == (usable - weights) / 131072);
    CHECK(cell(t, 0, "fits") == "yes");
    CHECK(cell(table_named(report, "Largest batch at each context"), 0, "max_batch") == (usable - weights) / (131072ull * 8192));
    // one sequence fits the model's whole context
    CHECK(cell(table_named(report, "Longest context at each batch"), 0, "max_context").get<std::uint64_t>() == 8192);
    const auto& roof = table_named(report, "Decode roofline");
    // (weights + 8192 x 131072 B of KV) / 2e12 B/s
    CHECK(cell(roof, 0, "min_ms_per_step").get<double>() == doctest::Approx((weights + 8192.0 * 131072) / 2e12 * 1e3));
}

TEST_CASE("--pp sizes every per-GPU figure for the fullest stage; the roofline still reads every stage") {
    // Llama-3-8B at --pp 2, TP 1: 32 layers split 16 + 16. Parameters 8,030,261,248; embeddings and lm_head 128256 x 4096 =
    // 525,336,576 each; per layer (8,030,261,248 - 2 x 525,336,576) / 32 = 218,112,128. Stage 0 (the first of the tie):
    // 16 x 218,112,128 + 525,336,576 = 4,015,130,624 params x 2 B = 8,030,261,248 B of weights (PP 1: 16,060,522,496 B).
    // Usable floor(80 GiB x 0.9) = 77,309,411,328 B; KV budget 77,309,411,328 - 8,030,261,248 = 69,279,150,080 B.
    // KV per token on the stage: 16 layers x 2 x 8 heads x 128 x 2 B = 65,536 B: max tokens 69,279,150,080 / 65,536 = 1,057,115;
    // 8192 tokens hold 536,870,912 B: largest batch floor(69,279,150,080 / 536,870,912) = 129 (PP 1: 57).
    auto r = gpu_request("llama-3-8b", "test", 80ull << 30, 2000000000000ull);
    r.pp = 2;
    const auto report = run_kvcalc(r);
    const auto& t = table_named(report, "Does it fit on test (90% of 80.00 GiB, TP 1 × PP 2 = 2 GPUs, the fullest stage)");
    CHECK(cell(t, 0, "bytes_weights_per_gpu") == 8030261248ull);
    CHECK(cell(t, 0, "bytes_kv_budget_per_gpu") == 69279150080ull);
    CHECK(cell(t, 0, "max_tokens") == 1057115);
    CHECK(cell(t, 0, "bytes_kv_per_gpu") == 536870912ull);
    CHECK(cell(table_named(report, "KV cache per sequence and batch"), 0, "bytes_per_batch_per_gpu") == 536870912ull);
    CHECK(cell(table_named(report, "KV cache per sequence and batch"), 0, "bytes_per_batch") == 1073741824ull);  // the whole model's
    CHECK(cell(table_named(report, "Largest batch at each context"), 0, "max_batch") == 129);
    // a step passes through both stages: (16,060,522,496 B of weights + 8192 x 131,072 B of KV) / 2e12 B/s = 8.567 ms, as at PP 1
    const auto& roof = table_named(report, "Decode roofline");
    CHECK(cell(roof, 0, "bytes_weights_read") == 16060522496ull);
    CHECK(cell(roof, 0, "bytes_kv_read") == 8192ull * 131072);
    CHECK(cell(roof, 0, "min_ms_per_step").get<double>() == doctest::Approx((16060522496.0 + 8192.0 * 131072) / 2e12 * 1e3));
    REQUIRE(report.headline.size() >= 1);
    CHECK(report.headline[0].find("(7.48 GiB of weights per GPU at TP 1 × PP 2)") != std::string::npos);  // 8,030,261,248 B
    // --pp 3: 11, 11, 10 layers; stage 0 holds 11 x 218,112,128 + 525,336,576 = 2,924,569,984 params = 5,849,139,968 B
    r.pp = 3;
    CHECK(cell(table_named(run_kvcalc(r), "Does it fit on"), 0, "bytes_weights_per_gpu") == 5849139968ull);
    r.pp = 33;  // more stages than layers
    CHECK_THROWS_AS(run_kvcalc(r), UsageError);
}

TEST_CASE("A MoE decode step reads the routed experts its whole batch uses, not one token's") {
    // Mixtral-8x7B (d 4096, 32 layers, vocab 32000 untied, 32 heads, 8 KV heads of 128, expert FFN 14336, top-2 of 8):
    //   embeddings 2 x 32000 x 4096 = 262,144,000; attention 32 x (2 x 4096^2 + 2 x 4096 x 1024) = 1,342,177,280;
    //   norms 32 x 2 x 4096 + 4096 = 266,240; one expert 3 x 4096 x 14336 = 176,160,768; router 4096 x 8 = 32,768
    //   one token: 262,144,000 + 1,342,177,280 + 266,240 + 32 x (2 x 176,160,768 + 32,768) = 12,879,925,248 parameters
    const std::uint64_t one_token = 12879925248ull, expert = 176160768ull;
    auto r = gpu_request("mixtral-8x7b", "test", 1ull << 40, 2000000000000ull);
    r.batches = {1, 2, 64};
    const auto report = run_kvcalc(r);
    const auto& roof = table_named(report, "Decode roofline");
    CHECK(cell(roof, 0, "bytes_weights_read") == one_token * 2);  // fp16
    // B = 2: an expert is missed by both tokens with probability (6/8)^2 = 0.5625, so 8 x 0.4375 = 3.5 experts
    // per layer are read: 1.5 more than one token's 2, on 32 layers
    CHECK(cell(roof, 1, "bytes_weights_read") == (one_token + 48 * expert) * 2);
    // B = 64: (6/8)^64 = 1.0e-8, so all 8 experts (every parameter: 46,702,792,704) but ~8e-8 of an expert per layer
    const auto all = count_params(load_preset("mixtral-8x7b")).total() * 2;
    CHECK(all == 46702792704ull * 2);
    const auto b64 = cell(roof, 2, "bytes_weights_read").get<std::uint64_t>();
    CHECK(b64 < all);
    CHECK(b64 > all - 1000);  // 32 layers x 8 x 0.75^64 x 176,160,768 parameters = 455, x 2 B = 910 B short of every expert
    // with the checkpoint's stored bytes (1 B a parameter, as an fp8 checkpoint), the read is that share
    // of them, and never more than the weights held
    auto fp8 = gpu_request("mixtral-8x7b", "test", 1ull << 40, 2000000000000ull);
    fp8.models[0].stored_weight_bytes = 46702792704ull;
    fp8.batches = {1, 64};
    const auto fp8_report = run_kvcalc(fp8);
    const auto& froof = table_named(fp8_report, "Decode roofline");
    CHECK(cell(froof, 0, "bytes_weights_read").get<double>() == doctest::Approx(12879925248.0).epsilon(1e-12));  // one token's parameters x 1 B
    CHECK(cell(froof, 1, "bytes_weights_read").get<std::uint64_t>() <= 46702792704ull);
    CHECK(cell(froof, 1, "bytes_weights_read").get<std::uint64_t>() > 46702792704ull - 1000);
    CHECK(cell(table_named(fp8_report, "Does it fit on"), 0, "bytes_weights_per_gpu") == 46702792704ull);
    // a dense model reads the same weights at any batch
    auto dense = gpu_request("llama-3-8b", "test", 80ull << 30, 2000000000000ull);
    dense.batches = {1, 64};
    const auto dense_report = run_kvcalc(dense);
    const auto& droof = table_named(dense_report, "Decode roofline");
    CHECK(cell(droof, 0, "bytes_weights_read") == cell(droof, 1, "bytes_weights_read"));
}

TEST_CASE("A model whose weights do not fit says so, with the smallest TP that would, and gets no batch, context or roofline rows") {
    const auto report = run_kvcalc(gpu_request("llama-3-70b", "24 GiB", 24ull << 30, 300000000000ull));
    const auto& t = table_named(report, "Does it fit on");
    // 70,553,706,496 parameters x 2 B (bf16) = 141,107,412,992 B; usable floor(24 GiB x 0.9) = 23,192,823,398 B.
    // TP 8 holds 17,638,426,624 B per GPU and fits; TP 4 (35.3 GB) does not; 5, 6 and 7 do not divide 64 heads.
    CHECK(cell(t, 0, "bytes_weights_per_gpu") == 141107412992ull);
    CHECK(cell(t, 0, "fits") == "no: weights");  // the batch cannot fit where the weights alone do not
    CHECK(cell(t, 0, "max_tokens").is_null());
    bool said = false;
    for (const auto& n : report.notes) said = said || n.find("llama-3-70b does not fit on 24 GiB") != std::string::npos &&
                                                         n.find("needs TP >= 8 (--tp 8)") != std::string::npos;
    CHECK(said);
    for (const auto& other : report.tables) {
        CHECK(other.title.rfind("Largest batch", 0) != 0);
        CHECK(other.title.rfind("Decode roofline", 0) != 0);
    }
}

TEST_CASE("A batch of 1e15 sequences overflows instead of wrapping") {
    KvcalcRequest r;
    r.models = {load_preset("llama-2-7b")};
    r.contexts = {4096};
    r.batches = {1000000000000000ull};
    CHECK_THROWS_AS(run_kvcalc(r), OverflowError);
}

TEST_CASE("Attention variants parse and reject unknown names") {
    const auto v = parse_attention_variants("native,mha,gqa:8,mqa");
    REQUIRE(v.size() == 4);
    CHECK(v[2].n_head_kv == 8);
    CHECK(v[3].n_head_kv == 1);
    CHECK_THROWS_AS(parse_attention_variants("mha,foo"), UsageError);
}

TEST_CASE("Every output format carries the exact byte counts") {
    KvcalcRequest r;
    r.models = {load_preset("llama-2-7b")};
    r.dtypes = {DType::fp16};
    r.contexts = {4096};
    const auto report = run_kvcalc(r);
    std::ostringstream json, csv, md, table;
    print_report(json, report, Format::json);
    print_report(csv, report, Format::csv);
    print_report(md, report, Format::markdown);
    print_report(table, report, Format::table);
    const auto j = nlohmann::json::parse(json.str());
    CHECK(j["tables"][0]["rows"][0]["bytes_per_token"] == 524288);
    CHECK(j["tables"][1]["rows"][0]["bytes_per_sequence"] == 2147483648ull);
    CHECK(j["inputs"]["models"][0]["n_layer"] == 32);
    CHECK(csv.str().find(",524288,") != std::string::npos);
    CHECK(md.str().find("| 512.00 KiB |") != std::string::npos);
    CHECK(table.str().find("2.00 GiB") != std::string::npos);
    CHECK(table.str().find(" GB") == std::string::npos);  // IEC output never says GB
}

TEST_CASE("A name from a file is escaped in table and markdown cells, and quoted in CSV when it holds a CR") {
    KvcalcRequest r;
    r.models = {load_preset("llama-2-7b")};
    r.models[0].name = "evil\x1b[31m\rname";  // as a config's _name_or_path may carry
    r.dtypes = {DType::fp16};
    r.contexts = {4096};
    const auto report = run_kvcalc(r);
    std::ostringstream csv, md, table;
    print_report(csv, report, Format::csv);
    print_report(md, report, Format::markdown);
    print_report(table, report, Format::table);
    CHECK(table.str().find('\x1b') == std::string::npos);
    CHECK(md.str().find('\x1b') == std::string::npos);
    CHECK(table.str().find("evil\\x1B[31m\\rname") != std::string::npos);
    // CSV keeps the exact bytes, as data, in quotes: RFC 4180 quotes a field with a CR
    CHECK(csv.str().find("\"evil\x1b[31m\rname\"") != std::string::npos);
}

TEST_CASE("A config whose quantization_config names a method gets a note on the fit's weight width") {
    nlohmann::json j = {{"model_type", "llama"}, {"hidden_size", 4096}, {"num_hidden_layers", 32}, {"num_attention_heads", 32},
                        {"num_key_value_heads", 8}, {"intermediate_size", 14336}, {"vocab_size", 128256}, {"max_position_embeddings", 8192},
                        {"quantization_config", {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}}}};
    KvcalcRequest r;
    r.models = {parse_model_config(j, "q.json", "q")};
    CHECK(r.models[0].quant_method == "fp8");
    r.dtypes = {DType::bf16};
    r.contexts = {4096};
    r.gpu = find_gpu("h100-sxm-80gb");
    const auto report = run_kvcalc(r);
    CHECK(std::any_of(report.notes.begin(), report.notes.end(),
                      [](const std::string& n) { return n.find("quant_method 'fp8'") != std::string::npos && n.find("--weights-dtype") != std::string::npos; }));
    j.erase("quantization_config");  // no method, no note
    r.models = {parse_model_config(j, "q.json", "q")};
    const auto plain = run_kvcalc(r);
    CHECK(std::none_of(plain.notes.begin(), plain.notes.end(), [](const std::string& n) { return n.find("quant_method") != std::string::npos; }));
}

TEST_CASE("Roofline rows say whether the batch's KV fits; no batch is sized past the model's max context") {
    auto r = gpu_request("llama-3-8b", "test", 80ull << 30, 2000000000000ull);
    r.contexts = {8192, 32768};  // Llama-3-8B's max context is 8192
    r.batches = {1, 64};
    const auto report = run_kvcalc(r);
    // budget floor(80 GiB x 0.9) - 16,060,522,496 B = 61,248,888,832 B; 64 x 8192 tokens x 131,072 B = 64 GiB does not fit, 1 x 8192 does
    const auto& roof = table_named(report, "Decode roofline");
    CHECK(cell(roof, 0, "kv_fits") == "yes");  // T 8192, B 1
    CHECK(cell(roof, 1, "kv_fits") == "no");   // T 8192, B 64
    const auto& batch = table_named(report, "Largest batch at each context");
    CHECK(cell(batch, 0, "max_batch") == 61248888832ull / (131072ull * 8192));  // 57 at 8192
    CHECK(batch.rows[1][4].text == "-");                                       // 32768: past the model's 8192
    CHECK(cell(batch, 1, "max_batch").is_null());
    // with --block-size 16, 4097 tokens hold 257 blocks = 4112 token slots: 114 x 4112 x 131072 B = 61,442,359,296 B is past the
    // budget, though 114 x 4097 x 131072 B = 61,218,226,176 B of tokens would fit; KV fits follows the blocks, as Largest batch does
    r.contexts = {4097};
    r.batches = {114};
    r.block_size = 16;
    const auto paged = run_kvcalc(r);
    CHECK(cell(table_named(paged, "Decode roofline"), 0, "kv_fits") == "no");
    CHECK(cell(table_named(paged, "Largest batch at each context"), 0, "max_batch") == 113);  // 61,248,888,832 / 538,968,064
}

TEST_CASE("roofline time is the larger of compute time and memory time, from the preset's datasheet figures") {
    const auto h100 = kvlab::find_gpu("h100");
    // gpus.json (NVIDIA H100 SXM datasheet): 3.35 TB/s = 3.35e12 B/s, 989.4 TFLOP/s dense BF16.
    // 3.35e9 bytes take 3.35e9 / 3.35e12 = 1 ms; 9.894e11 FLOPs take 9.894e11 / 9.894e14 = 1 ms.
    auto t = kvlab::roofline_time(h100, 9.894e11 / 2, 3.35e9);  // compute 0.5 ms, memory 1 ms
    CHECK(t.memory_s == doctest::Approx(1e-3));
    CHECK(t.compute_s == doctest::Approx(0.5e-3));
    CHECK(t.seconds() == doctest::Approx(1e-3));
    CHECK(t.memory_bound());
    t = kvlab::roofline_time(h100, 9.894e11 * 2, 3.35e9);  // compute 2 ms beats memory 1 ms
    CHECK(t.seconds() == doctest::Approx(2e-3));
    CHECK_FALSE(t.memory_bound());
    kvlab::GpuSpec no_bandwidth = h100;
    no_bandwidth.bandwidth_bytes_per_s = 0;
    CHECK_THROWS_AS(kvlab::roofline_time(no_bandwidth, 1, 1), kvlab::UsageError);
}

TEST_CASE("The headline answers does-it-fit with the figures the fit table holds, and the two agree") {
    // Llama-3-8B fp16: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 131072 B (128 KiB) per token; a batch of
    // 64 at 8192 tokens holds 64 x 8192 x 128 KiB = 64 GiB. On an 80 GiB GPU at 90%: usable 77,309,411,328 B,
    // weights 8,030,261,248 x 2 B = 16,060,522,496 B, so the KV budget is 61,248,888,832 B = 57.04 GiB: no.
    auto r = gpu_request("llama-3-8b", "test", 80ull << 30, 2000000000000ull);
    r.batches = {64};
    const auto report = run_kvcalc(r);
    const auto& t = table_named(report, "Does it fit on");
    CHECK(cell(t, 0, "bytes_kv_per_gpu") == 64ull << 30);
    CHECK(cell(t, 0, "bytes_kv_budget_per_gpu") == 61248888832ull);
    CHECK(cell(t, 0, "fits") == "no: KV");
    REQUIRE(report.headline.size() == 2);
    CHECK(report.headline[0] == "does not fit: batch 64 at 8,192 tokens needs 64.00 GiB of KV per GPU; 57.04 GiB is free after the weights "
                                "(14.96 GiB of weights)");
    // what fits: floor(61,248,888,832 / (8192 x 131072)) = 57 sequences of 8192 tokens; floor(61,248,888,832 /
    // (64 x 131072)) = 7301 tokens at batch 64 (as "Largest batch" and "Longest context" say)
    CHECK(report.headline[1] == "fits: batch 57 at 8,192 tokens, or 7,301 tokens at batch 64");
    CHECK(cell(table_named(report, "Largest batch at each context"), 0, "max_batch") == 57);
    CHECK(cell(table_named(report, "Longest context at each batch"), 0, "max_context") == 7301);

    // batch 8 fits: 8 GiB of the 57.04 GiB, 49.04 GiB to spare; the roofline: (16,060,522,496 + 8 GiB) B / 2e12 B/s = 12.325 ms
    r.batches = {8};
    const auto fits = run_kvcalc(r);
    CHECK(cell(table_named(fits, "Does it fit on"), 0, "fits") == "yes");
    REQUIRE(fits.headline.size() == 2);
    CHECK(fits.headline[0] == "fits: batch 8 at 8,192 tokens needs 8.00 GiB of KV per GPU of the 57.04 GiB free after the weights "
                              "(14.96 GiB of weights): 49.04 GiB to spare");
    CHECK(fits.headline[1].rfind("room for up to batch 57 at 8,192 tokens; decode at best 12.325 ms/step", 0) == 0);
}

TEST_CASE("Without a GPU the headline gives the KV per token and per batch") {
    KvcalcRequest r;
    r.models = {load_preset("llama-3-8b")};
    r.dtypes = {DType::fp16};
    r.contexts = {4096};
    // 128 KiB per token (above) x 4096 tokens = 512 MiB
    CHECK(run_kvcalc(r).headline == std::vector<std::string>{"llama-3-8b keeps 128.00 KiB of KV per token (fp16, GQA-8); 4,096 tokens × batch 1 = 512.00 MiB"});
    r.models.push_back(load_preset("llama-2-7b"));
    r.models.push_back(load_preset("mistral-7b-v0.1"));
    r.models.push_back(load_preset("qwen3-8b"));
    const auto many = run_kvcalc(r).headline;  // more than 3 models: the range in at most 3 lines
    REQUIRE(many.size() == 2);
    // Llama-2-7B MHA: 32 x 32 x 128 x 2 x 2 B = 512 KiB, the most; Llama-3-8B and Mistral-7B GQA-8 128 KiB, the least
    CHECK(many[0] == "4 models: KV per token from 128.00 KiB (llama-3-8b GQA-8 fp16) to 512.00 KiB (llama-2-7b MHA fp16)");
}

TEST_CASE("Warnings reach stderr in every format; JSON keeps them in its notes too") {
    Report report;
    report.headline = {"the answer"};
    report.notes = {"a rule applied", "warning: something to see"};
    for (const Format f : {Format::table, Format::markdown, Format::csv, Format::json}) {
        std::ostringstream out, err;
        print_report(out, report, f, err);
        CHECK(err.str() == "warning: something to see\n");
        CHECK((out.str().find("warning:") != std::string::npos) == (f == Format::json));
        if (f == Format::table || f == Format::markdown) CHECK(out.str().find("a rule applied") != std::string::npos);
        if (f == Format::json) CHECK(nlohmann::json::parse(out.str())["notes"][1] == "warning: something to see");
    }
}
