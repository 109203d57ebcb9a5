#include "session/simulate_session.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>  // mallopt
#endif

#include <Eigen/Core>
#include <fmt/format.h>
#include <omp.h>

#include "calc/attention_variant.hpp"
#include "kvlab/calc/kv_memory.hpp"
#include "kvlab/calc/presets.hpp"
#include "core/atomic_write.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/core/mapped_file.hpp"
#include "kvlab/core/text.hpp"
#include "kvlab/core/units.hpp"
#include "kvlab/formats/checkpoint.hpp"
#include "formats/llama2c_checkpoint.hpp"
#include "kvlab/model/mla.hpp"
#include "kvlab/sim/evaluate.hpp"
#include "kvlab/sim/stop.hpp"
#include "kernels/narrow_weights.hpp"
#include "kvlab/weights/random_weights.hpp"
#include "report/simulation_report.hpp"
#include "session/model_source.hpp"
#include "trace/step_trace.hpp"

namespace kvlab {

namespace {

std::vector<TokenId> parse_token_ids(const std::string& text) {
    std::vector<TokenId> ids;
    for (const auto& item : split_list(text)) {
        TokenId id = 0;
        const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), id);
        if (ec != std::errc() || end != item.data() + item.size())
            throw UsageError(fmt::format("--prompt-ids: {} is not a token id; expected comma-separated integers, e.g. 1,403,9038", quote(item)));
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

}  // namespace

namespace {

// --attention mla:R: DeepSeek-V2's latent attention on the model's shape, random weights: a latent of R
// values, RoPE on half a head's width (64 of 128 in DeepSeek-V2), per-head q/k and v widths the model's
// head dim, no query compression. The cache: R + D/2 values per token per layer.
ModelConfig with_mla_latent(const SimulateRequest& o, ModelConfig cfg) {
    const auto rank = static_cast<std::int64_t>(parse_count(std::string_view(o.attention).substr(4), "--attention"));
    if (!o.checkpoint.empty() || cfg.family != Family::llama || cfg.mla || cfg.d_head % 4 != 0 || cfg.sliding_window)
        throw UsageError(fmt::format("--attention {}: the MLA what-if runs random weights of a Llama-family shape with a head dim "
                                     "divisible by 4 and no sliding window; {} is not one (give the shape with --model or --config)",
                                     o.attention, cfg.name));
    cfg.mla = MlaShape{rank, cfg.d_head / 2, 0, cfg.d_head, cfg.d_head};
    cfg.display_name += fmt::format(", MLA r={} what-if", rank);
    return cfg;
}

}  // namespace

// The shape simulate runs: --layers of the model, and an --attention what-if's KV heads.
ModelConfig shaped_config(const SimulateRequest& o, const ModelConfig& full) {
    ModelConfig cfg = simulation_config(full, o.layers > 0 ? std::optional<std::int64_t>(o.layers) : std::nullopt);
    if (o.layers < 0) throw UsageError(fmt::format("--layers: {}; expected 1..{}", o.layers, full.n_layer));
    if (o.attention.rfind("mla:", 0) == 0) return with_mla_latent(o, cfg);
    if (const AttentionVariant variant = parse_attention_variant(o.attention); variant.n_head_kv != 0) {
        // the seed's MHA vs GQA vs MQA lesson on one shape: K and V projections of another width, random weights
        if (!o.checkpoint.empty())
            throw UsageError(fmt::format("--attention {}: {} runs trained weights ({}), whose K and V projections have {} KV heads; a "
                                         "what-if layout needs random weights: give the shape with --model or --config",
                                         o.attention, cfg.name, o.checkpoint, cfg.n_head_kv));
        cfg = with_kv_heads(cfg, variant_kv_heads(variant, cfg.n_head, cfg.n_head_kv));
        cfg.display_name += fmt::format(", {} what-if", cfg.attention_kind());
    }
    return cfg;
}

namespace {

// The cache and weight policies (--window, --sink-tokens, --kv-dtype, --weight-dtype, --no-quality,
// --kernel) as runs to compare, each checked against the shape; cfg gets the window policy.
void plan_policies(SimulateRequest& o, ModelConfig& cfg, PreparedSimulation& p) {
    SimulateOptions& sim = p.sim;
    sim.mode = o.mode;
    // --window / --sink-tokens: a cache policy on the model's attention, measured against the model as it is
    const bool attention_policy = o.window > 0 || o.sink_tokens > 0;
    if (attention_policy) sim.reference_config = cfg;
    apply_window_policy(cfg, o.window, o.sink_tokens);  // (also refuses negative values)
    if (o.sink_positions == SinkPositions::cache) {
        if (cfg.sink_tokens == 0)
            throw UsageError("--sink-positions cache: it places StreamingLLM's sinks at their slots in the cache; expected --sink-tokens S with --window W");
        if (cfg.family == Family::gpt2)
            throw UsageError(fmt::format("--sink-positions cache: {} adds learned positions to its input, so a kept key cannot be moved to "
                                         "another position; expected a RoPE model (Llama family)", cfg.name));
        cfg.sink_cache_positions = true;
    }
    // --kv-dtype: how the cache stores K and V; --weight-dtype: how the matmuls read the weights. A narrow
    // format runs cached, beside the fp32 weights and an fp32 cache on the same tokens.
    std::vector<KvStorage> kv_list;
    for (const auto& name : split_list(o.kv_dtype)) {
        const KvStorage storage{parse_dtype(name, "--kv-dtype"), o.kv_scale};
        check_kv_storage(storage, kv_row_values(cfg));
        if (std::find_if(kv_list.begin(), kv_list.end(), [&](const KvStorage& k) { return k.dtype == storage.dtype; }) != kv_list.end())
            throw UsageError(fmt::format("--kv-dtype: {} is listed twice", dtype_name(storage.dtype)));
        kv_list.push_back(storage);
    }
    std::vector<DType> weight_list;
    for (const auto& name : split_list(o.weight_dtype)) {
        const DType d = parse_dtype(name, "--weight-dtype");
        check_weight_dtype(d);
        check_weight_shapes(cfg, d);
        if (std::find(weight_list.begin(), weight_list.end(), d) != weight_list.end())
            throw UsageError(fmt::format("--weight-dtype: {} is listed twice", dtype_name(d)));
        weight_list.push_back(d);
    }
    if (kv_list.size() > 1 && weight_list.size() > 1)
        throw UsageError(fmt::format("--kv-dtype {} and --weight-dtype {}: one of them may list several formats; compare the other's one at a time",
                                     o.kv_dtype, o.weight_dtype));
    for (std::size_t i = 0; i < std::max(kv_list.size(), weight_list.size()); ++i)
        p.policies.push_back({kv_list[std::min(i, kv_list.size() - 1)], weight_list[std::min(i, weight_list.size() - 1)]});
    const bool any_narrow = std::any_of(kv_list.begin(), kv_list.end(), [](const KvStorage& k) { return k.dtype != DType::fp32; });
    const bool any_narrow_weights = std::any_of(weight_list.begin(), weight_list.end(), [](DType d) { return d != DType::fp32; });
    if (o.kv_scale_given && std::none_of(kv_list.begin(), kv_list.end(), [](const KvStorage& k) { return k.scaled(); }))
        throw UsageError(fmt::format("--kv-scale: scales apply to fp8_e4m3, fp8_e5m2 and int8 caches; --kv-dtype {} has none", o.kv_dtype));
    if (any_narrow || attention_policy || any_narrow_weights) {
        if (o.mode_given && o.mode != SimMode::cached)
            throw UsageError(fmt::format("--mode {}: {} is measured on the cached mode, beside the fp32 model; expected --mode cached (its "
                                         "default then)",
                                         choice_name(sim_mode_choices, o.mode),
                                         any_narrow           ? fmt::format("--kv-dtype {}", o.kv_dtype)
                                         : any_narrow_weights ? fmt::format("--weight-dtype {}", o.weight_dtype)
                                                              : std::string(o.window > 0 ? "--window" : "--sink-tokens")));
        sim.mode = o.mode = SimMode::cached;
    }
    if (o.kernel == ForwardKernel::reference && (any_narrow || attention_policy || any_narrow_weights || o.mode == SimMode::uncached))
        throw UsageError("--kernel reference: the reference forward runs beside the cached mode with fp32 weights and an fp32 full cache; "
                         "expected --mode cached or both, without --kv-dtype, --weight-dtype, --window or --sink-tokens");
    sim.kernel = o.kernel;
    if (o.kernel == ForwardKernel::reference && cfg.mla)
        throw UsageError(fmt::format("--kernel reference: {} uses MLA, whose readable forward (src/model/reference_mla.cpp) is run by "
                                     "the tests, not beside simulate; expected --kernel fast", cfg.name));
    if (o.mla_given && !cfg.mla)
        throw UsageError(fmt::format("--mla {}: {} has no latent attention ({}); --mla applies to MLA models and --attention mla:R",
                                     choice_name(mla_path_choices, o.mla_path), cfg.name, cfg.attention_kind()));
    sim.mla_path = o.mla_path;
    if (o.no_quality && !any_narrow && !attention_policy && !any_narrow_weights)
        throw UsageError("--no-quality: there is no policy to run alone; it applies with --kv-dtype or --weight-dtype other than fp32, "
                         "--window or --sink-tokens");
    if (p.policies.size() > 1 && !o.trace.empty())
        throw UsageError(fmt::format("--trace: one run per trace, and {} lists {} formats; trace each one alone",
                                     kv_list.size() > 1 ? fmt::format("--kv-dtype {}", o.kv_dtype) : fmt::format("--weight-dtype {}", o.weight_dtype),
                                     p.policies.size()));
    if (p.policies.size() > 1 && !o.save_checkpoint.empty())
        throw UsageError("--save-checkpoint: give it with one --kv-dtype and one --weight-dtype");
    sim.kv_storage = p.policies.front().kv;
    sim.weight_dtype = p.policies.front().weights;
    sim.quality = !o.no_quality;
}

// The prompt's token ids (--prompt-ids, or --prompt through the tokenizer), --eval's text, the steps and the sampler.
void prepare_prompt(const SimulateRequest& o, const ModelConfig& cfg, const ModelConfig& full, PreparedSimulation& p) {
    SimulateOptions& sim = p.sim;
    sim.n_prompt = o.prompt_len;
    if (!o.prompt_ids.empty()) sim.prompt_ids = parse_token_ids(o.prompt_ids);
    std::optional<Tokenizer>& tokenizer = p.tokenizer;
    if (!o.tokenizer.empty()) tokenizer.emplace(Tokenizer::load(o.tokenizer, full.n_vocab));
    std::vector<TokenId>& eval_ids = p.eval_ids;
    if (!o.eval.empty()) {
        if (!tokenizer) throw UsageError("--eval: the text needs --tokenizer FILE (llama2.c tokenizer.bin) to become token ids");
        eval_ids = tokenizer->encode(read_input_file(o.eval, "eval text file", 64 << 20), true, false);
    }
    if (o.prompt_given) {
        // a prompt that cannot fit is refused before it is encoded, however long it is
        if (const std::int64_t at_least = tokenizer->min_tokens(o.prompt.size(), true); at_least > cfg.n_ctx_max)
            throw UsageError(fmt::format("--prompt: {} bytes of text encode to at least {} tokens (BOS included; the longest "
                                         "piece of {} is {} bytes); the context of {} is {} positions",
                                         o.prompt.size(), at_least, o.tokenizer, tokenizer->max_piece_bytes(), cfg.name,
                                         cfg.n_ctx_max));
        sim.prompt_ids = tokenizer->encode(o.prompt, true, false);
    }
    sim.n_steps = o.steps;
    sim.sampler = {o.temperature, o.top_k, o.top_p, o.seed, o.sampler};
    sim.seed = o.seed;
    if (!o.stop.empty() && !tokenizer)
        throw UsageError("--stop: stop strings are matched in the text, which needs --tokenizer FILE (llama2.c tokenizer.bin)");
    if (!o.stop.empty() && !o.eval.empty()) throw UsageError("--stop: --eval scores a text and generates nothing to stop");
    StopMatcher{o.stop};  // refuses an empty stop string
    // end of text: a trained llama2.c-style model ends a story with BOS (its training stream is stories each
    // opened by BOS, none closed by EOS; run.c stops there) or EOS; random weights write no text to end
    if (tokenizer && !o.checkpoint.empty() && !o.ignore_eos) sim.end_tokens = {Tokenizer::bos_id, Tokenizer::eos_id};
}

// The memory the run will hold, refused above --max-memory (default 75% of RAM) before anything is allocated.
MemoryEstimate check_memory(const SimulateRequest& o, const ModelConfig& cfg, const PreparedSimulation& p) {
    const SimulateOptions& sim = p.sim;
    const std::vector<TokenId>& eval_ids = p.eval_ids;
    const std::uint64_t max_memory = max_memory_allowed(o.max_memory, o.force_memory);
    // --eval holds the weights (and every listed narrow copy), one window's KV cache and one token's
    // activations: the weights decide. A list of runs holds one run's buffers at a time.
    std::uint64_t narrow_copies = 0;
    for (const PreparedSimulation::Policy& pol : p.policies) {
        if (pol.weights != DType::fp32) narrow_copies = checked_add(narrow_copies, narrow_weights_bytes(cfg, pol.weights), "memory estimate");
        if (o.eval.empty() && p.policies.size() > 1) {
            SimulateOptions one = sim;
            one.kv_storage = pol.kv;
            one.weight_dtype = pol.weights;
            check_simulation_memory(cfg, one, max_memory);
        }
    }
    const MemoryEstimate memory =
        o.eval.empty() ? check_simulation_memory(cfg, sim, max_memory)
                       : MemoryEstimate{checked_add(weights_bytes(cfg), narrow_copies, "memory estimate"),
                                        kv_bytes_sequence(cfg, DType::fp32,
                                                          static_cast<std::uint64_t>(std::min<std::int64_t>(cfg.n_ctx_max, std::ssize(eval_ids))),
                                                          WindowMode::cap).total()};
    if (memory.total() > max_memory)
        throw UsageError(fmt::format("--max-memory: the weights of {} and one window's KV cache need {}, more than the {} allowed",
                                     cfg.display_name, format_bytes(memory.total(), UnitSystem::iec),
                                     format_bytes(max_memory, UnitSystem::iec)));

    return memory;
}

// The report's and trace's "inputs": every value the run used.
nlohmann::json simulation_inputs(const SimulateRequest& o, const ModelConfig& cfg, const ModelConfig& full, const PreparedSimulation& p,
                                 std::int64_t n_positions, const MemoryEstimate& memory) {
    const SimulateOptions& sim = p.sim;
    nlohmann::json inputs = {
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
        {"kv_dtype", o.kv_dtype},
        {"window", cfg.sliding_window ? *cfg.sliding_window : 0},
        {"sink_tokens", cfg.sink_tokens},
        {"kv_scale", std::string(choice_name(kv_scale_choices, o.kv_scale))},
        {"weight_dtype", o.weight_dtype},
        {"policy", !p.policies.empty() && (p.policies.size() > 1 || p.policies.front().kv.dtype != DType::fp32 ||
                                          p.policies.front().weights != DType::fp32 || o.window > 0 || o.sink_tokens > 0)},
        {"quality", !o.no_quality},
    };

    if (!o.checkpoint.empty()) inputs["checkpoint"] = o.checkpoint;
    if (!o.tokenizer.empty()) inputs["tokenizer"] = o.tokenizer;
    if (o.prompt_given) inputs["prompt"] = to_valid_utf8(o.prompt);
    if (!o.save_checkpoint.empty()) inputs["save_checkpoint"] = o.save_checkpoint;
    if (cfg.sink_cache_positions) inputs["sink_positions"] = "cache";
    if (o.sampler != SamplerRule::kvlab) inputs["sampler"] = std::string(choice_name(sampler_rule_choices, o.sampler));
    if (!o.stop.empty()) inputs["stop"] = o.stop;
    if (!p.sim.end_tokens.empty()) inputs["end_tokens"] = p.sim.end_tokens;
    if (o.kernel != ForwardKernel::fast) inputs["kernel"] = std::string(choice_name(forward_kernel_choices, o.kernel));
    // the GPU whose roofline models each step's time: its figures travel with the trace, so that trace
    // summary and plot model the same time without the presets (simulation_report.hpp, modelled_gpu)
    inputs["gpu"] = {{"name", p.gpu.name},
                     {"display_name", p.gpu.display_name},
                     {"bf16_dense_flops", p.gpu.bf16_dense_flops},
                     {"bandwidth_bytes_per_s", p.gpu.bandwidth_bytes_per_s}};
    if (o.repeat > 1) inputs["repeat"] = o.repeat;
    if (!o.logits.empty()) inputs["logits"] = o.logits;
    return inputs;
}

// The host's load as the run ends: /proc/loadavg's 1-minute average (Linux; else unknown) and the cores.
HostLoad host_load() {
    HostLoad load;
    load.n_cores = omp_get_num_procs();
    if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
        if (std::fscanf(f, "%lf", &load.load1) != 1) load.load1 = -1;
        std::fclose(f);
    }
    return load;
}

// --logits and --repeat: what they apply to, checked before any work.
void check_run_outputs(const SimulateRequest& o, const PreparedSimulation& p) {
    if (!o.logits.empty()) {
        if (!o.eval.empty()) throw UsageError("--logits: --eval decodes nothing; the logits are written for a decoding run");
        if (p.policies.size() > 1)
            throw UsageError(fmt::format("--logits: one run per file, and --kv-dtype {} / --weight-dtype {} list {} runs; write each alone",
                                         o.kv_dtype, o.weight_dtype, p.policies.size()));
        check_output_path(o.logits, "--logits");
        // a preset's checkpoint and tokenizer are inputs the command line never named (main's check sees
        // only the options): refused here too
        for (const std::string& input : {o.checkpoint, o.tokenizer}) {
            std::error_code ec;
            if (!input.empty() && std::filesystem::equivalent(o.logits, input, ec))
                throw UsageError(fmt::format("--logits: {} is the run's input {}; expected a new .npy file", quote(o.logits), quote(input)));
        }
    }
    if (o.repeat > 1 && (p.policies.size() > 1 || !o.eval.empty()))
        throw UsageError(fmt::format("--repeat {}: repeats one decoding run (cached vs uncached); not with --eval or a list of "
                                     "--kv-dtype / --weight-dtype formats", o.repeat));
}

}  // namespace

