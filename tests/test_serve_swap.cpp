// Swap preemption and narrow KV pools in serve (issue 47, parts 3 and 4). Truth from outside: the trained
// models, preempted by swapping, must still write the greedy text PyTorch wrote (models/reference.json);
// random-weight models must match a solo run of each request (--check); byte counts are hand arithmetic.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#include "kvlab/calc/gpu_specs.hpp"
#include "kvlab/formats/checkpoint.hpp"
#include "kvlab/kv/kv_pool.hpp"
#include "kvlab/serve/scheduler.hpp"
#include "kvlab/weights/random_weights.hpp"
#include "serve/swap.hpp"
#include "session/serve_session.hpp"
#include "sim_configs.hpp"
#include "reference_models.hpp"
#include "test_paths.hpp"

using namespace kvlab;

namespace {

std::int64_t sum_steps(const ServeResult& r, std::int64_t ServeStep::*field) {
    std::int64_t n = 0;
    for (const ServeStep& s : r.steps) n += s.*field;
    return n;
}

// Tokens swapped out over the run (each swapped_out event's count).
std::int64_t swapped_tokens(const ServeResult& r) {
    std::int64_t n = 0;
    for (const ServeRequestResult& q : r.requests)
        for (const ServeEvent& e : q.events)
            if (e.kind == ServeEventKind::swapped_out) n += e.n_tokens;
    return n;
}

}  // namespace

TEST_CASE("serve --preempt swap: the trained models still write PyTorch's greedy text, every preemption swapped out and back in") {
    const nlohmann::json ref = test::reference_json();  // kept alive: the loop iterates into it
    for (const auto& item : ref.at("models").items()) {
        CAPTURE(item.key());
        const LoadedModel model = test::reference_checkpoint(item.value());
        std::vector<std::vector<TokenId>> want;
        const std::vector<ServeRequest> reqs = test::greedy_requests(item.value(), want);
        // prompts of 5, 16 and 9 tokens, 64 generated each: a 160-row pool of 4-row blocks preempts
        ServeOptions o;
        o.pool = {KvLayout::paged, 160, 4, false};
        o.max_batched_tokens = 8;
        o.max_seqs = 4;
        o.max_model_len = model.config.n_ctx_max;
        o.preempt = PreemptMode::swap;
        o.host_kv_bytes = std::uint64_t{1} << 30;
        o.host_bytes_per_s = pcie4_x16_bytes_per_s;
        const ServeResult r = run_serving(model.config, model.weights, reqs, o);
        for (std::size_t i = 0; i < reqs.size(); ++i) {
            CAPTURE(i);
            CHECK(r.requests[i].generated == want[i]);
            CHECK(r.requests[i].recomputed_tokens == 0);  // nothing discarded: every preemption swapped
        }
        CHECK(r.preemptions > 0);
        CHECK(sum_steps(r, &ServeStep::n_swapped_out) == r.preemptions);
        CHECK(sum_steps(r, &ServeStep::n_swapped_in) == r.preemptions);  // all came back
        CHECK(sum_steps(r, &ServeStep::swap_in_bytes) == sum_steps(r, &ServeStep::swap_out_bytes));
        // fp32 rows, no window: each swapped token moves 2 (K, V) x layers x d_kv x 4 bytes; for MLA (tiny-mla)
        // one latent row of kv_lora_rank + qk_rope_head_dim values per layer, no V
        const ModelConfig& c = model.config;
        const auto token_bytes = static_cast<std::int64_t>(c.mla ? c.n_layer * (c.mla->kv_lora_rank + c.mla->qk_rope_head_dim) * 4
                                                                 : 2 * c.n_layer * c.d_kv() * 4);
        CHECK(sum_steps(r, &ServeStep::swap_out_bytes) == token_bytes * swapped_tokens(r));
        CHECK(r.recompute_flops == 0);
        CHECK(r.host_peak_bytes > 0);
        CHECK(r.rows_left_in_use == 0);
    }
}

