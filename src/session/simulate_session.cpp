#include "session/simulate_session.hpp"

#include <charconv>
#include <filesystem>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>  // mallopt
#endif

#include <Eigen/Core>
#include <fmt/format.h>
#include <omp.h>

#include "calc/attention_variant.hpp"
#include "calc/kv_memory.hpp"
#include "calc/presets.hpp"
#include "core/atomic_write.hpp"
#include "core/error.hpp"
#include "core/mapped_file.hpp"
#include "core/text.hpp"
#include "formats/checkpoint.hpp"
#include "formats/llama2c_checkpoint.hpp"
#include "model/evaluate.hpp"
#include "model/random_weights.hpp"
#include "report/simulation_report.hpp"
#include "trace/step_trace.hpp"

namespace kvlab {

namespace {

std::uint64_t physical_memory_bytes() {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) : 0;
}

std::vector<TokenId> parse_token_ids(const std::string& text) {
    std::vector<TokenId> ids;
    for (const auto& item : split_list(text)) {
        TokenId id = 0;
        const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), id);
        if (ec != std::errc() || end != item.data() + item.size())
            throw UsageError(fmt::format("--prompt-ids: '{}' is not a token id; expected comma-separated integers, e.g. 1,403,9038", item));
        ids.push_back(id);
    }
    if (ids.empty()) throw UsageError("--prompt-ids: empty list; expected comma-separated token ids");
    return ids;
}

// Everything --save-checkpoint needs is checked before any weights are built.
void check_save_path(const std::string& path, const ModelConfig& cfg) {
    check_output_path(path, "--save-checkpoint");
    check_llama2c_v0_config(path, cfg);
}

// The model's config. A preset that ships its weights (the trained models in models/) runs them: its
// checkpoint, and its tokenizer unless --tokenizer names another, as if given with --checkpoint.
ModelConfig resolve_model(SimulateRequest& o) {
    if (!o.checkpoint.empty()) return load_checkpoint_config(o.checkpoint);
    if (!o.config.empty()) return load_model_config(o.config);
    const ModelConfig preset = load_model(o.model);
    if (preset.checkpoint.empty()) return preset;
    o.checkpoint = preset.checkpoint.string();
    if (o.tokenizer.empty()) o.tokenizer = preset.tokenizer.string();
    ModelConfig real = load_checkpoint_config(o.checkpoint);
    real.name = preset.name;
    real.display_name = preset.display_name;
    return real;
}

}  // namespace