PreparedSimulation prepare_simulation(SimulateRequest o) {
    // options that exclude one another (--config/--model/--checkpoint, the prompt options, --eval) are
    // refused by the CLI (CLI11 excludes); what is checked here depends on values, not on presence
    const bool prompt_given = o.prompt_given;
    ModelSource source{o.model, o.config, o.checkpoint, o.tokenizer};
    const ModelConfig full = resolve_model(source);  // a preset with weights: its checkpoint and tokenizer
    o.checkpoint = source.checkpoint;
    o.tokenizer = source.tokenizer;
    if (prompt_given && o.tokenizer.empty())
        throw UsageError("--prompt: text needs --tokenizer FILE (llama2.c tokenizer.bin) to become token ids; without one, give "
                         "--prompt-ids, or a model that ships a tokenizer (kvlab presets: tiny-llama, tiny-gpt2)");
    // a trained model with a tokenizer, and no prompt asked for: a sentence, whose continuation means
    // something (random ids decode to noise, docs/cli-simulate.md)
    if (!o.prompt_given && o.prompt_ids.empty() && !o.prompt_len_given && o.eval.empty() && !o.tokenizer.empty() &&
        !o.checkpoint.empty()) {
        o.prompt = default_text_prompt;
        o.prompt_given = true;
    }
    PreparedSimulation p;
    set_thread_count(o.threads, o.deterministic);
    p.gpu = find_gpu(o.gpu);
    roofline_time(p.gpu, 0, 0);  // refuses a GPU without bandwidth or BF16 peak, before any work
    if (o.repeat < 1) throw UsageError(fmt::format("--repeat: {}; expected 1 or more runs", o.repeat));

    // everything that can be wrong with the input is found before any allocation or work
    ModelConfig cfg = shaped_config(o, full);
    plan_policies(o, cfg, p);
    prepare_prompt(o, cfg, full, p);
    SimulateOptions& sim = p.sim;
    const std::int64_t n_positions = o.eval.empty() ? simulation_positions(cfg, sim) : 0;  // validates sizes and ids first
    if (!o.trace.empty()) check_trace_writable(o.trace);
    if (!o.save_checkpoint.empty()) check_save_path(o.save_checkpoint, cfg);
    check_run_outputs(o, p);
    const MemoryEstimate memory = check_memory(o, cfg, p);
    nlohmann::json& inputs = p.inputs;
    inputs = simulation_inputs(o, cfg, full, p, n_positions, memory);

#if defined(__GLIBC__)
    // The KV cache and weights converted at load are allocated once and live for the whole run (random
    // weights and narrow copies come from huge-page arenas instead: core/huge_pages.hpp). glibc gives each block
    // over 128 KiB a mapping of its own, whole pages, the chunk header and Eigen's alignment pushing the
    // data onto one page more: ~4 KiB resident per matrix. From the heap they pack end to end. (32 MiB is
    // mallopt's ceiling; the embedding table, larger, keeps a mapping.) docs/performance.md, peak RSS.
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
#endif
    // A checkpoint's fp32 matrices stored as kvlab holds them (a llama2.c file's; a safetensors file's F32
    // ones but GPT-2's transposed) are read in place, where the page cache holds the file, as run.c reads
    // them: nothing is copied into fresh memory first, which on a virtual machine can cost more than the
    // decode, and the GEMV reads rows that start off a cache line at the aligned rate (kernels/matmul.hpp),
    // so the decode is as fast as from a copy (docs/performance.md, "Checkpoints are read in place").
    p.weights = load_model_weights(source, cfg, o.seed, WeightPlacement::mapped_file);
    if (!o.save_checkpoint.empty()) save_llama2c_v0(o.save_checkpoint, cfg, p.weights);
    if (!o.eval.empty()) inputs["eval"] = o.eval;
    // tokens mean something (and are worth streaming) with a tokenizer, a given prompt or real weights
    p.tokens_meaningful = p.tokenizer || !sim.prompt_ids.empty() || !o.checkpoint.empty();
    if (o.eval.empty()) sim.prompt_ids = simulation_prompt(cfg, sim);
    if (!o.logits.empty()) {
        p.logits = std::make_shared<NpyRowWriter>(o.logits, "--logits", static_cast<std::uint64_t>(sim.n_steps),
                                                  static_cast<std::uint64_t>(cfg.n_vocab));
        sim.on_logits = [w = p.logits.get()](const VectorF& l) { w->add_row({l.data(), static_cast<std::size_t>(l.size())}); };
    }
    p.config = cfg;
    p.request = o;
    return p;
}