TEST_CASE("serve --preempt swap --check: every request equals a solo run (windows, prefix cache, a narrow pool, a full host tier)") {
    struct Case {
        const char* what;
        ModelConfig cfg;
        bool prefix;
        KvStorage storage;
        std::uint64_t host_bytes;
    };
    const Case cases[] = {
        {"llama", test::tiny_config(Family::llama, 4, 2), true, {}, 1 << 20},
        {"gpt2", test::tiny_config(Family::gpt2, 4, 4), false, {}, 1 << 20},
        {"windowed", test::tiny_config(Family::llama, 4, 1, 2, 8), false, {}, 1 << 20},
        {"q8_0 pool", test::tiny_config(Family::llama, 4, 4), false, {DType::q8_0, KvScale::tensor}, 1 << 20},
        {"host tier of 600 bytes: most swaps refused", test::tiny_config(Family::llama, 4, 2), false, {}, 600},
    };
    for (const Case& c : cases) {
        const std::string what = c.what;
        CAPTURE(what);
        const Weights w = random_weights(c.cfg, 7);
        std::vector<ServeRequest> reqs;
        for (int i = 0; i < 6; ++i) {
            std::vector<TokenId> p = {3, 1, 4, 1, 5, 9, 2, 6};
            for (int j = 0; j < 3 + 2 * i; ++j) p.push_back(static_cast<TokenId>((7 * i + 3 * j) % c.cfg.n_vocab));
            reqs.push_back({p, 6 + 3 * i, i / 2});
        }
        ServeOptions o;
        o.pool = {KvLayout::paged, c.cfg.sliding_window ? 24 : 64, 4, c.prefix};
        o.kv_storage = c.storage;
        o.max_batched_tokens = 12;
        o.max_seqs = 4;
        o.max_model_len = 48;
        o.check = true;
        o.preempt = PreemptMode::swap;
        o.host_kv_bytes = c.host_bytes;
        o.host_bytes_per_s = 1e9;
        const ServeResult r = run_serving(c.cfg, w, reqs, o);
        const bool narrow = c.storage.dtype != DType::fp32;
        for (const ServeRequestResult& rr : r.requests) {
            CHECK(rr.checked);
            CHECK(std::ssize(rr.generated) == rr.max_tokens);
            if (!narrow) {
                CHECK(rr.solo_agree == rr.max_tokens);
                CHECK(rr.within_tolerance);
            }
        }
        CHECK(r.rows_left_in_use == 0);
        const std::int64_t outs = sum_steps(r, &ServeStep::n_swapped_out);
        CHECK(sum_steps(r, &ServeStep::n_swapped_in) == outs);
        if (!c.cfg.sliding_window) CHECK(r.preemptions > 0);
        if (c.host_bytes < 1000) {
            // 600 bytes hold a sequence of at most 2 tokens (256 bytes each: 2 layers x 2 x 16 values x 4 bytes)
            CHECK(r.swap_fallbacks > 0);
            CHECK(r.recompute_flops > 0);
            CHECK(r.host_peak_bytes <= 600);
        } else if (!c.cfg.sliding_window) {
            CHECK(outs == r.preemptions);
            // one stored row: fp32 d_kv x 4 bytes; q8_0 d_kv / 32 blocks of 34 bytes (32 values, an fp16 scale)
            const std::int64_t row = narrow ? c.cfg.d_kv() / 32 * 34 : c.cfg.d_kv() * 4;
            CHECK(sum_steps(r, &ServeStep::swap_out_bytes) == 2 * c.cfg.n_layer * row * swapped_tokens(r));
        }
        if (narrow) CHECK(r.requests.front().max_abs_dlogit > 0.0);  // the narrow pool differs from fp32 K and V
    }
}

TEST_CASE("A narrow KV pool saves and loads rows bit for bit, and copies them with their scales") {
    const ModelConfig cfg = test::tiny_config(Family::llama, 4, 4);  // d_kv 32: one q4_0 block per row
    for (const KvStorage storage : {KvStorage{DType::q4_0, KvScale::tensor}, KvStorage{DType::int8, KvScale::token_head}, KvStorage{}}) {
        CAPTURE(dtype_name(storage.dtype));
        KvPool pool(cfg, 8, storage);
        // q4_0: 18 bytes per 32 values; int8 token-head: 32 bytes and 4 fp32 scales (one per KV head); fp32: 128
        const std::uint64_t want_row = storage.dtype == DType::q4_0 ? 18 : storage.dtype == DType::int8 ? 32 + 16 : 128;
        CHECK(pool.stored_row_bytes() == want_row);
        std::vector<std::uint8_t> rows(3 * want_row);
        for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<std::uint8_t>(i * 7 + 1);
        pool.load_rows(1, 1, 2, 3, rows.data());
        pool.copy({2, 5, 3});  // rows 2..4 to 5..7 in every layer
        std::vector<std::uint8_t> back(rows.size(), 0);
        pool.save_rows(1, 1, 5, 3, back.data());
        CHECK(back == rows);
    }
}

TEST_CASE("serve --kv-dtype: the same budget holds more rows; sized at the stored width") {
    ServeCommand c;
    c.requests = 2;
    c.prompt_len = "4";
    c.output_len = "2";
    c.kv_budget = "512KiB";
    c.layout = LayoutChoice::paged;
    c.quiet = true;
    const PreparedServe fp32 = prepare_serve(c);
    // tiny-llama: one token's K and V, every layer, fp32 = 2 KiB, so 512 KiB hold 256 rows
    CHECK(fp32.token_bytes == 2048);
    CHECK(fp32.runs.front().pool.n_rows == 256);
    CHECK(fp32.fp32_runs.empty());
    c.kv_dtype = "q8_0";
    const PreparedServe q8 = prepare_serve(c);
    // q8_0 stores 34 bytes per 32 values: 2048 x 34 / 128 = 544 bytes per token; 524288 / 544 = 963.8, whole
    // blocks of 16: 960 rows; the fp32 comparison keeps 256
    CHECK(q8.token_bytes == 544);
    CHECK(q8.runs.front().pool.n_rows == 960);
    CHECK(q8.runs.front().check);  // a narrow pool's quality is always measured
    REQUIRE(q8.fp32_runs.size() == 1);
    CHECK(q8.fp32_runs.front().pool.n_rows == 256);
    CHECK(q8.fp32_runs.front().kv_storage.dtype == DType::fp32);
}

