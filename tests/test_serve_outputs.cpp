// Several outputs per request in serve (src/serve/outputs.hpp): parallel sampling and beam search. The
// pool's forks against hand-counted blocks; beam search against a plain-loop beam search over the
// reference forward (src/model/reference.cpp) and against PyTorch's on the trained models
// (models/reference.json, "beam_search"); --check covering every output.
#include <memory>
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>

#include <nlohmann/json.hpp>

#include "kvlab/core/dtype.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/formats/checkpoint.hpp"
#include "kvlab/kv/kv_pool.hpp"
#include "kvlab/model/reference.hpp"
#include "kvlab/serve/scheduler.hpp"
#include "kvlab/weights/random_weights.hpp"
#include "reference_models.hpp"
#include "sim_configs.hpp"
#include "test_paths.hpp"

using namespace kvlab;

namespace {

struct Beam {
    std::vector<TokenId> generated;
    double score = 0.0;
};

// Beam search as src/serve/outputs.hpp defines it, in plain loops over the reference forward: every
// candidate sequence run from position 0 on a model of its own, log softmax in double, every candidate
// sorted (score down, then the beam's rank, then the token id), the first W kept.
std::vector<Beam> plain_beam_search(const ModelConfig& cfg, const Weights& w, const std::vector<TokenId>& prompt, std::int64_t W,
                                    std::int64_t T) {
    std::vector<Beam> beams{Beam{}};
    for (std::int64_t t = 0; t < T; ++t) {
        struct Cand {
            double score;
            std::size_t rank;
            TokenId token;
        };
        std::vector<Cand> cands;
        for (std::size_t r = 0; r < beams.size(); ++r) {
            std::vector<TokenId> seq = prompt;
            seq.insert(seq.end(), beams[r].generated.begin(), beams[r].generated.end());
            ReferenceModel m(cfg, w, std::ssize(seq));
            std::span<const float> logits;
            for (std::size_t p = 0; p < seq.size(); ++p) logits = m.forward(seq[p], static_cast<std::int64_t>(p));
            double mx = -INFINITY, sum = 0.0;
            for (const float x : logits) mx = std::max(mx, static_cast<double>(x));
            for (const float x : logits) sum += std::exp(static_cast<double>(x) - mx);
            for (std::size_t v = 0; v < logits.size(); ++v)
                cands.push_back({beams[r].score + static_cast<double>(logits[v]) - mx - std::log(sum), r, static_cast<TokenId>(v)});
        }
        std::sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) {
            if (a.score != b.score) return a.score > b.score;
            return a.rank != b.rank ? a.rank < b.rank : a.token < b.token;
        });
        std::vector<Beam> next;
        for (std::size_t i = 0; i < static_cast<std::size_t>(W); ++i) {
            Beam b = beams[cands[i].rank];
            b.generated.push_back(cands[i].token);
            b.score = cands[i].score;
            next.push_back(std::move(b));
        }
        beams = std::move(next);
    }
    return beams;
}

ServeOptions paged_options(std::int64_t rows, std::int64_t block, std::int64_t max_model_len) {
    ServeOptions o;
    o.pool = {KvLayout::paged, rows, block, false};
    o.max_batched_tokens = 32;
    o.max_seqs = 8;
    o.max_model_len = max_model_len;
    return o;
}

}  // namespace