PreparedSimulation prepare_simulation(SimulateRequest o) {
    // options that exclude one another (--config/--model/--checkpoint, the prompt options, --eval) are
    // refused by the CLI (CLI11 excludes); what is checked here depends on values, not on presence
    const bool prompt_given = o.prompt_given;
    const ModelConfig full = resolve_model(o);  // may set o.checkpoint and o.tokenizer
    if (prompt_given && o.tokenizer.empty())
        throw UsageError("--prompt: text needs --tokenizer FILE (llama2.c tokenizer.bin) to become token ids; without one, give "
                         "--prompt-ids, or a model that ships a tokenizer (kvlab presets: tiny-llama, tiny-gpt2)");
    PreparedSimulation p;
    if (o.threads < 0) throw UsageError(fmt::format("--threads: {}; expected 0 (all cores) or more", o.threads));
    if (o.threads > 0) {
        omp_set_num_threads(o.threads);
        Eigen::setNbThreads(o.threads);
    } else if (!o.deterministic) {
        // all cores, but fewer when the machine is busy: libgomp then sizes teams by the load average,
        // which avoids the many-fold slowdown of spinning threads on an oversubscribed machine.
        // Not with --deterministic: GEMM blocking, and so float rounding, may depend on the team size.
        omp_set_dynamic(1);
    }

    // everything that can be wrong with the input is found before any allocation or work
    ModelConfig cfg = simulation_config(full, o.layers > 0 ? std::optional<std::int64_t>(o.layers) : std::nullopt);
    if (o.layers < 0) throw UsageError(fmt::format("--layers: {}; expected 1..{}", o.layers, full.n_layer));
    if (const AttentionVariant variant = parse_attention_variant(o.attention); variant.n_head_kv != 0) {
        // the seed's MHA vs GQA vs MQA lesson on one shape: K and V projections of another width, random weights
        if (!o.checkpoint.empty())
            throw UsageError(fmt::format("--attention {}: {} runs trained weights ({}), whose K and V projections have {} KV heads; a "
                                         "what-if layout needs random weights: give the shape with --model or --config",
                                         o.attention, cfg.name, o.checkpoint, cfg.n_head_kv));
        cfg = with_kv_heads(cfg, variant_kv_heads(variant, cfg.n_head, cfg.n_head_kv));
        cfg.display_name += fmt::format(", {} what-if", cfg.attention_kind());
    }
    SimulateOptions& sim = p.sim;
    sim.mode = o.mode;
    sim.n_prompt = o.prompt_len;
    if (!o.prompt_ids.empty()) sim.prompt_ids = parse_token_ids(o.prompt_ids);
    std::optional<Tokenizer>& tokenizer = p.tokenizer;
    if (!o.tokenizer.empty()) tokenizer.emplace(Tokenizer::load(o.tokenizer, full.n_vocab));
    std::vector<TokenId>& eval_ids = p.eval_ids;
    if (!o.eval.empty()) {
        if (!tokenizer) throw UsageError("--eval: the text needs --tokenizer FILE (llama2.c tokenizer.bin) to become token ids");
        eval_ids = tokenizer->encode(read_input_file(o.eval, "eval text file", 64 << 20), true, false);
    }
    if (prompt_given) {
        // a prompt that cannot fit is refused before it is encoded, however long it is
        if (const std::int64_t at_least = tokenizer->min_tokens(o.prompt.size(), true); at_least > cfg.n_ctx_max)
            throw UsageError(fmt::format("--prompt: {} bytes of text encode to at least {} tokens (BOS included; the longest "
                                         "piece of {} is {} bytes); the context of {} is {} positions",
                                         o.prompt.size(), at_least, o.tokenizer, tokenizer->max_piece_bytes(), cfg.name,
                                         cfg.n_ctx_max));
        sim.prompt_ids = tokenizer->encode(o.prompt, true, false);
    }
    sim.n_steps = o.steps;
    sim.sampler = {o.temperature, o.top_k, o.top_p, o.seed};
    sim.seed = o.seed;
    const std::int64_t n_positions = o.eval.empty() ? simulation_positions(cfg, sim) : 0;  // validates sizes and ids first
    if (!o.trace.empty()) check_trace_writable(o.trace);
    if (!o.save_checkpoint.empty()) check_save_path(o.save_checkpoint, cfg);
    if (!o.trace.empty() && !o.save_checkpoint.empty()) {
        std::error_code ec;
        const auto a = std::filesystem::weakly_canonical(o.trace, ec), b = std::filesystem::weakly_canonical(o.save_checkpoint, ec);
        if (a == b)
            throw UsageError(fmt::format("--trace and --save-checkpoint: both name {}; give two different files", quote(o.trace)));
    }
    const std::uint64_t max_memory =
        o.max_memory.empty() ? physical_memory_bytes() / 4 * 3 : parse_size(o.max_memory, "--max-memory");
    // --eval holds the weights, one window's KV cache and one token's activations: the weights decide
    const MemoryEstimate memory =
        o.eval.empty() ? check_simulation_memory(cfg, sim, max_memory)
                       : MemoryEstimate{weights_bytes(cfg),
                                        kv_bytes_sequence(cfg, DType::fp32,
                                                          static_cast<std::uint64_t>(std::min<std::int64_t>(cfg.n_ctx_max, std::ssize(eval_ids))),
                                                          WindowMode::cap).total()};
    if (memory.total() > max_memory)
        throw UsageError(fmt::format("--max-memory: the weights of {} and one window's KV cache need {}, more than the {} allowed",
                                     cfg.display_name, format_bytes(memory.total(), UnitSystem::iec),
                                     format_bytes(max_memory, UnitSystem::iec)));

    nlohmann::json& inputs = p.inputs;
    inputs = {
        {"model", cfg.name},
        {"model_source", cfg.source},
        {"family", cfg.family == Family::gpt2 ? "gpt2" : "llama"},
        {"layers", cfg.n_layer},
        {"layers_in_model", full.n_layer},
        {"attention", o.attention},
        {"n_head_kv", cfg.n_head_kv},
        {"mode", choice_name(sim_mode_choices, o.mode)},
        {"prompt_len", sim.prompt_ids.empty() ? o.prompt_len : static_cast<std::int64_t>(sim.prompt_ids.size())},
        {"steps", o.steps},
        {"positions", n_positions},
        {"seed", o.seed},
        {"weights", o.checkpoint.empty() ? fmt::format("random N(0, {}), norms 1, seed {}", default_weight_sigma, o.seed)
                                         : full.source},
        {"temperature", o.temperature},
        {"top_k", o.top_k},
        {"top_p", o.top_p},
        {"threads", omp_get_max_threads()},
        {"memory_estimate_bytes", memory.total()},
    };

    if (!o.checkpoint.empty()) inputs["checkpoint"] = o.checkpoint;
    if (!o.tokenizer.empty()) inputs["tokenizer"] = o.tokenizer;
    if (prompt_given) inputs["prompt"] = to_valid_utf8(o.prompt);
    if (!o.save_checkpoint.empty()) inputs["save_checkpoint"] = o.save_checkpoint;

#if defined(__GLIBC__)
    // The weights and the KV cache are allocated once and live for the whole run. glibc gives each block
    // over 128 KiB a mapping of its own, whole pages, the chunk header and Eigen's alignment pushing the
    // data onto one page more: ~4 KiB resident per matrix. From the heap they pack end to end. (32 MiB is
    // mallopt's ceiling; the embedding table, larger, keeps a mapping.) docs/performance.md, peak RSS.
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
#endif
    if (o.checkpoint.empty()) {
        p.weights = random_weights(cfg, o.seed);
    } else {
        p.weights = load_checkpoint(o.checkpoint, cfg.n_layer).weights;  // --layers: only the first N are read
    }
    if (!o.save_checkpoint.empty()) save_llama2c_v0(o.save_checkpoint, cfg, p.weights);
    if (!o.eval.empty()) inputs["eval"] = o.eval;
    // tokens mean something (and are worth streaming) with a tokenizer, a given prompt or real weights
    p.tokens_meaningful = tokenizer || !sim.prompt_ids.empty() || !o.checkpoint.empty();
    if (o.eval.empty()) sim.prompt_ids = simulation_prompt(cfg, sim);
    p.config = cfg;
    p.request = o;
    return p;
}