TEST_CASE("Swap or recompute: swap time is the bytes over the link both ways; the crossover lengths are where the faster one changes") {
    const ModelConfig cfg = test::tiny_config(Family::llama, 4, 2);
    const GpuSpec gpu = find_gpu("h100");
    // one token: 2 layers x 2 (K, V) x 16 values x 4 bytes = 256 bytes, out and in over 1 GB/s: 512 ns
    CHECK(swap_or_recompute(cfg, 0, gpu, 1e9, 1).swap_s == doctest::Approx(512e-9));
    for (const double bw : {1e6, 1e9, 1e12}) {
        const SwapCrossover x = swap_crossover(cfg, 0, gpu, bw, 64);
        CHECK(swap_or_recompute(cfg, 0, gpu, bw, 1).recompute_faster() == x.recompute_faster_at_1);
        bool faster = x.recompute_faster_at_1;
        for (const std::int64_t f : x.flips) {
            CHECK(swap_or_recompute(cfg, 0, gpu, bw, f - 1).recompute_faster() == faster);
            CHECK(swap_or_recompute(cfg, 0, gpu, bw, f).recompute_faster() != faster);
            faster = !faster;
        }
        CHECK(swap_or_recompute(cfg, 0, gpu, bw, 64).recompute_faster() == faster);
    }
    // a slow link (1 MB/s): 256 bytes each way take 512 us, far more than recomputing one token on an H100
    CHECK(swap_crossover(cfg, 0, gpu, 1e6, 64).recompute_faster_at_1);
}

TEST_CASE("Host tier: a sequence's rows swapped out and into other blocks come back bit for bit, every block of every layer") {
    const ModelConfig cfg = test::tiny_config(Family::llama, 4, 2);  // 2 layers, d_kv 16: fp32 rows of 64 bytes
    KvPool pool(cfg, 32);
    const std::vector<std::uint8_t> zero(32 * 64, 0);
    std::vector<std::uint8_t> pattern(32 * 64);
    for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<std::uint8_t>(i * 13 + 5);
    for (std::int64_t l = 0; l < 2; ++l)
        for (int which = 0; which < 2; ++which) pool.load_rows(l, which, 0, 32, pattern.data());
    const std::int64_t out_blocks[] = {8, 0, 20}, in_blocks[] = {4, 28, 12};  // blocks of 4 rows, out of order
    KvView out_rows, in_rows;
    out_rows.block_rows = out_blocks;
    in_rows.block_rows = in_blocks;
    out_rows.block_size = in_rows.block_size = 4;
    HostKvTier host(cfg, 1 << 20);
    // 10 tokens: 2 layers x 2 x 10 rows x 64 bytes = 2560
    CHECK(host.swap_out(7, pool, out_rows, 10) == 2560);
    CHECK(host.bytes_held() == 2560);
    std::vector<std::vector<std::uint8_t>> want;  // each layer's K and V rows of the 10 tokens, in sequence order
    for (std::int64_t l = 0; l < 2; ++l)
        for (int which = 0; which < 2; ++which) {
            std::vector<std::uint8_t> rows(10 * 64);
            for (std::int64_t r = 0; r < 10; ++r) pool.save_rows(l, which, out_rows.pool_row(r), 1, rows.data() + r * 64);
            want.push_back(rows);
            pool.load_rows(l, which, 0, 32, zero.data());  // the pool's rows are gone (others wrote them)
        }
    CHECK(host.swap_in(7, pool, in_rows) == 2560);
    CHECK(host.bytes_held() == 0);
    CHECK(host.peak_bytes() == 2560);
    std::size_t k = 0;
    for (std::int64_t l = 0; l < 2; ++l)
        for (int which = 0; which < 2; ++which, ++k) {
            std::vector<std::uint8_t> rows(10 * 64);
            for (std::int64_t r = 0; r < 10; ++r) pool.save_rows(l, which, in_rows.pool_row(r), 1, rows.data() + r * 64);
            CAPTURE(l);
            CAPTURE(which);
            CHECK(rows == want[k]);
        }
    CHECK(!host.fits(pool, 1 << 20));  // 2^20 tokens x 256 bytes: more than the 1 MiB budget
}
