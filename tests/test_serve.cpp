// The serving simulation: the KV pool's bookkeeping against hand-counted blocks, and the scheduler on
// the running model. Truth from outside: the trained models, served several requests at once through a
// pool small enough to preempt, must still write the greedy text their PyTorch implementation wrote
// (models/reference.json); random-weight models of both families must match a solo run of each request.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <numeric>

#include <nlohmann/json.hpp>

#include "kvlab/calc/gpu_specs.hpp"
#include "kvlab/formats/checkpoint.hpp"
#include "kvlab/kv/kv_pool.hpp"
#include "kvlab/weights/random_weights.hpp"
#include "kvlab/serve/scheduler.hpp"
#include "report/serve_report.hpp"
#include "session/serve_session.hpp"
#include "reference_models.hpp"
#include "sim_configs.hpp"
#include "test_paths.hpp"

using namespace kvlab;

namespace {

std::vector<TokenId> iota_tokens(std::int64_t n, TokenId first = 1) {
    std::vector<TokenId> t(static_cast<std::size_t>(n));
    std::iota(t.begin(), t.end(), first);
    return t;
}

std::vector<std::int64_t> block_rows(const KvAllocator& a, SeqId s) {
    const KvView r = a.rows(s);
    return {r.block_rows.begin(), r.block_rows.end()};
}

bool any_step(const ServeResult& r, auto pred) { return std::any_of(r.steps.begin(), r.steps.end(), pred); }

}  // namespace

TEST_CASE("Paged KV pool: blocks taken on demand, all or none, every one back at the end") {
    KvAllocator a({KvLayout::paged, 64, 16, false});  // 64 rows / 16 = 4 blocks
    CHECK(a.n_blocks() == 4);
    CHECK(a.reserve(0, 17));                  // 17 rows need ceil(17/16) = 2 blocks
    CHECK(a.rows_in_use() == 32);             // 2 x 16
    a.commit(0, iota_tokens(17), 17);
    CHECK(a.rows_holding_tokens() == 17);     // the second block holds 1 token: 15 rows of slack
    CHECK_FALSE(a.reserve(1, 33));            // 3 more blocks: only 2 are free, so none is taken
    CHECK(a.rows_in_use() == 32);
    CHECK(a.rows_reserved(1) == 0);
    CHECK(a.reserve(1, 32));                  // exactly the 2 free blocks
    CHECK(a.rows_free() == 0);
    std::vector<std::int64_t> all = block_rows(a, 0);
    for (const std::int64_t r : block_rows(a, 1)) all.push_back(r);
    std::sort(all.begin(), all.end());
    CHECK(all == std::vector<std::int64_t>{0, 16, 32, 48});  // four distinct blocks
    CHECK(a.reserve(0, 32));                  // still within its 2 blocks: nothing new
    CHECK(a.rows_in_use() == 64);
    a.release(0);
    a.release(1);
    CHECK(a.rows_in_use() == 0);
    CHECK(a.rows_free() == 64);
    CHECK(a.n_live() == 0);
}

