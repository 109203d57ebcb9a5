#include "session/serve_session.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

#include <fmt/format.h>
#include <omp.h>

#include "core/atomic_write.hpp"
#include "kvlab/calc/gpu_specs.hpp"
#include "kvlab/calc/kv_memory.hpp"
#include "report/gnuplot.hpp"
#include "kvlab/core/checked.hpp"
#include "kvlab/core/error.hpp"
#include "core/json_input.hpp"
#include "kvlab/core/mapped_file.hpp"
#include "kvlab/core/text.hpp"
#include "kvlab/weights/random_weights.hpp"
#include "kvlab/sim/simulator.hpp"
#include "kvlab/weights/tensor_table.hpp"
#include "kvlab/model/transformer.hpp"
#include "serve/swap.hpp"
#include "session/serve_stop.hpp"
#include "serve/workload.hpp"
#include "trace/serve_trace.hpp"
#include "trace/step_trace.hpp"

namespace kvlab {

namespace {

struct Range {
    std::int64_t lo = 0, hi = 0;
};

// "A..B" or "N": whole tokens, 1 <= A <= B.
Range parse_range(const std::string& text, std::string_view flag) {
    const auto bad = [&] {
        return UsageError(fmt::format("{}: {} is not a length range; expected A..B or N, whole tokens >= 1 (e.g. 16..128)", flag, quote(text)));
    };
    const auto dots = text.find("..");
    auto number = [&](std::string_view s) {
        std::int64_t v = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec != std::errc() || end != s.data() + s.size() || s.empty()) throw bad();
        return v;
    };
    const Range r = dots == std::string::npos ? Range{number(text), number(text)}
                                              : Range{number(std::string_view(text).substr(0, dots)), number(std::string_view(text).substr(dots + 2))};
    if (r.lo < 1 || r.hi < r.lo) throw bad();
    return r;
}

// Token rows the pool holds: (--kv-budget bytes less the per-tensor scales) / one token's bytes at the
// stored width, or --kv-blocks, or the bytes of four fp32 sequences of max_model_len (so a narrow pool
// gets more rows in the same default bytes); whole blocks of block_size (the same rows for both layouts).
std::int64_t pool_rows(const ServeCommand& c, const ModelConfig& cfg, const KvStorage& storage, std::int64_t max_model_len) {
    const auto B = static_cast<std::uint64_t>(c.block_size);
    const std::uint64_t token_bytes = kv_stored_token_bytes(storage, cfg), scales = kv_resident_bytes(cfg, storage, 0);
    const std::string dtype(dtype_name(storage.dtype));
    std::uint64_t rows = 0;
    if (!c.kv_budget.empty()) {
        const std::uint64_t budget = parse_size(c.kv_budget, "--kv-budget");
        rows = budget > scales ? (budget - scales) / token_bytes / B * B : 0;
        if (rows == 0)
            throw UsageError(fmt::format("--kv-budget: {} holds no block of {} tokens ({} per token: {}, every layer, {}); expected at least {}",
                                         c.kv_budget, c.block_size, format_bytes(token_bytes, UnitSystem::iec), cfg.mla ? "the MLA latent" : "K and V", dtype,
                                         format_bytes(token_bytes * B + scales, UnitSystem::iec)));
    } else if (c.kv_blocks != 0) {
        if (c.kv_blocks < 0) throw UsageError(fmt::format("--kv-blocks: {}; expected at least 1", c.kv_blocks));
        rows = checked_mul(static_cast<std::uint64_t>(c.kv_blocks), B, "--kv-blocks x --block-size");
    } else {
        const std::uint64_t fp32_rows = (4 * static_cast<std::uint64_t>(max_model_len) + B - 1) / B * B;
        rows = checked_mul(fp32_rows, kv_stored_token_bytes({}, cfg), "KV pool bytes") / token_bytes / B * B;
    }
    const std::uint64_t bytes = checked_mul(rows, kv_stored_token_bytes(storage, cfg), "KV pool bytes");
    if (rows > static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max()))
        throw UsageError(fmt::format("--kv-budget/--kv-blocks: a pool of {} token rows ({}); expected at most 2^31 rows",
                                     rows, format_bytes(bytes, UnitSystem::iec)));
    return static_cast<std::int64_t>(rows);
}

