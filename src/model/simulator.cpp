#include "model/simulator.hpp"

#include <chrono>
#include <cmath>
#include <random>

#include <fmt/format.h>

#include "core/checked.hpp"
#include "core/error.hpp"
#include "model/kv_cache.hpp"
#include "model/narrow_weights.hpp"
#include "calc/kv_memory.hpp"
#include "model/random_weights.hpp"
#include "core/text.hpp"
#include "core/units.hpp"

namespace kvlab {

std::string_view step_mode_name(StepMode mode) { return mode == StepMode::cached ? "cached" : "uncached"; }

double logit_tolerance(const VectorF& reference) {
    return 1e-3 * std::max(1.0, static_cast<double>(reference.cwiseAbs().maxCoeff()));
}

ModelConfig simulation_config(const ModelConfig& cfg, std::optional<std::int64_t> n_layers) {
    if (cfg.mla)
        throw ConfigError(fmt::format("{}: multi-head latent attention (MLA) is not simulated; use kvcalc for its cache size",
                                      cfg.name));
    if (cfg.d_ff == 0)
        throw ConfigError(fmt::format("{}: the config has no intermediate_size; the simulator needs the MLP width", cfg.name));
    if (cfg.n_expert > 1)
        throw ConfigError(fmt::format("{}: mixture-of-experts ({} experts, {} active) is not simulated; use kvcalc for its "
                                      "cache size, or a dense preset of the same attention shape",
                                      cfg.name, cfg.n_expert, cfg.n_expert_active));
    // the forward pass computes SwiGLU (silu) for llama and the tanh GELU for gpt2: refuse any other
    // activation rather than run a different model under its name (transformers' names for the same functions)
    const bool gpt2 = cfg.family == Family::gpt2;
    const auto& act = cfg.activation;
    const bool supported = act.empty() || (gpt2 ? act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast"
                                                : act == "silu" || act == "swish");
    if (!supported)
        throw ConfigError(fmt::format("{}: activation {} is not simulated; kvlab computes {} ({})", cfg.name, quote(act, 40),
                                      gpt2 ? "the tanh GELU" : "SwiGLU with silu",
                                      gpt2 ? "activation_function gelu_new, gelu_pytorch_tanh or gelu_fast" : "hidden_act silu"));
    ModelConfig out = cfg;
    if (n_layers) {
        if (*n_layers < 1 || *n_layers > cfg.n_layer)
            throw UsageError(fmt::format("--layers: {}; expected 1..{} (the layers of {})", *n_layers, cfg.n_layer, cfg.name));
        out.n_layer = *n_layers;
        if (!out.layer_windowed.empty()) out.layer_windowed.resize(static_cast<std::size_t>(*n_layers));
        if (*n_layers != cfg.n_layer)
            out.display_name = fmt::format("{} ({} of {} layers)", cfg.display_name, *n_layers, cfg.n_layer);
    }
    return out;
}

std::int64_t simulation_positions(const ModelConfig& cfg, const SimulateOptions& o) {
    const std::int64_t n_prompt = o.prompt_ids.empty() ? o.n_prompt : static_cast<std::int64_t>(o.prompt_ids.size());
    if (n_prompt <= 0) throw UsageError(fmt::format("--prompt-len: {}; expected at least 1 token", n_prompt));
    if (o.n_steps <= 0) throw UsageError(fmt::format("--steps: {}; expected at least 1", o.n_steps));
    for (const TokenId t : o.prompt_ids)
        if (t < 0 || t >= cfg.n_vocab)
            throw UsageError(fmt::format("--prompt-ids: token id {} is outside the vocabulary [0, {}) of {}", t, cfg.n_vocab,
                                         cfg.name));
    // The last generated token is never fed back: a run reads prompt + steps - 1 positions (run.c's
    // `steps` counts the same way: 256 positions hold a 5-token prompt and 252 generated tokens).
    if (n_prompt > cfg.n_ctx_max || o.n_steps - 1 > cfg.n_ctx_max - n_prompt)
        throw UsageError(fmt::format("--steps: the prompt's {} tokens + {} steps - 1 = {} positions exceed the context of {} ({} "
                                     "positions); at most {} steps",
                                     n_prompt, o.n_steps, static_cast<std::uint64_t>(n_prompt) + static_cast<std::uint64_t>(o.n_steps) - 1,
                                     cfg.name, cfg.n_ctx_max, std::max<std::int64_t>(cfg.n_ctx_max - n_prompt + 1, 0)));
    validate_sampler_options(o.sampler);
    return n_prompt + o.n_steps - 1;
}

TransformerSize simulation_size(const ModelConfig& cfg, const SimulateOptions& o) {
    const std::int64_t n_positions = simulation_positions(cfg, o);
    const bool narrow = o.weight_dtype != DType::fp32;
    if (o.mode != SimMode::cached) return {n_positions, n_positions, true, narrow};
    const std::int64_t n_prompt = o.prompt_ids.empty() ? o.n_prompt : static_cast<std::int64_t>(o.prompt_ids.size());
    return {n_positions, n_prompt, false, narrow};
}

MemoryEstimate estimate_simulation_memory(const ModelConfig& cfg, const SimulateOptions& o) {
    const TransformerSize size = simulation_size(cfg, o);
    MemoryEstimate e;
    e.weights = weights_bytes(cfg);
    const bool narrow_weights = o.weight_dtype != DType::fp32;
    if (narrow_weights) e.weights = checked_add(e.weights, narrow_weights_bytes(cfg, o.weight_dtype), "memory estimate");  // both copies
    if (o.mode != SimMode::uncached) {
        const auto n = static_cast<std::uint64_t>(size.n_positions);
        e.kv_cache = kv_resident_bytes(cfg, o.kv_storage, n);
        if (o.quality && (o.kv_storage.dtype != DType::fp32 || o.reference_config || narrow_weights)) {
            // the fp32 full reference cache beside it (and its model's activations)
            const ModelConfig& ref_cfg = o.reference_config ? *o.reference_config : cfg;
            auto fp32 = kv_bytes_sequence(ref_cfg, DType::fp32, n, WindowMode::cap).total();
            TransformerSize ref_size = size;
            ref_size.narrow_weights = false;
            if (o.reference_config || narrow_weights) fp32 = checked_add(fp32, Transformer::activation_bytes(ref_cfg, ref_size), "memory estimate");
            e.kv_cache = checked_add(e.kv_cache, fp32, "memory estimate");
        }
    }
    e.activations = Transformer::activation_bytes(cfg, size);
    const auto n_modes = static_cast<std::uint64_t>(o.mode == SimMode::both ? 2 : 1);
    e.records = checked_mul(checked_mul(static_cast<std::uint64_t>(o.n_steps), n_modes, "trace records"), sizeof(StepRecord),
                            "trace records");  // one per step per mode
    return e;
}

MemoryEstimate check_simulation_memory(const ModelConfig& cfg, const SimulateOptions& o, std::uint64_t max_bytes) {
    const MemoryEstimate e = estimate_simulation_memory(cfg, o);
    if (e.total() <= max_bytes) return e;
    // weights and KV grow by the same amount per layer: suggest the most layers that fit
    std::string hint = "; lower --prompt-len/--steps or raise --max-memory";
    if (cfg.n_layer > 1) {
        const std::uint64_t one_layer = estimate_simulation_memory(simulation_config(cfg, 1), o).total();
        const std::uint64_t per_layer = (e.total() - one_layer) / static_cast<std::uint64_t>(cfg.n_layer - 1);
        if (one_layer <= max_bytes && per_layer > 0)
            hint = fmt::format("; try --layers {} (the real layer shapes, fewer layers)", 1 + (max_bytes - one_layer) / per_layer);
    }
    throw UsageError(fmt::format("--max-memory: simulating {} needs about {} (weights {}, KV cache {}, activations {}), "
                                 "more than the {} allowed{}",
                                 cfg.display_name, format_bytes(e.total(), UnitSystem::iec),
                                 format_bytes(e.weights, UnitSystem::iec), format_bytes(e.kv_cache, UnitSystem::iec),
                                 format_bytes(e.activations + e.records, UnitSystem::iec), format_bytes(max_bytes, UnitSystem::iec), hint));
}

namespace {

std::int64_t keys_of_newest(const ModelConfig& cfg, std::int64_t pos) {
    std::int64_t widest = 0;
    for (std::int64_t l = 0; l < cfg.n_layer; ++l) widest = std::max(widest, cfg.keys_attended(l, pos));
    return widest;
}

}  // namespace

std::vector<TokenId> simulation_prompt(const ModelConfig& cfg, const SimulateOptions& o) {
    if (!o.prompt_ids.empty()) return o.prompt_ids;
    std::vector<TokenId> prompt;
    std::mt19937_64 rng(o.seed);
    for (std::int64_t i = 0; i < o.n_prompt; ++i)
        prompt.push_back(static_cast<TokenId>(rng() % static_cast<std::uint64_t>(cfg.n_vocab)));
    return prompt;
}

double kl_divergence(const VectorF& p_logits, const VectorF& q_logits) {
    // log-softmax of each in double: log p_i = x_i - max - log sum exp(x - max)
    auto log_norm = [](const VectorF& x) {
        const double m = static_cast<double>(x.maxCoeff());
        double sum = 0.0;
        for (Eigen::Index i = 0; i < x.size(); ++i) sum += std::exp(static_cast<double>(x[i]) - m);
        return m + std::log(sum);
    };
    const double lp = log_norm(p_logits), lq = log_norm(q_logits);
    double kl = 0.0;
    for (Eigen::Index i = 0; i < p_logits.size(); ++i) {
        const double log_p = static_cast<double>(p_logits[i]) - lp, log_q = static_cast<double>(q_logits[i]) - lq;
        kl += std::exp(log_p) * (log_p - log_q);
    }
    return std::max(kl, 0.0);  // rounding can leave -1e-17 for identical inputs
}

SimulationResult run_simulation(const ModelConfig& cfg, const Weights& weights, const SimulateOptions& o) {
    using clock = std::chrono::steady_clock;
    const TransformerSize size = simulation_size(cfg, o);
    const std::int64_t n_positions = size.n_positions;
    const bool run_cached = o.mode != SimMode::uncached, run_uncached = o.mode != SimMode::cached;

    SimulationResult r;
    r.prompt = simulation_prompt(cfg, o);

    // everything the loop touches is allocated here
    const bool narrow = o.kv_storage.dtype != DType::fp32;
    const bool any_policy = narrow || o.reference_config.has_value() || o.weight_dtype != DType::fp32;
    if (any_policy && run_uncached)
        throw UsageError("--kv-dtype, --window, --sink-tokens, --weight-dtype: policies are measured on the cached mode; expected --mode cached");
    const bool policy = any_policy && o.quality;  // measured against the fp32 model, in lockstep
    std::optional<NarrowWeights> narrow_w;  // --weight-dtype: what the matmuls read instead of the fp32 weights
    if (o.weight_dtype != DType::fp32) narrow_w.emplace(narrow_weights(weights, o.weight_dtype));
    Transformer model(cfg, weights, size, narrow_w ? &*narrow_w : nullptr);
    std::optional<KvCache> cache, reference;  // reference: the fp32 full cache a policy is measured against
    std::optional<Transformer> reference_model;  // a policy that changes attention (windows, sinks) needs the model without it
    if (run_cached) {
        cache.emplace(cfg, n_positions, o.kv_storage);
        r.kv_cache_bytes = cache->bytes();
    }
    if (policy) {
        const ModelConfig& ref_cfg = o.reference_config ? *o.reference_config : cfg;
        reference.emplace(ref_cfg, n_positions);
        TransformerSize ref_size = size;
        ref_size.narrow_weights = false;
        if (o.reference_config || narrow_w) reference_model.emplace(ref_cfg, weights, ref_size);  // fp32 weights
        r.kv_quality.emplace();
    }
    VectorF logits_narrow;  // a policy run's logits, kept while the reference forward may reuse the buffers
    if (policy) logits_narrow.resize(cfg.n_vocab);
    Sampler sampler(o.sampler, cfg.n_vocab);
    std::vector<TokenId> seq = r.prompt;
    seq.reserve(static_cast<std::size_t>(n_positions));
    r.generated.reserve(static_cast<std::size_t>(o.n_steps));
    r.records.reserve(static_cast<std::size_t>(o.n_steps * (run_cached && run_uncached ? 2 : 1)));
    VectorF logits_cached;  // (V) both modes: the cached logits, kept while the uncached forward reuses the buffers
    if (run_cached && run_uncached) logits_cached.resize(cfg.n_vocab);

    const CoreUseClock core_clock;
    for (std::int64_t step = 0; step < o.n_steps; ++step) {
        if (o.stop && o.stop->load()) {
            r.interrupted = true;
            break;
        }
        const auto n_seq = static_cast<std::int64_t>(seq.size());
        const std::int64_t pos = n_seq - 1;  // newest token
        StepRecord* rec_cached = nullptr;
        StepRecord* rec_uncached = nullptr;
        const VectorF* logits = nullptr;
        if (run_cached) {
            StepRecord& rec = r.records.emplace_back();
            rec.mode = StepMode::cached;
            // prefill: the whole prompt as one batch; then one token per step against the cache
            const std::span<const TokenId> tokens =
                step == 0 ? std::span<const TokenId>(seq) : std::span<const TokenId>(seq).last(1);
            const auto t0 = clock::now();
            const VectorF& out = model.forward_cached(tokens, n_seq - static_cast<std::int64_t>(tokens.size()), *cache,
                                                      o.count ? &rec.cost : nullptr);
            rec.wall_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - t0).count();
            rec.n_tokens = static_cast<std::int64_t>(tokens.size());
            rec.kv_bytes_resident = kv_resident_bytes(cfg, o.kv_storage, static_cast<std::uint64_t>(n_seq));
            rec_cached = &rec;
            if (policy) {
                // the same tokens through the fp32 full cache (not timed, not counted): how far the policy moved the logits
                logits_narrow = out;
                Transformer& ref_model = reference_model ? *reference_model : model;
                const VectorF& ref = ref_model.forward_cached(tokens, n_seq - static_cast<std::int64_t>(tokens.size()), *reference, nullptr);
                KvQuality& q = *r.kv_quality;
                const double kl = kl_divergence(ref, logits_narrow);
                q.max_abs_dlogit = std::max(q.max_abs_dlogit, static_cast<double>((ref - logits_narrow).cwiseAbs().maxCoeff()));
                q.mean_kl += kl;  // a sum until the end
                q.max_kl = std::max(q.max_kl, kl);
                q.n_agree += argmax(ref) == argmax(logits_narrow) ? 1 : 0;
                ++q.n_steps;
                logits = &logits_narrow;
            } else if (run_uncached) {
                logits_cached = out;
                logits = &logits_cached;
            } else {
                logits = &out;
            }
        }
        if (run_uncached) {
            StepRecord& rec = r.records.emplace_back();
            rec.mode = StepMode::uncached;
            // the full forward over every token so far, as naive generate does
            const auto t0 = clock::now();
            const VectorF& out = model.forward_uncached(seq, o.count ? &rec.cost : nullptr);
            rec.wall_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - t0).count();
            rec.n_tokens = n_seq;
            rec_uncached = &rec;
            if (!logits) logits = &out;
            if (rec_cached) {
                // both modes saw the same tokens: compare logits; a near-tie may flip the argmax
                const double dlogit = static_cast<double>((logits_cached - out).cwiseAbs().maxCoeff());
                const double tol = logit_tolerance(logits_cached);
                const bool flip = argmax(logits_cached) != argmax(out);
                rec_cached->max_abs_dlogit = rec.max_abs_dlogit = dlogit;
                r.max_abs_dlogit = std::max(r.max_abs_dlogit, dlogit);
                if (dlogit > tol) {
                    if (!r.first_divergent_step) {
                        r.first_divergent_step = step;
                        r.divergent_dlogit = dlogit;
                        r.divergent_tolerance = tol;
                    }
                } else if (flip) {
                    rec_cached->argmax_flip = rec.argmax_flip = true;
                    ++r.n_argmax_flips;
                }
            }
        }
        const TokenId next = sampler.sample(*logits);
        for (StepRecord* rec : {rec_cached, rec_uncached}) {
            if (!rec) continue;
            rec->step = step;
            rec->position = pos;
            rec->n_keys = keys_of_newest(cfg, pos);
            rec->token = next;
        }
        if (step + 1 < o.n_steps) seq.push_back(next);  // the last token is generated, never fed back
        r.generated.push_back(next);
        r.n_steps_done = step + 1;
        if (o.on_token) o.on_token(next);
        if (o.on_step) o.on_step(step + 1, o.n_steps);
    }
    r.core_use = core_clock.elapsed();
    if (r.kv_quality && r.kv_quality->n_steps > 0) r.kv_quality->mean_kl /= static_cast<double>(r.kv_quality->n_steps);
    return r;
}

}  // namespace kvlab