TEST_CASE("Prefix cache: full blocks shared by reference count, copy-on-write before a write, idle blocks evicted last") {
    KvAllocator a({KvLayout::paged, 32, 4, true});  // 8 blocks of 4 rows
    const std::vector<TokenId> t = iota_tokens(10);  // A: 10 tokens = blocks of 4, 4, 2
    REQUIRE(a.reserve(0, 10));
    a.commit(0, t, 10);                                // blocks 0 and 1 are full: cached under t[0..4) and t[0..8)
    CHECK(a.rows_in_use() == 12);

    std::vector<TokenId> tb(t.begin(), t.begin() + 8);  // B: A's first 8 tokens, then its own
    tb.push_back(99);
    tb.push_back(98);
    CHECK(a.match_prefix(1, tb) == 8);                 // two full blocks found
    const std::vector<std::int64_t> rows_a = block_rows(a, 0);
    CHECK(block_rows(a, 1) == std::vector<std::int64_t>(rows_a.begin(), rows_a.begin() + 2));
    CHECK(a.rows_in_use() == 12);                      // shared blocks are held once
    REQUIRE(a.reserve(1, 10));                         // one block of its own for tokens 8, 9
    const auto none = a.make_writable(1, 8, 2);
    REQUIRE(none);
    CHECK(none->empty());                              // its own block: written in place
    a.commit(1, tb, 10);
    CHECK(a.rows_in_use() == 16);
    CHECK(a.rows_holding_tokens() == 12);              // A's 10 + B's 2; the shared 8 count once

    // C: exactly A's first 8 tokens, all cached; its last token must run again (its logits are needed), and
    // its row 7 lies in a block A and B share: C gets a copy first
    const std::vector<TokenId> tc(t.begin(), t.begin() + 8);
    CHECK(a.match_prefix(2, tc) == 8);
    const auto copies = a.make_writable(2, 7, 1);
    REQUIRE(copies);
    REQUIRE(copies->size() == 1);
    CHECK((*copies)[0].src == block_rows(a, 0)[1]);
    CHECK((*copies)[0].n == 4);
    CHECK((*copies)[0].dst == block_rows(a, 2)[1]);
    CHECK(block_rows(a, 2)[1] != block_rows(a, 0)[1]);
    CHECK(block_rows(a, 2)[0] == block_rows(a, 0)[0]);  // the untouched block stays shared
    CHECK(a.counters().cow_copies == 1);
    CHECK(a.rows_in_use() == 20);

    a.release(0);
    a.release(1);
    a.release(2);
    CHECK(a.rows_in_use() == 0);
    CHECK(a.rows_cached() == 8);  // the two keyed blocks stay findable; the others are free
    CHECK(a.match_prefix(3, t) == 8);
    a.release(3);
    REQUIRE(a.reserve(4, 32));    // the whole pool: the two idle cached blocks are evicted
    CHECK(a.counters().evictions == 2);
    a.release(4);
    CHECK(a.match_prefix(5, t) == 0);
    CHECK(a.rows_in_use() == 0);
}

TEST_CASE("Prefix cache: a block rewritten in place with the same tokens keeps the blocks cached after it reachable") {
    KvAllocator a({KvLayout::paged, 64, 4, true});  // 16 blocks of 4 rows
    std::vector<TokenId> prefix(12);
    for (int i = 0; i < 12; ++i) prefix[static_cast<std::size_t>(i)] = 100 + i;  // 3 full blocks
    std::vector<TokenId> first = prefix;
    first.push_back(7);  // + one generated token
    REQUIRE(a.reserve(0, 13));
    a.make_writable(0, 0, 12);
    a.commit(0, first, 12);
    a.make_writable(0, 12, 1);
    a.commit(0, first, 13);
    a.release(0);  // 3 keyed blocks stay cached
    CHECK(a.match_prefix(1, prefix) == 12);
    a.release(1);
    // a prompt of exactly the first 8 tokens: found whole (8), and its last token recomputed for the logits,
    // as the scheduler does, rewriting row 7 of the second block in place (held by this sequence alone)
    const std::vector<TokenId> eight(prefix.begin(), prefix.begin() + 8);
    CHECK(a.match_prefix(2, eight) == 8);
    REQUIRE(a.reserve(2, 8));
    const auto copies = a.make_writable(2, 7, 1);
    REQUIRE(copies);
    CHECK(copies->empty());  // written in place, not copied
    a.commit(2, eight, 8);
    a.release(2);
    // the third block was keyed with the second's prefix id as its parent: still reachable, 12 tokens found
    CHECK(a.match_prefix(3, prefix) == 12);
    a.release(3);
}

TEST_CASE("Pool map, paged: each block's request, its filled rows, shared prefix blocks and idle cached ones") {
    KvAllocator a({KvLayout::paged, 32, 4, true});  // 8 blocks of 4 rows; free blocks are taken from block 0 up
    const std::vector<TokenId> t = iota_tokens(10);  // request 0: 10 tokens = blocks 0, 1, 2 holding 4, 4, 2 rows
    REQUIRE(a.reserve(0, 10));
    a.commit(0, t, 10);
    std::vector<TokenId> tb(t.begin(), t.begin() + 8);  // request 1: request 0's first 8 tokens, then 2 of its own
    tb.push_back(99);
    tb.push_back(98);
    CHECK(a.match_prefix(1, tb) == 8);  // it shares blocks 0 and 1 (ref count 2)
    REQUIRE(a.reserve(1, 10));          // and takes block 3 for its tokens 8 and 9
    REQUIRE(a.make_writable(1, 8, 2));
    a.commit(1, tb, 10);
    CHECK(a.map_cell_rows() == 4);
    const KvPoolCell free_cell{kv_cell_free, 0, false};
    // blocks 0, 1: shared, owner the lower request (0), full; block 2: request 0's last 2 rows; block 3: request 1's 2
    CHECK(a.pool_map() == std::vector<KvPoolCell>{{0, 4, true}, {0, 4, true}, {0, 2, false}, {1, 2, false},
                                                  free_cell, free_cell, free_cell, free_cell});
    a.release(0);
    a.release(1);
    // the two full blocks stay in the prefix cache, idle (their 4 rows still hold K and V); the partial ones are free
    CHECK(a.pool_map() == std::vector<KvPoolCell>{{kv_cell_cached, 4, false}, {kv_cell_cached, 4, false}, free_cell, free_cell,
                                                  free_cell, free_cell, free_cell, free_cell});
}

