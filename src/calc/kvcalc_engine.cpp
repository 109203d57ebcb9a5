// kvcalc --engine: per model, dtype, context and batch, what the engine allocates next to what the
// exact math needs, and the lines the engine prints (calc/engine.hpp holds the engines' rules).
#include <algorithm>
#include <climits>
#include <cstdint>

#include <fmt/format.h>

#include "calc/kvcalc.hpp"
#include "kvlab/calc/param_count.hpp"
#include "kvlab/core/checked.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/core/units.hpp"

namespace kvlab {
namespace {

// --pp with --kv-budget: one budget for every stage, one per stage, or one per rank (stage-major, as vLLM numbers
// ranks: rank = stage x TP + TP rank) of which each stage keeps its smallest. Empty: every stage has the request's budget.
std::vector<std::uint64_t> stage_budgets_of(const KvcalcRequest& r) {
    const std::uint64_t pp = r.engine_settings.pp, n = r.kv_budget_ranks.size();
    if (pp == 1 || n <= 1) return {};
    if (n != pp && n != pp * r.tp)
        throw UsageError(fmt::format("--kv-budget: {} budgets for --pp {} --tp {}; expected 1, one per stage ({}) or one per GPU ({})", n, pp, r.tp,
                                     pp, pp * r.tp));
    std::vector<std::uint64_t> stages(pp, UINT64_MAX);
    const std::uint64_t per_stage = n / pp;
    for (std::uint64_t i = 0; i < n; ++i) stages[i / per_stage] = std::min(stages[i / per_stage], r.kv_budget_ranks[i]);
    return stages;
}

// The draft for one model: --draft's config, or --draft mtp:N's N layers of the model's own shape.
std::optional<ModelConfig> draft_for(const KvcalcRequest& r, const ModelConfig& target) {
    if (r.draft) return r.draft;
    if (r.draft_mtp_layers == 0) return std::nullopt;
    ModelConfig mtp = target;
    mtp.name = fmt::format("{} MTP ({} layer{})", target.name, r.draft_mtp_layers, r.draft_mtp_layers == 1 ? "" : "s");
    mtp.n_layer = static_cast<std::int64_t>(r.draft_mtp_layers);
    mtp.layer_windowed.assign(r.draft_mtp_layers, false);
    return mtp;
}

// The layers of the stage with the most (the exact need per GPU under pipeline parallelism).
ModelConfig stage_config(ModelConfig cfg, Engine engine, std::uint64_t pp) {
    if (pp == 1) return cfg;
    const auto split = pp_layer_split(engine, static_cast<std::uint64_t>(cfg.n_layer), pp);
    std::uint64_t first = 0, best = 0, at = 0;
    for (const auto n : split) {
        if (n > best) best = n, first = at;
        at += n;
    }
    cfg.n_layer = static_cast<std::int64_t>(best);
    if (!cfg.layer_windowed.empty())
        cfg.layer_windowed = std::vector<bool>(cfg.layer_windowed.begin() + static_cast<std::ptrdiff_t>(first),
                                               cfg.layer_windowed.begin() + static_cast<std::ptrdiff_t>(first + best));
    return cfg;
}

// The KV budget per GPU for one model: what the engine reported (--kv-budget), else the GPU fit's estimate by the
// engine's own rule (with a note saying it is an upper bound).
std::optional<std::uint64_t> engine_budget(const KvcalcRequest& r, const ModelConfig& cfg, const std::string& release, Report& report) {
    const auto U = r.units;
    const std::uint64_t pp = r.engine_settings.pp;
    std::optional<std::uint64_t> budget = r.kv_budget;
    if (!budget && r.gpu) {
        // Each engine's budget rule with --mem-util as its fraction (activations, graphs and NCCL buffers are not known here):
        // vLLM: memory x gpu_memory_utilization - weights; SGLang: memory x mem_fraction_static - weights;
        // TensorRT-LLM: (memory - weights) x free_gpu_memory_fraction.
        const auto memory = usable_gpu_bytes(*r.gpu);
        const auto weights = ceil_div(model_weight_bytes(cfg, true, r), checked_mul(r.tp, pp, "GPUs"));
        const bool trt = r.engine == Engine::trtllm;
        const auto usable = trt ? memory : usable_bytes(memory, r.mem_util);
        if (usable > weights) {
            budget = trt ? usable_bytes(usable - weights, r.mem_util) : usable - weights;
            const char* fraction = r.engine == Engine::vllm ? "gpu_memory_utilization" : r.engine == Engine::sglang ? "mem_fraction_static"
                                   : trt ? "free_gpu_memory_fraction" : "--mem-util";
            report.notes.push_back(fmt::format(
                "{}: {} KV budget estimated as {} = {} per GPU ({} = --mem-util {}), an upper bound: the engine also keeps activations and "
                "graphs, and sizes from the memory CUDA reports, below nvidia-smi's total (an H100 80GB: 79.11-79.18 GiB, not 79.65); give --kv-budget "
                "with its own figure for its exact numbers",
                cfg.name, release,
                trt ? fmt::format("({} - {} weights) x {}", format_bytes(memory, U), format_bytes(weights, U), r.mem_util)
                    : fmt::format("{} x {} - {} weights", format_bytes(memory, U), r.mem_util, format_bytes(weights, U)),
                format_bytes(*budget, U), fraction, r.mem_util));
        }
    }
    return budget;
}

// The headline's engine line for a model's first case: the pool the engine allocates and what it holds, or the line
// it stops with; nothing when it sizes no pool (no budget given or estimated).
std::optional<std::string> engine_glance(const std::string& release, const ModelConfig& cfg, const EngineCase& c, const EngineAnswer& a, bool estimated,
                                         UnitSystem U) {
    const std::string who = fmt::format("{} on {} ({})", release, cfg.name, dtype_name(c.dtype));
    if (!a.bytes_allocated) {
        if (a.log_lines.empty()) return std::nullopt;
        return fmt::format("{}: does not start: {}", who, a.log_lines.front());
    }
    std::string line = fmt::format("{}: {} of KV per GPU", who, format_bytes(*a.bytes_allocated, U));
    if (a.token_capacity) line += fmt::format(" holds {} tokens", with_thousands(*a.token_capacity));
    if (a.concurrency) line += fmt::format(": max concurrency {:.2f}x at {} tokens per request", *a.concurrency, with_thousands(c.context));
    if (estimated) line += " (the budget estimated from the GPU: an upper bound)";
    return line;
}

}  // namespace

void append_engine_tables(Report& report, const KvcalcRequest& r) {
    const auto U = r.units;
    const std::string release = engine_release_name(r.engine, r.engine_settings.version);
    const std::uint64_t pp = r.engine_settings.pp;
    const std::vector<std::uint64_t> stage_budgets = stage_budgets_of(r);
    report.inputs["engine"] = std::string(choice_name(engine_choices, r.engine));
    report.inputs["engine_release"] = release;
    Table alloc{"What " + release + " allocates (per GPU)",
                {{"model", "model", false}, {"dtype", "dtype", false}, {"context", "context"}, {"batch", "batch"},
                 {"engine_settings", "engine flags", false}, {"bytes_exact", "exact need"}, {"bytes_engine", "engine allocates"},
                 {"engine_tokens", "holds tokens"}, {"engine_concurrency", "max concurrency"}},
                {}, {}};
    Table lines{release + " would print", {{"model", "model", false}, {"line", "log line", false}}, {}, {}};
    if (r.kv_budget_ranks.size() > 1 && pp == 1)
        alloc.notes.push_back(fmt::format("{} budgets given, one per rank: every rank sizes its pool from the smallest, {} (vLLM unifies the ranks "
                                          "on the fewest blocks; SGLang and TensorRT-LLM take the minimum over ranks)",
                                          r.kv_budget_ranks.size(), format_bytes(*r.kv_budget, U)));
    std::vector<std::pair<const ModelConfig*, std::optional<std::string>>> glance;  // each model's first case, for the headline
    for (const auto& cfg : r.models) {
        const std::optional<std::uint64_t> budget = engine_budget(r, cfg, release, report);
        const bool estimated = budget && !r.kv_budget && r.engine != Engine::llamacpp;  // llama.cpp sizes from -c, not a budget
        const auto gpu_cfg = stage_config(per_gpu_config(cfg, r.tp), r.engine, pp);
        const auto contexts = r.contexts.empty() ? std::vector<std::uint64_t>{cfg.n_ctx_max > 0 ? static_cast<std::uint64_t>(cfg.n_ctx_max) : 4096}
                                                 : r.contexts;
        for (const auto dtype : r.dtypes)
            for (const auto t : contexts)
                for (const auto b : r.batches) {
                    EngineCase c;
                    c.model = &cfg;
                    c.dtype = dtype;
                    c.context = t;
                    c.batch = b;
                    c.tp = r.tp;
                    c.kv_budget = budget;
                    c.gpu_memory = r.gpu ? r.gpu->memory_bytes : 0;
                    c.gpu_is_a100 = r.gpu && gpu_is_a100(*r.gpu);
                    EngineSettings s = r.engine_settings;
                    s.stage_budgets = stage_budgets;
                    const std::optional<ModelConfig> draft = draft_for(r, cfg);
                    s.draft = draft ? &*draft : nullptr;
                    const EngineAnswer a = engine_answer(r.engine, c, s);
                    if (glance.size() < 3 && (glance.empty() || glance.back().first != &cfg)) glance.emplace_back(&cfg, engine_glance(release, cfg, c, a, estimated, U));
                    const auto exact = checked_mul(kv_bytes_sequence(gpu_cfg, dtype, t, r.window_mode).total(), b, "KV bytes per batch");
                    const Cell none{"-", nullptr};
                    alloc.rows.push_back({text_cell(cfg.name), text_cell(std::string(dtype_name(dtype))), uint_cell(t), uint_cell(b), text_cell(a.settings),
                                          bytes_cell(exact, U), a.bytes_allocated ? bytes_cell(*a.bytes_allocated, U) : none,
                                          a.token_capacity ? uint_cell(*a.token_capacity) : none,
                                          a.concurrency ? Cell{fmt::format("{:.2f}x", *a.concurrency), *a.concurrency} : none});
                    for (const auto& line : a.log_lines) lines.rows.push_back({text_cell(cfg.name), text_cell(line)});
                    for (const auto& note : a.notes)
                        if (std::find(alloc.notes.begin(), alloc.notes.end(), note) == alloc.notes.end()) alloc.notes.push_back(note);
                }
    }
    alloc.notes.push_back(fmt::format("exact need: B sequences of T tokens by the formula in docs/kv-memory.md{}; engine: its own rounding, "
                                      "padding and pool (docs/kv-memory.md, \"Engines\")",
                                      pp > 1 ? ", for the layers of the fullest pipeline stage" : ""));
    report.tables.push_back(std::move(alloc));
    if (!lines.rows.empty()) report.tables.push_back(std::move(lines));
    for (const auto& [model, line] : glance)
        if (line) report.headline.push_back(*line);
}

}  // namespace kvlab