// --arrival "bursty:SIZE/EVERY": SIZE requests arrive together every EVERY steps, whole numbers >= 1.
Range parse_burst(const std::string& text) {
    const auto bad = [&] {
        return UsageError(fmt::format("--arrival: {} is not an arrival pattern; expected bursty:SIZE/EVERY, whole numbers >= 1 "
                                      "(e.g. bursty:8/50: 8 requests every 50 steps); Poisson arrivals are --arrival-rate", quote(text)));
    };
    constexpr std::string_view kind = "bursty:";
    const auto slash = text.find('/');
    if (text.rfind(kind, 0) != 0 || slash == std::string::npos) throw bad();
    auto number = [&](std::string_view s) {
        std::int64_t v = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec != std::errc() || end != s.data() + s.size() || s.empty() || v < 1) throw bad();
        return v;
    };
    const std::string_view t(text);
    return {number(t.substr(kind.size(), slash - kind.size())), number(t.substr(slash + 1))};
}

// The step request i arrives at: a Poisson process of `rate` per step (`t` its running arrival time), or bursts.
std::int64_t arrival_step(const ServeCommand& c, const std::optional<Range>& burst, std::int64_t i, double& t, std::mt19937_64& rng) {
    if (burst) {
        const std::int64_t burst_index = i / burst->lo;
        if (burst_index > max_arrival_step / burst->hi)
            throw UsageError(fmt::format("--arrival: {} puts request {} past step 2^40; expected bursts closer together", c.arrival, i));
        return burst_index * burst->hi;
    }
    if (c.arrival_rate > 0 && i > 0) t += std::exponential_distribution<double>(c.arrival_rate)(rng);  // the first arrives at step 0
    if (t > static_cast<double>(max_arrival_step))
        throw UsageError(fmt::format("--arrival-rate: {} requests per step puts request {} past step 2^40; expected a higher rate",
                                     c.arrival_rate, i));
    return static_cast<std::int64_t>(t);
}

}  // namespace

double parse_bandwidth(const std::string& text, std::string_view flag) {
    std::string t = text;
    while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
    if (t.size() < 3 || (t.substr(t.size() - 2) != "/s" && t.substr(t.size() - 2) != "/S"))
        throw UsageError(fmt::format("{}: {} is not a bandwidth; expected a size per second with its unit, e.g. 25GB/s or 16GiB/s", flag, quote(text)));
    return static_cast<double>(parse_size(t.substr(0, t.size() - 2), flag));
}