TEST_CASE("Pool map, contiguous: a cell per 16 rows, owned by the request holding its first held row") {
    KvAllocator a({KvLayout::contiguous, 40, 0, false});  // cells: rows 0-15, 16-31, 32-39 (the last has 8)
    REQUIRE(a.reserve(5, 20));  // request 5: rows [0, 20)
    REQUIRE(a.reserve(2, 10));  // request 2: rows [20, 30)
    a.commit(5, iota_tokens(12), 12);  // rows 0-11 hold tokens
    a.commit(2, iota_tokens(3), 3);    // rows 20-22
    CHECK(a.map_cell_rows() == 16);
    // cell 0: request 5, 12 rows filled; cell 1: its first held row (16) is request 5's, the filled rows (20-22) request 2's
    CHECK(a.pool_map() == std::vector<KvPoolCell>{{5, 12, false}, {5, 3, false}, {kv_cell_free, 0, false}});
    a.release(5);
    CHECK(a.pool_map() == std::vector<KvPoolCell>{{kv_cell_free, 0, false}, {2, 3, false}, {kv_cell_free, 0, false}});
}

TEST_CASE("Contiguous KV pool: one range per sequence, first fit, free ranges merge") {
    KvAllocator a({KvLayout::contiguous, 100, 0, false});
    CHECK(a.reserve(0, 40));  // [0, 40)
    CHECK(a.reserve(1, 40));  // [40, 80)
    CHECK(block_rows(a, 1) == std::vector<std::int64_t>{40});
    CHECK(a.rows(1).block_size == 40);
    CHECK_FALSE(a.reserve(2, 30));  // 20 rows left
    CHECK(a.largest_free_range() == 20);
    a.release(0);                   // free: [0, 40) and [80, 100)
    CHECK(a.largest_free_range() == 40);
    CHECK(a.rows_free() == 60);
    CHECK(a.reserve(2, 30));        // first fit: [0, 30)
    CHECK(block_rows(a, 2) == std::vector<std::int64_t>{0});
    a.release(1);                   // [30, 40) + [40, 80) + [80, 100) merge
    CHECK(a.largest_free_range() == 70);
    a.commit(2, iota_tokens(12), 12);
    CHECK(a.rows_holding_tokens() == 12);  // 30 reserved, 18 rows of reservation waste
    a.release(2);
    CHECK(a.largest_free_range() == 100);
}

TEST_CASE("A sequence's rows in the pool: a windowed model keeps a ring of its window") {
    const ModelConfig full = test::tiny_config(Family::llama, 4, 2);
    CHECK(kv_seq_rows(full, 20) == 20);
    const ModelConfig windowed = test::tiny_config(Family::llama, 4, 2, 2, 8);
    CHECK(kv_seq_rows(windowed, 20) == 8);
    CHECK(kv_seq_rows(windowed, 5) == 5);
    ModelConfig mixed = windowed;
    mixed.layer_windowed = {true, false};  // one full layer holds every position
    CHECK(kv_seq_rows(mixed, 20) == 20);
}

