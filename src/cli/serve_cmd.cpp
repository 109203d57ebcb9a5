// `kvlab serve`: many requests through one KV pool on the CPU transformer, paged against contiguous,
// with continuous batching, chunked prefill, preemption and prefix sharing; prints the layouts side by
// side and writes a trace.
#include <atomic>
#include <cstdio>
#include <iostream>
#include <memory>
#include <unistd.h>

#include "commands.hpp"
#include "options.hpp"
#include "core/interrupt.hpp"
#include "session/serve_session.hpp"

namespace kvlab::cli {

namespace {

void run(const ServeCommand& command) {
    const PreparedServe p = prepare_serve(command);
    std::atomic<bool> stop{false};
    std::vector<ServeResult> results, fp32_results;
    {
        const StopOnInterrupt stop_on_interrupt(stop);
        // a progress line on a terminal, cleared however the runs end
        const bool progress = !command.quiet && ::isatty(STDERR_FILENO);
        struct ClearLine {
            bool on;
            ~ClearLine() {
                if (on) std::fprintf(stderr, "\r\033[K");
            }
        } clear{progress};
        auto run_all = [&](const std::vector<ServeOptions>& runs, std::vector<ServeResult>& out, const char* what) {
            for (ServeOptions o : runs) {
                if (progress)
                    std::fprintf(stderr, "\rserve: %s layout%s, %zu requests...\033[K",
                                 std::string(choice_name(kv_layout_choices, o.pool.layout)).c_str(), what, p.requests.size());
                o.stop = &stop;
                out.push_back(run_serving(p.config, p.weights, p.requests, o));
                if (out.back().interrupted) return;
            }
        };
        run_all(p.runs, results, "");
        if (results.size() == p.runs.size() && !results.back().interrupted) run_all(p.fp32_runs, fp32_results, " (fp32 pool)");
    }
    std::vector<ServeOptions> runs(p.runs.begin(), p.runs.begin() + static_cast<std::ptrdiff_t>(results.size()));
    if (fp32_results.size() < p.fp32_runs.size() || (!fp32_results.empty() && fp32_results.back().interrupted)) fp32_results.clear();
    PreparedServe shown{p.command, p.config, {}, std::nullopt, p.requests, runs, p.fp32_runs, p.token_bytes, p.pool_bytes, p.inputs, p.gpu};
    print_report(std::cout, serve_outcome(shown, results, fp32_results), command.format);
    std::cout.flush();
    check_serve_outcome(shown, results);
}

// What a preemption does with K and V (docs/serving.md, "Swap or recompute").
void add_preempt_options(CLI::App* cmd, ServeCommand& o) {
    add_choice(cmd, "--preempt", o.preempt, preempt_mode_choices,
               "What a preemption does with a sequence's K and V: recompute (discard them) or swap (copy them to host memory and back)");
    cmd->add_option("--host-kv-budget", o.host_kv_budget, "--preempt swap: host memory for swapped-out K and V, e.g. 64MiB (default: the KV pool's size)");
    cmd->add_option("--host-bandwidth", o.host_bandwidth,
                    "--preempt swap: the host link per direction, e.g. 25GB/s, for the modelled swap time (default: PCIe 4.0 x16, 31.5 GB/s)");
}

// Several outputs per request (--n, --beam-width) and how each token is chosen (docs/serving.md, "Several outputs").
void add_outputs_options(CLI::App* cmd, ServeCommand& o) {
    auto* n_opt = cmd->add_option("--n", o.n, "Outputs per request (parallel sampling), sharing the prompt's blocks; paged layout")->capture_default_str();
    cmd->add_option("--beam-width", o.beam_width, "Beam search: the W most likely sequences by cumulative log-probability; paged layout")
        ->capture_default_str()
        ->excludes(n_opt);
    cmd->add_option("--temperature", o.sampling.temperature, "Sampling temperature (0 = greedy); seeded by --seed")->capture_default_str();
    cmd->add_option("--top-k", o.sampling.top_k, "Sample among the k most likely tokens (0 = off)")->capture_default_str();
    cmd->add_option("--top-p", o.sampling.top_p, "Sample among the smallest set of tokens whose probability reaches p (1 = off)")->capture_default_str();
    add_choice(cmd, "--sampler", o.sampling.rule, sampler_rule_choices,
               "Sampling rule and generator: kvlab (its own, with top-k) or llama2c (run.c's rule and xorshift generator; each output "
               "seeded as docs/serving.md says)");
    cmd->add_option("--stop", o.stop, "An output stops when its text reaches STR (repeatable; needs a tokenizer; beams run to max_tokens)");
    cmd->add_flag("--ignore-eos", o.ignore_eos, "--workload requests generate max_tokens even after a trained model writes end-of-text (a synthetic workload always does)");
}

}  // namespace

void setup_serve(CLI::App& app) {
    auto o = std::make_shared<ServeCommand>();
    auto* cmd = app.add_subcommand("serve", "Serve many requests through one KV-cache pool on a CPU transformer: paged vs contiguous, "
                                            "continuous batching, chunked prefill, preemption, prefix sharing");
    auto* model = input_file(cmd->add_option("-m,--model", o->source.model, "Preset name, or a path to a config.json"))->capture_default_str();
    auto* config = input_file(cmd->add_option("-c,--config", o->source.config, "A Hugging Face config.json, or a directory holding one (instead of --model)"))->excludes(model);
    input_file(cmd->add_option("--checkpoint", o->source.checkpoint, "Real weights: a llama2.c .bin or a Hugging Face directory (instead of --model/--config)"))
        ->excludes(model)
        ->excludes(config);
    input_file(cmd->add_option("--tokenizer", o->source.tokenizer, "llama2.c tokenizer.bin: text prompts in a --workload file"));
    cmd->add_option("--layers", o->layers, "Run only the first N layers, at their real shapes (0 = all)")->capture_default_str();
    // workload
    auto* requests = cmd->add_option("--requests", o->requests, "Synthetic workload: number of requests")->capture_default_str();
    auto* prompt_len = cmd->add_option("--prompt-len", o->prompt_len, "Prompt length range A..B in tokens, after the shared prefix (uniform)")
                           ->capture_default_str();
    auto* output_len = cmd->add_option("--output-len", o->output_len, "Tokens each request generates, range A..B (uniform)")->capture_default_str();
    auto* rate = cmd->add_option("--arrival-rate", o->arrival_rate, "Requests arriving per step, a Poisson process (0 = all at step 0)")
                     ->capture_default_str();
    auto* arrival = cmd->add_option("--arrival", o->arrival, "bursty:SIZE/EVERY: SIZE requests arrive together every EVERY steps, e.g. bursty:8/50 "
                                                             "(instead of --arrival-rate)")
                        ->excludes(rate);
    auto* prefix = cmd->add_option("--shared-prefix", o->shared_prefix, "Tokens common to every prompt (a system prompt), before its own")
                       ->capture_default_str();
    input_file(cmd->add_option("--workload", o->workload,
                    "JSONL file, one request per line: {\"prompt\": text | \"prompt_ids\": [...], \"max_tokens\": N, \"arrival_step\": S}"))
        ->excludes(requests)
        ->excludes(prompt_len)
        ->excludes(output_len)
        ->excludes(rate)
        ->excludes(arrival)
        ->excludes(prefix);
    cmd->add_option("-s,--seed", o->seed, "Seed for the synthetic workload and random weights")->capture_default_str();
    // pool
    auto* budget = cmd->add_option("--kv-budget", o->kv_budget, "KV pool size in bytes, e.g. 2MiB (default: room for 4 sequences of --max-model-len)");
    cmd->add_option("--kv-blocks", o->kv_blocks, "KV pool size in blocks of --block-size tokens (instead of --kv-budget)")
        ->excludes(budget)
        ->check(given_nonzero("expected at least 1"));
    add_choice(cmd, "--kv-layout", o->layout, layout_choices, "paged (blocks on demand), contiguous (reserved up front) or both, side by side");
    cmd->add_option("--block-size", o->block_size, "Tokens per paged block")->capture_default_str();
    add_choice(cmd, "--reserve", o->reserve, reserve_rule_choices,
               "Contiguous: each request reserves max-len (--max-model-len, a static cache) or request (its prompt + output length)");
    cmd->add_option("--max-model-len", o->max_model_len, "Most positions a request may use (0 = the model's context)")->capture_default_str();
    cmd->add_flag("--prefix-cache", o->prefix_cache, "Paged: share full blocks of identical prefixes by reference count (copy-on-write)");
    cmd->add_option("--kv-dtype", o->kv_dtype,
                    "How the pool stores K and V: fp32, fp16, bf16, fp8_e4m3, fp8_e5m2, int8, q8_0, q4_0 (as simulate --kv-dtype); a narrow "
                    "pool is also run at fp32 in the same budget, and its logits compared with fp32's")
        ->capture_default_str();
    auto* kv_scale = add_choice(cmd, "--kv-scale", o->kv_scale, kv_scale_choices,
                                "fp8/int8 scales: tensor (one per layer from the first prefill's max) or token-head (one per token per KV head)");
    add_preempt_options(cmd, *o);
    // scheduler
    cmd->add_option("--max-batched-tokens", o->max_batched_tokens, "Tokens per step: decodes plus prompt chunks (chunked prefill)")
        ->capture_default_str();
    cmd->add_option("--max-seqs", o->max_seqs, "Sequences per step")->capture_default_str();
    add_outputs_options(cmd, *o);
    cmd->add_flag("--check", o->check, "Check every request against a solo run of the single-sequence path (tokens and logits)");
    output_file(cmd->add_option("--trace", o->trace, "Write one record per step per layout to FILE.csv or FILE.jsonl, or a Perfetto timeline FILE.json"));
    output_file(cmd->add_option("--plot", o->plot, "Also draw the run's chart (KV use, utilization, requests, time, modelled GPU time): FILE.svg or FILE.png"));
    cmd->add_option("--gpu", o->gpu, "GPU preset the modelled time is for (kvlab presets --gpus lists them)")->capture_default_str();
    cmd->add_flag("--deterministic", o->deterministic, "Omit wall time from the trace, modelled time in Perfetto");
    cmd->add_flag("-q,--quiet", o->quiet, "No progress line on stderr");
    cmd->add_option("--max-memory", o->max_memory, "Refuse runs whose weights + KV pool + buffers exceed this, e.g. 8GiB (default: 75% of RAM; at most the RAM)");
    cmd->add_flag("--force-memory", o->force_memory, "Allow a --max-memory above the machine's physical memory");
    cmd->add_option("--threads", o->threads, "Threads for matmuls and attention (0 = all cores)")->capture_default_str();
    add_units_option(cmd, o->units);
    add_format_option(cmd, o->format);
    cmd->footer("Examples:\n  kvlab serve -m tiny-llama --requests 32 --kv-layout both\n"
                "  kvlab serve -m tiny-llama --requests 16 --shared-prefix 64 --prefix-cache --kv-layout paged\n"
                "  kvlab serve -m tiny-llama --requests 32 --arrival bursty:8/50 --plot serve.svg\n"
                "  kvlab serve -m tiny-gpt2 --requests 8 --check --trace serve.json\n"
                "  kvlab serve -m tiny-llama --requests 16 --kv-budget 1MiB --preempt swap --check\n"
                "  kvlab serve -m tiny-llama --requests 16 --kv-budget 1MiB --kv-dtype q8_0\n"
                "  kvlab serve -m tiny-llama --requests 1 --shared-prefix 200 --prompt-len 6 --output-len 16 --beam-width 4 --kv-layout paged --check");
    cmd->callback([o, kv_scale] {
        o->kv_scale_given = kv_scale->count() > 0;
        run(*o);
    });
}

}  // namespace kvlab::cli
