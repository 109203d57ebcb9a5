#include "kvlab/sim/simulator.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

#include <omp.h>

#include <fmt/format.h>

#include "kvlab/core/checked.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/kv/kv_cache.hpp"
#include "kernels/narrow_weights.hpp"
#include "kvlab/calc/kv_memory.hpp"
#include "kvlab/weights/random_weights.hpp"
#include "kvlab/model/reference.hpp"
#include "kvlab/core/text.hpp"
#include "kvlab/core/units.hpp"

namespace kvlab {

std::string_view step_mode_name(StepMode mode) { return mode == StepMode::cached ? "cached" : "uncached"; }

double logit_tolerance(const VectorF& reference) {
    return 1e-3 * std::max(1.0, static_cast<double>(reference.cwiseAbs().maxCoeff()));
}

ModelConfig simulation_config(const ModelConfig& cfg, std::optional<std::int64_t> n_layers) {
    if (cfg.mla && cfg.mla->q_lora_rank > 0)
        throw ConfigError(fmt::format("{}: MLA with a compressed query (q_lora_rank {}) is not simulated; kvlab runs MLA without it "
                                      "(DeepSeek-V2-Lite's form, or --attention mla:R on a Llama shape); kvcalc sizes this cache",
                                      cfg.name, cfg.mla->q_lora_rank));
    if (cfg.cross)
        throw ConfigError(fmt::format("{}: encoder-decoder models ({}) are not simulated; kvcalc sizes their self- and cross-attention caches",
                                      cfg.name, cfg.model_type));
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
    if (o.mode != SimMode::cached) return {n_positions, n_positions, true, narrow, 0, o.mla_path};
    const std::int64_t n_prompt = o.prompt_ids.empty() ? o.n_prompt : static_cast<std::int64_t>(o.prompt_ids.size());
    return {n_positions, n_prompt, false, narrow, 0, o.mla_path};
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

namespace {

using Clock = std::chrono::steady_clock;
std::int64_t ns_since(Clock::time_point t0) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
}

// One simulate run: the models it steps in lockstep and the result it fills, one method per part of a step.
class SimulationRun {
public:
    SimulationRun(const ModelConfig& cfg, const Weights& weights, const SimulateOptions& o);
    SimulationResult run();

private:
    const VectorF* cached_step(std::int64_t step);
    void measure_policy(std::span<const TokenId> tokens, std::int64_t pos0, const VectorF& out);
    void compare_modes(std::int64_t step, const VectorF& out, StepRecord& cached, StepRecord& uncached);
    void reference_step(std::span<const TokenId> tokens, std::int64_t pos0, const VectorF& fast);
    void finish_step(std::int64_t step, TokenId next, StepRecord* cached, StepRecord* uncached);

    const ModelConfig& cfg_;
    const SimulateOptions& o_;
    const TransformerSize size_;
    const bool run_cached_, run_uncached_, policy_;
    SimulationResult r_;
    std::optional<NarrowWeights> narrow_w_;  // --weight-dtype: what the matmuls read instead of the fp32 weights
    Transformer model_;
    std::optional<KvCache> cache_;
    // a policy: the fp32 full cache it is measured against, and the model without it when the policy
    // changes attention (windows, sinks) or the weights
    std::optional<KvCache> policy_ref_cache_;
    std::optional<Transformer> policy_ref_model_;
    VectorF logits_policy_;  // a policy run's logits, kept while the fp32 model reuses the buffers
    VectorF logits_cached_;  // both modes: the cached logits, kept while the uncached forward reuses the buffers
    // --kernel reference: the readable forward, its sampler, its logits and the token it picked this step
    std::optional<ReferenceModel> readable_;
    std::optional<Sampler> readable_sampler_;
    VectorF readable_logits_;
    TokenId readable_token_ = 0;
    Sampler sampler_;
    std::vector<TokenId> seq_;
};

bool has_policy(const SimulateOptions& o) {
    return o.kv_storage.dtype != DType::fp32 || o.reference_config.has_value() || o.weight_dtype != DType::fp32;
}

const SimulateOptions& checked_options(const SimulateOptions& o) {
    if (has_policy(o) && o.mode != SimMode::cached)
        throw UsageError("--kv-dtype, --window, --sink-tokens, --weight-dtype: policies are measured on the cached mode; expected --mode cached");
    if (o.kernel == ForwardKernel::reference && (has_policy(o) || o.mode == SimMode::uncached))
        throw UsageError("--kernel reference: the reference forward runs beside the cached mode with fp32 weights and an fp32 full cache; "
                         "expected --mode cached or both, without --kv-dtype, --weight-dtype, --window or --sink-tokens");
    return o;
}

SimulationRun::SimulationRun(const ModelConfig& cfg, const Weights& weights, const SimulateOptions& o)
    : cfg_(cfg), o_(checked_options(o)), size_(simulation_size(cfg, o)), run_cached_(o.mode != SimMode::uncached),
      run_uncached_(o.mode != SimMode::cached), policy_(has_policy(o) && o.quality),
      narrow_w_(o.weight_dtype != DType::fp32 ? std::optional<NarrowWeights>(narrow_weights(weights, o.weight_dtype)) : std::nullopt),
      model_(cfg, weights, size_, narrow_w_ ? &*narrow_w_ : nullptr), sampler_(o.sampler, cfg.n_vocab) {
    // everything the loop touches is allocated here
    const std::int64_t n_positions = size_.n_positions;
    r_.prompt = simulation_prompt(cfg, o);
    if (run_cached_) {
        cache_.emplace(cfg, n_positions, o.kv_storage);
        r_.kv_cache_bytes = cache_->bytes();
    }
    if (policy_) {
        const ModelConfig& ref_cfg = o.reference_config ? *o.reference_config : cfg;
        policy_ref_cache_.emplace(ref_cfg, n_positions);
        TransformerSize ref_size = size_;
        ref_size.narrow_weights = false;
        if (o.reference_config || narrow_w_) policy_ref_model_.emplace(ref_cfg, weights, ref_size);  // fp32 weights
        r_.kv_quality.emplace();
        logits_policy_.resize(cfg.n_vocab);
    }
    if (o.kernel == ForwardKernel::reference) {
        readable_.emplace(cfg, weights, n_positions);
        readable_sampler_.emplace(o.sampler, cfg.n_vocab);
        readable_logits_.resize(cfg.n_vocab);
        r_.reference_kernel.emplace();
        r_.reference_kernel->wall_ns.reserve(static_cast<std::size_t>(o.n_steps));
        r_.reference_kernel->fast_threads = omp_get_max_threads();
    }
    seq_ = r_.prompt;
    seq_.reserve(static_cast<std::size_t>(n_positions));
    r_.generated.reserve(static_cast<std::size_t>(o.n_steps));
    r_.records.reserve(static_cast<std::size_t>(o.n_steps * (run_cached_ && run_uncached_ ? 2 : 1)));
    if (run_cached_ && run_uncached_) logits_cached_.resize(cfg.n_vocab);
}

SimulationResult SimulationRun::run() {
    const CoreUseClock core_clock;
    // One untimed, uncounted forward over the prompt first, when both modes are timed against each other:
    // the first forward of a process pays one-off costs (the thread team starting, the weights' pages
    // faulted in, scratch buffers growing), and step 0 is the cached mode's, so on a short run they
    // alone made cached decoding look slower. It touches no cache, record or sampler.
    if (run_cached_ && run_uncached_ && !seq_.empty()) model_.forward_uncached(seq_, nullptr);
    for (std::int64_t step = 0; step < o_.n_steps; ++step) {
        if (o_.stop && o_.stop->load()) {
            r_.interrupted = true;
            break;
        }
        const VectorF* logits = run_cached_ ? cached_step(step) : nullptr;
        StepRecord* rec_cached = run_cached_ ? &r_.records.back() : nullptr;
        StepRecord* rec_uncached = nullptr;
        if (run_uncached_) {
            StepRecord& rec = r_.records.emplace_back();
            rec.mode = StepMode::uncached;
            // the full forward over every token so far, as naive generate does
            const auto t0 = Clock::now();
            const VectorF& out = model_.forward_uncached(seq_, o_.count ? &rec.cost : nullptr);
            rec.wall_ns = ns_since(t0);
            rec.n_tokens = static_cast<std::int64_t>(seq_.size());
            rec_uncached = &rec;
            if (!logits) logits = &out;
            if (rec_cached) compare_modes(step, out, *rec_cached, rec);
        }
        if (o_.on_logits) o_.on_logits(*logits);
        finish_step(step, sampler_.sample(*logits), rec_cached, rec_uncached);
        if (r_.early_stop != EarlyStop::none) break;
    }
    r_.core_use = core_clock.elapsed();
    if (r_.kv_quality && r_.kv_quality->n_steps > 0) r_.kv_quality->mean_kl /= static_cast<double>(r_.kv_quality->n_steps);
    return std::move(r_);
}

// The cached mode's step: the prompt as one batch at step 0, then one token against the cache. Returns
// the logits the sampler reads (kept in a buffer of the run's when another forward follows).
const VectorF* SimulationRun::cached_step(std::int64_t step) {
    StepRecord& rec = r_.records.emplace_back();
    rec.mode = StepMode::cached;
    const auto n_seq = static_cast<std::int64_t>(seq_.size());
    const std::span<const TokenId> tokens = step == 0 ? std::span<const TokenId>(seq_) : std::span<const TokenId>(seq_).last(1);
    const std::int64_t pos0 = n_seq - static_cast<std::int64_t>(tokens.size());
    const auto t0 = Clock::now();
    const VectorF& out = model_.forward_cached(tokens, pos0, *cache_, o_.count ? &rec.cost : nullptr);
    rec.wall_ns = ns_since(t0);
    rec.n_tokens = static_cast<std::int64_t>(tokens.size());
    rec.kv_bytes_resident = kv_resident_bytes(cfg_, o_.kv_storage, static_cast<std::uint64_t>(n_seq));
    if (readable_) reference_step(tokens, pos0, out);
    if (policy_) {
        logits_policy_ = out;
        measure_policy(tokens, pos0, logits_policy_);
        return &logits_policy_;
    }
    if (!run_uncached_) return &out;
    logits_cached_ = out;
    return &logits_cached_;
}

// The same tokens through the fp32 full cache (not timed, not counted): how far the policy moved the logits.
void SimulationRun::measure_policy(std::span<const TokenId> tokens, std::int64_t pos0, const VectorF& out) {
    Transformer& ref_model = policy_ref_model_ ? *policy_ref_model_ : model_;
    const VectorF& ref = ref_model.forward_cached(tokens, pos0, *policy_ref_cache_, nullptr);
    KvQuality& q = *r_.kv_quality;
    const double kl = kl_divergence(ref, out);
    q.max_abs_dlogit = std::max(q.max_abs_dlogit, static_cast<double>((ref - out).cwiseAbs().maxCoeff()));
    q.mean_kl += kl;  // a sum until the end
    q.max_kl = std::max(q.max_kl, kl);
    q.n_agree += argmax(ref) == argmax(out) ? 1 : 0;
    ++q.n_steps;
}

// Both modes saw the same tokens: compare their logits; a near-tie may flip the argmax.
void SimulationRun::compare_modes(std::int64_t step, const VectorF& out, StepRecord& cached, StepRecord& uncached) {
    const double dlogit = static_cast<double>((logits_cached_ - out).cwiseAbs().maxCoeff());
    const double tol = logit_tolerance(logits_cached_);
    cached.max_abs_dlogit = uncached.max_abs_dlogit = dlogit;
    r_.max_abs_dlogit = std::max(r_.max_abs_dlogit, dlogit);
    if (dlogit > tol) {
        if (!r_.first_divergent_step) {
            r_.first_divergent_step = step;
            r_.divergent_dlogit = dlogit;
            r_.divergent_tolerance = tol;
        }
    } else if (argmax(logits_cached_) != argmax(out)) {
        cached.argmax_flip = uncached.argmax_flip = true;
        ++r_.n_argmax_flips;
    }
}

// --kernel reference: the step's tokens through the readable forward, one at a time and timed; its
// logits against the fast path's, and the token its own sampler picks from them.
void SimulationRun::reference_step(std::span<const TokenId> tokens, std::int64_t pos0, const VectorF& fast) {
    ReferenceKernelRun& run = *r_.reference_kernel;
    const auto t0 = Clock::now();
    std::span<const float> out;
    for (std::size_t i = 0; i < tokens.size(); ++i) out = readable_->forward(tokens[i], pos0 + static_cast<std::int64_t>(i));
    run.wall_ns.push_back(ns_since(t0));
    readable_logits_ = Eigen::Map<const VectorF>(out.data(), static_cast<Eigen::Index>(out.size()));
    const double scale = std::max(1.0, static_cast<double>(readable_logits_.cwiseAbs().maxCoeff()));
    run.max_rel_dlogit = std::max(run.max_rel_dlogit, static_cast<double>((fast - readable_logits_).cwiseAbs().maxCoeff()) / scale);
    readable_token_ = readable_sampler_->sample(readable_logits_);
}

void SimulationRun::finish_step(std::int64_t step, TokenId next, StepRecord* cached, StepRecord* uncached) {
    const std::int64_t pos = static_cast<std::int64_t>(seq_.size()) - 1;  // newest token
    for (StepRecord* rec : {cached, uncached}) {
        if (!rec) continue;
        rec->step = step;
        rec->position = pos;
        rec->n_keys = keys_of_newest(cfg_, pos);
        rec->token = next;
    }
    if (readable_) {
        ReferenceKernelRun& run = *r_.reference_kernel;
        ++run.n_steps;
        if (readable_token_ == next) ++run.n_same_token;
        else if (!run.first_other_token) run.first_other_token = step;
    }
    if (step + 1 < o_.n_steps) seq_.push_back(next);  // the last token is generated, never fed back
    r_.generated.push_back(next);
    r_.n_steps_done = step + 1;
    if (std::find(o_.end_tokens.begin(), o_.end_tokens.end(), next) != o_.end_tokens.end()) {
        r_.early_stop = EarlyStop::end_token;
    } else {
        if (o_.on_token) o_.on_token(next);
        if (o_.stop_after && o_.stop_after(next)) r_.early_stop = EarlyStop::stop_after;
    }
    if (o_.on_step) o_.on_step(step + 1, o_.n_steps);
}

}  // namespace

SimulationResult run_simulation(const ModelConfig& cfg, const Weights& weights, const SimulateOptions& o) {
    return SimulationRun(cfg, weights, o).run();
}

}  // namespace kvlab