TEST_CASE("Serving the trained models writes PyTorch's greedy text for every request at once, preempted or not") {
    const nlohmann::json ref = test::reference_json();  // kept alive: the loop iterates into it
    for (const auto& item : ref.at("models").items()) {
        const std::string name = item.key();
        CAPTURE(name);
        const LoadedModel model = test::reference_checkpoint(item.value());
        std::vector<std::vector<TokenId>> want;
        std::vector<ServeRequest> reqs = test::greedy_requests(item.value(), want);
        // the third prompt again, later: with a prefix cache of 3-row blocks its 9 tokens are all cached
        reqs.push_back({reqs[2].prompt, reqs[2].max_tokens, 20});
        want.push_back(want[2]);

        struct Case {
            const char* what;
            KvPoolOptions pool;
            std::int64_t max_batched_tokens;
            ReserveRule reserve;
        };
        // prompts of 5, 16 and 9 tokens, 64 generated each: 68..79 positions per request, 4 requests
        const Case cases[] = {
            {"paged, a pool for ~2 requests (preempts), chunks of 8", {KvLayout::paged, 160, 4, false}, 8, ReserveRule::max_len},
            {"paged with prefix cache, 3-row blocks, room for all", {KvLayout::paged, 402, 3, true}, 8, ReserveRule::max_len},
            {"contiguous, each reserves prompt + max_tokens", {KvLayout::contiguous, 160, 0, false}, 8, ReserveRule::request},
        };
        for (const Case& c : cases) {
            const std::string what = c.what;
            CAPTURE(what);
            ServeOptions o;
            o.pool = c.pool;
            o.max_batched_tokens = c.max_batched_tokens;
            o.max_seqs = 4;
            o.max_model_len = model.config.n_ctx_max;
            o.reserve = c.reserve;
            const ServeResult r = run_serving(model.config, model.weights, reqs, o);
            for (std::size_t i = 0; i < reqs.size(); ++i) {
                CAPTURE(i);
                CHECK(r.requests[i].generated == want[i]);
            }
            CHECK(r.rows_left_in_use == 0);
            CHECK(any_step(r, [](const ServeStep& s) { return s.n_seqs > 1; }));  // requests really shared steps
            CHECK(any_step(r, [](const ServeStep& s) { return s.n_decode > 0 && s.n_tokens > s.n_decode; }));  // a prefill chunk beside decodes
            if (c.pool.layout == KvLayout::paged && !c.pool.prefix_cache) CHECK(r.preemptions > 0);
            if (c.pool.prefix_cache) {
                CHECK(r.preemptions == 0);
                CHECK(r.requests[3].prefix_hit_tokens == 8);  // 9 cached, the last runs again
                CHECK(r.counters.cow_copies >= 1);
            }
        }
    }
}

TEST_CASE("serve --check: every request equals a solo run, for both families, both layouts, windows, preemption and shared prefixes") {
    struct Model {
        ModelConfig cfg;
        bool prefix;
        std::int64_t paged_rows;  // small enough that 4 running requests preempt
    };
    const Model models[] = {
        {test::tiny_config(Family::llama, 4, 2), true, 64},
        {test::tiny_config(Family::gpt2, 4, 4), true, 64},
        {test::tiny_config(Family::llama, 4, 1, 2, 8), false, 24},  // windowed: a ring of 8 rows (2 blocks) per request
    };
    for (const Model& m : models) {
        CAPTURE(m.cfg.name);
        const Weights w = random_weights(m.cfg, 7);
        std::vector<ServeRequest> reqs;
        const std::vector<TokenId> shared = {3, 1, 4, 1, 5, 9, 2, 6};  // a "system prompt" of 2 blocks of 4
        for (int i = 0; i < 6; ++i) {
            std::vector<TokenId> p = shared;
            for (int j = 0; j < 3 + 2 * i; ++j) p.push_back(static_cast<TokenId>((7 * i + 3 * j) % m.cfg.n_vocab));
            reqs.push_back({p, 6 + 3 * i, i / 2});
        }
        for (const KvLayout layout : {KvLayout::paged, KvLayout::contiguous}) {
            ServeOptions o;
            o.pool = {layout, layout == KvLayout::paged ? m.paged_rows : 96, 4, layout == KvLayout::paged && m.prefix};
            o.max_batched_tokens = 12;
            o.max_seqs = 4;
            o.max_model_len = 48;
            o.reserve = ReserveRule::request;
            o.check = true;
            const ServeResult r = run_serving(m.cfg, w, reqs, o);
            for (const ServeRequestResult& rr : r.requests) {
                CHECK(rr.checked);
                CHECK(std::ssize(rr.generated) == rr.max_tokens);
                CHECK(rr.solo_agree == rr.max_tokens);
                CHECK(rr.within_tolerance);
            }
            CHECK(r.rows_left_in_use == 0);
            // a windowed request holds its window's 2 blocks from its first chunk (11+ tokens) on and never
            // grows, so admission alone bounds the pool: no preemption there
            if (layout == KvLayout::paged) CHECK((r.preemptions > 0) == !m.cfg.sliding_window);
            if (o.pool.prefix_cache) CHECK(r.prefix_hit_blocks > 0);
        }
    }
}

