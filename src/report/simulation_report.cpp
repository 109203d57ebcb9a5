#include "report/simulation_report.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "kvlab/core/text.hpp"

namespace kvlab {

namespace {

double ratio(double num, double den) { return den > 0.0 ? num / den : 0.0; }

const StepRecord* find_record(const std::vector<StepRecord>& records, StepMode mode, std::int64_t step) {
    for (const auto& r : records)
        if (r.mode == mode && r.step == step) return &r;
    return nullptr;
}

// "9.3x faster here (wall, median of 5 runs: 7.5-12.1x)" or "(wall, one run: timings vary)": a wall-time ratio with its spread.
std::string ratio_spread_text(const Spread& s) {
    return s.n > 1 ? fmt::format("{:.1f}x faster here (wall, median of {} runs: {:.1f}-{:.1f}x)", s.median, s.n, s.min, s.max)
                   : fmt::format("{:.1f}x faster here (wall, one run: timings vary)", s.median);
}

// Both modes: how much faster the cached decode was here (wall, measured, with its spread) and on the
// modelled GPU, why (FLOPs and bytes, counted), and the memory the cache took for it.
std::vector<std::string> cached_headline(const RunSummary& run, const std::vector<StepRecord>& records, const nlohmann::json& inputs,
                                         UnitSystem units) {
    const ModeTotals c = mode_totals(records, StepMode::cached), u = mode_totals(records, StepMode::uncached);
    const double flops = ratio(static_cast<double>(u.cost.flops), static_cast<double>(c.cost.flops));
    const double bytes = ratio(static_cast<double>(u.cost.bytes_total()), static_cast<double>(c.cost.bytes_total()));
    std::string modelled;
    if (const std::optional<GpuSpec> gpu = modelled_gpu(inputs)) {
        double sec[2] = {0, 0};  // [cached, uncached]
        for (const StepRecord& r : records) sec[r.mode == StepMode::cached ? 0 : 1] += modelled_step_seconds(*gpu, r);
        modelled = fmt::format("{:.1f}x modelled on {}", ratio(sec[1], sec[0]), gpu->display_name);
    }
    std::vector<std::string> h;
    const std::vector<double> wc = run_walls_ns(run, records, StepMode::cached), wu = run_walls_ns(run, records, StepMode::uncached);
    std::vector<double> speedups;
    for (std::size_t i = 0; i < wc.size() && i < wu.size(); ++i)
        if (wc[i] > 0 && wu[i] > 0) speedups.push_back(wu[i] / wc[i]);
    const Spread s = spread_of(speedups);
    const std::string model_part = modelled.empty() ? "" : ", " + modelled;
    if (run.has_wall_time && s.n > 0 && s.median >= 1.0)
        h.push_back(fmt::format("cached decoding: {}{}", ratio_spread_text(s), model_part));
    else if (run.has_wall_time && s.n > 0)  // a model this small: fixed costs per call dominate on a CPU
        h.push_back(fmt::format("cached decoding: {:.1f}x slower here (wall{}: each call's fixed costs outweigh the work saved on a "
                                "model this small){}",
                                1.0 / s.median, s.n > 1 ? fmt::format(", median of {} runs", s.n) : ", one run", model_part));
    else
        h.push_back(fmt::format("cached decoding{} (no wall time in this trace)", modelled.empty() ? "" : ": " + modelled));
    std::string why = fmt::format("from {:.1f}x fewer FLOPs and {:.1f}x fewer bytes moved (counted, exact)", flops, bytes);
    if (run.kv_cache_bytes > 0)
        why += fmt::format("; the cache held {} for {} positions (uncached keeps none)", format_bytes(run.kv_cache_bytes, units), c.n_tokens);
    h.push_back(why);
    return h;
}

// Measured step times: the median and range of the decode steps (step >= 1), and the prompt's (step 0).
struct StepTimes {
    std::int64_t prompt_ns = 0;
    std::int64_t n_decode = 0;
    std::int64_t median_ns = 0, min_ns = 0, max_ns = 0;
};
StepTimes step_times(std::vector<std::int64_t> ns) {
    StepTimes t;
    if (ns.empty()) return t;
    t.prompt_ns = ns.front();
    ns.erase(ns.begin());
    t.n_decode = static_cast<std::int64_t>(ns.size());
    if (ns.empty()) return t;
    std::sort(ns.begin(), ns.end());
    t.median_ns = ns[ns.size() / 2];
    t.min_ns = ns.front();
    t.max_ns = ns.back();
    return t;
}

// --kernel reference: the readable forward beside the fast path, its times and whether it chose the same tokens.
Table reference_kernel_table(const ReferenceKernelRun& ref, const std::vector<StepRecord>& records) {
    std::vector<std::int64_t> fast_ns;
    for (const StepRecord& r : records)
        if (r.mode == StepMode::cached) fast_ns.push_back(r.wall_ns);
    const StepTimes fast = step_times(fast_ns), slow = step_times(ref.wall_ns);
    Table t;
    t.title = "the reference forward (src/model/reference.cpp: plain loops, one token per call) beside the fast path, same tokens";
    t.columns = {{"kernel", "kernel", false}, {"threads", "threads"}, {"prompt_ms", "prompt (ms)"},
                 {"decode_ms_median", "decode ms/token, median"}, {"decode_ms_min", "min"}, {"decode_ms_max", "max"},
                 {"decode_tokens_per_s", "tokens/s (median)"}, {"time_vs_fast", "time vs fast"}};
    auto row = [&](const char* name, int threads, const StepTimes& s) {
        const bool decode = s.n_decode > 0;
        auto ms = [&](std::int64_t ns) { return decode ? real_cell(static_cast<double>(ns) * 1e-6, 3) : text_cell("-"); };
        t.rows.push_back({text_cell(name), int_cell(threads), real_cell(static_cast<double>(s.prompt_ns) * 1e-6, 3), ms(s.median_ns),
                          ms(s.min_ns), ms(s.max_ns),
                          decode ? real_cell(1e9 / static_cast<double>(std::max<std::int64_t>(1, s.median_ns)), 1) : text_cell("-"),
                          decode ? ratio_cell(static_cast<double>(s.median_ns) / static_cast<double>(std::max<std::int64_t>(1, fast.median_ns)))
                                 : text_cell("-")});
    };
    row("fast", ref.fast_threads, fast);
    row("reference", 1, slow);
    t.notes.push_back(ref.first_other_token
                          ? fmt::format("tokens: the reference's own sampler (same options, same seed) picked the fast path's token at {} of {} "
                                        "steps; first another at step {} (a near-tie: its logits still agree, below)",
                                        ref.n_same_token, ref.n_steps, *ref.first_other_token)
                          : fmt::format("tokens: the reference's own sampler (same options, same seed) picked the fast path's token at all {} "
                                        "steps", ref.n_steps));
    t.notes.push_back(fmt::format("logits: max |fast - reference| = {:.3g} x max(1, max |logit|) over {} (the tests hold it under 1e-4)",
                                  ref.max_rel_dlogit, counted(ref.n_steps, "step")));
    t.notes.push_back(fmt::format("times are measured, one sample per step: the median and range of {} decode steps (step 0, the "
                                  "prompt, apart: the fast path runs it as one batch, the reference token by token)",
                                  fast.n_decode));
    return t;
}

// The modes the run holds: cached, uncached or both, cached first.
std::vector<StepMode> report_modes(const RunSummary& run) {
    std::vector<StepMode> modes;
    if (run.mode != SimMode::uncached) modes.push_back(StepMode::cached);
    if (run.mode != SimMode::cached) modes.push_back(StepMode::uncached);
    return modes;
}

// A measured figure over runs: "199.4", or "199.4 (180.2-220.1)" for the median and range of several.
Cell spread_cell(const Spread& s, int decimals) {
    if (s.n <= 1) return real_cell(s.median, decimals);
    return {fmt::format("{:.{}f} ({:.{}f}-{:.{}f})", s.median, decimals, s.min, decimals, s.max, decimals), s.median};
}

// The measured rows: wall time, ms/token, tokens/s, achieved rates; over --repeat runs their median
// (and range), the ratio column the median of each run's uncached / cached.
void add_wall_rows(Table& t, const RunSummary& run, const std::vector<StepRecord>& records, const std::vector<StepMode>& modes,
                   const std::vector<ModeTotals>& totals) {
    const bool both = modes.size() == 2;
    std::vector<std::vector<double>> walls;  // per mode, per run (ns)
    for (const StepMode m : modes) walls.push_back(run_walls_ns(run, records, m));
    auto add = [&](const std::string& key, const std::string& label, int decimals, auto value) {
        std::vector<Cell> row{{label, key}};
        std::vector<std::vector<double>> per_run(modes.size());
        for (std::size_t i = 0; i < modes.size(); ++i) {
            for (const double ns : walls[i]) per_run[i].push_back(value(ns, totals[i]));
            row.push_back(spread_cell(spread_of(per_run[i]), decimals));
        }
        if (both) {
            std::vector<double> ratios;
            for (std::size_t r = 0; r < per_run[0].size() && r < per_run[1].size(); ++r) ratios.push_back(ratio(per_run[1][r], per_run[0][r]));
            row.push_back(ratio_cell(spread_of(ratios).median));
        }
        t.rows.push_back(std::move(row));
    };
    const std::string which = walls.front().size() > 1 ? fmt::format(", median (min-max) of {} runs", walls.front().size()) : "";
    add("wall_ms", "wall time (ms)" + which, 1, [](double ns, const ModeTotals&) { return ns * 1e-6; });
    add("ms_per_token", "ms/token", 3, [](double ns, const ModeTotals& m) { return m.n_steps > 0 ? ns * 1e-6 / static_cast<double>(m.n_steps) : 0.0; });
    add("tokens_per_s", "tokens/s", 2, [](double ns, const ModeTotals& m) { return ns > 0 ? static_cast<double>(m.n_steps) / (ns * 1e-9) : 0.0; });
    add("gflop_per_s", "achieved GFLOP/s", 2,
        [](double ns, const ModeTotals& m) { return ns > 0 ? static_cast<double>(m.cost.flops) / ns : 0.0; });
    add("gb_per_s", "achieved GB/s (1e9 B/s)", 2,
        [](double ns, const ModeTotals& m) { return ns > 0 ? static_cast<double>(m.cost.bytes_total()) / ns : 0.0; });
}

// The totals table: one row per metric, one column per mode, and their ratio when both ran.
Table totals_table(const RunSummary& run, const std::vector<StepRecord>& records, const std::vector<StepMode>& modes,
                   const nlohmann::json& inputs, UnitSystem units) {
    const bool both = modes.size() == 2;
    std::vector<ModeTotals> totals;
    for (const StepMode m : modes) totals.push_back(mode_totals(records, m));

    Table t;
    t.title = fmt::format("kvlab simulate: {}, prompt {}, {}", run.display_name, counted(run.n_prompt, "token"),
                          counted(run.n_steps_done, "step"));
    t.columns.push_back({"metric", "", false});
    for (const StepMode m : modes) t.columns.push_back({std::string(step_mode_name(m)), std::string(step_mode_name(m))});
    if (both) t.columns.push_back({"uncached_over_cached", "uncached / cached"});

    auto add_row = [&](const std::string& key, const std::string& label, auto make_cell, auto value_of) {
        std::vector<Cell> row{{label, key}};
        for (const auto& mt : totals) row.push_back(make_cell(value_of(mt)));
        if (both) row.push_back(ratio_cell(ratio(static_cast<double>(value_of(totals[1])), static_cast<double>(value_of(totals[0])))));
        t.rows.push_back(std::move(row));
    };
    auto flop = [](std::uint64_t v) { return count_cell(v, "FLOP"); };
    auto ops = [](std::uint64_t v) { return count_cell(v, "op"); };
    auto bytes = [&](std::uint64_t v) { return bytes_cell(v, units); };
    auto integer = [](std::int64_t v) { return int_cell(v); };
    auto rate = [](double v) { return real_cell(v, 2); };

    add_row("steps", "steps (tokens generated)", integer, [](const ModeTotals& m) { return m.n_steps; });
    add_row("tokens_processed", "tokens through the model", integer, [](const ModeTotals& m) { return m.n_tokens; });
    add_row("flops", "FLOPs", flop, [](const ModeTotals& m) { return m.cost.flops; });
    add_row("flops_matmul", "  matmul (weights)", flop, [](const ModeTotals& m) { return m.flops_matmul; });
    add_row("flops_attention", "  attention (QK, softmax, AV)", flop, [](const ModeTotals& m) { return m.flops_attention; });
    add_row("flops_other", "  other (norms, RoPE, act., ...)", flop, [](const ModeTotals& m) { return m.flops_other; });
    add_row("transcendentals", "transcendentals", ops, [](const ModeTotals& m) { return m.cost.transcendentals; });
    add_row("bytes_weights_read", "weight bytes read", bytes, [](const ModeTotals& m) { return m.cost.bytes_weights_read; });
    add_row("bytes_act", "activation bytes (read + written)", bytes,
            [](const ModeTotals& m) { return m.cost.bytes_act_read + m.cost.bytes_act_written; });
    add_row("bytes_kv_read", "KV-cache bytes read", bytes, [](const ModeTotals& m) { return m.cost.bytes_kv_read; });
    add_row("bytes_kv_written", "KV-cache bytes written", bytes, [](const ModeTotals& m) { return m.cost.bytes_kv_written; });
    add_row("bytes_total", "bytes moved", bytes, [](const ModeTotals& m) { return m.cost.bytes_total(); });
    add_row("kv_bytes_resident", "KV cache resident at the end", bytes, [](const ModeTotals& m) { return m.kv_bytes_resident; });
    add_row("flop_per_byte", "arithmetic intensity (FLOP/B)", rate,
            [](const ModeTotals& m) { return ratio(static_cast<double>(m.cost.flops), static_cast<double>(m.cost.bytes_total())); });
    if (const std::optional<GpuSpec> gpu = modelled_gpu(inputs)) {
        std::vector<double> sec;
        for (const StepMode m : modes) {
            double total = 0;
            for (const StepRecord& r : records) total += r.mode == m ? modelled_step_seconds(*gpu, r) : 0.0;
            sec.push_back(total);
        }
        auto modelled_row = [&](const std::string& key, const std::string& label, int decimals, auto value) {
            std::vector<Cell> row{{label, key}};
            for (std::size_t i = 0; i < modes.size(); ++i) row.push_back(real_cell(value(sec[i], totals[i]), decimals));
            if (both) row.push_back(ratio_cell(ratio(value(sec[1], totals[1]), value(sec[0], totals[0]))));
            t.rows.push_back(std::move(row));
        };
        modelled_row("modelled_gpu_ms", fmt::format("modelled time on {} (ms)", gpu->name), 4, [](double s_, const ModeTotals&) { return s_ * 1e3; });
        modelled_row("modelled_gpu_tokens_per_s", "modelled tokens/s", 0,
                     [](double s_, const ModeTotals& m) { return s_ > 0 ? static_cast<double>(m.n_steps) / s_ : 0.0; });
    }
    if (run.has_wall_time) add_wall_rows(t, run, records, modes, totals);
    return t;
}

// How per-step cost grows: first decode step vs last step, measured, and why the uncached one grows faster.
void add_growth_notes(Table& t, const RunSummary& run, const std::vector<StepRecord>& records,
                      const std::vector<StepMode>& modes) {
    const std::int64_t last = run.n_steps_done - 1;
    if (last < 2) return;
    std::string growth = fmt::format("per-step FLOPs, step 1 -> step {}:", last);
    for (const StepMode m : modes) {
        const StepRecord* a = find_record(records, m, 1);
        const StepRecord* b = find_record(records, m, last);
        growth += fmt::format(" {} x{:.2f} (attention x{:.2f}){}", step_mode_name(m),
                              ratio(static_cast<double>(b->cost.total().flops), static_cast<double>(a->cost.total().flops)),
                              ratio(static_cast<double>(b->cost.flops(OpCategory::attention)),
                                    static_cast<double>(a->cost.flops(OpCategory::attention))),
                              m == modes.back() ? "" : ";");
    }
    const StepRecord* first = find_record(records, modes[0], 1);
    const StepRecord* final = find_record(records, modes[0], last);
    growth += fmt::format(" (keys attended {} -> {})", first->n_keys, final->n_keys);
    t.notes.push_back(growth);
    if (std::find(modes.begin(), modes.end(), StepMode::uncached) != modes.end())
        t.notes.push_back("uncached work per step grows with T (every K and V is recomputed), so its total grows with T^2; "
                          "cached work per step is flat apart from attention over the cache");
}

// The note on the KV cache allocated: its size, the positions it holds, and how it compares to kvcalc's figure.
std::string kv_cache_note(const RunSummary& run, const nlohmann::json& inputs, UnitSystem units) {
    // --layers N runs the first N layers: kvcalc's figure is the whole model's
    const auto layers = inputs.value("layers", std::int64_t{0}), in_model = inputs.value("layers_in_model", std::int64_t{0});
    const std::string which = layers > 0 && in_model > layers ? fmt::format("the {} run, of {}; kvcalc's figure is for all {}", counted(layers, "layer"), in_model, in_model)
                                                              : "all layers; = kvcalc's figure";
    // a windowed layer keeps W rows, not all positions: the last W (or S sinks and the last W - S)
    const std::int64_t positions = run.n_prompt + run.n_steps - 1;  // the last token is not fed back
    const auto window = inputs.value("window", std::int64_t{0}), sinks = inputs.value("sink_tokens", std::int64_t{0});
    const std::string held = window > 0 && window < positions
                                 ? fmt::format(", a windowed layer holding {} of them{}", window,
                                               sinks > 0 ? fmt::format(" ({} sinks and the last {})", sinks, window - sinks) : "")
                                 : "";
    return fmt::format("KV cache allocated: {} for {} positions{} ({}, K and V, {}{})",
                       format_bytes(run.kv_cache_bytes, units), positions, held,
                       inputs.value("kv_dtype", std::string("fp32")), which,
                       inputs.value("kv_dtype", std::string("fp32")) == "fp32" ? "" : " for the dtype, plus the scales");
}

// The logit comparison of the two modes: the largest difference, argmax flips, and whether they diverged.
void add_logit_notes(Table& t, const RunSummary& run) {
    t.notes.push_back(fmt::format("logits: max |cached - uncached| = {:.3g} over {} (tolerance 1e-3 * max(1, max |logit|)); "
                                  "argmax flips on near-ties: {}",
                                  run.max_abs_dlogit, counted(run.n_steps_done, "step"), run.n_argmax_flips));
    if (run.first_divergent_step)
        t.notes.push_back(fmt::format("DIVERGED: at step {} max |delta logit| = {:.3g} > tolerance {:.3g}",
                                      *run.first_divergent_step, run.divergent_dlogit, run.divergent_tolerance));
    else
        t.notes.push_back("both modes produced the same logits within tolerance, on the same tokens");
}

// The KV cache policy's table: its logit error, KL and argmax agreement against the fp32 full cache.
Table kv_quality_table(const RunSummary& run, const KvQuality& q, const nlohmann::json& inputs, UnitSystem units) {
    // the policy is in the inputs (as simulate recorded them); the figures against the fp32 full cache
    const std::string window = inputs.value("sink_tokens", 0) > 0
                                   ? fmt::format(", window {} + {} sinks", inputs.value("window", 0), inputs.value("sink_tokens", 0))
                               : inputs.value("window", 0) > 0 ? fmt::format(", window {}", inputs.value("window", 0))
                                                               : std::string();
    Table k;
    const std::string dtype = inputs.value("kv_dtype", std::string("fp32"));
    const bool scaled = dtype.rfind("fp8", 0) == 0 || dtype == "int8";
    const std::string weights = inputs.value("weight_dtype", std::string("fp32"));
    k.title = weights == "fp32" ? fmt::format("KV cache {}{}{} against the fp32 full cache", dtype,
                                              scaled ? fmt::format(" ({} scale)", inputs.value("kv_scale", std::string("tensor"))) : "", window)
                                : fmt::format("KV cache {}{}{}, {} weights against the fp32 weights and fp32 full cache", dtype,
                                              scaled ? fmt::format(" ({} scale)", inputs.value("kv_scale", std::string("tensor"))) : "", window,
                                              weights);
    k.columns = {{"kv_cache_bytes", "KV cache"}, {"max_abs_dlogit", "max |dlogit|"}, {"mean_kl", "mean KL"}, {"max_kl", "max KL"},
                 {"argmax_agreement_percent", "same argmax"}, {"steps", "steps"}};
    const double agree = q.n_steps ? 100.0 * static_cast<double>(q.n_agree) / static_cast<double>(q.n_steps) : 0.0;
    k.rows.push_back({bytes_cell(run.kv_cache_bytes, units), real_cell(q.max_abs_dlogit, 5), {fmt::format("{:.3g}", q.mean_kl), q.mean_kl},
                      {fmt::format("{:.3g}", q.max_kl), q.max_kl}, percent_cell(agree), int_cell(q.n_steps)});
    k.notes.push_back("the same tokens through the model's fp32 weights and fp32 full cache, teacher-forced: the largest logit difference, "
                      "KL(p_fp32 || p) of the next-token distributions in nats, and the steps whose argmax agrees (docs/cli-simulate.md)");
    return k;
}

// A boolean of the inputs, else `absent`: a trace read back may hold anything, so booleans only.
bool input_flag(const nlohmann::json& inputs, const char* key, bool absent) {
    const auto it = inputs.find(key);
    return it != inputs.end() && it->is_boolean() ? it->get<bool>() : absent;
}

}  // namespace

ModeTotals mode_totals(const std::vector<StepRecord>& records, StepMode mode) {
    ModeTotals t;
    for (const auto& r : records) {
        if (r.mode != mode) continue;
        ++t.n_steps;
        t.n_tokens += r.n_tokens;
        t.cost += r.cost.total();
        t.flops_matmul += r.cost.flops(OpCategory::matmul);
        t.flops_attention += r.cost.flops(OpCategory::attention);
        t.flops_other += r.cost.flops(OpCategory::other);
        t.kv_bytes_resident = r.kv_bytes_resident;
        t.wall_ns += r.wall_ns;
    }
    return t;
}

std::optional<GpuSpec> modelled_gpu(const nlohmann::json& inputs) {
    const auto it = inputs.find("gpu");
    if (it == inputs.end() || !it->is_object()) return std::nullopt;
    const nlohmann::json& g = *it;
    GpuSpec gpu;
    if (!g.value("name", nlohmann::json()).is_string() || !g.value("display_name", nlohmann::json()).is_string() ||
        !g.value("bf16_dense_flops", nlohmann::json()).is_number() || !g.value("bandwidth_bytes_per_s", nlohmann::json()).is_number_unsigned())
        return std::nullopt;
    gpu.name = g.at("name").get<std::string>();
    gpu.display_name = g.at("display_name").get<std::string>();
    gpu.bf16_dense_flops = g.at("bf16_dense_flops").get<double>();
    gpu.bandwidth_bytes_per_s = g.at("bandwidth_bytes_per_s").get<std::uint64_t>();
    if (!(gpu.bf16_dense_flops > 0) || gpu.bandwidth_bytes_per_s == 0) return std::nullopt;  // a trace read back may hold anything
    return gpu;
}

double modelled_step_seconds(const GpuSpec& gpu, const StepRecord& record) {
    const OpCost total = record.cost.total();
    return roofline_time(gpu, static_cast<double>(total.flops), static_cast<double>(total.bytes_total())).seconds();
}

Spread spread_of(std::vector<double> v) {
    Spread s;
    s.n = v.size();
    if (v.empty()) return s;
    std::sort(v.begin(), v.end());
    const std::size_t mid = v.size() / 2;
    s.median = v.size() % 2 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
    s.min = v.front();
    s.max = v.back();
    return s;
}

std::vector<double> run_walls_ns(const RunSummary& run, const std::vector<StepRecord>& records, StepMode mode) {
    const std::vector<std::int64_t>& rep = mode == StepMode::cached ? run.repeats.cached_ns : run.repeats.uncached_ns;
    if (!rep.empty()) return {rep.begin(), rep.end()};
    return {static_cast<double>(mode_totals(records, mode).wall_ns)};
}

std::string timing_note(const RunSummary& run, const HostLoad& load) {
    const std::string exact = "FLOPs, bytes, tokens and steps are counted: exact, the same on every machine; modelled GPU times are "
                              "computed from them (docs/kv-memory.md, \"Modelled GPU time\"); wall times are measured";
    const std::size_t n = std::max(run.repeats.cached_ns.size(), run.repeats.uncached_ns.size());
    if (n > 1) return fmt::format("{}: the median of {} runs, their range in brackets", exact, n);
    const std::string host = load.load1 >= 0 ? fmt::format(" on a host with load average {:.2f} over {} cores", load.load1, load.n_cores)
                             : load.n_cores > 0 ? fmt::format(" on a host with {} cores", load.n_cores)
                                                : std::string();
    return fmt::format("{}, one run{}: they vary from run to run (--repeat N gives their median and range)", exact, host);
}

RunSummary run_summary(const ModelConfig& cfg, const SimulateOptions& o, const SimulationResult& result) {
    RunSummary s;
    s.display_name = cfg.display_name;
    s.mode = o.mode;
    s.n_prompt = static_cast<std::int64_t>(result.prompt.size());
    s.n_steps = o.n_steps;
    s.n_steps_done = result.n_steps_done;
    s.interrupted = result.interrupted;
    s.counted = o.count;
    s.kv_cache_bytes = result.kv_cache_bytes;
    s.max_abs_dlogit = result.max_abs_dlogit;
    s.n_argmax_flips = result.n_argmax_flips;
    s.first_divergent_step = result.first_divergent_step;
    s.divergent_dlogit = result.divergent_dlogit;
    s.divergent_tolerance = result.divergent_tolerance;
    s.kv_quality = result.kv_quality;
    s.reference_kernel = result.reference_kernel;
    s.repeats = result.repeats;
    return s;
}

Report simulation_report(const ModelConfig& cfg, const SimulateOptions& o, const SimulationResult& result,
                         const nlohmann::json& inputs, UnitSystem units) {
    return simulation_report(run_summary(cfg, o, result), result.records, inputs, units);
}

Report simulation_report(const RunSummary& run, const std::vector<StepRecord>& records, const nlohmann::json& inputs,
                         UnitSystem units) {
    const std::vector<StepMode> modes = report_modes(run);
    Report report;
    report.inputs = inputs;
    if (modes.size() == 2 && run.counted) report.headline = cached_headline(run, records, inputs, units);
    Table t = totals_table(run, records, modes, inputs, units);
    add_growth_notes(t, run, records, modes);
    if (run.kv_cache_bytes > 0) t.notes.push_back(kv_cache_note(run, inputs, units));
    if (modes.size() == 2) add_logit_notes(t, run);
    if (!run.counted) t.notes.push_back("counting was off: FLOP and byte figures are zero");
    if (!run.has_wall_time) t.notes.push_back("no wall time: the trace was written with --deterministic");
    if (run.has_wall_time) report.notes.push_back(timing_note(run, run.host_load.value_or(HostLoad{})));
    if (run.interrupted)
        report.notes.push_back(fmt::format("interrupted: stopped after {} of {} steps", run.n_steps_done, run.n_steps));
    report.tables.push_back(std::move(t));
    if (run.reference_kernel) report.tables.push_back(reference_kernel_table(*run.reference_kernel, records));
    if (const auto& q = run.kv_quality)
        report.tables.push_back(kv_quality_table(run, *q, inputs, units));
    else if (input_flag(inputs, "policy", false) && !input_flag(inputs, "quality", true))
        report.notes.push_back("--no-quality: the run's cache policy or weight storage ran alone, without the fp32 model beside it: "
                               "no logit error was measured");
    return report;
}

}  // namespace kvlab