std::vector<ServeRequest> synthetic_workload(const ModelConfig& cfg, const ServeCommand& c) {
    if (c.requests < 1) throw UsageError(fmt::format("--requests: {}; expected at least 1", c.requests));
    if (c.shared_prefix < 0) throw UsageError(fmt::format("--shared-prefix: {}; expected 0 or more tokens", c.shared_prefix));
    if (!(c.arrival_rate >= 0.0) || !std::isfinite(c.arrival_rate))
        throw UsageError(fmt::format("--arrival-rate: {}; expected requests per step >= 0 (0: all at once)", c.arrival_rate));
    const Range prompt = parse_range(c.prompt_len, "--prompt-len"), output = parse_range(c.output_len, "--output-len");
    // bounded before anything is generated: a request must fit the model's context
    if (c.requests > 1'000'000) throw UsageError(fmt::format("--requests: {}; expected at most 1000000", c.requests));
    if (c.shared_prefix > cfg.n_ctx_max || prompt.hi > cfg.n_ctx_max - c.shared_prefix || output.hi > cfg.n_ctx_max)
        throw UsageError(fmt::format("--shared-prefix {} + --prompt-len {} + --output-len {}: the longest request exceeds the {} positions of {}",
                                     c.shared_prefix, c.prompt_len, c.output_len, cfg.n_ctx_max, cfg.name));
    std::mt19937_64 rng(c.seed);
    std::uniform_int_distribution<TokenId> token(0, static_cast<TokenId>(cfg.n_vocab - 1));
    std::vector<TokenId> prefix(static_cast<std::size_t>(c.shared_prefix));
    for (TokenId& t : prefix) t = token(rng);
    if (!c.arrival.empty() && c.arrival_rate > 0) throw UsageError("--arrival excludes --arrival-rate");
    const std::optional<Range> burst = c.arrival.empty() ? std::nullopt : std::optional<Range>(parse_burst(c.arrival));
    double t_arrival = 0.0;
    std::vector<ServeRequest> reqs;
    for (std::int64_t i = 0; i < c.requests; ++i) {
        ServeRequest r;
        r.prompt = prefix;
        const std::int64_t own = std::uniform_int_distribution<std::int64_t>(prompt.lo, prompt.hi)(rng);
        for (std::int64_t j = 0; j < own; ++j) r.prompt.push_back(token(rng));
        r.max_tokens = std::uniform_int_distribution<std::int64_t>(output.lo, output.hi)(rng);
        r.arrival_step = arrival_step(c, burst, i, t_arrival, rng);
        reqs.push_back(std::move(r));
    }
    return reqs;
}

