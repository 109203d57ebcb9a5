// `kvlab simulate`: decode one prompt with and without the KV cache on a random-weight model of any
// preset's shape or on a loaded checkpoint, counting FLOPs and bytes per step; streams the generated
// tokens, prints the side-by-side totals, writes a trace.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>  // malloc_trim
#endif

#include <fmt/format.h>

#include "commands.hpp"
#include "options.hpp"
#include "core/interrupt.hpp"
#include "kvlab/core/printer.hpp"
#include "kvlab/formats/tokenizer.hpp"
#include "kvlab/sim/stop.hpp"
#include "session/simulate_session.hpp"

namespace kvlab::cli {

namespace {

// Prints tokens as the run produces them: text through the tokenizer, else ids. On stdout before the
// table (table format), or on stderr, so that a csv/json/markdown stdout stays one document; or nowhere
// (out null) when it only watches the text for --stop strings. The text passes through a StopMatcher:
// it ends before the first stop string, which is not printed.
class TokenEcho {
public:
    TokenEcho(std::ostream* out, const Tokenizer* tokenizer, const std::vector<std::string>& stops) : out_(out), stop_(stops) {
        if (tokenizer) decoder_.emplace(*tokenizer);
    }
    void prompt(const std::vector<TokenId>& ids) {
        if (!out_) return;
        if (!decoder_) *out_ << "prompt ids:";
        for (const TokenId id : ids) put(decoder_ ? decoder_->next(id) : fmt::format(" {}", id));
        if (!decoder_) *out_ << "\ngenerated ids:";
        out_->flush();
    }
    // true when the text has reached a stop string
    bool token(TokenId id) {
        if (!decoder_) {
            put(fmt::format(" {}", id));
        } else {
            StopMatcher::Step step = stop_.push(decoder_->next(id));
            put(step.text);
            if (step.stopped) return true;
        }
        if (out_) out_->flush();
        return false;
    }
    void end() {
        if (decoder_ && !stop_.stopped()) put(stop_.finish() + decoder_->finish());  // a character cut short: U+FFFD
        if (out_) *out_ << "\n";
    }

private:
    void put(const std::string& text) {
        if (out_) *out_ << text;
    }
    std::ostream* out_;
    std::optional<TextDecoder> decoder_;
    StopMatcher stop_;
};

// "simulate: step 40/256, 18.2 steps/s, ETA 12 s" on stderr: the rate so far, and the time left at that
// rate (an uncached run slows as T grows, so its ETA is a lower bound); at most ten updates a second.
class ProgressLine {
public:
    void operator()(std::int64_t done, std::int64_t total) {
        const auto now = std::chrono::steady_clock::now();
        if (done < total && now - last_print_ < std::chrono::milliseconds(100)) return;
        last_print_ = now;
        const double elapsed = std::chrono::duration<double>(now - start_).count();
        const double rate = elapsed > 0 ? static_cast<double>(done) / elapsed : 0.0;
        const double eta = rate > 0 ? static_cast<double>(total - done) / rate : 0.0;
        std::fprintf(stderr, "\rsimulate: step %lld/%lld, %.1f steps/s, ETA %.0f s\033[K", static_cast<long long>(done),
                     static_cast<long long>(total), rate, eta);
        std::fflush(stderr);
    }
    static void clear() { std::fprintf(stderr, "\r\033[K"); }

private:
    std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), last_print_ = start_;
};

// Several storages: the same run once per policy (the token stream shows the first), for one table.
std::vector<SimulationResult> run_each_policy(const PreparedSimulation& p, std::atomic<bool>& stop) {
    std::vector<SimulationResult> runs;
    const StopOnInterrupt stop_on_interrupt(stop);
    for (const PreparedSimulation::Policy& policy : p.policies) {
        SimulateOptions one = p.sim;
        one.kv_storage = policy.kv;
        one.weight_dtype = policy.weights;
        if (!runs.empty()) {  // the first run's length (an early stop), its tokens not printed again
            one.n_steps = runs.front().n_steps_done;
            one.end_tokens.clear();
            one.on_token = nullptr;
            one.stop_after = nullptr;
        }
        runs.push_back(run_simulation(p.config, p.weights, one));
        if (runs.back().interrupted) throw Interrupted("interrupted; no comparison printed");
    }
    return runs;
}

void run(const SimulateRequest& request) {
    if (!request.cost_at.empty()) return print_report(std::cout, decode_cost_comparison(request), request.format);
    PreparedSimulation p = prepare_simulation(request);
    const SimulateRequest& o = p.request;
    if (!o.eval.empty()) {
        print_report(std::cout, eval_report(p), o.format);
        return;
    }
    SimulateOptions& sim = p.sim;
    const Format format = o.format;
    // tokens stream as they come when they mean something (a tokenizer, a given prompt or real
    // weights): on stdout above the table, else on stderr (not with --quiet)
    const bool tokens_meaningful = p.tokens_meaningful;
    const bool echo_on_stdout = format == Format::table && tokens_meaningful;
    const bool echoing = echo_on_stdout || (tokens_meaningful && !o.quiet);
    std::optional<TokenEcho> echo;
    if (echoing || !o.stop.empty()) {  // --stop: the text is watched, printed or not
        echo.emplace(echoing ? (echo_on_stdout ? &std::cout : &std::cerr) : nullptr, p.tokenizer ? &*p.tokenizer : nullptr, o.stop);
        echo->prompt(sim.prompt_ids);
        sim.stop_after = [&](TokenId id) { return echo->token(id); };
    }

    // progress on stderr only when a person watches it and sees no tokens streaming there or on a
    // terminal stdout
    const bool show_progress = !o.quiet && ::isatty(STDERR_FILENO) && (!echoing || (echo_on_stdout && !::isatty(STDOUT_FILENO)));
    if (show_progress) sim.on_step = ProgressLine{};
#if defined(__GLIBC__)
    // loading's freed allocations (parsing, weight init on every thread) leave pages in malloc's arenas;
    // give them back so the process holds only what the run needs (docs/performance.md, peak RSS)
    malloc_trim(0);
#endif
    // the first Ctrl-C ends the run after the current step (report and trace of the steps done); a
    // second one, or one while the trace is written, kills the process and removes the temporary file
    std::atomic<bool> stop{false};
    sim.stop = &stop;
    if (p.policies.size() > 1) {
        const std::vector<SimulationResult> runs = run_each_policy(p, stop);
        if (show_progress) ProgressLine::clear();
        if (echo) echo->end();
        if (echo_on_stdout) std::cout << "\n";
        print_report(std::cout, kv_policy_report(p, runs), format);
        return;
    }
    SimulationResult result;
    {
        const StopOnInterrupt stop_on_interrupt(stop);
        result = run_simulation(p.config, p.weights, sim);
        if (!result.interrupted) repeat_simulation(p, result, stop);
    }
    if (show_progress) ProgressLine::clear();

    if (echo) echo->end();
    if (echo_on_stdout) std::cout << "\n";  // one blank line between the tokens and the table

    print_report(std::cout, simulation_outcome(p, result), format);
    std::cout.flush();
    check_outcome(p, result);
}

// --temperature, --top-k, --top-p, --seed, --sampler, and where a run ends (--stop, --ignore-eos).
void add_sampling_options(CLI::App* cmd, SimulateRequest& o) {
    cmd->add_option("--temperature", o.temperature, "Sampling temperature (0 = greedy)")->capture_default_str();
    cmd->add_option("--top-k", o.top_k, "Keep the k most likely tokens (0 = off)")->capture_default_str();
    cmd->add_option("--top-p", o.top_p, "Nucleus sampling threshold (1 = off)")->capture_default_str();
    cmd->add_option("-s,--seed", o.seed, "Seed for weights, prompt and sampler")->capture_default_str();
    add_choice(cmd, "--sampler", o.sampler, sampler_rule_choices,
               "Sampling rule and generator: kvlab (its own, with top-k) or llama2c (run.c's: the same tokens as llama2.c's "
               "run.c -t T -p P -s SEED on the same checkpoint and prompt)");
    cmd->add_option("--stop", o.stop, "Stop when the text reaches STR (repeatable; the stop string is not printed; needs a tokenizer)");
    cmd->add_flag("--ignore-eos", o.ignore_eos, "Run every step even after a trained model writes end-of-text (BOS or EOS)");
}

// --cost-at and its --plot: the closed-form comparison of layouts, instead of a run (no option of a run with it).
void add_cost_options(CLI::App* cmd, SimulateRequest& o) {
    auto* cost_at = cmd->add_option("--cost-at", o.cost_at,
                                    "Instead of a run: one decoded token's attention FLOPs and bytes at these contexts (e.g. 1k,8k,128k), "
                                    "exact from the cost model's closed form, for each layout of a comma-separated --attention "
                                    "(mla:R: naive and absorbed)");
    for (const char* name : {"--trace", "--logits", "--eval", "--save-checkpoint", "--prompt", "--prompt-ids", "--prompt-len", "--steps",
                             "--mode", "--repeat", "--kernel", "--window", "--sink-tokens", "--weight-dtype", "--tokenizer", "--stop"})
        cost_at->excludes(cmd->get_option(name));
    output_file(cmd->add_option("--plot", o.plot, "With --cost-at: its chart, bytes and FLOPs against context, FILE.svg or FILE.png"))->needs(cost_at);
}

constexpr const char* simulate_examples =
    "Examples:\n  kvlab simulate -m tiny-llama --prompt \"Once upon a time\" -n 64 --trace run.json\n"
    "  kvlab simulate -m stories15m -p 32 -n 128 --mode both\n"
    "  kvlab simulate -m tiny-llama --prompt \"Once upon a time\" -n 64 --kv-dtype fp32,fp16,fp8_e4m3,q4_0\n"
    "  kvlab simulate -m stories110m -p 16 -n 64 --weight-dtype fp32,bf16,q8_0\n"
    "  kvlab simulate -m llama-3.1-8b --attention mha,gqa:8,mqa,mla:512 --cost-at 1k,8k,128k --plot mla.svg";

}  // namespace