TEST_CASE("Fork: an output takes its parent's blocks by reference count; a write copies a shared block first; release frees") {
    KvAllocator a({KvLayout::paged, 32, 4, false});  // 8 blocks of 4 rows, no prefix cache
    const std::vector<TokenId> prompt{1, 2, 3, 4, 5, 6};  // 6 tokens: one full block, one holding 2 rows
    REQUIRE(a.reserve(0, 6));
    a.commit(0, prompt, 6);
    a.fork(0, 1);
    a.fork(0, 2);
    CHECK(a.rows_in_use() == 8);  // 2 blocks, held 3 times: counted once
    const std::array<SeqId, 3> outs{0, 1, 2};
    CHECK(a.blocks_held(outs).held == 2);
    CHECK(a.blocks_held(outs).unshared == 6);  // 3 outputs x 2 blocks
    // each output writes its first generated token at row 6, in the shared partial block: the first two
    // writers get a copy of its 2 filled rows, the last holds it alone and writes in place
    for (const SeqId s : outs) REQUIRE(a.reserve(s, 7));
    const auto c0 = a.make_writable(0, 6, 1), c1 = a.make_writable(1, 6, 1), c2 = a.make_writable(2, 6, 1);
    REQUIRE((c0 && c1 && c2));
    REQUIRE(c0->size() == 1);
    CHECK((*c0)[0].n == 2);
    CHECK(c1->size() == 1);
    CHECK(c2->empty());
    CHECK(a.counters().cow_copies == 2);
    CHECK(a.rows(0).block_rows[0] == a.rows(2).block_rows[0]);  // the full prompt block: still shared
    CHECK(a.blocks_held(outs).held == 4);  // 1 shared + 3 partial
    CHECK(a.rows_in_use() == 16);
    a.release(1);  // a pruned beam: its copy is freed, the shared block stays held by the others
    CHECK(a.rows_in_use() == 12);
    a.release(0);
    a.release(2);
    CHECK(a.rows_in_use() == 0);
}

TEST_CASE("Beam search in serve equals a plain-loop beam search over the reference forward, with every block freed") {
    // random weights of a tiny llama and a tiny gpt2; prompts of 6 and 9 tokens in blocks of 4, so the
    // beams share a partial last block (a beam writing into it without a copy would change its siblings' K)
    for (const ModelConfig& cfg : {test::tiny_config(Family::llama, 4, 2), test::tiny_config(Family::gpt2, 4, 4)}) {
        CAPTURE(cfg.name);
        const Weights w = random_weights(cfg, 5);
        const std::vector<ServeRequest> reqs{{{3, 1, 4, 1, 5, 9}, 6, 0}, {{2, 7, 1, 8, 2, 8, 1, 8, 2}, 5, 1}};
        ServeOptions o = paged_options(128, 4, 32);
        o.beam_width = 3;
        o.check = true;
        const ServeResult r = run_serving(cfg, w, reqs, o);
        for (std::size_t i = 0; i < reqs.size(); ++i) {
            CAPTURE(i);
            const std::vector<Beam> want = plain_beam_search(cfg, w, reqs[i].prompt, 3, reqs[i].max_tokens);
            const ServeRequestResult& rr = r.requests[i];
            REQUIRE(rr.outputs.size() == 3);
            for (std::size_t b = 0; b < 3; ++b) {
                CAPTURE(b);
                CHECK(rr.outputs[b] == want[b].generated);
                CHECK(rr.scores[b] == doctest::Approx(want[b].score).epsilon(1e-4));  // float logits of two code paths
            }
            CHECK(rr.generated == want[0].generated);
            CHECK(rr.within_tolerance);
            CHECK(rr.solo_agree == 3 * rr.max_tokens);  // --check's beam search on the solo path: the same beams
            CHECK(rr.cow_copies > 0);
            CHECK(rr.peak_blocks < rr.peak_blocks_unshared);
        }
        CHECK(r.rows_left_in_use == 0);
        // pruned beams free their blocks: the pool holds exactly the blocks the running requests' beams hold
        for (const ServeStep& s : r.steps) CHECK(s.rows_in_use == s.out_blocks * 4);
    }
}

TEST_CASE("Beam search on the trained models writes PyTorch's beams (models/reference.json)") {
    const nlohmann::json ref = test::reference_json();  // kept alive: the loop iterates into it
    for (const auto& item : ref.at("models").items()) {
        CAPTURE(item.key());
        const LoadedModel model = test::reference_checkpoint(item.value());
        std::vector<ServeRequest> reqs;
        for (const auto& p : item.value().at("prompts")) {
            const nlohmann::json& bs = p.at("beam_search");
            reqs.push_back({p.at("ids").get<std::vector<TokenId>>(), bs.at("new_tokens").get<std::int64_t>(), 0});
        }
        ServeOptions o = paged_options(512, 4, 64);
        o.beam_width = item.value().at("prompts")[0].at("beam_search").at("width").get<std::int64_t>();
        o.max_seqs = 3 * o.beam_width;  // all three prompts at once
        const ServeResult r = run_serving(model.config, model.weights, reqs, o);
        for (std::size_t i = 0; i < reqs.size(); ++i) {
            CAPTURE(i);
            const nlohmann::json& beams = item.value().at("prompts")[i].at("beam_search").at("beams");
            REQUIRE(r.requests[i].outputs.size() == beams.size());
            for (std::size_t b = 0; b < beams.size(); ++b) {
                CAPTURE(b);
                CHECK(r.requests[i].outputs[b] == beams[b].at("ids").get<std::vector<TokenId>>());
                // scores: sums of 8 log-probs from float32 logits of two implementations
                CHECK(r.requests[i].scores[b] == doctest::Approx(beams[b].at("score").get<double>()).epsilon(1e-3));
            }
        }
        CHECK(r.rows_left_in_use == 0);
    }
}

