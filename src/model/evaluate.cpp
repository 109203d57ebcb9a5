#include "model/evaluate.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/error.hpp"
#include "model/kv_cache.hpp"
#include "model/simulator.hpp"

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

EvalComparison evaluate_policy(const ModelConfig& cfg, const ModelConfig& reference_cfg, const Weights& weights, std::span<const TokenId> ids,
                               const KvStorage& storage) {
    check_eval_ids(cfg, ids);
    const auto n = static_cast<std::int64_t>(ids.size());
    const std::int64_t window = std::min(cfg.n_ctx_max, n);
    Transformer model(cfg, weights, TransformerSize{window, 1, false});
    Transformer reference(reference_cfg, weights, TransformerSize{window, 1, false});
    EvalComparison c;
    c.policy.n_tokens = c.reference.n_tokens = n;
    VectorF ref_logits(cfg.n_vocab);
    for (std::int64_t start = 0; start + 1 < n; start += window - 1) {
        const std::int64_t len = std::min(window, n - start);
        KvCache cache(cfg, window, storage), ref_cache(reference_cfg, window);
        for (std::int64_t p = 0; p + 1 < len; ++p) {
            const auto token = ids.subspan(static_cast<std::size_t>(start + p), 1);
            const TokenId target = ids[static_cast<std::size_t>(start + p + 1)];
            ref_logits = reference.forward_cached(token, p, ref_cache, nullptr);
            const VectorF& logits = model.forward_cached(token, p, cache, nullptr);
            c.reference.nll_sum += token_nll(ref_logits, target);
            c.policy.nll_sum += token_nll(logits, target);
            const double kl = kl_divergence(ref_logits, logits);
            c.mean_kl += kl;
            c.max_kl = std::max(c.max_kl, kl);
            Eigen::Index a = 0, b = 0;
            ref_logits.maxCoeff(&a);
            logits.maxCoeff(&b);
            c.n_agree += a == b ? 1 : 0;
            ++c.policy.n_scored;
            ++c.reference.n_scored;
        }
        ++c.policy.n_windows;
        ++c.reference.n_windows;
    }
    c.mean_kl /= static_cast<double>(c.policy.n_scored);
    finish(c.policy);
    finish(c.reference);
    return c;
}

}  // namespace kvlab