namespace {
std::string kv_policy_name(const KvStorage& k);
std::string attention_policy_name(const PreparedSimulation& p);
std::string policy_name(const PreparedSimulation& p, const PreparedSimulation::Policy& policy);
}  // namespace

// --eval: the model's mean NLL and perplexity on a text, teacher-forced through the cached forward pass.
Report eval_report(const PreparedSimulation& p) {
    const SimulateRequest& o = p.request;
    const ModelConfig& cfg = p.config;
    Report report;
    report.inputs = p.inputs;
    Table t;
    t.title = fmt::format("kvlab simulate --eval: {} on {}", cfg.display_name, o.eval);
    t.columns = {{"kv_dtype", "KV storage", false}, {"tokens", "tokens (BOS incl.)"}, {"windows", "windows"}, {"scored", "scored"},
                 {"nll_sum", "NLL sum (nats)"},   {"mean_nll", "mean NLL (nats/token)"}, {"perplexity", "perplexity"}};
    auto row = [&](const std::string& name, const EvalResult& r) {
        return std::vector<Cell>{text_cell(name), int_cell(r.n_tokens), int_cell(r.n_windows), int_cell(r.n_scored),
                                 real_cell(r.nll_sum, 4), real_cell(r.mean_nll, 6), real_cell(r.perplexity, 6)};
    };
    // with no cache policy, the model's perplexity alone; with one, every policy beside the fp32 full cache
    const bool policy = p.sim.reference_config || std::any_of(p.policies.begin(), p.policies.end(), [](const PreparedSimulation::Policy& k) {
                            return k.kv.dtype != DType::fp32 || k.weights != DType::fp32;
                        });
    if (!policy) {
        t.rows.push_back(row("fp32", evaluate_nll(cfg, p.weights, p.eval_ids)));
    } else {
        t.columns.insert(t.columns.end(), {{"kv_bytes_per_token", "KV/token"}, {"perplexity_change_percent", "vs fp32 full"}, {"mean_kl", "mean KL"},
                                           {"max_kl", "max KL"}, {"argmax_agreement_percent", "same argmax"}});
        const ModelConfig& reference_cfg = p.sim.reference_config ? *p.sim.reference_config : cfg;
        std::vector<KvStorage> storages;
        std::vector<std::unique_ptr<NarrowWeights>> narrow;  // one copy per policy with narrow weights
        std::vector<const NarrowWeights*> narrow_of;
        for (const PreparedSimulation::Policy& pol : p.policies) {
            storages.push_back(pol.kv);
            if (pol.weights != DType::fp32) narrow.push_back(std::make_unique<NarrowWeights>(narrow_weights(p.weights, pol.weights)));
            narrow_of.push_back(pol.weights != DType::fp32 ? narrow.back().get() : nullptr);
        }
        const EvalPolicies e = evaluate_policies(cfg, reference_cfg, p.weights, p.eval_ids, storages, narrow_of);
        auto ref_cells = row(std::any_of(p.policies.begin(), p.policies.end(), [](const auto& k) { return k.weights != DType::fp32; })
                                 ? "fp32 weights, fp32 full cache (reference)"
                                 : "fp32 full cache (reference)",
                             e.reference);
        ref_cells.insert(ref_cells.end(), {bytes_cell(kv_stored_token_bytes({}, reference_cfg), o.units), text_cell("-"), text_cell("-"),
                                           text_cell("-"), text_cell("-")});
        t.rows.push_back(std::move(ref_cells));
        for (std::size_t i = 0; i < e.policies.size(); ++i) {
            const EvalComparison& c = e.policies[i];
            const double change = 100.0 * (c.policy.perplexity / e.reference.perplexity - 1.0);
            const double agree = 100.0 * static_cast<double>(c.n_agree) / static_cast<double>(c.policy.n_scored);
            auto cells = row(policy_name(p, p.policies[i]), c.policy);
            cells.insert(cells.end(), {bytes_cell(kv_stored_token_bytes(p.policies[i].kv, cfg), o.units), change_percent_cell(change),
                                       {fmt::format("{:.3g}", c.mean_kl), c.mean_kl}, {fmt::format("{:.3g}", c.max_kl), c.max_kl},
                                       percent_cell(agree)});
            t.rows.push_back(std::move(cells));
        }
        t.notes.push_back("each policy and the fp32 full cache (with the fp32 weights) read the same tokens in lockstep: vs fp32 full = the perplexity's relative change, "
                          "KL(p_fp32 || p) per prediction in nats, same argmax = predictions whose most likely token agrees");
    }
    t.notes.push_back(fmt::format("text encoded with {} (BOS first); windows of at most {} tokens overlapping by one; "
                                  "perplexity = exp(mean NLL); docs/cli-simulate.md", o.tokenizer, cfg.n_ctx_max));
    report.tables.push_back(std::move(t));
    return report;
}