TEST_CASE("Parallel sampling: n outputs share the prompt's full blocks; the partial one is copied once per output but the last") {
    const ModelConfig cfg = test::tiny_config(Family::llama, 4, 2);
    const Weights w = random_weights(cfg, 3);
    // a 10-token prompt in blocks of 4: 2 full blocks + 2 rows; 3 tokens each: positions 0..11, 3 blocks per output
    const std::vector<ServeRequest> reqs{{{9, 8, 7, 6, 5, 4, 3, 2, 1, 0}, 3, 0}};
    ServeOptions o = paged_options(64, 4, 16);
    o.n = 3;
    o.sampling.temperature = 1.0;
    o.sampling.seed = 42;
    o.check = true;
    const ServeResult r = run_serving(cfg, w, reqs, o);
    const ServeRequestResult& rr = r.requests[0];
    REQUIRE(rr.outputs.size() == 3);
    CHECK(rr.within_tolerance);
    CHECK(rr.solo_agree == 9);  // each output's sampler, replayed on the solo path's logits: the same 3 tokens
    // by hand: the 2 full prompt blocks shared + each output's third block = 2 + 3 = 5 held; unshared copies
    // would hold 3 outputs x 3 blocks = 9; the partial block is copied for 2 of the 3 outputs
    CHECK(rr.peak_blocks == 5);
    CHECK(rr.peak_blocks_unshared == 9);
    CHECK(rr.cow_copies == 2);
    CHECK(r.counters.cow_copies == 2);
    CHECK(r.rows_left_in_use == 0);
    // the same seed, the same samples; another seed, other samples (9 tokens of 50 at temperature 1)
    CHECK(run_serving(cfg, w, reqs, o).requests[0].outputs == rr.outputs);
    o.sampling.seed = 43;
    CHECK(run_serving(cfg, w, reqs, o).requests[0].outputs != rr.outputs);
}

TEST_CASE("An output that stops early gives its rows back at once; the request ends with its last output") {
    const ModelConfig cfg = test::tiny_config(Family::llama, 4, 2);
    const Weights w = random_weights(cfg, 3);
    // a 16-token prompt in blocks of 16: one full block, shared by both outputs after the fork at step 0.
    // Step t >= 1 writes each output's token at position 15 + t, in a block of its own. The rule stops the
    // first output it sees reach 4 generated tokens (output 0, at step 3) and no other: output 1 runs to 8.
    std::vector<TokenId> prompt(16);
    for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<TokenId>(i + 3);
    const std::vector<ServeRequest> reqs{{prompt, 8, 0}};
    ServeOptions o = paged_options(64, 16, 32);
    o.n = 2;
    o.sampling.temperature = 1.0;
    o.sampling.seed = 7;
    o.check = true;
    auto stopped_one = std::make_shared<bool>(false);
    o.stop_rule = [stopped_one](std::int64_t, std::span<const TokenId> generated) -> std::optional<FinishReason> {
        if (*stopped_one || generated.size() != 4) return std::nullopt;
        *stopped_one = true;
        return FinishReason::stop_string;
    };
    const ServeResult r = run_serving(cfg, w, reqs, o);
    const ServeRequestResult& rr = r.requests[0];
    REQUIRE(rr.outputs.size() == 2);
    CHECK(rr.outputs[0].size() == 4);
    CHECK(rr.outputs[1].size() == 8);
    CHECK(rr.finish_reasons == std::vector<FinishReason>{FinishReason::stop_string, FinishReason::length});
    CHECK(rr.within_tolerance);
    CHECK(rr.solo_agree == 12);  // 4 + 8 tokens, each output's sampler replayed on the solo path
    REQUIRE(r.steps.size() == 8);  // steps 0..7: the prompt, then output 1's tokens 2..8
    // rows held when each step writes: steps 1..3, the shared block + a block per output = 3 x 16; step 3
    // stops output 0 and frees its block, so from step 4 on 2 x 16 (without the release: still 48)
    for (std::size_t t = 1; t < 8; ++t) CHECK(r.steps[t].rows_in_use == (t <= 3 ? 48 : 32));
    CHECK(r.steps[3].n_stopped == 1);
    CHECK(r.steps[3].n_tokens == 2);
    CHECK(r.steps[4].n_tokens == 1);  // output 1 alone from then on
    CHECK(r.rows_left_in_use == 0);
}