namespace {

// --kv-dtype and --kv-scale: one of simulate's formats.
KvStorage serve_kv_storage(const ServeCommand& c, const ModelConfig& cfg) {
    if (c.kv_dtype.find(',') != std::string::npos)
        throw UsageError(fmt::format("--kv-dtype: {} lists several formats; serve runs one pool format at a time (simulate compares several)",
                                     quote(c.kv_dtype)));
    const KvStorage storage{parse_dtype(c.kv_dtype, "--kv-dtype"), c.kv_scale};
    check_kv_storage(storage, cfg.d_kv());
    if (c.kv_scale_given && !storage.scaled())
        throw UsageError(fmt::format("--kv-scale: scales apply to fp8_e4m3, fp8_e5m2 and int8 pools; --kv-dtype {} has none", c.kv_dtype));
    return storage;
}

struct PreemptOptions {
    std::uint64_t host_bytes = 0;
    double bytes_per_s = 0.0;
};

// --host-kv-budget and --host-bandwidth: swap preemption's host tier (given without --preempt swap: refused).
PreemptOptions preempt_options(const ServeCommand& c, std::uint64_t pool_bytes) {
    if (c.preempt != PreemptMode::swap) {
        if (!c.host_kv_budget.empty() || !c.host_bandwidth.empty())
            throw UsageError(fmt::format("{}: the host tier is swap preemption's; expected --preempt swap with it",
                                         c.host_kv_budget.empty() ? "--host-bandwidth" : "--host-kv-budget"));
        return {};
    }
    PreemptOptions o;
    o.host_bytes = c.host_kv_budget.empty() ? pool_bytes : parse_size(c.host_kv_budget, "--host-kv-budget");
    o.bytes_per_s = c.host_bandwidth.empty() ? pcie4_x16_bytes_per_s : parse_bandwidth(c.host_bandwidth, "--host-bandwidth");
    if (!(o.bytes_per_s > 0)) throw UsageError(fmt::format("--host-bandwidth: {}; expected more than 0 bytes per second", c.host_bandwidth));
    return o;
}

// What the run holds at once (one layout runs at a time), refused above --max-memory before anything is allocated.
std::uint64_t check_serve_memory(const ServeCommand& c, const ModelConfig& cfg, const PreparedServe& p, std::int64_t rows,
                                 std::int64_t max_model_len) {
    // what the run holds at once (one layout runs at a time): the weights, the pool, the batched forward's
    // buffers; with --check, the solo run's and the logits kept for the running requests' tokens
    const std::uint64_t max_memory = max_memory_allowed(c.max_memory, c.force_memory);
    std::uint64_t memory = checked_add(weights_bytes(cfg), checked_mul(static_cast<std::uint64_t>(rows), p.token_bytes, "KV pool bytes"),
                                       "memory estimate");
    memory = checked_add(memory, p.runs.front().host_kv_bytes, "memory estimate");  // --preempt swap: the host tier, at most
    memory = checked_add(memory, Transformer::activation_bytes(cfg, {max_model_len, c.max_batched_tokens, false, false, c.max_seqs}),
                         "memory estimate");
    if (c.check) {
        std::int64_t longest_prompt = 1, most_tokens = 1;
        for (const ServeRequest& r : p.requests) {
            longest_prompt = std::max<std::int64_t>(longest_prompt, std::ssize(r.prompt));
            most_tokens = std::max(most_tokens, r.max_tokens);
        }
        memory = checked_add(memory, Transformer::activation_bytes(cfg, {max_model_len, longest_prompt, false}), "memory estimate");
        const std::uint64_t logits = checked_mul(checked_mul(static_cast<std::uint64_t>(c.max_seqs), static_cast<std::uint64_t>(most_tokens), "memory estimate"),
                                                 checked_mul(static_cast<std::uint64_t>(cfg.n_vocab), sizeof(float), "memory estimate"), "memory estimate");
        memory = checked_add(memory, logits, "memory estimate");
    }
    if (memory > max_memory)
        throw UsageError(fmt::format("--max-memory: the weights of {}, the {} KV pool and the batch's buffers{} need {}, more than the {} "
                                     "allowed; try --layers, a smaller --kv-budget or --max-seqs",
                                     cfg.display_name, format_bytes(static_cast<std::uint64_t>(rows) * p.token_bytes, UnitSystem::iec),
                                     c.check ? " (and --check's logits)" : "", format_bytes(memory, UnitSystem::iec),
                                     format_bytes(max_memory, UnitSystem::iec)));
    return memory;
}

// The outputs and sampling flags, when any is not its default (a greedy single-output run's inputs are as before).
void add_outputs_inputs(nlohmann::json& inputs, const ServeCommand& c) {
    if (c.n != 1) inputs["n"] = c.n;
    if (c.beam_width != 1) inputs["beam_width"] = c.beam_width;
    if (c.sampling.temperature != 0.0) inputs["temperature"] = c.sampling.temperature;
    if (c.sampling.top_k != 0) inputs["top_k"] = c.sampling.top_k;
    if (c.sampling.top_p != 1.0) inputs["top_p"] = c.sampling.top_p;
    if (c.sampling.rule != SamplerRule::kvlab) inputs["sampler"] = std::string(choice_name(sampler_rule_choices, c.sampling.rule));
}

// The report's and trace's "inputs": every value the run used.
nlohmann::json serve_inputs(const ServeCommand& c, const ModelConfig& cfg, const PreparedServe& p, std::int64_t rows,
                            std::int64_t max_model_len, std::uint64_t memory) {
    std::int64_t prompt_tokens = 0, output_tokens = 0;
    for (const ServeRequest& r : p.requests) {
        prompt_tokens += std::ssize(r.prompt);
        output_tokens += r.max_tokens;
    }
    nlohmann::json inputs = {
        {"command", "serve"},
        {"model", cfg.name},
        {"model_source", cfg.source},
        {"family", cfg.family == Family::gpt2 ? "gpt2" : "llama"},
        {"layers", cfg.n_layer},
        {"weights", c.source.checkpoint.empty() ? fmt::format("random N(0, {}), norms 1, seed {}", default_weight_sigma, c.seed)
                                                : c.source.checkpoint},
        {"workload", c.workload.empty() ? "synthetic" : c.workload},
        {"requests", std::ssize(p.requests)},
        {"prompt_tokens", prompt_tokens},
        {"max_output_tokens", output_tokens},
        {"kv_layout", std::string(choice_name(layout_choices, c.layout))},
        {"kv_row", cfg.mla ? "mla latent" : "k and v"},  // what one token row of the pool holds
        {"pool_rows", rows},
        {"pool_bytes", p.pool_bytes},
        {"token_bytes", p.token_bytes},
        {"kv_dtype", std::string(dtype_name(p.runs.front().kv_storage.dtype))},
        {"preempt", std::string(choice_name(preempt_mode_choices, c.preempt))},
        {"block_size", c.block_size},
        {"reserve", std::string(choice_name(reserve_rule_choices, c.reserve))},
        {"max_model_len", max_model_len},
        {"prefix_cache", c.prefix_cache},
        {"max_batched_tokens", c.max_batched_tokens},
        {"max_seqs", c.max_seqs},
        {"seed", c.seed},
        {"threads", omp_get_max_threads()},
        {"check", c.check},
        {"memory_estimate_bytes", memory},
        {"gpu", p.gpu.name},
    };
    if (c.workload.empty()) {
        inputs["prompt_len"] = c.prompt_len;
        inputs["output_len"] = c.output_len;
        inputs["arrival_rate"] = c.arrival_rate;
        if (!c.arrival.empty()) inputs["arrival"] = c.arrival;
        inputs["shared_prefix"] = c.shared_prefix;
    }
    if (!c.source.tokenizer.empty()) inputs["tokenizer"] = c.source.tokenizer;
    if (p.runs.front().kv_storage.scaled()) inputs["kv_scale"] = std::string(choice_name(kv_scale_choices, c.kv_scale));
    if (c.preempt == PreemptMode::swap) {
        inputs["host_kv_bytes"] = p.runs.front().host_kv_bytes;
        inputs["host_bytes_per_s"] = p.runs.front().host_bytes_per_s;
    }
    add_outputs_inputs(inputs, c);
    std::int64_t own_n = 0;  // the most outputs a workload line asks for itself ("n")
    for (const ServeRequest& r : p.requests) own_n = std::max(own_n, r.n);
    if (own_n > 0) inputs["request_n_max"] = own_n;
    return inputs;
}

}  // namespace