namespace {

std::string kv_policy_name(const KvStorage& k) {
    return k.scaled() ? fmt::format("{} ({})", dtype_name(k.dtype), choice_name(kv_scale_choices, k.scale)) : std::string(dtype_name(k.dtype));
}

// "fp8_e4m3 (tensor), window 64 + 4 sinks, bf16 weights": the KV storage, the attention policy, the weights
std::string policy_name(const PreparedSimulation& p, const PreparedSimulation::Policy& policy) {
    return kv_policy_name(policy.kv) + attention_policy_name(p) +
           (policy.weights != DType::fp32 ? fmt::format(", {} weights", dtype_name(policy.weights)) : std::string());
}

// ", window 64 + 4 sinks" for a run whose --window / --sink-tokens changed the model's attention
std::string attention_policy_name(const PreparedSimulation& p) {
    if (!p.sim.reference_config) return "";
    const ModelConfig& c = p.config;
    return fmt::format(", window {}{}{}", c.sliding_window.value_or(0), c.sink_tokens ? fmt::format(" + {} sinks", c.sink_tokens) : "",
                       c.sink_cache_positions ? " at cache positions" : "");
}

// Decode steps' (1..) mean counted KV and weight bytes read, and their speed: 1 / the median step's wall
// time. The median, not the mean: on a shared host another program's time slice lands on a few steps of
// one run and not of the next, and a mean over one run's steps moved by 2x from run to run (fp8_e5m2 read
// "2.13x" fp8_e4m3 over the same bytes, issue 51); the median step ignores those few.
struct DecodeRates {
    double kv_read = 0.0, weights_read = 0.0, tokens_per_s = 0.0;
};
DecodeRates decode_rates(const SimulationResult& r) {
    std::uint64_t kv = 0, weights = 0;
    std::vector<double> ns;
    for (const StepRecord& rec : r.records)
        if (rec.mode == StepMode::cached && rec.step > 0) {
            kv += rec.cost.total().bytes_kv_read;
            weights += rec.cost.total().bytes_weights_read;
            ns.push_back(static_cast<double>(rec.wall_ns));
        }
    if (ns.empty()) return {};
    const auto steps = static_cast<double>(ns.size());
    const double median_ns = spread_of(ns).median;
    return {static_cast<double>(kv) / steps, static_cast<double>(weights) / steps, median_ns > 0 ? 1e9 / median_ns : 0.0};
}

// The policy table's one note on what is measured: its speeds, one run each, and the host's load then.
std::string policy_timing_note(const HostLoad& load) {
    return fmt::format("KV/token, KV cache and bytes read are counted, exact; decode tok/s is measured: 1 / the median decode step's wall "
                       "time, one run per row, on a host with load average {:.2f} over {} cores; rows a few percent apart are within "
                       "the noise (docs/cli-simulate.md, \"Exact, modelled and measured figures\")",
                       load.load1, load.n_cores);
}

Table policy_table(const std::string& title) {
    Table t;
    t.title = title;
    t.columns = {{"kv_dtype", "KV storage", false},  {"weight_dtype", "weights", false}, {"bytes_kv_per_token", "KV/token"},
                 {"kv_cache_bytes", "KV cache"},     {"bytes_kv_read_per_decode_step", "KV read/step"},
                 {"bytes_weights_read_per_decode_step", "weights read/step"}, {"decode_tokens_per_s", "decode tok/s"},
                 {"speed_vs_first", "tok/s vs first"}, {"max_abs_dlogit", "max |dlogit|"}, {"mean_kl", "mean KL"}, {"max_kl", "max KL"},
                 {"argmax_agreement_percent", "same argmax"}};
    return t;
}

void add_quality_row(Table& t, const ModelConfig& cfg, const PreparedSimulation::Policy& policy, const SimulationResult& r, double first_rate,
                     UnitSystem units, bool measured, bool attention_policy) {
    const DecodeRates d = decode_rates(r);
    std::vector<Cell> row{text_cell(kv_policy_name(policy.kv)), text_cell(std::string(dtype_name(policy.weights))),
                          bytes_cell(kv_stored_token_bytes(policy.kv, cfg), units), bytes_cell(r.kv_cache_bytes, units),
                          bytes_cell(static_cast<std::uint64_t>(d.kv_read), units), bytes_cell(static_cast<std::uint64_t>(d.weights_read), units),
                          real_cell(d.tokens_per_s, 1), ratio_cell(first_rate > 0 ? d.tokens_per_s / first_rate : 0.0)};
    if (const auto& q = r.kv_quality) {
        const double agree = q->n_steps ? 100.0 * static_cast<double>(q->n_agree) / static_cast<double>(q->n_steps) : 0.0;
        row.insert(row.end(), {real_cell(q->max_abs_dlogit, 5), {fmt::format("{:.3g}", q->mean_kl), q->mean_kl},
                               {fmt::format("{:.3g}", q->max_kl), q->max_kl}, percent_cell(agree)});
    } else {  // the fp32 weights and full cache themselves, or --no-quality
        const bool is_reference = policy.kv.dtype == DType::fp32 && policy.weights == DType::fp32 && !attention_policy;
        row.insert(row.end(), {text_cell(measured ? "reference" : is_reference ? "-" : "not measured"), text_cell("-"), text_cell("-"), text_cell("-")});
    }
    t.rows.push_back(std::move(row));
}

const char* quality_note =
    "against the model's fp32 weights and fp32 full cache on the same tokens (teacher-forced): max |dlogit| over every step, KL(p_fp32 || p) of the "
    "next-token distributions in nats, and the steps whose argmax agrees; KV/token: K and V over the layers at the stored width, "
    "scales included (kvcalc -d gives the same bytes without per-token-head scales); KV and weights read/step: counted at the stored width, "
    "decode steps; tok/s vs first: decode speed against the first row's";

}  // namespace