TEST_CASE("A request's own n and seed: its outputs next to single-output requests; output 0 samples with the seed as given") {
    const ModelConfig cfg = test::tiny_config(Family::llama, 4, 2);
    const Weights w = random_weights(cfg, 3);
    const std::vector<TokenId> prompt{9, 8, 7, 6, 5, 4, 3, 2, 1, 0};
    ServeRequest three{prompt, 6, 0};
    three.n = 3;
    three.seed = 11;
    ServeRequest one{prompt, 6, 0};
    one.seed = 11;
    ServeRequest two{{5, 6, 7}, 4, 0};
    two.n = 2;
    const std::vector<ServeRequest> reqs{three, one, two};
    ServeOptions o = paged_options(128, 4, 16);
    o.sampling.temperature = 1.0;
    o.sampling.seed = 42;
    o.check = true;
    const ServeResult r = run_serving(cfg, w, reqs, o);
    REQUIRE(r.requests[0].outputs.size() == 3);
    CHECK(r.requests[1].outputs.empty());  // one output: `generated` alone
    REQUIRE(r.requests[2].outputs.size() == 2);
    // the same prompt, the same weights and the same seed 11: request 0's output 0 is request 1's text
    CHECK(r.requests[0].outputs[0] == r.requests[1].generated);
    CHECK(r.requests[0].outputs[1] != r.requests[0].outputs[0]);  // output 1: splitmix64(11 + 1), 6 tokens of 50
    // every output against its sampler replayed on the solo path: 3 x 6 + 6 + 2 x 4 = 32 tokens
    std::int64_t agree = 0;
    for (const ServeRequestResult& q : r.requests) {
        CHECK(q.within_tolerance);
        agree += q.solo_agree;
    }
    CHECK(agree == 32);
    // the first step: request 0's prompt chooses 3 tokens, request 1's one, request 2's two
    CHECK(r.steps[0].n_generated == 6);
    CHECK(r.rows_left_in_use == 0);
    ServeOptions beams = o;
    beams.beam_width = 2;
    CHECK_THROWS_WITH_AS(run_serving(cfg, w, reqs, beams), doctest::Contains("request 0 has \"n\" 3 with --beam-width 2"), UsageError);
}