// --eval: the model's mean NLL and perplexity on a text, teacher-forced through the cached forward pass.
Report eval_report(const PreparedSimulation& p) {
    const SimulateRequest& o = p.request;
    const ModelConfig& cfg = p.config;
    const EvalResult r = evaluate_nll(cfg, p.weights, p.eval_ids);
    Report report;
    report.inputs = p.inputs;
    Table t;
    t.title = fmt::format("kvlab simulate --eval: {} on {}", cfg.display_name, o.eval);
    t.columns = {{"tokens", "tokens (BOS incl.)"}, {"windows", "windows"}, {"scored", "scored"},
                 {"nll_sum", "NLL sum (nats)"},   {"mean_nll", "mean NLL (nats/token)"}, {"perplexity", "perplexity"}};
    t.rows.push_back({int_cell(r.n_tokens), int_cell(r.n_windows), int_cell(r.n_scored), real_cell(r.nll_sum, 4),
                      real_cell(r.mean_nll, 6), real_cell(r.perplexity, 6)});
    t.notes.push_back(fmt::format("text encoded with {} (BOS first); windows of at most {} tokens overlapping by one; "
                                  "perplexity = exp(mean NLL); docs/cli-simulate.md", o.tokenizer, cfg.n_ctx_max));
    report.tables.push_back(std::move(t));
    return report;
}

Report simulation_outcome(const PreparedSimulation& p, const SimulationResult& result) {
    const SimulateRequest& o = p.request;
    const ModelConfig& cfg = p.config;
    const RunSummary summary = run_summary(cfg, p.sim, result);
    if (result.records.empty())  // interrupted before step 0 finished: nothing to report or trace
        throw Interrupted(fmt::format("interrupted before the first step; no report{}",
                                      o.trace.empty() ? "" : fmt::format(", {} not written", quote(o.trace))));
    if (!o.trace.empty()) write_step_trace(o.trace, summary, result.records, p.inputs, o.deterministic);
    Report report = simulation_report(summary, result.records, p.inputs, p.request.units);
    if (!o.save_checkpoint.empty())
        report.notes.push_back(fmt::format("saved the model run as llama2.c v0: {} ({} bytes)", o.save_checkpoint,
                                           llama2c_file_bytes(cfg, Llama2cVersion::v0)));
    return report;
}

void check_outcome(const PreparedSimulation& p, const SimulationResult& result) {
    const SimulateRequest& o = p.request;
    if (result.first_divergent_step)
        throw Error(fmt::format("cached and uncached logits diverge at step {}: max |delta logit| {:.3g} > tolerance {:.3g}",
                                *result.first_divergent_step, result.divergent_dlogit, result.divergent_tolerance));
    if (result.interrupted)
        throw Interrupted(fmt::format("interrupted after {} of {} steps{}", result.n_steps_done, p.sim.n_steps,
                                      o.trace.empty() ? "" : fmt::format("; {} holds the steps done", quote(o.trace))));
}

}  // namespace kvlab