PreparedServe prepare_serve(ServeCommand c) {
    PreparedServe p;
    const ModelConfig full = resolve_model(c.source);
    set_thread_count(c.threads, c.deterministic);
    if (c.layers < 0) throw UsageError(fmt::format("--layers: {}; expected 1..{}", c.layers, full.n_layer));
    ModelConfig cfg = simulation_config(full, c.layers > 0 ? std::optional<std::int64_t>(c.layers) : std::nullopt);
    if (c.block_size < 1 || c.block_size > 1024) throw UsageError(fmt::format("--block-size: {}; expected 1..1024 tokens", c.block_size));
    const std::int64_t max_model_len = c.max_model_len == 0 ? cfg.n_ctx_max : c.max_model_len;
    if (max_model_len < 1 || max_model_len > cfg.n_ctx_max)
        throw UsageError(fmt::format("--max-model-len: {}; expected 1..{} (the context of {})", c.max_model_len, cfg.n_ctx_max, cfg.name));
    if (!c.source.tokenizer.empty()) p.tokenizer.emplace(Tokenizer::load(c.source.tokenizer, full.n_vocab));
    p.requests = c.workload.empty() ? synthetic_workload(cfg, c) : read_workload(c.workload, cfg, p.tokenizer ? &*p.tokenizer : nullptr);
    const KvStorage storage = serve_kv_storage(c, cfg);
    p.token_bytes = kv_stored_token_bytes(storage, cfg);
    const std::int64_t rows = pool_rows(c, cfg, storage, max_model_len);
    p.pool_bytes = checked_add(checked_mul(static_cast<std::uint64_t>(rows), p.token_bytes, "KV pool bytes"), kv_resident_bytes(cfg, storage, 0),
                               "KV pool bytes");
    const PreemptOptions preempt = preempt_options(c, p.pool_bytes);
    // end-of-text: a trained model's outputs for a --workload file's requests; a synthetic workload's
    // random-token prompts generate exactly --output-len tokens, as benchmarks' ignore_eos
    const bool end_of_text = p.tokenizer && !c.source.checkpoint.empty() && !c.workload.empty();
    const auto stop_rule = serve_stop_rule({c.stop, c.ignore_eos, end_of_text}, p.requests, p.tokenizer);
    for (const KvLayout layout : {KvLayout::paged, KvLayout::contiguous}) {
        if (c.layout != LayoutChoice::both && static_cast<int>(c.layout) != static_cast<int>(layout)) continue;
        ServeOptions o;
        o.pool = {layout, rows, c.block_size, layout == KvLayout::paged && c.prefix_cache};
        o.kv_storage = storage;
        o.preempt = c.preempt;
        o.host_kv_bytes = preempt.host_bytes;
        o.host_bytes_per_s = preempt.bytes_per_s;
        o.max_batched_tokens = c.max_batched_tokens;
        o.max_seqs = c.max_seqs;
        o.max_model_len = max_model_len;
        o.reserve = c.reserve;
        o.check = c.check || storage.dtype != DType::fp32;  // a narrow pool: its quality against fp32
        o.n = c.n;
        o.beam_width = c.beam_width;
        o.sampling = c.sampling;
        o.sampling.seed = c.seed;
        o.stop_rule = stop_rule;
        check_serve_workload(cfg, p.requests, o);
        p.runs.push_back(o);
        if (storage.dtype == DType::fp32) continue;
        o.kv_storage = {};  // the same budget at fp32
        o.pool.n_rows = pool_rows(c, cfg, {}, max_model_len);
        o.check = false;
        check_serve_workload(cfg, p.requests, o);
        p.fp32_runs.push_back(o);
    }
    if (c.prefix_cache && c.layout == LayoutChoice::contiguous)
        throw UsageError("--prefix-cache: blocks are shared in the paged layout; expected --kv-layout paged or both");
    if (!c.trace.empty()) check_trace_writable(c.trace);
    if (!c.plot.empty()) {
        gnuplot_terminal(c.plot, 1, 1, "--plot");  // .svg or .png
        check_output_path(c.plot, "--plot");
        find_gnuplot();  // before the run, not after it
    }
    p.gpu = find_gpu(c.gpu);
    roofline_time(p.gpu, 0, 0);  // a GPU with no bandwidth or peak is refused before any work
    for (ServeOptions& o : p.runs) o.record_pool_map = !c.trace.empty() && trace_format_for(c.trace) == TraceFormat::jsonl;  // the block map
    const std::uint64_t memory = check_serve_memory(c, cfg, p, rows, max_model_len);
    p.inputs = serve_inputs(c, cfg, p, rows, max_model_len, memory);
    p.weights = load_model_weights(c.source, cfg, c.seed);
    p.config = cfg;
    p.command = c;
    return p;
}

