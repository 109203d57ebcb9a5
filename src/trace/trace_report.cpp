#include "trace/trace_report.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include <fmt/format.h>

#include "core/json_input.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/core/text.hpp"
#include "trace/perfetto_trace.hpp"
#include "report/simulation_report.hpp"

namespace kvlab {

namespace {

// B - A with a sign, in the unit's human form; the exact signed difference for scripts
Cell delta_cell(std::uint64_t a, std::uint64_t b, bool bytes, UnitSystem units) {
    const bool negative = b < a;
    const std::uint64_t magnitude = negative ? a - b : b - a;
    const Cell c = bytes ? bytes_cell(magnitude, units) : count_cell(magnitude, "FLOP");
    const double exact = negative ? -static_cast<double>(magnitude) : static_cast<double>(magnitude);
    return {fmt::format("{}{}", negative ? "-" : "+", c.text),
            magnitude <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ? nlohmann::json(negative ? -static_cast<std::int64_t>(magnitude)
                                                                                        : static_cast<std::int64_t>(magnitude))
                                                              : nlohmann::json(exact)};
}

double ratio(double num, double den) { return den > 0.0 ? num / den : 0.0; }
// B / A: "-" (null in JSON) where A's value is 0; three significant digits below 0.1, where "0.00x" would
// read as zero (a 15M model against a 110M one: 0.00262x)
Cell ratio_of(double b, double a) {
    if (!(a > 0.0)) return {"-", nullptr};
    const double r = b / a;
    if (!(r > 0.0 && r < 0.1)) return ratio_cell(r);
    const int decimals = std::min(12, 2 - static_cast<int>(std::floor(std::log10(r))));  // 3 significant digits, fixed
    return Cell{fmt::format("{:.{}f}x", r, decimals), r};
}
Cell us_cell(std::int64_t ns) { return real_cell(static_cast<double>(ns) * 1e-3, 1); }

std::vector<StepMode> modes_of(const StepTrace& t) {
    std::vector<StepMode> modes;
    if (t.run.mode != SimMode::uncached) modes.push_back(StepMode::cached);
    if (t.run.mode != SimMode::cached) modes.push_back(StepMode::uncached);
    return modes;
}

std::string source_note(const StepTrace& t) {
    return fmt::format("{}, prompt {}, {} ({} trace{})", t.run.display_name, counted(t.run.n_prompt, "token"),
                       counted(t.run.n_steps_done, "step"), trace_format_name(t.format), t.run.has_wall_time ? "" : ", --deterministic");
}

}  // namespace

std::vector<std::int64_t> steps_shown(std::int64_t n_steps, std::int64_t every) {
    if (every < 1) throw UsageError(fmt::format("--every: {}; expected 1 or more (1 = every step)", every));
    std::vector<std::int64_t> steps;
    for (std::int64_t s = 0; s < n_steps; s += every) steps.push_back(s);
    if (n_steps > 0 && steps.back() != n_steps - 1) steps.push_back(n_steps - 1);
    return steps;
}

Report trace_summary_report(const StepTrace& trace, UnitSystem units) {
    return simulation_report(trace.run, trace.records, trace.inputs, units);
}

Report trace_steps_report(const StepTrace& trace, std::int64_t every, bool ops, UnitSystem units) {
    const auto steps = steps_shown(trace.run.n_steps_done, every);
    const StepIndex index(trace);
    const bool wall = trace.run.has_wall_time;
    Report report;
    report.inputs = trace.inputs;

    Table t;
    t.title = fmt::format("kvlab trace steps: {}", source_note(trace));
    t.columns = {{"step", "step"},           {"mode", "mode", false},     {"phase", "phase", false},
                 {"n_tokens", "tokens"},     {"n_keys", "keys"},          {"flops", "FLOPs"},
                 {"flops_attention", "attn FLOPs"}, {"bytes_total", "bytes moved"}, {"bytes_weights_read", "weights read"},
                 {"bytes_kv_read", "KV read"}, {"kv_bytes_resident", "KV resident"}, {"flop_per_byte", "FLOP/B"}};
    if (wall) t.columns.push_back({"wall_us", "wall µs"});
    else t.columns.push_back({"modelled_us", "modelled µs"});
    for (const std::int64_t s : steps)
        for (const StepMode m : modes_of(trace)) {
            const StepRecord* r = index.find(m, s);
            const OpCost c = r->cost.total();
            std::int64_t modelled = 0;
            for (const auto& op : r->cost.ops) modelled += modelled_op_ns(op);
            t.rows.push_back({int_cell(s), text_cell(std::string(step_mode_name(m))),
                              text_cell(s == 0 ? "prefill" : "decode"), int_cell(r->n_tokens), int_cell(r->n_keys),
                              count_cell(c.flops, "FLOP"), count_cell(r->cost.flops(OpCategory::attention), "FLOP"),
                              bytes_cell(c.bytes_total(), units), bytes_cell(c.bytes_weights_read, units),
                              bytes_cell(c.bytes_kv_read, units), bytes_cell(r->kv_bytes_resident, units),
                              real_cell(ratio(static_cast<double>(c.flops), static_cast<double>(c.bytes_total())), 2),
                              us_cell(wall ? r->wall_ns : modelled)});
        }
    if (!wall)
        t.notes.push_back(fmt::format("no wall time in a --deterministic trace: modelled µs = sum over ops of "
                                      "max(flops / {:g} FLOP/s, bytes / {:g} B/s)",
                                      model_flop_per_s, model_bytes_per_s));
    if (every > 1) t.notes.push_back(fmt::format("every {} steps and the last (--every)", every));
    report.tables.push_back(std::move(t));

    if (ops) {
        Table o;
        o.title = "per op (summed over layers)";
        o.columns = {{"step", "step"},   {"mode", "mode", false}, {"op", "op", false},         {"flops", "FLOPs"},
                     {"bytes_total", "bytes moved"}, {"bytes_kv_read", "KV read"}, {"flop_per_byte", "FLOP/B"}};
        if (wall) {
            o.columns.push_back({"wall_us", "wall µs"});
            o.columns.push_back({"wall_share", "% of step"});
        } else {
            o.columns.push_back({"modelled_us", "modelled µs"});
        }
        for (const std::int64_t s : steps)
            for (const StepMode m : modes_of(trace)) {
                const StepRecord* r = index.find(m, s);
                for (int i = 0; i < n_ops; ++i) {
                    const Op op = static_cast<Op>(i);
                    const OpCost& c = r->cost.at(op);
                    if (c == OpCost{} && r->cost.wall_ns_of(op) == 0) continue;
                    std::vector<Cell> row{int_cell(s),
                                          text_cell(std::string(step_mode_name(m))),
                                          text_cell(std::string(op_name(op))),
                                          count_cell(c.flops, "FLOP"),
                                          bytes_cell(c.bytes_total(), units),
                                          bytes_cell(c.bytes_kv_read, units),
                                          real_cell(ratio(static_cast<double>(c.flops), static_cast<double>(c.bytes_total())), 2)};
                    if (wall) {
                        row.push_back(us_cell(r->cost.wall_ns_of(op)));
                        row.push_back(real_cell(100.0 * ratio(static_cast<double>(r->cost.wall_ns_of(op)),
                                                              static_cast<double>(r->wall_ns)), 1));
                    } else {
                        row.push_back(us_cell(modelled_op_ns(c)));
                    }
                    o.rows.push_back(std::move(row));
                }
            }
        if (wall)
            o.notes.push_back("wall µs: measured per op; qk, softmax and av run as one fused kernel whose time is split "
                              "by their FLOPs; the ops' sum falls short of the step by the timers' own overhead");
        report.tables.push_back(std::move(o));
    }
    return report;
}

namespace {

// The modes both traces ran; none in common is a usage error.
std::vector<StepMode> common_modes(const StepTrace& a, const StepTrace& b, const std::string& label_a, const std::string& label_b) {
    std::vector<StepMode> modes;
    for (const StepMode m : modes_of(a)) {
        const auto bm = modes_of(b);
        if (std::find(bm.begin(), bm.end(), m) != bm.end()) modes.push_back(m);
    }
    if (modes.empty())
        throw UsageError(fmt::format("trace compare: {} and {} have no mode in common (one is cached only, the other "
                                     "uncached only)", quote(label_a), quote(label_b)));
    return modes;
}

// A mode's totals over the steps both traces have: A, B, B - A and B / A per metric.
void add_mode_totals(Table& tot, const StepTrace& a, const StepTrace& b, StepMode m, std::int64_t n_common, bool wall, UnitSystem units) {
    std::vector<StepRecord> ra, rb;
    for (const auto& r : a.records)
        if (r.mode == m && r.step < n_common) ra.push_back(r);
    for (const auto& r : b.records)
        if (r.mode == m && r.step < n_common) rb.push_back(r);
    const ModeTotals ta = mode_totals(ra, m), tb = mode_totals(rb, m);
    const std::string mode(step_mode_name(m));
    auto add = [&](const char* metric, std::uint64_t va, std::uint64_t vb, bool bytes) {
        const Cell ca = bytes ? bytes_cell(va, units) : count_cell(va, "FLOP");
        const Cell cb = bytes ? bytes_cell(vb, units) : count_cell(vb, "FLOP");
        tot.rows.push_back({text_cell(mode), text_cell(metric), ca, cb, delta_cell(va, vb, bytes, units),
                            ratio_of(static_cast<double>(vb), static_cast<double>(va))});
    };
    add("flops", ta.cost.flops, tb.cost.flops, false);
    add("flops_matmul", ta.flops_matmul, tb.flops_matmul, false);
    add("flops_attention", ta.flops_attention, tb.flops_attention, false);
    add("bytes_total", ta.cost.bytes_total(), tb.cost.bytes_total(), true);
    add("bytes_weights_read", ta.cost.bytes_weights_read, tb.cost.bytes_weights_read, true);
    add("bytes_kv_read", ta.cost.bytes_kv_read, tb.cost.bytes_kv_read, true);
    add("kv_bytes_resident", ta.kv_bytes_resident, tb.kv_bytes_resident, true);
    if (wall) {
        const double ms_a = static_cast<double>(ta.wall_ns) * 1e-6, ms_b = static_cast<double>(tb.wall_ns) * 1e-6;
        tot.rows.push_back({text_cell(mode), text_cell("wall_ms"), real_cell(ms_a, 2), real_cell(ms_b, 2),
                            real_cell(ms_b - ms_a, 2), ratio_of(ms_b, ms_a)});
    }
}

// The cache policies' quality rows, when either trace ran one.
void add_quality_totals(Table& tot, const StepTrace& a, const StepTrace& b) {
    if (!(a.run.kv_quality || b.run.kv_quality)) return;
    // cache policies: how far each moved the logits from the fp32 full cache (a plain fp32 run: 0)
    const KvQuality qa = a.run.kv_quality.value_or(KvQuality{}), qb = b.run.kv_quality.value_or(KvQuality{});
    // a policy run with --no-quality measured nothing: not a 0
    auto measured = [](const StepTrace& t) {
        const auto it = t.inputs.find("quality");
        const bool off = it != t.inputs.end() && ((it->is_boolean() && !it->get<bool>()) || (it->is_string() && it->get<std::string>() == "false"));
        return t.run.kv_quality.has_value() || !off;
    };
    const bool ma = measured(a), mb = measured(b);
    auto add_real = [&](const char* metric, double va, double vb) {
        const Cell ca = ma ? Cell{fmt::format("{:.3g}", va), va} : text_cell("not measured");
        const Cell cb = mb ? Cell{fmt::format("{:.3g}", vb), vb} : text_cell("not measured");
        const bool both = ma && mb;
        tot.rows.push_back({text_cell("cached"), text_cell(metric), ca, cb, both ? Cell{fmt::format("{:+.3g}", vb - va), vb - va} : text_cell("-"),
                            both && va > 0 ? ratio_of(vb, va) : Cell{"-", nullptr}});
    };
    add_real("kv_max_abs_dlogit", qa.max_abs_dlogit, qb.max_abs_dlogit);
    add_real("kv_mean_kl", qa.mean_kl, qb.mean_kl);
    add_real("kv_max_kl", qa.max_kl, qb.max_kl);
    tot.notes.push_back("kv_*: the run's policy (KV storage, window, narrow weights) against the fp32 weights and fp32 full cache on the same tokens (0 for a run without one; "
                        "not measured for a policy run with --no-quality)");
}

// The inputs either trace has that differ, as one note (none: empty). One without a key ran its
// default: an older trace without weight_dtype ran fp32.
std::string differing_inputs_note(const StepTrace& a, const StepTrace& b) {
    std::vector<std::string> differ;
    for (const auto& [key, value] : a.inputs.items())
        if (key != "memory_estimate_bytes" && (!b.inputs.contains(key) || b.inputs.at(key) != value))
            differ.push_back(fmt::format("{} {} vs {}", key, json_excerpt(value), b.inputs.contains(key) ? json_excerpt(b.inputs.at(key)) : "absent"));
    for (const auto& [key, value] : b.inputs.items())
        if (key != "memory_estimate_bytes" && !a.inputs.contains(key)) differ.push_back(fmt::format("{} absent vs {}", key, json_excerpt(value)));
    if (differ.empty()) return "";
    std::string line = "inputs that differ:";
    for (std::size_t i = 0; i < differ.size(); ++i) line += (i ? "; " : " ") + differ[i];
    return line;
}

// The totals table's notes: the sources, the steps and modes compared, differing inputs, no wall time.
void add_totals_notes(Table& tot, const StepTrace& a, const StepTrace& b, const std::vector<StepMode>& modes, std::int64_t n_common,
                      bool wall) {
    tot.notes.push_back(fmt::format("A: {}", source_note(a)));
    tot.notes.push_back(fmt::format("B: {}", source_note(b)));
    if (a.run.n_steps_done != b.run.n_steps_done)
        tot.notes.push_back(fmt::format("A has {}, B has {}: steps 0..{} compared", counted(a.run.n_steps_done, "step"),
                                        b.run.n_steps_done, n_common - 1));
    for (const auto& [t, label] : {std::pair{&a, "A"}, std::pair{&b, "B"}})
        for (const StepMode m : modes_of(*t))
            if (std::find(modes.begin(), modes.end(), m) == modes.end())
                tot.notes.push_back(fmt::format("the {} mode is only in {}: not compared", step_mode_name(m), label));
    if (const std::string differ = differing_inputs_note(a, b); !differ.empty()) tot.notes.push_back(differ);
    if (!wall) tot.notes.push_back("wall time left out: a trace was written with --deterministic");
}

// The per-step table: each shown step's FLOPs, bytes, KV read (and wall time) in A and B.
Table per_step_table(const StepTrace& a, const StepTrace& b, const std::vector<StepMode>& modes, std::int64_t n_common, std::int64_t every,
                     bool wall, UnitSystem units) {
    Table ps;
    ps.title = "per step";
    ps.columns = {{"step", "step"},           {"mode", "mode", false},    {"flops_a", "FLOPs A"}, {"flops_b", "FLOPs B"},
                  {"flops_delta", "B - A"},   {"flops_ratio", "B / A"},   {"bytes_a", "bytes A"}, {"bytes_b", "bytes B"},
                  {"bytes_delta", "B - A"},   {"bytes_ratio", "B / A"},   {"kv_read_a", "KV read A"},
                  {"kv_read_b", "KV read B"}, {"kv_read_ratio", "B / A"}};
    if (wall) {
        ps.columns.push_back({"wall_us_a", "wall µs A"});
        ps.columns.push_back({"wall_us_b", "wall µs B"});
        ps.columns.push_back({"wall_ratio", "B / A"});
    }
    const StepIndex index_a(a), index_b(b);
    for (const std::int64_t s : steps_shown(n_common, every))
        for (const StepMode m : modes) {
            const StepRecord* x = index_a.find(m, s);
            const StepRecord* y = index_b.find(m, s);
            const OpCost cx = x->cost.total(), cy = y->cost.total();
            std::vector<Cell> row{int_cell(s),
                                  text_cell(std::string(step_mode_name(m))),
                                  count_cell(cx.flops, "FLOP"),
                                  count_cell(cy.flops, "FLOP"),
                                  delta_cell(cx.flops, cy.flops, false, units),
                                  ratio_of(static_cast<double>(cy.flops), static_cast<double>(cx.flops)),
                                  bytes_cell(cx.bytes_total(), units),
                                  bytes_cell(cy.bytes_total(), units),
                                  delta_cell(cx.bytes_total(), cy.bytes_total(), true, units),
                                  ratio_of(static_cast<double>(cy.bytes_total()), static_cast<double>(cx.bytes_total())),
                                  bytes_cell(cx.bytes_kv_read, units),
                                  bytes_cell(cy.bytes_kv_read, units),
                                  ratio_of(static_cast<double>(cy.bytes_kv_read), static_cast<double>(cx.bytes_kv_read))};
            if (wall) {
                row.push_back(us_cell(x->wall_ns));
                row.push_back(us_cell(y->wall_ns));
                row.push_back(ratio_of(static_cast<double>(y->wall_ns), static_cast<double>(x->wall_ns)));
            }
            ps.rows.push_back(std::move(row));
        }
    ps.notes.push_back("a ratio of -: A's value is 0 (e.g. KV read in the uncached mode)");
    if (every > 1) ps.notes.push_back(fmt::format("every {} steps and the last (--every)", every));
    return ps;
}

// The compare's answer in two lines: what B holds and moves against A in the cached mode (else the first
// common mode), counted over the steps both have; wall time only as measured, when both traces have it.
std::vector<std::string> compare_headline(const StepTrace& a, const StepTrace& b, const std::vector<StepMode>& modes,
                                          std::int64_t n_common, bool wall, UnitSystem units) {
    const StepMode m = std::find(modes.begin(), modes.end(), StepMode::cached) != modes.end() ? StepMode::cached : modes.front();
    auto totals = [&](const StepTrace& t) {
        std::vector<StepRecord> rs;
        for (const auto& r : t.records)
            if (r.mode == m && r.step < n_common) rs.push_back(r);
        return mode_totals(rs, m);
    };
    const ModeTotals ta = totals(a), tb = totals(b);
    auto ratio = [](double vb, double va) { return va > 0 ? fmt::format("{:.2f}x", vb / va) : std::string("-"); };
    std::vector<std::string> h;
    if (m == StepMode::cached)
        h.push_back(fmt::format("B keeps {} the KV cache of A ({} vs {} at the end) and reads {} its KV bytes ({} vs {}), cached, "
                                "over {} (counted, exact)",
                                ratio(static_cast<double>(tb.kv_bytes_resident), static_cast<double>(ta.kv_bytes_resident)),
                                format_bytes(tb.kv_bytes_resident, units), format_bytes(ta.kv_bytes_resident, units),
                                ratio(static_cast<double>(tb.cost.bytes_kv_read), static_cast<double>(ta.cost.bytes_kv_read)),
                                format_bytes(tb.cost.bytes_kv_read, units), format_bytes(ta.cost.bytes_kv_read, units),
                                counted(n_common, "step")));
    std::string line = fmt::format("{} FLOPs and {} bytes moved, B over A, {}", ratio(static_cast<double>(tb.cost.flops), static_cast<double>(ta.cost.flops)),
                                   ratio(static_cast<double>(tb.cost.bytes_total()), static_cast<double>(ta.cost.bytes_total())),
                                   step_mode_name(m));
    if (wall)
        line += fmt::format("; wall time {} (measured, one run each: it varies)",
                            ratio(static_cast<double>(tb.wall_ns), static_cast<double>(ta.wall_ns)));
    h.push_back(std::move(line));
    return h;
}

}  // namespace

Report trace_compare_report(const StepTrace& a, const StepTrace& b, const std::string& label_a, const std::string& label_b,
                            std::int64_t every, UnitSystem units) {
    const bool wall = a.run.has_wall_time && b.run.has_wall_time;
    const std::vector<StepMode> modes = common_modes(a, b, label_a, label_b);
    const std::int64_t n_common = std::min(a.run.n_steps_done, b.run.n_steps_done);

    Report report;
    report.inputs = {{"a", label_a}, {"b", label_b}, {"every", every}};
    report.headline = compare_headline(a, b, modes, n_common, wall, units);

    // totals over the steps both traces have
    Table tot;
    tot.title = fmt::format("kvlab trace compare: A = {}, B = {}", label_a, label_b);
    tot.columns = {{"mode", "mode", false}, {"metric", "metric", false}, {"a", "A"}, {"b", "B"}, {"delta", "B - A"},
                   {"ratio", "B / A"}};
    for (const StepMode m : modes) add_mode_totals(tot, a, b, m, n_common, wall, units);
    add_quality_totals(tot, a, b);
    add_totals_notes(tot, a, b, modes, n_common, wall);
    report.tables.push_back(std::move(tot));

    report.tables.push_back(per_step_table(a, b, modes, n_common, every, wall, units));
    return report;
}

}  // namespace kvlab