Report kv_policy_report(const PreparedSimulation& p, const std::vector<SimulationResult>& runs) {
    Report report;
    report.inputs = p.inputs;
    const bool weights_listed = p.policies.size() > 1 && p.policies[0].weights != p.policies[1].weights;
    Table t = policy_table(fmt::format("{} on {}{}: {} prompt tokens, {} steps", weights_listed ? "Weight storage" : "KV cache storage",
                                       p.config.display_name, attention_policy_name(p), p.sim.prompt_ids.size(), p.sim.n_steps));
    const double first_rate = runs.empty() ? 0.0 : decode_rates(runs.front()).tokens_per_s;
    for (std::size_t i = 0; i < runs.size(); ++i) add_quality_row(t, p.config, p.policies[i], runs[i], first_rate, p.request.units, p.sim.quality,
                                                         p.sim.reference_config.has_value());
    t.notes.push_back(p.sim.quality ? quality_note
                                    : "--no-quality: each format ran alone, without the fp32 model beside it on the same tokens, so "
                                      "no logit error, KL or argmax agreement was measured; KV and weights read/step and tok/s as without it");
    if (weights_listed)
        t.notes.push_back("narrow weights: the matmuls read bf16 / fp16 / q8_0 rows and widen them in the kernels, so a decode step reads fewer "
                          "weight bytes; where reading the weights bounds the step, tokens/s rises as the bytes fall (docs/performance.md)");
    t.notes.push_back(policy_timing_note(host_load()));
    for (const SimulationResult& r : runs)
        if (const std::string note = thread_use_note(r.core_use); !note.empty()) {
            t.notes.push_back(note);  // once: the first run it held for
            break;
        }
    if (p.request.checkpoint.empty() && p.sim.quality)
        t.notes.push_back("random weights: the logit error and KL are real, but the text means nothing; a trained model (--model tiny-llama) and "
                          "--eval give a perplexity that does");
    report.tables.push_back(std::move(t));
    return report;
}