TEST_CASE("Batch invariance: a request's tokens do not depend on the requests beside it") {
    const ModelConfig cfg = test::tiny_config(Family::llama, 4, 2);
    const Weights w = random_weights(cfg, 11);
    const ServeRequest alone{{5, 6, 7, 8, 9}, 20, 0};
    ServeOptions o;
    o.pool = {KvLayout::paged, 256, 4, false};
    o.max_batched_tokens = 32;
    o.max_seqs = 8;
    o.max_model_len = 64;
    const ServeResult solo = run_serving(cfg, w, std::span(&alone, 1), o);
    std::vector<ServeRequest> crowd;
    for (int i = 0; i < 7; ++i) crowd.push_back({{static_cast<TokenId>(10 + i), 2, 3}, 10 + i, 0});
    crowd.insert(crowd.begin() + 3, alone);
    const ServeResult crowded = run_serving(cfg, w, crowd, o);
    CHECK(crowded.requests[3].generated == solo.requests[0].generated);
    CHECK(any_step(crowded, [](const ServeStep& s) { return s.n_seqs == 8; }));
}

TEST_CASE("Impossible serving budgets are refused before any work") {
    const ModelConfig cfg = test::tiny_config(Family::llama, 4, 2);
    const std::vector<ServeRequest> reqs = {{{1, 2, 3}, 20, 0}};  // 22 positions
    ServeOptions o;
    o.pool = {KvLayout::paged, 16, 4, false};
    o.max_model_len = 64;
    CHECK_THROWS_WITH_AS(check_serve_workload(cfg, reqs, o), doctest::Contains("--kv-budget"), UsageError);
    o.pool = {KvLayout::contiguous, 32, 0, false};  // max-len reserves 64 rows
    CHECK_THROWS_WITH_AS(check_serve_workload(cfg, reqs, o), doctest::Contains("--reserve max-len"), UsageError);
    o.pool.n_rows = 64;
    CHECK_NOTHROW(check_serve_workload(cfg, reqs, o));
    o.max_model_len = 16;
    CHECK_THROWS_WITH_AS(check_serve_workload(cfg, reqs, o), doctest::Contains("--max-model-len"), UsageError);
}

namespace {

// A step of the given counted cost: `flops` in q_proj, `bytes` split between q_proj's weights and kv_store's
// KV writes (the modelled time counts every byte of every op).
ServeStep fake_step(std::int64_t step, std::uint64_t flops, std::uint64_t bytes, std::int64_t seqs, std::int64_t rows, std::int64_t tokens) {
    ServeStep s;
    s.step = step;
    s.n_seqs = s.n_tokens = s.n_decode = s.n_generated = s.n_running = seqs;
    s.rows_in_use = rows;
    s.rows_tokens = tokens;
    s.cost.ops[static_cast<std::size_t>(Op::q_proj)].flops = flops;
    s.cost.ops[static_cast<std::size_t>(Op::q_proj)].bytes_weights_read = bytes - bytes / 10;
    s.cost.ops[static_cast<std::size_t>(Op::kv_store)].bytes_kv_written = bytes / 10;
    return s;
}

const Cell& table_cell(const Report& r, const std::string& key, std::size_t column) {
    for (const auto& row : r.tables.at(0).rows)
        if (row.at(0).value == key) return row.at(column);
    FAIL("no row " << key);
    throw std::logic_error("unreachable");
}

}  // namespace