TEST_CASE("An MLA pool: tiny-mla's latent rows, fp32 and fp16, shared and copied on write by parallel outputs; --check passes") {
    const LoadedModel model = load_checkpoint(std::filesystem::path(kvlab::test::models_dir) / "tiny-mla");
    const ModelConfig& cfg = model.config;
    REQUIRE(cfg.mla);
    REQUIRE(kv_rows_per_token(cfg) == 1);  // one latent "head" per token, no V row
    // a 20-token prompt in blocks of 16: 1 full block + 4 rows; 8 tokens per output: the last one is not run,
    // so positions 0..26 hold K, all inside block 2. By hand: 1 shared full block + each output's own copy of
    // block 2 = 3 held, vs 2 x 2 = 4 unshared; the first writer of position 20 copies the partial block (4 rows),
    // the last holds it alone: 1 copy
    const std::vector<ServeRequest> reqs{{{1, 40, 41, 42, 300, 17, 88, 250, 9, 131, 77, 402, 5, 260, 310, 44, 61, 190, 222, 3}, 8, 0}};
    for (const DType dtype : {DType::fp32, DType::fp16}) {
        CAPTURE(dtype_name(dtype));
        ServeOptions o = paged_options(64, 16, 32);  // 4 blocks of 16 rows
        o.kv_storage = KvStorage{dtype};
        o.n = 2;
        o.sampling.temperature = 1.0;
        o.sampling.seed = 7;
        o.check = true;
        const ServeResult r = run_serving(cfg, model.weights, reqs, o);
        const ServeRequestResult& rr = r.requests[0];
        // the pool's bytes are the latent's: per layer one row of kv_lora_rank + qk_rope_head_dim = 32 + 16 = 48
        // values (docs/kv-memory.md), 192 B at fp32 and 96 B at fp16; 64 rows x 4 layers x that, no V rows
        const std::uint64_t row = dtype == DType::fp32 ? 48 * 4 : 48 * 2;
        CHECK(r.kv_row_bytes == row);
        CHECK(r.pool_bytes == 64 * 4 * row);
        REQUIRE(rr.outputs.size() == 2);
        CHECK(rr.outputs[0] != rr.outputs[1]);  // two samples apart: a missed copy would mix their K
        CHECK(rr.peak_blocks == 3);
        CHECK(rr.peak_blocks_unshared == 4);
        CHECK(rr.cow_copies == 1);
        CHECK(r.counters.cow_copies == 1);
        // KV bytes written, counted by the forward: 20 prompt rows + 2 outputs x 7 decoded = 34 latent rows per layer
        std::uint64_t written = 0;
        std::int64_t peak_rows = 0;
        for (const ServeStep& s : r.steps) {
            written += s.cost.total().bytes_kv_written;
            peak_rows = std::max(peak_rows, s.rows_in_use);
        }
        CHECK(written == 34 * 4 * row);
        CHECK(peak_rows == 3 * 16);
        CHECK(r.rows_left_in_use == 0);
        CHECK(rr.checked);
        if (dtype == DType::fp32) {  // the single-sequence path on the same tokens: the same logits and samples
            CHECK(rr.within_tolerance);
            CHECK(rr.solo_agree == 16);
        } else {  // the solo run keeps fp32 latents: fp16's rounding (2^-11 relative) moves logits by far less than 0.1
            CHECK(rr.max_abs_dlogit < 0.1);
        }
    }
}

TEST_CASE("Beams of a preempted request start over and end the same; outputs options refused before any work") {
    const ModelConfig cfg = test::tiny_config(Family::llama, 4, 2);
    const Weights w = random_weights(cfg, 9);
    std::vector<ServeRequest> reqs;
    for (int i = 0; i < 4; ++i) reqs.push_back({{static_cast<TokenId>(1 + i), 5, 6, 7, 8}, 10, 0});
    // 12 blocks of 4; each request's 14 positions take 4 blocks per beam: at least 4 blocks (both beams
    // sharing every one), at most 1 shared + 2 x 3 = 7; 4 requests need 16..28 blocks at the end: it preempts
    ServeOptions o = paged_options(48, 4, 16);
    o.beam_width = 2;
    o.check = true;
    const ServeResult r = run_serving(cfg, w, reqs, o);
    CHECK(r.preemptions > 0);
    for (const ServeRequestResult& rr : r.requests) {
        CHECK(rr.within_tolerance);
        CHECK(rr.solo_agree == 2 * rr.max_tokens);
    }
    CHECK(r.rows_left_in_use == 0);

    ServeOptions bad = o;
    bad.pool.layout = KvLayout::contiguous;
    CHECK_THROWS_AS(check_serve_workload(cfg, reqs, bad), UsageError);  // outputs share blocks only when paged
    bad = o;
    bad.n = 2;
    CHECK_THROWS_AS(check_serve_workload(cfg, reqs, bad), UsageError);  // n and beams together
    bad = o;
    bad.beam_width = 9;
    CHECK_THROWS_AS(check_serve_workload(cfg, reqs, bad), UsageError);  // more beams than --max-seqs 8
    bad = o;
    bad.pool.n_rows = 24;
    CHECK_THROWS_AS(check_serve_workload(cfg, reqs, bad), UsageError);  // 1 shared + 2 x 3 own blocks = 7 > 6
}