namespace {

// The one line that says how noisy this run's timed figures are: the host's cores and its load after the run.
std::string host_timing_note() {
    std::ifstream in("/proc/loadavg");
    double one = 0, five = 0;
    const std::string load = (in >> one >> five) ? fmt::format(", load average {:.2f} (1 min), {:.2f} (5 min)", one, five) : std::string();
    return fmt::format("on this host ({}{}) they vary from run to run", counted(omp_get_num_procs(), "core"), load);
}

// --plot: the chart `kvlab trace plot` draws from the run's trace, drawn from the run itself.
void plot_serve_run(const PreparedServe& p, const std::vector<ServeResult>& results) {
    ServeTrace t;
    t.inputs = p.inputs;
    for (std::size_t k = 0; k < results.size(); ++k) {
        t.layouts.push_back(p.runs[k].pool.layout);
        t.steps.push_back(results[k].steps);
        t.pool_rows.push_back(results[k].pool_rows);
    }
    plot_serve_trace(t, p.command.plot, "--plot");
}

}  // namespace

namespace {

// The lengths swap_crossover found, as ranges: "swap up to 127 tokens, recompute from 128".
std::string crossover_text(const SwapCrossover& x, std::int64_t max_len) {
    auto name = [](bool recompute) { return recompute ? "recompute" : "swap"; };
    if (x.flips.empty()) return fmt::format("{} is faster at every length up to {} tokens", name(x.recompute_faster_at_1), max_len);
    std::string out = fmt::format("{} is faster below {} tokens", name(x.recompute_faster_at_1), x.flips.front());
    bool recompute = x.recompute_faster_at_1;
    for (std::size_t i = 0; i < x.flips.size(); ++i) {
        recompute = !recompute;
        out += i + 1 < x.flips.size() ? fmt::format(", {} from {} to {}", name(recompute), x.flips[i], x.flips[i + 1] - 1)
                                       : fmt::format(", {} from {} on", name(recompute), x.flips[i]);
    }
    return out;
}

// --preempt swap: where recomputing wins (what moved over the host link is serve_headline's line, which a
// trace's report prints too; the crossover needs the model).
std::string crossover_headline(const PreparedServe& p) {
    const ServeOptions& o = p.runs.front();
    const std::uint64_t row = kv_stored_row_bytes(o.kv_storage, p.config.n_head_kv, p.config.d_head);
    const SwapCrossover x = swap_crossover(p.config, o.kv_storage.dtype == DType::fp32 ? 0 : row, p.gpu, o.host_bytes_per_s, o.max_model_len);
    return fmt::format("recompute vs swap for one sequence of {} on {}: {}", p.config.display_name, p.gpu.display_name,
                       crossover_text(x, o.max_model_len));
}

// A narrow pool against the fp32 pool of the same budget: blocks, concurrency, steps, modelled time; and quality.
std::vector<std::string> narrow_headline(const PreparedServe& p, const ServeSummary& n, const ServeSummary& f) {
    const std::string dtype(dtype_name(n.kv_dtype));
    std::vector<std::string> h;
    std::string line = fmt::format("{} pool: {} token rows ({}) vs {} at fp32 ({}) in the same budget ({}x): up to {} requests at once vs {}, {} vs {}",
                                   dtype, n.pool_rows, format_bytes(n.pool_bytes, p.command.units), f.pool_rows,
                                   format_bytes(f.pool_bytes, p.command.units),
                                   fmt::format("{:.2f}", static_cast<double>(n.pool_rows) / static_cast<double>(f.pool_rows)), n.max_running,
                                   f.max_running, counted(n.n_steps, "step"), f.n_steps);
    if (n.gpu && n.modelled.seconds > 0 && f.modelled.seconds > 0)
        line += fmt::format(", modelled {} ms vs {} ms ({:.2f}x the throughput)", real_cell(n.modelled.seconds * 1e3, 3).text,
                            real_cell(f.modelled.seconds * 1e3, 3).text,
                            n.modelled_tokens_per_s / std::max(1e-300, f.modelled_tokens_per_s));
    h.push_back(line + " (counted, exact)");
    h.push_back(fmt::format("quality vs fp32 K and V on the same tokens: max |delta logit| {:.3g}, argmax agreement {} / {} tokens", n.max_abs_dlogit,
                            n.n_tokens_agree, n.n_tokens_checked));
    return h;
}

}  // namespace