namespace {

// Why the run ended before its steps, if it did.
std::string early_stop_note(const PreparedSimulation& p, const SimulationResult& result) {
    if (result.early_stop == EarlyStop::end_token)
        return fmt::format("stopped at step {} of {}: the model wrote end-of-text (token {}, not printed; --ignore-eos runs every step)",
                           result.n_steps_done - 1, p.sim.n_steps, result.generated.back());
    if (result.early_stop == EarlyStop::stop_after)
        return fmt::format("stopped at step {} of {}: the text reached a --stop string (printed up to it, the stop string excluded)",
                           result.n_steps_done - 1, p.sim.n_steps);
    return "";
}

}  // namespace

Report simulation_outcome(const PreparedSimulation& p, const SimulationResult& result) {
    const SimulateRequest& o = p.request;
    const ModelConfig& cfg = p.config;
    RunSummary summary = run_summary(cfg, p.sim, result);
    if (!o.deterministic) summary.host_load = host_load();  // for the note on timings, in the report and the trace
    if (result.records.empty())  // interrupted before step 0 finished: nothing to report or trace
        throw Interrupted(fmt::format("interrupted before the first step; no report{}",
                                      o.trace.empty() ? "" : fmt::format(", {} not written", quote(o.trace))));
    if (!o.trace.empty()) write_step_trace(o.trace, summary, result.records, p.inputs, o.deterministic);
    if (p.logits) p.logits->finish();
    Report report = simulation_report(summary, result.records, p.inputs, p.request.units);
    if (const std::string note = early_stop_note(p, result); !note.empty()) report.notes.push_back(note);
    if (p.logits)
        report.notes.push_back(fmt::format("logits: {} rows (one per step, the logits the tokens were chosen from, {} mode) of {} float32 "
                                           "values in {} (.npy, docs/cli-simulate.md)",
                                           p.logits->n_rows(), p.sim.mode == SimMode::uncached ? "uncached" : "cached", p.config.n_vocab,
                                           o.logits));
    if (const std::string note = thread_use_note(result.core_use); !note.empty()) report.notes.push_back(note);
    if (!o.checkpoint.empty()) {  // where the run read the checkpoint's matrices from
        const MatrixBytes m = matrix_bytes(cfg, p.weights);
        const std::string total = format_bytes(m.total, o.units);
        const char* converted = "converted into memory of their own (BF16/F16 widened, GPT-2's Conv1D weights transposed, F32 "
                                "off a 4-byte boundary)";
        const std::string where = m.in_place == 0 ? fmt::format("none read in place: all {} {}", total, converted)
                                  : m.in_place == m.total
                                      ? fmt::format("all {} read in place, from the file's pages in the page cache (mapped, as run.c "
                                                    "reads them)", total)
                                      : fmt::format("{} of {} read in place, from the file's pages in the page cache (mapped, as "
                                                    "run.c reads them); the other {} {}",
                                                    format_bytes(m.in_place, o.units), total,
                                                    format_bytes(m.total - m.in_place, o.units), converted);
        report.notes.push_back(fmt::format("checkpoint matrices: {}; docs/performance.md, \"Where a checkpoint's matrices live\"", where));
    }
    if (!o.save_checkpoint.empty())
        report.notes.push_back(fmt::format("saved the model run as llama2.c v0: {} ({} bytes)", o.save_checkpoint,
                                           llama2c_file_bytes(cfg, Llama2cVersion::v0)));
    return report;
}