void setup_simulate(CLI::App& app) {
    auto o = std::make_shared<SimulateRequest>();
    auto* cmd = app.add_subcommand("simulate", "Decode with and without the KV cache on a CPU transformer, counting FLOPs and bytes per step");
    auto* model = input_file(cmd->add_option("-m,--model", o->model, "Preset name, or a path to a config.json"))->capture_default_str();
    auto* config = input_file(cmd->add_option("-c,--config", o->config, "A Hugging Face config.json, or a directory holding one (instead of --model)"))->excludes(model);
    input_file(cmd->add_option("--checkpoint", o->checkpoint, "Real weights: a llama2.c .bin (v0 or v1) or a Hugging Face directory with safetensors (instead of --model/--config)"))
        ->excludes(model)
        ->excludes(config);
    cmd->add_option("--layers", o->layers, "Simulate only the first N layers, at their real shapes (0 = all)")->capture_default_str();
    cmd->add_option("-a,--attention", o->attention,
                    "What-if attention on random weights: native, mha, gqa:N (N KV heads), mqa, or mla:R (DeepSeek-V2's latent "
                    "cache of R values + half a head of RoPE key per token)")
        ->capture_default_str();
    add_choice(cmd, "--mode", o->mode, sim_mode_choices, "cached, uncached or both (same tokens, logits compared)");
    input_file(cmd->add_option("--tokenizer", o->tokenizer, "llama2.c tokenizer.bin for the model's vocabulary: --prompt text in, text out"));
    auto* prompt = cmd->add_option("--prompt", o->prompt,
                                   "Prompt text, encoded with --tokenizer (BOS first); a trained model with a tokenizer and no prompt option: "
                                   "\"Once upon a time\"");
    auto* prompt_len = cmd->add_option("-p,--prompt-len", o->prompt_len, "Prompt length in tokens (random ids from --seed)")->capture_default_str();
    auto* prompt_ids = cmd->add_option("--prompt-ids", o->prompt_ids, "Comma-separated prompt token ids (instead of --prompt-len)")->excludes(prompt_len);
    prompt->excludes(prompt_len)->excludes(prompt_ids);
    cmd->add_option("-n,--steps", o->steps, "Tokens to generate; step 0 is the prefill")->capture_default_str();
    add_sampling_options(cmd, *o);
    auto* eval = input_file(cmd->add_option("--eval", o->eval, "Score a text file instead of decoding: teacher-forced mean NLL and perplexity (needs --tokenizer)"));
    eval->excludes(prompt)->excludes(prompt_len)->excludes(prompt_ids);
    output_file(cmd->add_option("--save-checkpoint", o->save_checkpoint, "Write the model run (e.g. random weights) as a llama2.c v0 FILE.bin"));
    output_file(cmd->add_option("--trace", o->trace, "Write one record per step per mode to FILE.csv, FILE.jsonl or FILE.json (Perfetto timeline)"))->excludes(eval);
    cmd->add_flag("--deterministic", o->deterministic, "Omit wall time from the trace, modelled time in Perfetto (byte-identical reruns)");
    cmd->add_option("--gpu", o->gpu, "GPU preset whose roofline models each step's time beside the wall time (kvlab presets --gpus)")
        ->capture_default_str();
    cmd->add_option("--repeat", o->repeat, "Run the timed decode N times; wall figures as median and min-max")->capture_default_str();
    output_file(cmd->add_option("--logits", o->logits,
                                "Write each step's logits (the ones the token is chosen from) to FILE.npy: float32, shape (steps, vocab)"))
        ->excludes(eval);
    cmd->add_flag("-q,--quiet", o->quiet, "No progress line on stderr (csv/json/markdown: no token stream there either)");
    cmd->add_option("--max-memory", o->max_memory, "Refuse runs whose weights + KV + activations exceed this, e.g. 8GiB (default: 75% of RAM; at most the RAM)");
    cmd->add_flag("--force-memory", o->force_memory, "Allow a --max-memory above the machine's physical memory");
    cmd->add_option("--threads", o->threads, "Threads for matmuls and attention (0 = all cores, fewer when the machine is busy)")->capture_default_str();
    cmd->add_option("--kv-dtype", o->kv_dtype,
                    "How the cache stores K and V: fp32, fp16, bf16, fp8_e4m3, fp8_e5m2, int8, q8_0, q4_0; a comma list compares them "
                    "(quality against fp32 on the same tokens)")
        ->capture_default_str();
    auto* kv_scale = add_choice(cmd, "--kv-scale", o->kv_scale, kv_scale_choices,
                                "fp8/int8 scales: tensor (one per layer from the prefill's max) or token-head (one per token per KV head)");
    cmd->add_option("--weight-dtype", o->weight_dtype,
                    "How the matmuls read the weights: fp32, bf16, fp16, q8_0 (widened in the kernels); a comma list compares them "
                    "(speed, and quality against fp32 on the same tokens)")
        ->capture_default_str();
    cmd->add_flag("--no-quality", o->no_quality,
                  "Run a --kv-dtype, --weight-dtype, --window or --sink-tokens policy alone, without the fp32 model beside it on the "
                  "same tokens: speed and memory only, no logit error")
        ->excludes(eval);
    cmd->add_option("--window", o->window, "Every layer keeps only its last W positions (a ring), measured against the full cache")
        ->check(given_nonzero("expected a positive number of positions"));
    cmd->add_option("--sink-tokens", o->sink_tokens, "StreamingLLM: the window also keeps the first S positions (S < W)");
    add_choice(cmd, "--sink-positions", o->sink_positions, sink_positions_choices,
               "Where attention places the sinks once keys are evicted: text (their positions in the text) or cache (their slots "
               "in the cache, as StreamingLLM does)");
    add_choice(cmd, "--kernel", o->kernel, forward_kernel_choices,
               "fast (threaded, vectorised), or reference: also run the readable src/model/reference.cpp on the same tokens and "
               "report both speeds and whether it picks the same tokens")
        ->excludes(eval);
    auto* mla = add_choice(cmd, "--mla", o->mla_path, mla_path_choices, "MLA models: naive (decompress every cached latent into K and V "
                           "each step) or absorbed (W_UK folded into the query, W_UV into the output: attention reads the latents)");
    add_units_option(cmd, o->units);
    add_format_option(cmd, o->format);
    add_cost_options(cmd, *o);
    cmd->footer(simulate_examples);
    auto* mode_opt = cmd->get_option("--mode");
    cmd->callback([o, prompt, prompt_len, kv_scale, mode_opt, mla] {
        o->mla_given = mla->count() > 0;
        o->prompt_len_given = prompt_len->count() > 0;
        o->kv_scale_given = kv_scale->count() > 0;
        o->mode_given = mode_opt->count() > 0;
        o->prompt_given = prompt->count() > 0;
        run(*o);
    });
}

}  // namespace kvlab::cli