Report serve_outcome(const PreparedServe& p, const std::vector<ServeResult>& results, const std::vector<ServeResult>& fp32_results) {
    std::vector<ServeSummary> summaries;
    for (std::size_t i = 0; i < results.size(); ++i) summaries.push_back(summarize_serving(results[i], p.runs[i].pool.layout, &p.gpu));
    const bool narrow = !p.runs.empty() && p.runs.front().kv_storage.dtype != DType::fp32;
    std::vector<ServeResult> shown_results = results;
    for (std::size_t i = 0; i < fp32_results.size(); ++i) {  // a narrow pool's fp32 comparison: columns of their own
        for (ServeSummary& s : summaries) s.name = fmt::format("{} {}", choice_name(kv_layout_choices, s.layout), dtype_name(s.kv_dtype));
        ServeSummary f = summarize_serving(fp32_results[i], p.fp32_runs[i].pool.layout, &p.gpu);
        f.name = fmt::format("{} fp32", choice_name(kv_layout_choices, f.layout));
        f.token_bytes = kv_stored_token_bytes({}, p.config);
        summaries.push_back(std::move(f));
        shown_results.push_back(fp32_results[i]);
    }
    const bool any_step = std::any_of(results.begin(), results.end(), [](const ServeResult& r) { return !r.steps.empty(); });
    if (!p.command.trace.empty() && any_step) write_serve_trace(p.command.trace, p.runs, results, p.inputs, p.command.deterministic);
    if (!p.command.plot.empty() && any_step) plot_serve_run(p, results);
    const std::string title = fmt::format("kvlab serve: {} on {}, KV pool {} ({} token rows{})", counted(std::ssize(p.requests), "request"), p.config.display_name,
                                          format_bytes(p.pool_bytes, p.command.units),
                                          p.runs.front().pool.n_rows,
                                          p.command.layout == LayoutChoice::contiguous ? "" : fmt::format(", blocks of {}", p.command.block_size));
    Report report = serve_report(summaries, shown_results, p.inputs, title, p.token_bytes, p.command.units, p.command.format, host_timing_note());
    // swap and narrow pools: their own lines in place of the CPU wall time's (in the table still)
    const bool swap = !summaries.empty() && summaries.front().swap_mode;
    if (swap || (narrow && !fp32_results.empty()))
        std::erase_if(report.headline, [](const std::string& line) { return line.rfind("CPU wall time", 0) == 0; });
    if (swap)
        report.headline.push_back(crossover_headline(p));
    if (narrow && !fp32_results.empty())
        for (std::string& line : narrow_headline(p, summaries.front(), summaries[results.size()])) report.headline.push_back(std::move(line));
    for (const ServeResult& r : results)
        if (const std::string note = thread_use_note(r.core_use); !note.empty()) {
            report.notes.push_back(note);  // once: the first layout it held for
            break;
        }
    if (!p.command.plot.empty() && any_step) report.notes.push_back("chart written to " + p.command.plot);
    if (p.command.beam_width > 1 && !p.runs.empty() && p.runs.front().stop_rule)
        report.notes.push_back("beam search: every beam ran to max_tokens; end-of-text and stop strings stop sampled and greedy outputs only "
                               "(docs/serving.md, 'Stopping early')");
    return report;
}

void check_serve_outcome(const PreparedServe& p, const std::vector<ServeResult>& results) {
    for (std::size_t k = 0; k < results.size(); ++k)
        for (std::size_t i = 0; i < results[k].requests.size(); ++i) {
            const ServeRequestResult& r = results[k].requests[i];
            if (r.checked && !r.within_tolerance && p.runs[k].kv_storage.dtype == DType::fp32)  // narrow: a quality cost, reported
                throw Error(fmt::format("serve --check ({}): request {} left the solo run's logits: max |delta logit| {:.3g} > tolerance {:.3g}",
                                        choice_name(kv_layout_choices, p.runs[k].pool.layout), i, r.max_abs_dlogit, r.tolerance));
        }
    for (const ServeResult& r : results)
        if (r.interrupted) throw Interrupted("interrupted; the report covers the steps run");
}

}  // namespace kvlab
