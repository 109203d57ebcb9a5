#include "report/serve_report.hpp"

#include <algorithm>
#include <cmath>
#include <functional>

#include <fmt/format.h>

#include "kvlab/core/text.hpp"

namespace kvlab {

Percentiles percentiles(std::vector<double> v) {
    if (v.empty()) return {};
    std::sort(v.begin(), v.end());
    auto rank = [&](double p) {  // the ceil(p * n)-th smallest, 1-based
        const auto k = static_cast<std::size_t>(std::ceil(p * static_cast<double>(v.size())));
        return v[std::max<std::size_t>(k, 1) - 1];
    };
    return {rank(0.5), rank(0.9), v.back(), v.size()};
}

ModelledServeTime modelled_serve_time(const GpuSpec& gpu, const std::vector<ServeStep>& steps, double host_bytes_per_s) {
    ModelledServeTime m;
    for (const ServeStep& st : steps) {
        const OpCost c = st.cost.total();
        const RooflineTime t = roofline_time(gpu, static_cast<double>(c.flops), static_cast<double>(c.bytes_total()));
        const double swap = host_bytes_per_s > 0 ? static_cast<double>(st.swap_out_bytes + st.swap_in_bytes) / host_bytes_per_s : 0.0;
        m.seconds += t.seconds() + swap;
        m.swap_seconds += swap;
        m.memory_bound_steps += t.memory_bound() ? 1 : 0;
    }
    return m;
}

namespace {

// The tokens a request chose after its first, for TPOT: its longest output's (outputs that stopped early
// are shorter; the request ran until its last output finished).
std::int64_t decode_steps(const ServeRequestResult& q) {
    std::int64_t n = std::ssize(q.generated);
    for (const std::vector<TokenId>& out : q.outputs) n = std::max(n, std::ssize(out));
    return std::max<std::int64_t>(0, n - 1);
}

// A finished request's outputs: how each ended, and the tokens max_tokens allowed that they did not use.
void count_outputs(const ServeRequestResult& q, ServeSummary& s) {
    const auto one = [&](std::int64_t generated, FinishReason why) {
        ++s.n_outputs;
        s.n_end_of_text += why == FinishReason::end_of_text ? 1 : 0;
        s.n_stop_string += why == FinishReason::stop_string ? 1 : 0;
        s.n_tokens_unused += q.max_tokens - generated;
    };
    if (q.outputs.empty()) one(std::ssize(q.generated), q.finish_reason);
    for (std::size_t k = 0; k < q.outputs.size(); ++k) one(std::ssize(q.outputs[k]), q.finish_reasons[k]);
}

// The requests' figures: prompt tokens, recomputation, prefix hits, --check, latency percentiles.
void summarize_requests(const ServeResult& r, ServeSummary& s) {
    std::vector<double> ttft_steps, ttft_ms, tpot_steps, tpot_ms;
    for (const ServeRequestResult& q : r.requests) {
        s.n_prompt_tokens += q.prompt_len;
        s.recomputed_tokens += q.recomputed_tokens;
        s.prefix_hit_tokens += q.prefix_hit_tokens;
        if (q.checked) {
            ++s.n_checked;
            s.n_tokens_checked += std::ssize(q.generated);
            for (std::size_t k = 1; k < q.outputs.size(); ++k) s.n_tokens_checked += std::ssize(q.outputs[k]);  // every output's (the first is `generated`)
            s.n_tokens_agree += q.solo_agree;
            s.max_abs_dlogit = std::max(s.max_abs_dlogit, q.max_abs_dlogit);
            s.all_within_tolerance = s.all_within_tolerance && q.within_tolerance;
        }
        if (q.finish_step < 0) continue;
        ++s.n_finished;
        count_outputs(q, s);
        ttft_steps.push_back(static_cast<double>(q.first_token_step - q.arrival_step + 1));
        ttft_ms.push_back(static_cast<double>(q.first_token_ns - q.arrival_ns) * 1e-6);
        if (decode_steps(q) > 0) {
            const auto n = static_cast<double>(decode_steps(q));
            tpot_steps.push_back(static_cast<double>(q.finish_step - q.first_token_step) / n);
            tpot_ms.push_back(static_cast<double>(q.finish_ns - q.first_token_ns) * 1e-6 / n);
        }
    }
    s.ttft_steps = percentiles(ttft_steps);
    s.ttft_ms = percentiles(ttft_ms);
    s.tpot_steps = percentiles(tpot_steps);
    s.tpot_ms = percentiles(tpot_ms);
}

}  // namespace

ServeSummary summarize_serving(const ServeResult& r, KvLayout layout, const GpuSpec* gpu) {
    ServeSummary s;
    s.layout = layout;
    s.n_requests = std::ssize(r.requests);
    s.n_steps = std::ssize(r.steps);
    s.pool_rows = r.pool_rows;
    s.pool_bytes = r.pool_bytes;
    s.prefix_hit_blocks = r.prefix_hit_blocks;
    s.cow_copies = 0;  // the steps' (a trace keeps them too)
    s.evictions = r.counters.evictions;
    s.rows_left_in_use = r.rows_left_in_use;
    s.swap_mode = r.host_bytes_per_s > 0;
    s.host_bytes_per_s = r.host_bytes_per_s;
    s.swap_fallbacks = r.swap_fallbacks;
    s.host_peak_bytes = r.host_peak_bytes;
    s.recompute_flops = r.recompute_flops;
    s.kv_dtype = r.kv_dtype;
    std::int64_t forward_ns = 0, schedule_ns = 0;
    double utilization = 0.0, usage = 0.0, slack = 0.0;
    std::int64_t n_held = 0;  // steps with rows in use
    for (const ServeStep& st : r.steps) {
        s.n_generated += st.n_generated;
        s.n_stopped += st.n_stopped;
        s.preemptions += st.n_preempted;
        s.swap_outs += st.n_swapped_out;
        s.swap_ins += st.n_swapped_in;
        s.swap_out_bytes += static_cast<std::uint64_t>(st.swap_out_bytes);
        s.swap_in_bytes += static_cast<std::uint64_t>(st.swap_in_bytes);
        s.swap_ns += st.swap_ns;
        s.n_computed_tokens += st.n_tokens;
        s.max_running = std::max(s.max_running, st.n_seqs);
        s.mean_running += static_cast<double>(st.n_seqs);
        s.mean_batch_tokens += static_cast<double>(st.n_tokens);
        s.peak_rows_in_use = std::max(s.peak_rows_in_use, st.rows_in_use);
        s.peak_out_blocks = std::max(s.peak_out_blocks, st.out_blocks);
        s.peak_out_blocks_unshared = std::max(s.peak_out_blocks_unshared, st.out_blocks_unshared);
        s.cow_copies += st.cow_copies;
        for (int op = 0; op < n_ops; ++op) s.cost.add(static_cast<Op>(op), st.cost.ops[static_cast<std::size_t>(op)]);
        s.max_step_weight_bytes = std::max(s.max_step_weight_bytes, st.cost.total().bytes_weights_read);
        forward_ns += st.forward_ns;
        schedule_ns += st.schedule_ns;
        usage += static_cast<double>(st.rows_in_use) / static_cast<double>(std::max<std::int64_t>(1, r.pool_rows));
        if (st.rows_in_use > 0) {
            ++n_held;
            utilization += static_cast<double>(st.rows_tokens) / static_cast<double>(st.rows_in_use);
            slack += static_cast<double>(st.rows_in_use - st.rows_tokens);
        }
    }
    if (s.n_steps > 0) {
        s.mean_running /= static_cast<double>(s.n_steps);
        s.mean_batch_tokens /= static_cast<double>(s.n_steps);
        s.mean_pool_usage = usage / static_cast<double>(s.n_steps);
    }
    if (n_held > 0) {
        s.mean_utilization = utilization / static_cast<double>(n_held);
        s.mean_slack_rows = slack / static_cast<double>(n_held);
    }
    s.seconds = static_cast<double>(forward_ns + schedule_ns) * 1e-9;
    s.tokens_per_s = s.seconds > 0 ? static_cast<double>(s.n_generated) / s.seconds : 0.0;
    s.schedule_share = forward_ns + schedule_ns > 0 ? static_cast<double>(schedule_ns) / static_cast<double>(forward_ns + schedule_ns) : 0.0;
    const OpCost total = s.cost.total();
    if (s.n_generated > 0) {
        s.weight_bytes_per_token = static_cast<double>(total.bytes_weights_read) / static_cast<double>(s.n_generated);
        s.kv_read_bytes_per_token = static_cast<double>(total.bytes_kv_read) / static_cast<double>(s.n_generated);
    }
    summarize_requests(r, s);
    if (gpu) {
        s.gpu = *gpu;
        s.modelled = modelled_serve_time(*gpu, r.steps, r.host_bytes_per_s);
        s.modelled_tokens_per_s = s.modelled.seconds > 0 ? static_cast<double>(s.n_generated) / s.modelled.seconds : 0.0;
    }
    return s;
}

namespace {

Cell pct_cell(double fraction) { return percent_cell(100.0 * fraction); }

struct Metric {
    std::string key, name;
    std::function<Cell(const ServeSummary&)> cell;
    bool per_request = false;  // from the requests' records, which a trace does not keep
    bool timed = false;        // from the steps' wall time, which a --deterministic trace does not keep
    bool modelled = false;     // the modelled time on a GPU (none when the summaries have no GPU)
    bool swap = false;         // --preempt swap's (shown when a summary swapped)
    bool preempted = false;    // shown when a summary preempted (or swapped)
    bool outputs = false;      // several outputs per request (none: no output held blocks)
    bool stopped = false;      // outputs stopped early (shown when a summary has one)
};

// The cells the table and the headline share, so the headline's figures are the table's.
Cell utilization_cell(const ServeSummary& s) { return pct_cell(s.mean_utilization); }
Cell modelled_ms_cell(const ServeSummary& s) { return real_cell(s.modelled.seconds * 1e3, 3); }
Cell seconds_cell(const ServeSummary& s) { return real_cell(s.seconds, 3); }

std::string ratio_text(double r) { return fmt::format("{:.2f}x", r); }

// Why the CPU's wall time ranks the layouts against the modelled GPU time: what was counted says so.
std::string wall_reason(const ServeSummary& p, const ServeSummary& c, UnitSystem units) {
    std::vector<std::string> why;
    if (p.max_step_weight_bytes < (std::uint64_t{64} << 20))
        why.push_back(fmt::format("on a CPU a model this small ({} of weights read per step) gains little from batching",
                                  format_bytes(p.max_step_weight_bytes, units)));
    // (a trace keeps no per-request records: the tokens recomputed are known from a run only)
    const std::string after = p.recomputed_tokens > 0 ? fmt::format(" ({} recomputed after {})", p.recomputed_tokens, counted(p.preemptions, "preemption"))
                              : p.preemptions > 0     ? fmt::format(", after {}", counted(p.preemptions, "preemption"))
                                                      : std::string();
    if (p.n_computed_tokens > c.n_computed_tokens)
        why.push_back(fmt::format("paging ran {} tokens through the model vs {}{}", p.n_computed_tokens, c.n_computed_tokens, after));
    if (why.empty()) why.push_back("one run's timings vary");
    std::string out = why.front();
    for (std::size_t i = 1; i < why.size(); ++i) out += ", and " + why[i];
    return out;
}

// Paged against contiguous: utilization and concurrency (counted), the modelled GPU time, the CPU's wall time.
std::vector<std::string> compare_headline(const ServeSummary& p, const ServeSummary& c, UnitSystem units) {
    std::vector<std::string> h;
    h.push_back(fmt::format("paged kept {} of allocated KV holding tokens vs {} contiguous, and ran up to {} requests at once vs {} "
                            "in the same {} pool; {} vs {} (counted, exact)",
                            utilization_cell(p).text, utilization_cell(c).text, p.max_running, c.max_running,
                            format_bytes(p.pool_bytes, units), counted(p.n_steps, "step"), c.n_steps));
    const bool modelled = p.gpu && c.gpu && p.modelled.seconds > 0 && c.modelled.seconds > 0;
    const double modelled_ratio = modelled ? c.modelled.seconds / p.modelled.seconds : 0.0;
    if (modelled) {
        const std::int64_t bound = p.modelled.memory_bound_steps + c.modelled.memory_bound_steps, steps = p.n_steps + c.n_steps;
        const std::string memory = bound == steps ? "every step is memory-bound" : fmt::format("{} of {} steps are memory-bound", bound, steps);
        const std::string why = modelled_ratio >= 1.0
                                    ? fmt::format("{} faster: {}, and a batched step reads the weights once for all its sequences",
                                                  ratio_text(modelled_ratio), memory)
                                    : fmt::format("{} slower: paging ran {} tokens through the model vs {}, after {}", ratio_text(1.0 / modelled_ratio),
                                                  p.n_computed_tokens, c.n_computed_tokens, counted(p.preemptions, "preemption"));
        h.push_back(fmt::format("modelled on {}: paged {} ms vs contiguous {} ms ({})", p.gpu->display_name, modelled_ms_cell(p).text,
                                modelled_ms_cell(c).text, why));
    }
    if (p.has_wall_time && c.has_wall_time && p.seconds > 0 && c.seconds > 0) {
        std::string line = fmt::format("CPU wall time (measured, one run): paged {} s vs contiguous {} s", seconds_cell(p).text, seconds_cell(c).text);
        const bool paged_faster_wall = p.seconds < c.seconds;
        if (modelled && modelled_ratio >= 1.0 && !paged_faster_wall) line += ": " + wall_reason(p, c, units);
        else if (modelled && modelled_ratio >= 1.0) line += ": faster here too";
        h.push_back(line);
    }
    return h;
}

// One layout: its utilization and concurrency (counted), then its modelled and wall time.
std::vector<std::string> single_headline(const ServeSummary& s, UnitSystem units) {
    std::vector<std::string> h;
    h.push_back(fmt::format("{}: {} of allocated KV held tokens; up to {} {} at once in a {} pool, {} (counted, exact)",
                            choice_name(kv_layout_choices, s.layout), utilization_cell(s).text, s.max_running,
                            s.peak_out_blocks_unshared > 0 ? "sequences (outputs)" : "requests",
                            format_bytes(s.pool_bytes, units), counted(s.n_steps, "step")));
    if (s.gpu && s.modelled.seconds > 0)
        h.push_back(fmt::format("modelled on {}: {} ms ({} generated tok/s)", s.gpu->display_name, modelled_ms_cell(s).text,
                                real_cell(s.modelled_tokens_per_s, 0).text));
    if (s.has_wall_time && s.seconds > 0) h.push_back(fmt::format("CPU wall time (measured, one run): {} s", seconds_cell(s).text));
    return h;
}

// Outputs that stopped before max_tokens (shown when a summary has one): the steps' count, and how the
// finished requests' outputs ended (a run's).
std::vector<Metric> stop_metrics() {
    return {
        {"stopped_outputs", "outputs stopped early", [](const ServeSummary& s) { return int_cell(s.n_stopped); }, false, false, false, false, false, false, true},
        {"stopped_end_of_text", "of finished outputs: at end-of-text", [](const ServeSummary& s) { return int_cell(s.n_end_of_text); },
         true, false, false, false, false, false, true},
        {"stopped_stop_string", "of finished outputs: at a stop string", [](const ServeSummary& s) { return int_cell(s.n_stop_string); },
         true, false, false, false, false, false, true},
        {"unused_max_tokens", "max_tokens not generated (stopped early)", [](const ServeSummary& s) { return int_cell(s.n_tokens_unused); },
         true, false, false, false, false, false, true},
    };
}

std::vector<Metric> metrics(std::uint64_t token_bytes, std::int64_t block_size, UnitSystem units) {
    auto rows_bytes = [=](const ServeSummary& s, double rows) {
        const std::uint64_t row = s.token_bytes ? s.token_bytes : token_bytes;
        return bytes_cell(static_cast<std::uint64_t>(std::llround(rows * static_cast<double>(row))), units);
    };
    auto stats = [](const char* key, const char* name, Percentiles ServeSummary::* field, int decimals) {
        // no values (TPOT when every request generated one token): undefined, "-" (null in JSON), not 0
        auto cell = [=](const Percentiles& p, double v) { return p.n == 0 ? Cell{"-", nullptr} : real_cell(v, decimals); };
        return std::vector<Metric>{
            {fmt::format("{}_median", key), fmt::format("{} median", name), [=](const ServeSummary& s) { return cell(s.*field, (s.*field).median); }, true},
            {fmt::format("{}_p90", key), fmt::format("{} p90", name), [=](const ServeSummary& s) { return cell(s.*field, (s.*field).p90); }, true},
            {fmt::format("{}_max", key), fmt::format("{} max", name), [=](const ServeSummary& s) { return cell(s.*field, (s.*field).max); }, true},
        };
    };
    std::vector<Metric> m = {
        {"requests", "requests finished", [](const ServeSummary& s) { return text_cell(fmt::format("{} / {}", s.n_finished, s.n_requests)); }, true},
        {"steps", "steps (forward calls)", [](const ServeSummary& s) { return int_cell(s.n_steps); }},
        {"generated_tokens", "tokens generated", [](const ServeSummary& s) { return int_cell(s.n_generated); }},
        {"computed_tokens", "tokens run through the model", [](const ServeSummary& s) { return int_cell(s.n_computed_tokens); }},
        {"seconds", "time in steps (s)", [](const ServeSummary& s) { return seconds_cell(s); }, false, true},
        {"tokens_per_s", "throughput (generated tok/s)", [](const ServeSummary& s) { return real_cell(s.tokens_per_s, 1); }, false, true},
        {"modelled_ms", "modelled GPU time (ms)", [](const ServeSummary& s) { return modelled_ms_cell(s); }, false, false, true},
        {"modelled_tokens_per_s", "modelled GPU throughput (generated tok/s)",
         [](const ServeSummary& s) { return real_cell(s.modelled_tokens_per_s, 0); }, false, false, true},
        {"modelled_memory_bound_steps", "modelled: memory-bound steps",
         [](const ServeSummary& s) { return text_cell(fmt::format("{} / {}", s.modelled.memory_bound_steps, s.n_steps)); }, false, false, true},
    };
    const std::vector<Metric> stops = stop_metrics();
    m.insert(m.begin() + 4, stops.begin(), stops.end());  // after the tokens run through the model
    for (auto&& v : {stats("ttft_steps", "TTFT (steps)", &ServeSummary::ttft_steps, 0), stats("ttft_ms", "TTFT (ms)", &ServeSummary::ttft_ms, 2),
                     stats("tpot_steps", "TPOT (steps)", &ServeSummary::tpot_steps, 2), stats("tpot_ms", "TPOT (ms)", &ServeSummary::tpot_ms, 3)})
        m.insert(m.end(), v.begin(), v.end());
    const std::vector<Metric> rest = {
        {"max_running", "sequences per step, max", [](const ServeSummary& s) { return int_cell(s.max_running); }},
        {"mean_running", "sequences per step, mean", [](const ServeSummary& s) { return real_cell(s.mean_running, 2); }},
        {"mean_batch_tokens", "tokens per step, mean", [](const ServeSummary& s) { return real_cell(s.mean_batch_tokens, 1); }},
        {"pool_rows", "KV pool (token rows)", [](const ServeSummary& s) { return int_cell(s.pool_rows); }},
        {"pool_bytes", "KV pool (bytes)", [=](const ServeSummary& s) { return bytes_cell(s.pool_bytes, units); }},
        {"peak_bytes_in_use", "KV allocated, peak", [=](const ServeSummary& s) { return rows_bytes(s, static_cast<double>(s.peak_rows_in_use)); }},
        {"mean_utilization_percent", "KV utilization, mean (tokens / allocated)", [](const ServeSummary& s) { return utilization_cell(s); }},
        {"mean_pool_usage_percent", "pool reserved, mean (vLLM's 'KV cache usage')", [](const ServeSummary& s) { return pct_cell(s.mean_pool_usage); }},
        {"mean_slack_bytes", "allocated, no token, mean", [=](const ServeSummary& s) { return rows_bytes(s, s.mean_slack_rows); }},
        {"preemptions", "preemptions", [](const ServeSummary& s) { return int_cell(s.preemptions); }},
        {"recomputed_tokens", "tokens discarded by preemption", [](const ServeSummary& s) { return int_cell(s.recomputed_tokens); }, true},
        {"recompute_flops", "FLOPs to recompute them", [](const ServeSummary& s) { return count_cell(s.recompute_flops, "FLOP"); }, true, false, false, false, true},
        {"swap_outs", "preemptions swapped out / in", [](const ServeSummary& s) { return text_cell(fmt::format("{} / {}", s.swap_outs, s.swap_ins)); },
         false, false, false, true},
        {"swap_out_bytes", "KV swapped out to host", [=](const ServeSummary& s) { return bytes_cell(s.swap_out_bytes, units); }, false, false, false, true},
        {"swap_in_bytes", "KV swapped in from host", [=](const ServeSummary& s) { return bytes_cell(s.swap_in_bytes, units); }, false, false, false, true},
        {"swap_modelled_ms", "modelled swap time (ms, host link)", [](const ServeSummary& s) { return real_cell(s.modelled.swap_seconds * 1e3, 3); },
         false, false, true, true},
        {"host_peak_bytes", "host tier, peak", [=](const ServeSummary& s) { return bytes_cell(s.host_peak_bytes, units); }, true, false, false, true},
        {"swap_fallbacks", "swaps refused (host full): recomputed", [](const ServeSummary& s) { return int_cell(s.swap_fallbacks); }, true, false, false, true},
        {"prefix_hit_tokens", "tokens found in the prefix cache", [](const ServeSummary& s) { return int_cell(s.prefix_hit_tokens); }, true},
        {"prefix_hit_blocks", "blocks found in the prefix cache", [](const ServeSummary& s) { return int_cell(s.prefix_hit_blocks); }, true},
        {"prefix_hit_bytes", "KV shared, not recomputed", [=](const ServeSummary& s) { return rows_bytes(s, static_cast<double>(s.prefix_hit_tokens)); }, true},
        {"cow_copies", "copy-on-write block copies", [](const ServeSummary& s) { return int_cell(s.cow_copies); }},
        {"out_blocks_peak", "outputs' KV blocks held, peak (shared once)", [](const ServeSummary& s) { return int_cell(s.peak_out_blocks); },
         false, false, false, false, false, true},
        {"out_blocks_unshared_peak", "outputs' KV blocks if unshared, peak", [](const ServeSummary& s) { return int_cell(s.peak_out_blocks_unshared); },
         false, false, false, false, false, true},
        {"out_saved_bytes", "KV saved by sharing, peak (unshared - held)",
         [=](const ServeSummary& s) { return rows_bytes(s, static_cast<double>((s.peak_out_blocks_unshared - s.peak_out_blocks) * block_size)); },
         false, false, false, false, false, true},
        {"flops", "FLOPs counted", [](const ServeSummary& s) { return count_cell(s.cost.total().flops, "FLOP"); }},
        {"bytes_weights", "weight bytes read", [=](const ServeSummary& s) { return bytes_cell(s.cost.total().bytes_weights_read, units); }},
        {"bytes_kv_read", "KV bytes read", [=](const ServeSummary& s) { return bytes_cell(s.cost.total().bytes_kv_read, units); }},
        {"weight_bytes_per_token", "weight bytes per generated token",
         [=](const ServeSummary& s) { return bytes_cell(static_cast<std::uint64_t>(std::llround(s.weight_bytes_per_token)), units); }},
        {"kv_bytes_per_token", "KV bytes read per generated token",
         [=](const ServeSummary& s) { return bytes_cell(static_cast<std::uint64_t>(std::llround(s.kv_read_bytes_per_token)), units); }},
        {"schedule_share_percent", "scheduler bookkeeping / step time", [](const ServeSummary& s) { return pct_cell(s.schedule_share); }, false, true},
        {"rows_left_in_use", "KV rows still held at the end", [](const ServeSummary& s) { return int_cell(s.rows_left_in_use); }, true},
    };
    m.insert(m.end(), rest.begin(), rest.end());
    return m;
}

// --check's rows: tokens equal to the solo runs, the largest logit difference, and what a difference means.
void add_check_rows(Table& t, const std::vector<ServeSummary>& summaries) {
    if (std::none_of(summaries.begin(), summaries.end(), [](const ServeSummary& s) { return s.n_checked > 0; })) return;
    std::vector<Cell> agree{{"--check: tokens equal to solo runs", "check_tokens_agree"}}, dlogit{{"--check: max |logit - solo|", "check_max_abs_dlogit"}};
    for (const ServeSummary& s : summaries) {
        if (s.n_checked == 0) {
            agree.push_back({"-", nullptr});
            dlogit.push_back({"-", nullptr});
            continue;
        }
        agree.push_back({fmt::format("{} / {}", s.n_tokens_agree, s.n_tokens_checked), s.n_tokens_agree});
        const bool narrow = s.kv_dtype != DType::fp32;  // a narrow pool's difference is its quality cost, not a failure
        dlogit.push_back({fmt::format("{:.3g}{}", s.max_abs_dlogit, s.all_within_tolerance || narrow ? "" : " (beyond tolerance)"), s.max_abs_dlogit});
    }
    t.rows.push_back(std::move(agree));
    t.rows.push_back(std::move(dlogit));
    t.notes.push_back("--check: each request run again alone on the single-sequence path (one prefill, one decode call per "
                      "token), fed the tokens serving chose; logits compared with simulate's tolerance, 1e-3 x max(1, max |logit|)");
    if (std::any_of(summaries.begin(), summaries.end(), [](const ServeSummary& s) { return s.n_checked > 0 && s.kv_dtype != DType::fp32; }))
        t.notes.push_back("a narrow pool (--kv-dtype) is always checked: the solo run keeps fp32 K and V, so the logit difference and the "
                          "tokens whose argmax differs are what storing the pool narrow costs (teacher-forced on the same tokens)");
    if (std::any_of(summaries.begin(), summaries.end(), [](const ServeSummary& s) { return s.peak_out_blocks_unshared > 0; }))
        t.notes.push_back("--check with several outputs: every output so, its tokens against the same sampler replayed on the solo logits; "
                          "beams against a beam search run on the single-sequence path");
    for (const ServeSummary& s : summaries)
        if (s.n_tokens_agree < s.n_tokens_checked && s.kv_dtype == DType::fp32)
            t.notes.push_back(fmt::format("{}: {} of {} tokens differ from the solo run's argmax{}", choice_name(kv_layout_choices, s.layout),
                                          s.n_tokens_checked - s.n_tokens_agree, s.n_tokens_checked,
                                          s.all_within_tolerance ? " at near-ties: the logits agree within tolerance (summation order differs between "
                                                                   "a batched step and a solo call)"
                                                                 : ""));
}

// The table's notes: what is exact and what is measured, how each number is defined, the paper's figures.
void add_serve_notes(Table& t, const std::vector<ServeSummary>& summaries, bool from_trace, bool timed, std::uint64_t token_bytes, bool latent,
                     UnitSystem units, const std::string& timing_note) {
    const std::string exact = "counted figures (steps, tokens, FLOPs, bytes, blocks, and the modelled GPU time computed from them) are exact: "
                              "the same on any host";
    if (timed)
        t.notes.push_back(exact + "; timed ones (time in steps, throughput, TTFT/TPOT ms, bookkeeping share) are one run's wall time: " +
                          (timing_note.empty() ? "they vary from run to run" : timing_note));
    else
        t.notes.push_back(exact + "; no wall time: the trace was written with --deterministic, so time, throughput and the scheduler's "
                                  "share are left out");
    if (!from_trace)
        t.notes.push_back("TTFT: arrival to the step that chose the first token (inclusive); TPOT: (finish - first token) / (generated - 1); "
                          "percentiles by nearest rank over finished requests; times are the steps' wall time (docs/serving.md)");
    else
        t.notes.push_back("from a serve trace: the per-step numbers; per-request ones (latency, preemption and prefix counts) are in "
                          "kvlab serve's report and the Perfetto form");
    t.notes.push_back(fmt::format("KV utilization: rows holding a token's K and V / rows allocated, when each step's K and V are written, "
                                  "mean over steps; pool reserved: rows allocated / pool rows (what vLLM logs as 'KV cache usage'), high "
                                  "whenever reservations hold empty rows; one token row = {} ({}, every layer, {})",
                                  format_bytes(token_bytes, units), latent ? "MLA's latent c_KV and RoPE key" : "K and V", dtype_name(summaries.empty() ? DType::fp32 : summaries.front().kv_dtype)));
    if (!summaries.empty() && summaries.front().gpu) {
        const GpuSpec& g = *summaries.front().gpu;
        t.notes.push_back(fmt::format("modelled GPU time: each step's max(FLOPs / {:.4g} FLOP/s, bytes / {:.4g} B/s) on {} (BF16 dense peak and "
                                      "bandwidth, presets/gpus.json), summed; the bytes are this run's (fp32 weights, activations and KV), "
                                      "not re-sized for a GPU (docs/kv-memory.md, 'Modelled GPU time')",
                                      g.bf16_dense_flops, static_cast<double>(g.bandwidth_bytes_per_s), g.display_name));
    }
    if (std::any_of(summaries.begin(), summaries.end(), [](const ServeSummary& s) { return s.swap_mode; })) {
        const ServeSummary& w = *std::find_if(summaries.begin(), summaries.end(), [](const ServeSummary& s) { return s.swap_mode; });
        t.notes.push_back(fmt::format("swap: a preempted sequence's K and V rows are copied to host memory as the pool stores them and back "
                                      "when it is admitted again (counted bytes: each layer's held rows x 2 x one stored row); the modelled "
                                      "swap time is those bytes / {:.4g} B/s per direction, added to the step that moved them (never slept)",
                                      w.host_bytes_per_s));
    }
    t.notes.push_back("for comparison, the vLLM paper (Kwon et al., SOSP 2023, Fig. 2) measured 20.4% (Orca Max), 26.8% (Pow2) and 38.2% "
                      "(Oracle) of KV memory holding token states in systems that reserve contiguous space, and 96.3% with paging");
}

// One layout's requests, a row each (the csv/json/markdown forms: long, for tools).
Table request_table(const ServeSummary& summary, const ServeResult& result) {
    Table q;
    q.title = fmt::format("requests ({})", choice_name(kv_layout_choices, summary.layout));
    q.columns = {{"request", "request"}, {"arrival_step", "arrival"}, {"prompt_len", "prompt"}, {"max_tokens", "max tokens"},
                 {"generated", "generated"}, {"first_token_step", "first token step"}, {"finish_step", "finish step"},
                 {"ttft_ms", "TTFT (ms)"}, {"tpot_ms", "TPOT (ms)"}, {"preemptions", "preemptions"},
                 {"prefix_hit_tokens", "prefix hits"}, {"finish_reason", "finish"}};
    // several outputs per request: how many, the most blocks they held at once (shared once) and unshared
    const bool with_outputs = std::any_of(result.requests.begin(), result.requests.end(), [](const ServeRequestResult& r) { return !r.outputs.empty(); });
    if (with_outputs)
        q.columns.insert(q.columns.end(), {{"outputs", "outputs"}, {"peak_blocks", "blocks held, peak"},
                                           {"peak_blocks_unshared", "blocks if unshared, peak"}, {"cow_copies", "copy-on-write copies"}});
    for (std::size_t i = 0; i < result.requests.size(); ++i) {
        const ServeRequestResult& r = result.requests[i];
        // one token generated: no time per output token after the first ("-", null in JSON)
        const Cell tpot = decode_steps(r) > 0 ? real_cell(static_cast<double>(r.finish_ns - r.first_token_ns) * 1e-6 /
                                                              static_cast<double>(decode_steps(r)), 4)
                                                 : Cell{"-", nullptr};
        q.rows.push_back({int_cell(static_cast<std::int64_t>(i)), int_cell(r.arrival_step), int_cell(r.prompt_len), int_cell(r.max_tokens),
                          int_cell(std::ssize(r.generated)), int_cell(r.first_token_step), int_cell(r.finish_step),
                          real_cell(static_cast<double>(r.first_token_ns - r.arrival_ns) * 1e-6, 3), tpot,
                          int_cell(r.preemptions), int_cell(r.prefix_hit_tokens),
                          text_cell(r.finish_step < 0 ? "-" : std::string(choice_name(finish_reason_choices, r.finish_reason)))});
        if (with_outputs)
            for (const std::int64_t v : {std::max<std::int64_t>(1, std::ssize(r.outputs)), r.peak_blocks, r.peak_blocks_unshared, r.cow_copies}) q.rows.back().push_back(int_cell(v));
    }
    return q;
}

// Paged against contiguous, or one layout.
std::vector<std::string> serve_headline_layouts(const std::vector<ServeSummary>& summaries, UnitSystem units) {
    const auto paged = std::find_if(summaries.begin(), summaries.end(), [](const ServeSummary& s) { return s.layout == KvLayout::paged; });
    const auto contiguous = std::find_if(summaries.begin(), summaries.end(), [](const ServeSummary& s) { return s.layout == KvLayout::contiguous; });
    if (paged != summaries.end() && contiguous != summaries.end()) return compare_headline(*paged, *contiguous, units);
    if (summaries.empty()) return {};
    return single_headline(summaries.front(), units);
}

// Several outputs per request: the blocks they held against unshared copies, and the copies on write.
std::string outputs_headline(const ServeSummary& s) {
    return fmt::format("{}'s outputs held at most {} KV blocks at once, vs {} if each output had its own copy ({:.2f}x); "
                       "{} (counted, exact)",
                       s.name.empty() ? std::string(choice_name(kv_layout_choices, s.layout)) : s.name, s.peak_out_blocks, s.peak_out_blocks_unshared,
                       static_cast<double>(s.peak_out_blocks_unshared) / static_cast<double>(std::max<std::int64_t>(1, s.peak_out_blocks)),
                       fmt::format("{} copy-on-write block {}", s.cow_copies, s.cow_copies == 1 ? "copy" : "copies"));
}

// --preempt swap: what moved over the host link, and its modelled time (a run's or a trace's; a trace
// does not keep the swaps the full host tier turned into recomputation).
std::string swap_headline(const ServeSummary& s, UnitSystem units) {
    return fmt::format("swap: {} of {} swapped out {} and back in {} (counted, exact), {} ms on the host link at {} modelled{}",
                       s.swap_outs, counted(s.preemptions, "preemption"), format_bytes(s.swap_out_bytes, units),
                       format_bytes(s.swap_in_bytes, units), real_cell(s.modelled.swap_seconds * 1e3, 3).text,
                       format_rate(static_cast<std::uint64_t>(s.host_bytes_per_s)),
                       s.swap_fallbacks > 0 ? fmt::format("; {} recomputed (host full)", s.swap_fallbacks) : "");
}

// Outputs that stopped before max_tokens: how, and what it saved (one layout's: the first with any; the
// requests and their outputs are the same in every layout).
std::string stopped_headline(const ServeSummary& s) {
    const std::string what = s.n_outputs == 0  // from a trace: the steps' count only
        ? fmt::format("{} {} stopped before max_tokens (end-of-text or a stop string)", s.n_stopped, s.n_stopped == 1 ? "output" : "outputs")
        : fmt::format("{} of {} outputs stopped before max_tokens ({} at end-of-text, {} at a stop string), {} tokens short of it",
                      s.n_end_of_text + s.n_stop_string, s.n_outputs, s.n_end_of_text, s.n_stop_string, s.n_tokens_unused);
    return what + "; each gave its KV rows back as it stopped (counted, exact)";
}

}  // namespace

std::vector<std::string> serve_headline(const std::vector<ServeSummary>& summaries, UnitSystem units) {
    std::vector<std::string> h = serve_headline_layouts(summaries, units);
    for (const ServeSummary& s : summaries)
        if (s.peak_out_blocks_unshared > 0) h.push_back(outputs_headline(s));
    const auto swapped = std::find_if(summaries.begin(), summaries.end(), [](const ServeSummary& s) { return s.swap_mode; });
    if (swapped != summaries.end()) h.push_back(swap_headline(*swapped, units));
    const auto stopped = std::find_if(summaries.begin(), summaries.end(), [](const ServeSummary& s) { return s.n_stopped > 0; });
    if (stopped != summaries.end()) h.push_back(stopped_headline(*stopped));
    return h;
}

Report serve_report(const std::vector<ServeSummary>& summaries, const std::vector<ServeResult>& results, const nlohmann::json& inputs,
                    const std::string& title, std::uint64_t token_bytes, UnitSystem units, Format format, const std::string& timing_note) {
    Report report;
    report.inputs = inputs;
    report.headline = serve_headline(summaries, units);
    Table t;
    t.title = title;
    t.columns = {{"metric", "metric", false}};
    for (const ServeSummary& s : summaries) {
        const std::string name = s.name.empty() ? std::string(choice_name(kv_layout_choices, s.layout)) : s.name;
        t.columns.push_back({name, name});
    }
    const bool from_trace = results.empty();
    const bool timed = std::all_of(summaries.begin(), summaries.end(), [](const ServeSummary& s) { return s.has_wall_time; });
    const bool modelled = !summaries.empty() && std::all_of(summaries.begin(), summaries.end(), [](const ServeSummary& s) { return s.gpu.has_value(); });
    const bool swap = std::any_of(summaries.begin(), summaries.end(), [](const ServeSummary& s) { return s.swap_mode; });
    const bool preempted = swap || std::any_of(summaries.begin(), summaries.end(), [](const ServeSummary& s) { return s.preemptions > 0; });
    const bool outputs = std::any_of(summaries.begin(), summaries.end(), [](const ServeSummary& s) { return s.peak_out_blocks_unshared > 0; });
    const bool stopped = std::any_of(summaries.begin(), summaries.end(), [](const ServeSummary& s) { return s.n_stopped > 0; });
    for (const Metric& m : metrics(token_bytes, inputs.value("block_size", std::int64_t{0}), units)) {
        if ((from_trace && m.per_request) || (!timed && m.timed) || (!modelled && m.modelled) || (!swap && m.swap) || (!preempted && m.preempted) ||
            (!outputs && m.outputs) || (!stopped && m.stopped))
            continue;
        std::vector<Cell> row{{m.name, m.key}};
        for (const ServeSummary& s : summaries) row.push_back(m.cell(s));
        t.rows.push_back(std::move(row));
    }
    add_check_rows(t, summaries);
    // an MLA pool's token row holds the latent c_KV and the RoPE key (docs/kv-memory.md), not K and V
    const bool latent = inputs.value("kv_row", std::string()) == "mla latent";
    add_serve_notes(t, summaries, from_trace, timed, token_bytes, latent, units, timing_note);
    report.tables.push_back(std::move(t));

    if (format != Format::table && !from_trace) {  // per request: long, for tools
        for (std::size_t k = 0; k < summaries.size(); ++k) report.tables.push_back(request_table(summaries[k], results[k]));
    }
    return report;
}

}  // namespace kvlab