void repeat_simulation(const PreparedSimulation& p, SimulationResult& first, std::atomic<bool>& stop) {
    const std::int64_t n = p.request.repeat;
    if (n <= 1) return;
    const auto walls = [](const SimulationResult& r, StepMode m) {
        std::int64_t ns = 0;
        for (const StepRecord& rec : r.records) ns += rec.mode == m ? rec.wall_ns : 0;
        return ns;
    };
    RepeatWalls& w = first.repeats;
    w.cached_ns = {walls(first, StepMode::cached)};
    w.uncached_ns = {walls(first, StepMode::uncached)};
    SimulateOptions again = p.sim;
    again.n_steps = first.n_steps_done;  // an early stop: the same tokens, the same length
    again.end_tokens.clear();
    again.stop_after = nullptr;
    again.on_token = nullptr;
    again.on_logits = nullptr;
    again.stop = &stop;
    for (std::int64_t i = 1; i < n; ++i) {
        const SimulationResult r = run_simulation(p.config, p.weights, again);
        if (r.interrupted) throw Interrupted(fmt::format("interrupted in run {} of --repeat {}; no report", i + 1, n));
        w.cached_ns.push_back(walls(r, StepMode::cached));
        w.uncached_ns.push_back(walls(r, StepMode::uncached));
    }
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
