// `kvlab simulate`: decode one prompt with and without the KV cache on a random-weight model of any
// preset's shape or on a loaded checkpoint, counting FLOPs and bytes per step; streams the generated
// tokens, prints the side-by-side totals, writes a trace.
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>  // mallopt, malloc_trim
#endif

#include <Eigen/Core>
#include <fmt/format.h>
#include <omp.h>

#include "commands.hpp"
#include "core/atomic_write.hpp"
#include "formats/checkpoint.hpp"
#include "core/error.hpp"
#include "model/evaluate.hpp"
#include "core/interrupt.hpp"
#include "core/text.hpp"
#include "calc/kv_memory.hpp"
#include "formats/llama2c_checkpoint.hpp"
#include "core/mapped_file.hpp"
#include "calc/presets.hpp"
#include "model/random_weights.hpp"
#include "report/simulation_report.hpp"
#include "model/simulator.hpp"
#include "trace/step_trace.hpp"
#include "formats/tokenizer.hpp"
#include "core/units.hpp"

namespace kvlab::cli {

struct SimulateCliOptions {
    std::string model = "stories15m";  // preset name or path to a config.json
    std::string config;                // a config.json or a directory holding one
    std::string checkpoint;            // llama2.c .bin or Hugging Face directory: real config and weights
    std::string tokenizer;             // llama2.c tokenizer.bin: text prompt in, text out
    std::string prompt;                // text prompt, encoded with --tokenizer (BOS first)
    std::string save_checkpoint;       // write the model run as llama2.c v0
    std::string eval;                  // text file: teacher-forced NLL and perplexity instead of decoding
    std::int64_t layers = 0;           // 0: all of the model's layers
    std::string mode = "both";
    std::int64_t prompt_len = 32;
    std::string prompt_ids;            // comma-separated token ids, instead of a random prompt
    std::int64_t steps = 128;
    double temperature = 0.0;
    std::int64_t top_k = 0;
    double top_p = 1.0;
    std::uint64_t seed = 42;
    std::string trace;
    bool deterministic = false;
    bool quiet = false;
    std::string max_memory;            // empty: 75% of physical RAM
    int threads = 0;                   // 0: all cores
    std::string units = "iec";
    std::string format = "table";
};

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

// Prints tokens as the run produces them: text through the tokenizer, else ids. On stdout before the
// table (table format), or on stderr, so that a csv/json/markdown stdout stays one document.
class TokenEcho {
public:
    TokenEcho(std::ostream& out, const Tokenizer* tokenizer) : out_(out) {
        if (tokenizer) decoder_.emplace(*tokenizer);
    }
    void prompt(const std::vector<TokenId>& ids) {
        if (!decoder_) out_ << "prompt ids:";
        for (const TokenId id : ids) put(id);
        if (!decoder_) out_ << "\ngenerated ids:";
        out_.flush();
    }
    void token(TokenId id) {
        put(id);
        out_.flush();
    }
    void end() { out_ << "\n"; }

private:
    void put(TokenId id) {
        if (decoder_) out_ << decoder_->next(id);
        else out_ << ' ' << id;
    }
    std::ostream& out_;
    std::optional<TextDecoder> decoder_;
};

// Everything --save-checkpoint needs is checked before any weights are built.
void check_save_path(const std::string& path, const ModelConfig& cfg) {
    check_output_path(path, "--save-checkpoint");
    check_llama2c_v0_config(path, cfg);
}

// --eval: the model's mean NLL and perplexity on a text, teacher-forced through the cached forward pass.
void run_eval(const SimulateCliOptions& o, const ModelConfig& cfg, const Weights& weights, const std::vector<TokenId>& ids,
              Format format, const nlohmann::json& inputs) {
    const EvalResult r = evaluate_nll(cfg, weights, ids);
    Report report;
    report.inputs = inputs;
    Table t;
    t.title = fmt::format("kvlab simulate --eval: {} on {}", cfg.display_name, o.eval);
    t.columns = {{"tokens", "tokens (BOS incl.)"}, {"windows", "windows"}, {"scored", "scored"},
                 {"nll_sum", "NLL sum (nats)"},   {"mean_nll", "mean NLL (nats/token)"}, {"perplexity", "perplexity"}};
    t.rows.push_back({int_cell(r.n_tokens), int_cell(r.n_windows), int_cell(r.n_scored), real_cell(r.nll_sum, 4),
                      real_cell(r.mean_nll, 6), real_cell(r.perplexity, 6)});
    t.notes.push_back(fmt::format("text encoded with {} (BOS first); windows of at most {} tokens overlapping by one; "
                                  "perplexity = exp(mean NLL); docs/cli-simulate.md", o.tokenizer, cfg.n_ctx_max));
    report.tables.push_back(std::move(t));
    print_report(std::cout, report, format);
}

// The model's config. A preset that ships its weights (the trained models in models/) runs them: its
// checkpoint, and its tokenizer unless --tokenizer names another, as if given with --checkpoint.
ModelConfig resolve_model(SimulateCliOptions& o) {
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

void run(SimulateCliOptions o, bool model_given, bool prompt_len_given, bool prompt_given) {
    if (model_given && !o.config.empty()) throw UsageError("--config and --model: give one or the other, not both");
    if (!o.checkpoint.empty() && (model_given || !o.config.empty()))
        throw UsageError("--checkpoint and --model/--config: the checkpoint carries its own config; give one or the other");
    const ModelConfig full = resolve_model(o);  // may set o.checkpoint and o.tokenizer
    if (prompt_len_given && !o.prompt_ids.empty())
        throw UsageError("--prompt-len and --prompt-ids: give one or the other, not both");
    if (prompt_given && o.tokenizer.empty())
        throw UsageError("--prompt: text needs --tokenizer FILE (llama2.c tokenizer.bin) to become token ids; without one, give "
                         "--prompt-ids, or a model that ships a tokenizer (kvlab presets: tiny-llama, tiny-gpt2)");
    if (prompt_given && (prompt_len_given || !o.prompt_ids.empty()))
        throw UsageError("--prompt and --prompt-len/--prompt-ids: give one prompt, not both");
    const Format format = parse_format(o.format, "--format");
    const UnitSystem units = parse_unit_system(o.units);
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
    const ModelConfig cfg = simulation_config(full, o.layers > 0 ? std::optional<std::int64_t>(o.layers) : std::nullopt);
    if (o.layers < 0) throw UsageError(fmt::format("--layers: {}; expected 1..{}", o.layers, full.n_layer));
    SimulateOptions sim;
    sim.mode = parse_sim_mode(o.mode, "--mode");
    sim.n_prompt = o.prompt_len;
    if (!o.prompt_ids.empty()) sim.prompt_ids = parse_token_ids(o.prompt_ids);
    std::optional<Tokenizer> tokenizer;
    if (!o.tokenizer.empty()) tokenizer.emplace(Tokenizer::load(o.tokenizer, full.n_vocab));
    std::vector<TokenId> eval_ids;
    if (!o.eval.empty()) {
        if (!tokenizer) throw UsageError("--eval: the text needs --tokenizer FILE (llama2.c tokenizer.bin) to become token ids");
        if (prompt_given || prompt_len_given || !o.prompt_ids.empty() || !o.trace.empty())
            throw UsageError("--eval and --prompt/--prompt-len/--prompt-ids/--trace: --eval scores a text; it decodes no prompt "
                             "and writes no step trace");
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

    nlohmann::json inputs = {
        {"model", cfg.name},
        {"model_source", cfg.source},
        {"family", cfg.family == Family::gpt2 ? "gpt2" : "llama"},
        {"layers", cfg.n_layer},
        {"layers_in_model", full.n_layer},
        {"mode", o.mode},
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
    Weights weights;
    if (o.checkpoint.empty()) {
        weights = random_weights(cfg, o.seed);
    } else {
        weights = load_checkpoint(o.checkpoint, cfg.n_layer).weights;  // --layers: only the first N are read
    }
    if (!o.save_checkpoint.empty()) save_llama2c_v0(o.save_checkpoint, cfg, weights);
    if (!o.eval.empty()) {
        inputs["eval"] = o.eval;
        run_eval(o, cfg, weights, eval_ids, format, inputs);
        return;
    }

    // tokens stream as they come when they mean something (a tokenizer, a given prompt or real
    // weights): on stdout above the table, else on stderr (not with --quiet)
    const bool tokens_meaningful = tokenizer || !sim.prompt_ids.empty() || !o.checkpoint.empty();
    sim.prompt_ids = simulation_prompt(cfg, sim);
    const bool echo_on_stdout = format == Format::table && tokens_meaningful;
    std::optional<TokenEcho> echo;
    if (echo_on_stdout || (tokens_meaningful && !o.quiet)) {
        echo.emplace(echo_on_stdout ? std::cout : std::cerr, tokenizer ? &*tokenizer : nullptr);
        echo->prompt(sim.prompt_ids);
        sim.on_token = [&](TokenId id) { echo->token(id); };
    }

    // progress on stderr only when a person watches it and sees no tokens streaming there or on a
    // terminal stdout
    const bool show_progress = !o.quiet && ::isatty(STDERR_FILENO) && (!echo || (echo_on_stdout && !::isatty(STDOUT_FILENO)));
    auto last_print = std::chrono::steady_clock::now();
    if (show_progress)
        sim.on_step = [&](std::int64_t done, std::int64_t total) {
            const auto now = std::chrono::steady_clock::now();
            if (done < total && now - last_print < std::chrono::milliseconds(100)) return;
            last_print = now;
            std::fprintf(stderr, "\rsimulate: step %lld/%lld", static_cast<long long>(done), static_cast<long long>(total));
            std::fflush(stderr);
        };
#if defined(__GLIBC__)
    // loading's freed allocations (parsing, weight init on every thread) leave pages in malloc's arenas;
    // give them back so the process holds only what the run needs (docs/performance.md, peak RSS)
    malloc_trim(0);
#endif
    // the first Ctrl-C ends the run after the current step (report and trace of the steps done); a
    // second one, or one while the trace is written, kills the process and removes the temporary file
    std::atomic<bool> stop{false};
    sim.stop = &stop;
    SimulationResult result;
    {
        const StopOnInterrupt stop_on_interrupt(stop);
        result = run_simulation(cfg, weights, sim);
    }
    if (show_progress) std::fprintf(stderr, "\r\033[K");

    if (echo) echo->end();
    if (echo_on_stdout) std::cout << "\n";  // one blank line between the tokens and the table

    const RunSummary summary = run_summary(cfg, sim, result);
    if (result.records.empty())  // interrupted before step 0 finished: nothing to report or trace
        throw Interrupted(fmt::format("interrupted before the first step; no report{}",
                                      o.trace.empty() ? "" : fmt::format(", {} not written", quote(o.trace))));
    if (!o.trace.empty()) write_step_trace(o.trace, summary, result.records, inputs, o.deterministic);
    Report report = simulation_report(summary, result.records, inputs, units);
    if (!o.save_checkpoint.empty())
        report.notes.push_back(fmt::format("saved the model run as llama2.c v0: {} ({} bytes)", o.save_checkpoint,
                                           llama2c_file_bytes(cfg, Llama2cVersion::v0)));
    print_report(std::cout, report, format);
    std::cout.flush();
    if (result.first_divergent_step)
        throw Error(fmt::format("cached and uncached logits diverge at step {}: max |delta logit| {:.3g} > tolerance {:.3g}",
                                *result.first_divergent_step, result.divergent_dlogit, result.divergent_tolerance));
    if (result.interrupted)
        throw Interrupted(fmt::format("interrupted after {} of {} steps{}", summary.n_steps_done, summary.n_steps,
                                      o.trace.empty() ? "" : fmt::format("; {} holds the steps done", quote(o.trace))));
}

}  // namespace

void setup_simulate(CLI::App& app) {
    auto o = std::make_shared<SimulateCliOptions>();
    auto* cmd = app.add_subcommand("simulate", "Decode with and without the KV cache on a CPU transformer, counting FLOPs and bytes per step");
    auto* model = cmd->add_option("-m,--model", o->model, "Preset name, or a path to a config.json")->capture_default_str();
    cmd->add_option("-c,--config", o->config, "A Hugging Face config.json, or a directory holding one (instead of --model)");
    cmd->add_option("--checkpoint", o->checkpoint, "Real weights: a llama2.c .bin (v0 or v1) or a Hugging Face directory with safetensors (instead of --model/--config)");
    cmd->add_option("--layers", o->layers, "Simulate only the first N layers, at their real shapes (0 = all)")->capture_default_str();
    cmd->add_option("--mode", o->mode, "cached, uncached or both (same tokens, logits compared)")->capture_default_str();
    cmd->add_option("--tokenizer", o->tokenizer, "llama2.c tokenizer.bin for the model's vocabulary: --prompt text in, text out");
    auto* prompt = cmd->add_option("--prompt", o->prompt, "Prompt text, encoded with --tokenizer (BOS first)");
    auto* prompt_len = cmd->add_option("-p,--prompt-len", o->prompt_len, "Prompt length in tokens (random ids from --seed)")->capture_default_str();
    cmd->add_option("--prompt-ids", o->prompt_ids, "Comma-separated prompt token ids (instead of --prompt-len)");
    cmd->add_option("-n,--steps", o->steps, "Tokens to generate; step 0 is the prefill")->capture_default_str();
    cmd->add_option("--temperature", o->temperature, "Sampling temperature (0 = greedy)")->capture_default_str();
    cmd->add_option("--top-k", o->top_k, "Keep the k most likely tokens (0 = off)")->capture_default_str();
    cmd->add_option("--top-p", o->top_p, "Nucleus sampling threshold (1 = off)")->capture_default_str();
    cmd->add_option("-s,--seed", o->seed, "Seed for weights, prompt and sampler")->capture_default_str();
    cmd->add_option("--eval", o->eval, "Score a text file instead of decoding: teacher-forced mean NLL and perplexity (needs --tokenizer)");
    cmd->add_option("--save-checkpoint", o->save_checkpoint, "Write the model run (e.g. random weights) as a llama2.c v0 FILE.bin");
    cmd->add_option("--trace", o->trace, "Write one record per step per mode to FILE.csv, FILE.jsonl or FILE.json (Perfetto timeline)");
    cmd->add_flag("--deterministic", o->deterministic, "Omit wall time from the trace, modelled time in Perfetto (byte-identical reruns)");
    cmd->add_flag("-q,--quiet", o->quiet, "No progress line on stderr (csv/json/markdown: no token stream there either)");
    cmd->add_option("--max-memory", o->max_memory, "Refuse runs whose weights + KV + activations exceed this, e.g. 8GiB (default: 75% of RAM)");
    cmd->add_option("--threads", o->threads, "Threads for matmuls and attention (0 = all cores, fewer when the machine is busy)")->capture_default_str();
    cmd->add_option("--units", o->units, "iec (KiB/MiB/GiB) or si (KB/MB/GB)")->capture_default_str();
    cmd->add_option("-f,--format", o->format, "table, csv, json or markdown")->capture_default_str();
    cmd->callback([o, model, prompt_len, prompt] { run(*o, model->count() > 0, prompt_len->count() > 0, prompt->count() > 0); });
}

}  // namespace kvlab::cli
