// `kvlab simulate`: decode one prompt with and without the KV cache on a random-weight model of any
// preset's shape, counting FLOPs and bytes per step; prints the side-by-side totals, writes a trace.
#include <atomic>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <unistd.h>

#include <Eigen/Core>
#include <fmt/format.h>
#include <omp.h>

#include "commands.hpp"
#include "kvlab/error.hpp"
#include "kvlab/presets.hpp"
#include "kvlab/random_weights.hpp"
#include "kvlab/simulation_report.hpp"
#include "kvlab/simulator.hpp"
#include "kvlab/step_trace.hpp"
#include "kvlab/units.hpp"

namespace kvlab::cli {

struct SimulateCliOptions {
    std::string model = "stories15m";  // preset name or path to a config.json
    std::string config;                // a config.json or a directory holding one
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

std::atomic<bool> g_stop{false};
static_assert(std::atomic<bool>::is_always_lock_free, "the SIGINT flag must be lock-free");

extern "C" void on_sigint(int) {
    g_stop.store(true);
    std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C kills at once
}

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

void run(const SimulateCliOptions& o, bool model_given, bool prompt_len_given) {
    if (model_given && !o.config.empty()) throw UsageError("--config and --model: give one or the other, not both");
    if (prompt_len_given && !o.prompt_ids.empty())
        throw UsageError("--prompt-len and --prompt-ids: give one or the other, not both");
    const Format format = parse_format(o.format, "--format");
    UnitSystem units = UnitSystem::iec;
    if (o.units == "si") units = UnitSystem::si;
    else if (o.units != "iec") throw UsageError(fmt::format("--units: '{}'; expected iec or si", o.units));
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
    const ModelConfig full = o.config.empty() ? load_model(o.model) : load_model_config(o.config);
    const ModelConfig cfg = simulation_config(full, o.layers > 0 ? std::optional<std::int64_t>(o.layers) : std::nullopt);
    if (o.layers < 0) throw UsageError(fmt::format("--layers: {}; expected 1..{}", o.layers, full.n_layer));
    SimulateOptions sim;
    sim.mode = parse_sim_mode(o.mode, "--mode");
    sim.n_prompt = o.prompt_len;
    if (!o.prompt_ids.empty()) sim.prompt_ids = parse_token_ids(o.prompt_ids);
    sim.n_steps = o.steps;
    sim.sampler = {o.temperature, o.top_k, o.top_p, o.seed};
    sim.seed = o.seed;
    const std::int64_t n_positions = simulation_positions(cfg, sim);
    if (!o.trace.empty()) check_trace_writable(o.trace);
    const std::uint64_t max_memory =
        o.max_memory.empty() ? physical_memory_bytes() / 4 * 3 : parse_size(o.max_memory, "--max-memory");
    const MemoryEstimate memory = check_simulation_memory(cfg, n_positions, sim.mode, max_memory);

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
        {"weights", fmt::format("random N(0, {}), norms 1, seed {}", default_weight_sigma, o.seed)},
        {"temperature", o.temperature},
        {"top_k", o.top_k},
        {"top_p", o.top_p},
        {"threads", omp_get_max_threads()},
        {"memory_estimate_bytes", memory.total()},
    };

    const Weights weights = random_weights(cfg, o.seed);

    // progress on stderr only when a person watches it
    const bool show_progress = !o.quiet && ::isatty(STDERR_FILENO);
    auto last_print = std::chrono::steady_clock::now();
    if (show_progress)
        sim.on_step = [&](std::int64_t done, std::int64_t total) {
            const auto now = std::chrono::steady_clock::now();
            if (done < total && now - last_print < std::chrono::milliseconds(100)) return;
            last_print = now;
            std::fprintf(stderr, "\rsimulate: step %lld/%lld", static_cast<long long>(done), static_cast<long long>(total));
            std::fflush(stderr);
        };
    g_stop.store(false);
    sim.stop = &g_stop;
    const auto previous = std::signal(SIGINT, on_sigint);
    SimulationResult result;
    try {
        result = run_simulation(cfg, weights, sim);
    } catch (...) {
        std::signal(SIGINT, previous);
        throw;
    }
    std::signal(SIGINT, previous);
    if (show_progress) std::fprintf(stderr, "\r\033[K");

    const RunSummary summary = run_summary(cfg, sim, result);
    if (!o.trace.empty()) write_step_trace(o.trace, summary, result.records, inputs, o.deterministic);
    print_report(std::cout, simulation_report(summary, result.records, inputs, units), format);
    std::cout.flush();
    if (result.first_divergent_step)
        throw Error(fmt::format("cached and uncached logits diverge at step {}: max |delta logit| {:.3g} > tolerance {:.3g}",
                                *result.first_divergent_step, result.divergent_dlogit, result.divergent_tolerance));
}

}  // namespace

void setup_simulate(CLI::App& app) {
    auto o = std::make_shared<SimulateCliOptions>();
    auto* cmd = app.add_subcommand("simulate", "Decode with and without the KV cache on a CPU transformer, counting FLOPs and bytes per step");
    auto* model = cmd->add_option("-m,--model", o->model, "Preset name, or a path to a config.json")->capture_default_str();
    cmd->add_option("-c,--config", o->config, "A Hugging Face config.json, or a directory holding one (instead of --model)");
    cmd->add_option("--layers", o->layers, "Simulate only the first N layers, at their real shapes (0 = all)")->capture_default_str();
    cmd->add_option("--mode", o->mode, "cached, uncached or both (same tokens, logits compared)")->capture_default_str();
    auto* prompt_len = cmd->add_option("-p,--prompt-len", o->prompt_len, "Prompt length in tokens (random ids from --seed)")->capture_default_str();
    cmd->add_option("--prompt-ids", o->prompt_ids, "Comma-separated prompt token ids (instead of --prompt-len)");
    cmd->add_option("-n,--steps", o->steps, "Tokens to generate; step 0 is the prefill")->capture_default_str();
    cmd->add_option("--temperature", o->temperature, "Sampling temperature (0 = greedy)")->capture_default_str();
    cmd->add_option("--top-k", o->top_k, "Keep the k most likely tokens (0 = off)")->capture_default_str();
    cmd->add_option("--top-p", o->top_p, "Nucleus sampling threshold (1 = off)")->capture_default_str();
    cmd->add_option("-s,--seed", o->seed, "Seed for weights, prompt and sampler")->capture_default_str();
    cmd->add_option("--trace", o->trace, "Write one record per step per mode to FILE.csv, FILE.jsonl or FILE.json (Perfetto timeline)");
    cmd->add_flag("--deterministic", o->deterministic, "Omit wall time from the trace, modelled time in Perfetto (byte-identical reruns)");
    cmd->add_flag("-q,--quiet", o->quiet, "No progress line on stderr");
    cmd->add_option("--max-memory", o->max_memory, "Refuse runs whose weights + KV + activations exceed this, e.g. 8GiB (default: 75% of RAM)");
    cmd->add_option("--threads", o->threads, "Threads for matmuls and attention (0 = all cores, fewer when the machine is busy)")->capture_default_str();
    cmd->add_option("--units", o->units, "iec (KiB/MiB/GiB) or si (KB/MB/GB)")->capture_default_str();
    cmd->add_option("-f,--format", o->format, "table, csv, json or markdown")->capture_default_str();
    cmd->callback([o, model, prompt_len] { run(*o, model->count() > 0, prompt_len->count() > 0); });
}

}  // namespace kvlab::cli