TEST_CASE("Modelled GPU time: each step's roofline over its whole counted cost, summed; the headline's figures are the table's") {
    const GpuSpec h100 = find_gpu("h100");
    // gpus.json, H100 SXM: 989.4 TFLOP/s BF16 dense, 3.35 TB/s. Step 0: 4.947e11 FLOPs (0.5 ms) and 3.35e9 bytes (1 ms):
    // memory-bound, 1 ms. Step 1: 1.9788e12 FLOPs (2 ms) and 3.35e9 bytes (1 ms): compute-bound, 2 ms. Sum: 3 ms, one
    // step memory-bound.
    const ServeStep memory_bound = fake_step(0, 494'700'000'000, 3'350'000'000, 4, 32, 24);
    const ServeStep compute_bound = fake_step(1, 1'978'800'000'000, 3'350'000'000, 2, 64, 16);
    const ModelledServeTime m = modelled_serve_time(h100, {memory_bound, compute_bound});
    CHECK(m.seconds == doctest::Approx(3e-3));
    CHECK(m.memory_bound_steps == 1);
    CHECK(modelled_serve_time(h100, {memory_bound}).seconds == doctest::Approx(1e-3));

    // paged: step 0 alone (1 ms; 4 sequences, 24 of 32 rows hold tokens: 75%); contiguous: both steps (3 ms; at most
    // 4 sequences, (24/32 + 16/64) / 2 = 50%); 64-row pools
    ServeResult paged, contiguous;
    paged.steps = {memory_bound};
    contiguous.steps = {memory_bound, compute_bound};
    for (ServeResult* r : {&paged, &contiguous}) {
        r->pool_rows = 64;
        r->pool_bytes = 64 * 2048;
    }
    std::vector<ServeSummary> s = {summarize_serving(paged, KvLayout::paged, &h100), summarize_serving(contiguous, KvLayout::contiguous, &h100)};
    CHECK(s[0].modelled_tokens_per_s == doctest::Approx(4 / 1e-3));  // 4 tokens generated in 1 ms
    CHECK(s[1].modelled_tokens_per_s == doctest::Approx(6 / 3e-3));
    const Report r = serve_report(s, {}, nlohmann::json::object(), "t", 2048, UnitSystem::iec, Format::table);
    REQUIRE(r.headline.size() == 2);  // no wall time in these steps: no third line
    CHECK(r.headline[0] == "paged kept 75.0% of allocated KV holding tokens vs 50.0% contiguous, and ran up to 4 requests at once vs 4 "
                           "in the same 128.00 KiB pool; 1 step vs 2 (counted, exact)");
    CHECK(r.headline[1] == "modelled on NVIDIA H100 SXM 80GB: paged 1.000 ms vs contiguous 3.000 ms (3.00x faster: 2 of 3 steps are "
                           "memory-bound, and a batched step reads the weights once for all its sequences)");
    // the same figures as the table's rows
    for (std::size_t col : {1u, 2u}) {
        CHECK(r.headline[0].find(table_cell(r, "mean_utilization_percent", col).text) != std::string::npos);
        CHECK(r.headline[1].find(table_cell(r, "modelled_ms", col).text + " ms") != std::string::npos);
    }
    CHECK(table_cell(r, "modelled_memory_bound_steps", 2).text == "1 / 2");
    // the CPU's wall time (set here by hand): paging slower on the CPU while faster modelled, so the line says why from counts
    s[0].seconds = 2.0;
    s[1].seconds = 1.0;
    s[0].max_step_weight_bytes = 1 << 20;  // 1 MiB: below the 64 MiB called "a model this small"
    s[0].n_computed_tokens = 10;
    s[0].recomputed_tokens = 3;
    s[0].preemptions = 1;
    std::vector<std::string> h = serve_headline(s, UnitSystem::iec);
    REQUIRE(h.size() == 3);
    CHECK(h[2] == "CPU wall time (measured, one run): paged 2.000 s vs contiguous 1.000 s: on a CPU a model this small (1.00 MiB of "
                  "weights read per step) gains little from batching, and paging ran 10 tokens through the model vs 6 (3 recomputed after "
                  "1 preemption)");
    s[0].seconds = 0.5;  // faster on the CPU too: nothing to explain
    CHECK(serve_headline(s, UnitSystem::iec)[2] == "CPU wall time (measured, one run): paged 0.500 s vs contiguous 1.000 s: faster here too");
    // one layout: its own line
    const Report one = serve_report({s[0]}, {}, nlohmann::json::object(), "t", 2048, UnitSystem::iec, Format::table);
    REQUIRE(one.headline.size() == 3);
    CHECK(one.headline[1] == "modelled on NVIDIA H100 SXM 80GB: 1.000 ms (4000 generated tok/s)");
    CHECK(one.headline[2] == "CPU wall time (measured, one run): 0.500 s");
}

TEST_CASE("serve --arrival bursty:SIZE/EVERY: request i arrives at step (i / SIZE) x EVERY") {
    const ModelConfig cfg = test::tiny_config(Family::llama, 4, 2);
    ServeCommand c;
    c.requests = 32;
    c.prompt_len = "4..8";
    c.output_len = "4..8";
    const std::vector<ServeRequest> together = synthetic_workload(cfg, c);
    c.arrival = "bursty:8/50";
    const std::vector<ServeRequest> bursts = synthetic_workload(cfg, c);
    REQUIRE(bursts.size() == 32);
    // 32 requests in bursts of 8 every 50 steps: requests 0-7 at step 0, 8-15 at 50, 16-23 at 100, 24-31 at 150
    for (std::size_t i = 0; i < bursts.size(); ++i) {
        CHECK(bursts[i].arrival_step == static_cast<std::int64_t>(i / 8) * 50);
        CHECK(bursts[i].prompt == together[i].prompt);  // bursts draw no random numbers: the same requests, later
    }
    c.arrival = "bursty:5/3";  // 32 requests, 5 a burst: the last, request 31, is in burst 6, at step 18
    CHECK(synthetic_workload(cfg, c).back().arrival_step == 18);
    for (const char* bad : {"bursty:0/50", "bursty:8", "bursty:8/0", "poisson:2", "bursty:8/50x", "bursty:-1/5", "bursty:/5"}) {
        c.arrival = bad;
        CHECK_THROWS_WITH_AS(synthetic_workload(cfg, c), doctest::Contains("--arrival: '"), UsageError);
    }
    c.arrival = "bursty:1/1099511627776";  // 2^40 steps apart: request 1 would arrive past the last step allowed
    CHECK_THROWS_WITH_AS(synthetic_workload(cfg, c), doctest::Contains("past step 2^40"), UsageError);
}

TEST_CASE("Serving records each step's pool map: it agrees with the step's counts, and two requests with one prompt share its block") {
    const ModelConfig cfg = test::tiny_config(Family::llama, 4, 2);
    const Weights w = random_weights(cfg, 7);
    // two requests, both arriving at step 0, whose prompts share their first 8 tokens (2 blocks of 4); request 1
    // is admitted in the step after request 0 committed them, so it finds them in the prefix cache
    const std::vector<TokenId> shared = {3, 1, 4, 1, 5, 9, 2, 6};
    std::vector<TokenId> p0 = shared, p1 = shared;
    p0.push_back(7);
    p1.push_back(8);
    const std::vector<ServeRequest> reqs = {{p0, 4, 0}, {p1, 4, 1}};
    ServeOptions o;
    o.pool = {KvLayout::paged, 32, 4, true};  // 8 blocks of 4 rows
    o.max_batched_tokens = 16;
    o.max_seqs = 4;
    o.max_model_len = 32;
    o.record_pool_map = true;
    const ServeResult r = run_serving(cfg, w, reqs, o);
    bool saw_shared = false;
    for (const ServeStep& s : r.steps) {
        CAPTURE(s.step);
        REQUIRE(s.pool_map.size() == 8);
        std::int64_t held = 0, fill = 0, cached = 0;
        for (const KvPoolCell& c : s.pool_map) {
            held += c.owner >= 0 ? 1 : 0;
            fill += c.owner >= 0 ? c.fill : 0;
            cached += c.owner == kv_cell_cached ? 1 : 0;
        }
        CHECK(held * 4 == s.rows_in_use);  // every held block counted once, shared or not
        CHECK(fill == s.rows_tokens);
        CHECK(cached * 4 == s.rows_cached);
        if (s.n_running == 2) {
            // both hold the prompt's 2 shared blocks (owner: the lower request, 0) and one block each of their own
            CHECK(s.pool_map[0] == KvPoolCell{0, 4, true});
            CHECK(s.pool_map[1] == KvPoolCell{0, 4, true});
            saw_shared = true;
        }
    }
    CHECK(saw_shared);
    ServeOptions off = o;
    off.record_pool_map = false;
    CHECK(run_serving(cfg, w, reqs, off).steps.front().pool_map.empty());
}
