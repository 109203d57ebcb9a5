#include "kvlab/sim/evaluate.hpp"

#include <algorithm>
#include <cmath>
#include <memory>

#include <fmt/format.h>

#include "kvlab/core/error.hpp"
#include "kvlab/kv/kv_cache.hpp"
#include "kernels/narrow_weights.hpp"
#include "kvlab/sim/simulator.hpp"

namespace kvlab {

namespace {

// -ln softmax(logits)[target], in double: ln sum exp(l - max) - (l[target] - max)
double token_nll(const VectorF& logits, TokenId target) {
    const double max = static_cast<double>(logits.maxCoeff());
    double sum = 0.0;
    for (Eigen::Index i = 0; i < logits.size(); ++i) sum += std::exp(static_cast<double>(logits[i]) - max);
    return std::log(sum) - (static_cast<double>(logits[target]) - max);
}

void check_eval_ids(const ModelConfig& cfg, std::span<const TokenId> ids) {
    const auto n = static_cast<std::int64_t>(ids.size());
    if (n < 2) throw UsageError(fmt::format("--eval: the text encodes to {} token(s); at least one token after BOS is needed", n));
    if (cfg.n_ctx_max < 2) throw ConfigError(fmt::format("{}: a context of {} positions cannot score a next token", cfg.name, cfg.n_ctx_max));
    for (const TokenId t : ids)
        if (t < 0 || t >= cfg.n_vocab)
            throw UsageError(fmt::format("--eval: token id {} is outside the vocabulary [0, {}) of {}", t, cfg.n_vocab, cfg.name));
}

void finish(EvalResult& r) {
    r.mean_nll = r.nll_sum / static_cast<double>(r.n_scored);
    r.perplexity = std::exp(r.mean_nll);
}

}  // namespace

EvalResult evaluate_nll(const ModelConfig& cfg, const Weights& weights, std::span<const TokenId> ids, const KvStorage& storage) {
    check_eval_ids(cfg, ids);
    const auto n = static_cast<std::int64_t>(ids.size());
    const std::int64_t window = std::min(cfg.n_ctx_max, n);
    Transformer model(cfg, weights, TransformerSize{window, 1, false});
    EvalResult r;
    r.n_tokens = n;
    for (std::int64_t start = 0; start + 1 < n; start += window - 1) {
        const std::int64_t len = std::min(window, n - start);
        KvCache cache(cfg, window, storage);
        for (std::int64_t p = 0; p + 1 < len; ++p) {
            const VectorF& logits = model.forward_cached(ids.subspan(static_cast<std::size_t>(start + p), 1), p, cache, nullptr);
            r.nll_sum += token_nll(logits, ids[static_cast<std::size_t>(start + p + 1)]);
            ++r.n_scored;
        }
        ++r.n_windows;
    }
    finish(r);
    return r;
}

EvalPolicies evaluate_policies(const ModelConfig& cfg, const ModelConfig& reference_cfg, const Weights& weights, std::span<const TokenId> ids,
                               std::span<const KvStorage> storages, std::span<const NarrowWeights* const> narrow) {
    check_eval_ids(cfg, ids);
    if (narrow.size() != storages.size()) throw std::logic_error("evaluate_policies: one narrow-weights entry per storage");
    const auto n = static_cast<std::int64_t>(ids.size());
    const std::int64_t window = std::min(cfg.n_ctx_max, n);
    // one model per policy (a cached call reads only the cache it is given, so policies with the same
    // weights could share one; these are small), one for the reference
    std::vector<std::unique_ptr<Transformer>> models;
    for (const NarrowWeights* nw : narrow) models.push_back(std::make_unique<Transformer>(cfg, weights, TransformerSize{window, 1, false, nw != nullptr}, nw));
    Transformer reference(reference_cfg, weights, TransformerSize{window, 1, false});
    EvalPolicies r;
    r.policies.resize(storages.size());
    r.reference.n_tokens = n;
    for (auto& c : r.policies) c.policy.n_tokens = n;
    VectorF ref_logits(cfg.n_vocab);
    for (std::int64_t start = 0; start + 1 < n; start += window - 1) {
        const std::int64_t len = std::min(window, n - start);
        KvCache ref_cache(reference_cfg, window);
        std::vector<KvCache> caches;
        for (const KvStorage& storage : storages) caches.emplace_back(cfg, window, storage);
        for (std::int64_t p = 0; p + 1 < len; ++p) {
            const auto token = ids.subspan(static_cast<std::size_t>(start + p), 1);
            const TokenId target = ids[static_cast<std::size_t>(start + p + 1)];
            ref_logits = reference.forward_cached(token, p, ref_cache, nullptr);
            r.reference.nll_sum += token_nll(ref_logits, target);
            ++r.reference.n_scored;
            Eigen::Index ref_top = 0;
            ref_logits.maxCoeff(&ref_top);
            for (std::size_t i = 0; i < caches.size(); ++i) {
                EvalComparison& c = r.policies[i];
                const VectorF& logits = models[i]->forward_cached(token, p, caches[i], nullptr);
                c.policy.nll_sum += token_nll(logits, target);
                const double kl = kl_divergence(ref_logits, logits);
                c.mean_kl += kl;  // a sum until the end
                c.max_kl = std::max(c.max_kl, kl);
                Eigen::Index top = 0;
                logits.maxCoeff(&top);
                c.n_agree += top == ref_top ? 1 : 0;
                ++c.policy.n_scored;
            }
        }
        ++r.reference.n_windows;
        for (auto& c : r.policies) ++c.policy.n_windows;
    }
    finish(r.reference);
    for (auto& c : r.policies) {
        c.mean_kl /= static_cast<double>(c.policy.n_scored);
        finish(c.policy);
    }
    return r;
}

}  // namespace kvlab
