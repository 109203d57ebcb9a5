// The numbers `kvlab serve` must show (docs/serving.md), as ratios within one run:
//   1. KV utilization of paged blocks vs contiguous reservation on serve's default workload, and how
//      many more requests paging runs at once;
//   2. batched decode: tokens/s at B running sequences over tokens/s at 1, the batched step's FLOP/s
//      against the GEMM reference sampled right before, and the batch where decode turns from
//      bandwidth-bound to compute-bound, measured, beside the roofline's estimate;
//   3. the scheduler's bookkeeping as a share of step time.
// Not a test: run `build/release/bench/kvlab_bench_serve [--json FILE]`.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <omp.h>

#include "bench_common.hpp"
#include "bench_references.hpp"
#include "kvlab/calc/kv_memory.hpp"
#include "core/atomic_write.hpp"
#include "kvlab/calc/presets.hpp"
#include "kvlab/core/printer.hpp"
#include "kvlab/formats/checkpoint.hpp"
#include "kvlab/weights/random_weights.hpp"
#include "kvlab/weights/tensor_table.hpp"
#include "kvlab/serve/scheduler.hpp"
#include "kvlab/model/transformer.hpp"
#include "report/serve_report.hpp"
#include "session/serve_session.hpp"

namespace {

// A sequence's rows in the pool: blocks of 16 at the rows of its table.
kvlab::KvView pool_rows(const std::vector<std::int64_t>& table) {
    kvlab::KvView kv;
    kv.block_rows = table;
    kv.block_size = 16;
    return kv;
}

using namespace kvlab;
using namespace kvlab::bench;

struct Options {
    std::string pool_model = "tiny-llama";   // section 1 and 3: serve's default workload on serve's default model
    std::string decode_model = "stories110m"; // section 2: random weights of this shape (decode memory-bound at batch 1)
    std::vector<std::int64_t> batches = {1, 2, 4, 8, 16, 32, 64};
    std::int64_t prompt_len = 16;            // each sequence's context before the timed decode steps
    std::int64_t steps = 16;                 // timed decode steps per batch size
    int repeats = 3;
    std::int64_t stream_mib = 1024;
    std::vector<std::int64_t> gemm_sizes = {512, 1024, 2048};
    int threads = 0;
    std::string json;
    std::string format = "table";
};

// Section 1 and 3: serve's default command (tiny-llama, 32 requests, 2 MiB pool), paged, contiguous
// reserving max-len (a static cache) and contiguous reserving each request's own length (the best a
// reservation can do, the paper's "Oracle").
struct PoolRow {
    std::string name;
    ServeSummary s;
};

std::vector<PoolRow> bench_pool(const Options& o) {
    ServeCommand c;
    c.source.model = o.pool_model;
    c.threads = o.threads;
    c.quiet = true;
    const PreparedServe p = prepare_serve(c);
    std::vector<PoolRow> rows;
    for (const ServeOptions& run : p.runs) {
        const ServeResult r = run_serving(p.config, p.weights, p.requests, run);
        rows.push_back({run.pool.layout == KvLayout::paged ? "paged" : "contiguous, reserve max-len", summarize_serving(r, run.pool.layout)});
    }
    ServeOptions oracle = p.runs.back();
    oracle.reserve = ReserveRule::request;
    rows.push_back({"contiguous, reserve request", summarize_serving(run_serving(p.config, p.weights, p.requests, oracle), KvLayout::contiguous)});
    return rows;
}

// Section 2: B sequences of prompt_len tokens prefilled, then `steps` decode steps of all B at once.
struct BatchRow {
    std::int64_t batch = 0;
    double tok_s = 0, step_ms = 0, flop_s = 0, gemm_ref = 0;
};

std::vector<BatchRow> bench_batches(const Options& o, const ModelConfig& cfg, const Weights& w, References& refs) {
    const std::int64_t b_max = *std::max_element(o.batches.begin(), o.batches.end());
    const std::int64_t positions = o.prompt_len + o.steps;
    const std::int64_t rows_per_seq = (positions + 15) / 16 * 16;
    KvPool pool(cfg, b_max * rows_per_seq);
    Transformer model(cfg, w, TransformerSize{positions, std::max(b_max, o.prompt_len), false, false, b_max});
    std::vector<std::vector<std::int64_t>> tables(static_cast<std::size_t>(b_max));
    for (std::int64_t s = 0; s < b_max; ++s)
        for (std::int64_t r = 0; r < rows_per_seq; r += 16) tables[static_cast<std::size_t>(s)].push_back(s * rows_per_seq + r);
    std::vector<BatchRow> out;
    for (const std::int64_t B : o.batches) {
        std::vector<double> tok_s, flop_s, gemm;
        for (int rep = 0; rep < o.repeats; ++rep) {
            // prefill every sequence (its own prompt), untimed
            for (std::int64_t s = 0; s < B; ++s) {
                std::vector<TokenId> prompt(static_cast<std::size_t>(o.prompt_len));
                for (std::int64_t i = 0; i < o.prompt_len; ++i) prompt[static_cast<std::size_t>(i)] = static_cast<TokenId>((7 * s + 3 * i + 1) % cfg.n_vocab);
                const SeqStep one{o.prompt_len, 0, pool_rows(tables[static_cast<std::size_t>(s)]), true};
                model.forward_batch(prompt, std::span(&one, 1), pool, nullptr);
            }
            std::vector<SeqStep> seqs;
            std::vector<TokenId> tokens(static_cast<std::size_t>(B), 1);
            for (std::int64_t s = 0; s < B; ++s) seqs.push_back({1, o.prompt_len, pool_rows(tables[static_cast<std::size_t>(s)]), true});
            gemm.push_back(refs.gemm_rate());  // sampled right before the measurement it divides
            StepCost cost;
            const auto t0 = clock_type::now();
            for (std::int64_t k = 0; k < o.steps; ++k) {
                for (SeqStep& q : seqs) q.pos0 = o.prompt_len + k;
                const MatrixRM& logits = model.forward_batch(tokens, seqs, pool, k == 0 ? &cost : nullptr);
                for (std::int64_t s = 0; s < B; ++s) logits.row(s).maxCoeff(&tokens[static_cast<std::size_t>(s)]);
            }
            const double sec = seconds_since(t0);
            tok_s.push_back(static_cast<double>(B * o.steps) / sec);
            flop_s.push_back(static_cast<double>(cost.total().flops) * static_cast<double>(o.steps) / sec);
        }
        const double tok = median(tok_s);
        out.push_back({B, tok, static_cast<double>(B) / tok * 1e3, median(flop_s), median(gemm)});  // ms per step at the median rate
    }
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"kvlab serve benchmark: KV utilization by layout, batched decode scaling, scheduler overhead"};
    Options o;
    app.add_option("--pool-model", o.pool_model, "Model of the default serve workload (sections 1 and 3)")->capture_default_str();
    app.add_option("-m,--model", o.decode_model, "Model shape for batched decode, random weights (section 2)")->capture_default_str();
    app.add_option("--batches", o.batches, "Running sequences per decode step")->delimiter(',')->capture_default_str();
    app.add_option("-p,--prompt-len", o.prompt_len, "Context of each sequence before the timed steps")->capture_default_str();
    app.add_option("-n,--steps", o.steps, "Timed decode steps per batch size")->capture_default_str();
    app.add_option("-r,--repeats", o.repeats, "Repeats per batch size (medians)")->capture_default_str();
    app.add_option("--stream-mib", o.stream_mib, "Read-bandwidth buffer (MiB)")->capture_default_str();
    app.add_option("--gemm-sizes", o.gemm_sizes, "GEMM reference sizes (the best wins)")->delimiter(',')->capture_default_str();
    add_common_options(app, o.threads, o.json, o.format);
    CLI11_PARSE(app, argc, argv);
    try {
        const Format format = parse_choice(format_choices, o.format, "--format");
        if (!o.json.empty()) check_output_path(o.json, "--json");
        // the pool runs through serve's session, whose --threads 0 would turn dynamic teams back on: it gets
        // the fixed count (a run before this measured an FMA peak of one core while the table said two)
        o.threads = fix_threads(o.threads);
        Report report;
        report.inputs = {{"pool_model", o.pool_model}, {"decode_model", o.decode_model}, {"prompt_len", o.prompt_len},
                         {"steps", o.steps},           {"repeats", o.repeats},          {"threads", omp_get_max_threads()}};

        // 1. utilization by layout, 3. bookkeeping
        const std::vector<PoolRow> pool = bench_pool(o);
        Table t1;
        t1.title = fmt::format("KV pool use on serve's default workload ({}, 32 requests, 2 MiB pool)", o.pool_model);
        t1.columns = {{"layout", "layout", false}, {"utilization_percent", "KV utilization, mean"}, {"max_running", "sequences at once, max"},
                      {"preemptions", "preemptions"}, {"schedule_share_percent", "bookkeeping / step time"}};
        for (const PoolRow& r : pool)
            t1.rows.push_back({text_cell(r.name), percent_cell(100 * r.s.mean_utilization),
                               int_cell(r.s.max_running), int_cell(r.s.preemptions),
                               {fmt::format("{:.2f}%", 100 * r.s.schedule_share), 100 * r.s.schedule_share}});
        const ServeSummary& paged = pool[0].s;
        t1.notes.push_back(fmt::format("target: paged mean utilization >= 90%: {:.1f}%, {}", 100 * paged.mean_utilization,
                                       paged.mean_utilization >= 0.9 ? "met" : "NOT met"));
        t1.notes.push_back(fmt::format("paging runs {:.2f}x the requests at once of reserving max-len, {:.2f}x of reserving each request's length",
                                       static_cast<double>(paged.max_running) / static_cast<double>(pool[1].s.max_running),
                                       static_cast<double>(paged.max_running) / static_cast<double>(pool[2].s.max_running)));
        t1.notes.push_back("vLLM paper (Kwon et al., SOSP 2023, Fig. 2): 20.4% (Orca Max), 26.8% (Pow2), 38.2% (Oracle) of KV memory holding "
                           "token states with contiguous reservation; 96.3% with paging");
        double worst_share = 0;
        for (const PoolRow& r : pool) worst_share = std::max(worst_share, r.s.schedule_share);
        t1.notes.push_back(fmt::format("target: scheduler bookkeeping <= 2% of step time: at most {:.2f}%, {}", 100 * worst_share,
                                       worst_share <= 0.02 ? "met" : "NOT met"));
        report.tables.push_back(std::move(t1));

        // 2. batched decode
        References refs(o.stream_mib, o.gemm_sizes);
        const ModelConfig cfg = load_model(o.decode_model);
        const Weights w = random_weights(cfg, 42);
        const std::vector<BatchRow> rows = bench_batches(o, cfg, w, refs);
        const double bw = refs.read_bandwidth_over(weights_bytes(cfg));  // the ceiling for a working set of the weights' size
        Table t2;
        t2.title = fmt::format("Batched decode on {} (random weights, {} weight bytes), context {}..{}", cfg.display_name,
                               format_bytes(weights_bytes(cfg), UnitSystem::iec), o.prompt_len, o.prompt_len + o.steps);
        t2.columns = {{"batch", "sequences"}, {"tok_s", "tok/s"}, {"speedup", "vs 1 sequence"}, {"step_ms", "ms per step"},
                      {"gflop_s", "GFLOP/s counted"}, {"of_gemm", "of GEMM reference"}};
        const BatchRow* one = nullptr;
        for (const BatchRow& r : rows)
            if (r.batch == 1) one = &r;
        for (const BatchRow& r : rows)
            t2.rows.push_back({int_cell(r.batch), real_cell(r.tok_s, 1), one ? ratio_cell(r.tok_s / one->tok_s) : text_cell("-"),
                               real_cell(r.step_ms, 3), real_cell(r.flop_s * 1e-9, 2), ratio_cell(r.flop_s / r.gemm_ref)});
        const BatchRow* at16 = nullptr;
        for (const BatchRow& r : rows)
            if (r.batch == 16) at16 = &r;
        if (one && at16)
            t2.notes.push_back(fmt::format("target: tok/s at 16 sequences >= 6x at 1: {:.2f}x, {}", at16->tok_s / one->tok_s,
                                           at16->tok_s / one->tok_s >= 6 ? "met" : "NOT met"));
        const auto best = std::max_element(rows.begin(), rows.end(), [](const BatchRow& a, const BatchRow& b) { return a.flop_s / a.gemm_ref < b.flop_s / b.gemm_ref; });
        // as in every bench: a workload beats its reference when its median passes the reference's best sample
        const double ref_best = *std::max_element(refs.gemm_samples.begin(), refs.gemm_samples.end());
        const bool beaten = std::any_of(rows.begin(), rows.end(), [&](const BatchRow& r) { return r.flop_s > ref_best; });
        t2.notes.push_back(fmt::format("target: a batched step >= 50% of the GEMM reference's FLOP/s: {:.0f}% at {} sequences, {}",
                                       100 * best->flop_s / best->gemm_ref, best->batch,
                                       beaten ? "n/a (the reference is beaten)"
                                       : best->flop_s / best->gemm_ref >= 0.5 ? "met" : "NOT met"));
        // roofline: a step reads the P weights once (W = 4P bytes of fp32 at bandwidth BW) and does 2 FLOPs per
        // weight per sequence (at F FLOP/s): time = max(W / BW, B x 2P / F). The two meet at B* = F x W / (BW x 2P)
        // = 2 F / BW: the ridge point F / BW over the 0.5 FLOP per weight byte one sequence does (the context's KV
        // reads, 16..32 positions here, are left out)
        const double gemm_ref = median(refs.gemm_samples);
        const double b_roof = 2.0 * gemm_ref / bw;
        // measured: where the batch-1 step time (the bandwidth floor) meets the largest batch's time per
        // sequence (the compute slope): B = t(1) / (t(B_max) / B_max)
        if (one) {
            const BatchRow& big = rows.back();
            const double b_meas = one->step_ms / (big.step_ms / static_cast<double>(big.batch));
            t2.notes.push_back(fmt::format("bandwidth-bound -> compute-bound at about {:.1f} sequences measured (batch-1 step time / per-sequence "
                                           "time at {}); roofline estimate 2 F / BW = {:.1f} (F: the GEMM reference, {:.1f} GFLOP/s; BW: read {:.1f} GB/s over "
                                           "a working set of the weights' size; 2 FLOPs per 4-byte weight per sequence)",
                                           b_meas, big.batch, b_roof, gemm_ref * 1e-9, bw * 1e-9));
        }
        // Eigen's best case at the start, for scale: how far a tuned library's GEMM gets toward the peak
        double eigen_best = 0;
        std::size_t eigen_case = 0;
        for (std::size_t i = 0; i < refs.gemm_cases.size(); ++i)
            if (refs.gemm_cases[i].n > 0 && refs.gemm_case_rate[i] > eigen_best) eigen_best = refs.gemm_case_rate[i], eigen_case = i;
        t2.notes.push_back(fmt::format("GEMM reference: the best of Eigen (n, n) @ (n, n) for n = {} (one product on all threads or one per "
                                       "thread) and the FMA peak: {}; sampled before each batch size. Eigen's best at the start: {:.1f} "
                                       "GFLOP/s ({}), so the best batched step is {:.2f}x of it",
                                       fmt::join(o.gemm_sizes, ", "), References::gemm_name(refs.gemm_cases[refs.best_gemm]),
                                       eigen_best * 1e-9, References::gemm_name(refs.gemm_cases[eigen_case]), best->flop_s / eigen_best));
        if (beaten)
            t2.notes.push_back("NOT VALID: a batched step beat the GEMM reference's best sample, so the reference is not a ceiling here");
        report.tables.push_back(std::move(t2));
        emit_report(report, format, o.json);
    } catch (const Error& e) {
        std::fprintf(stderr, "kvlab_bench_serve: %s\n", e.what());
        return e.exit_code();
    }
    return 0;
}
