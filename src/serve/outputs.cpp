#include "serve/outputs.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>

#include <fmt/format.h>

#include "kvlab/core/error.hpp"
#include "kvlab/kv/kv_cache.hpp"
#include "kvlab/sim/simulator.hpp"

namespace kvlab {

namespace {

// log softmax(logits)[v] for every v, in double: logits[v] - (max + log sum exp(logits - max)).
void log_softmax(const VectorF& x, std::vector<double>& out) {
    const double mx = x.maxCoeff();
    double sum = 0.0;
    for (Eigen::Index v = 0; v < x.size(); ++v) sum += std::exp(static_cast<double>(x[v]) - mx);
    const double lse = mx + std::log(sum);
    out.resize(static_cast<std::size_t>(x.size()));
    for (Eigen::Index v = 0; v < x.size(); ++v) out[static_cast<std::size_t>(v)] = static_cast<double>(x[v]) - lse;
}

double log_prob(const VectorF& x, TokenId token) {
    std::vector<double> lp;
    log_softmax(x, lp);
    return lp[static_cast<std::size_t>(token)];
}

struct Candidate {
    double score = 0.0;
    std::int64_t parent = 0;  // the beam's rank
    TokenId token = 0;
};

// The W best extensions of the beams (ranked; scores[r] and log-probs lp[r] of the beam of rank r): by
// score, ties to the better-ranked beam, then the lower token id.
std::vector<Candidate> beam_select(std::span<const double> scores, const std::vector<std::vector<double>>& lp, std::int64_t W) {
    std::vector<Candidate> all;
    for (std::size_t r = 0; r < scores.size(); ++r)
        for (std::size_t v = 0; v < lp[r].size(); ++v) all.push_back({scores[r] + lp[r][v], static_cast<std::int64_t>(r), static_cast<TokenId>(v)});
    const auto better = [](const Candidate& a, const Candidate& b) {
        if (a.score != b.score) return a.score > b.score;
        return a.parent != b.parent ? a.parent < b.parent : a.token < b.token;
    };
    const auto keep = std::min<std::ptrdiff_t>(W, std::ssize(all));
    std::partial_sort(all.begin(), all.begin() + keep, all.end(), better);
    all.resize(static_cast<std::size_t>(keep));
    return all;
}

std::uint64_t splitmix64(std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// The same beam search on the single-sequence path, a KV cache per beam: a beam's first child takes it
// over, another child gets a new one, its tokens run again (a cache is not copied).
std::vector<std::vector<TokenId>> solo_beam_search(const ModelConfig& cfg, Transformer& solo, const std::vector<TokenId>& prompt,
                                                   std::int64_t W, std::int64_t T) {
    struct Beam {
        std::unique_ptr<KvCache> cache;
        std::vector<TokenId> generated;
        double score = 0.0;
        VectorF logits;
    };
    const auto P = std::ssize(prompt);
    const auto replay = [&](const std::vector<TokenId>& generated) {
        auto cache = std::make_unique<KvCache>(cfg, P + T - 1);
        solo.forward_cached(prompt, 0, *cache, nullptr);
        for (std::size_t i = 0; i < generated.size(); ++i)
            solo.forward_cached(std::span<const TokenId>(&generated[i], 1), P + static_cast<std::int64_t>(i), *cache, nullptr);
        return cache;
    };
    std::vector<Beam> beams(1);
    beams[0].cache = std::make_unique<KvCache>(cfg, P + T - 1);
    beams[0].logits = solo.forward_cached(prompt, 0, *beams[0].cache, nullptr);
    for (std::int64_t t = 0; t < T; ++t) {
        std::vector<double> scores;
        std::vector<std::vector<double>> lp(beams.size());
        for (std::size_t r = 0; r < beams.size(); ++r) {
            scores.push_back(beams[r].score);
            log_softmax(beams[r].logits, lp[r]);
        }
        std::vector<Beam> next;
        for (const Candidate& c : beam_select(scores, lp, W)) {
            Beam& parent = beams[static_cast<std::size_t>(c.parent)];
            Beam b{parent.cache ? std::move(parent.cache) : replay(parent.generated), parent.generated, c.score, {}};
            b.generated.push_back(c.token);
            if (t + 1 < T) b.logits = solo.forward_cached(std::span<const TokenId>(&c.token, 1), P + t, *b.cache, nullptr);
            next.push_back(std::move(b));
        }
        beams = std::move(next);
    }
    std::vector<std::vector<TokenId>> out;
    for (const Beam& b : beams) out.push_back(b.generated);
    return out;
}

}  // namespace

namespace {

// One width's refusals: the pool layout, the vocabulary, one step's sequences and tokens, windows. `flag`
// names where the width came from (--n, --beam-width, or a workload request's "n").
void check_width(const ModelConfig& cfg, const ServeOptions& o, std::int64_t W, const std::string& flag) {
    if (o.pool.layout != KvLayout::paged)
        throw UsageError(fmt::format("{} {}: a request's outputs share blocks in the paged layout; expected --kv-layout paged", flag, W));
    if (W > cfg.n_vocab) throw UsageError(fmt::format("{}: {}; expected at most the {} tokens of the vocabulary", flag, W, cfg.n_vocab));
    if (W > o.max_seqs) throw UsageError(fmt::format("--max-seqs: {}; expected at least {} ({} {}: a request's outputs run in one step)", o.max_seqs, W, flag, W));
    if (W > o.max_batched_tokens)
        throw UsageError(fmt::format("--max-batched-tokens: {}; expected at least {} ({} {}: a request's outputs run in one step)", o.max_batched_tokens, W, flag, W));
    for (std::int64_t l = 0; l < cfg.n_layer; ++l)
        if (cfg.layer_window(l) > 0)
            throw UsageError(fmt::format("{}: {} has sliding-window layers, whose ring overwrites shared blocks' rows; expected a model without windows", flag, cfg.name));
}

}  // namespace

void check_outputs_options(const ModelConfig& cfg, std::span<const ServeRequest> requests, const ServeOptions& o) {
    validate_sampler_options(o.sampling);
    if (o.n < 1) throw UsageError(fmt::format("--n: {}; expected at least 1 output per request", o.n));
    if (o.beam_width < 1) throw UsageError(fmt::format("--beam-width: {}; expected at least 1 (1: no beam search)", o.beam_width));
    if (o.n > 1 && o.beam_width > 1) throw UsageError(fmt::format("--n {} with --beam-width {}: beam search returns its {} beams; expected one of them", o.n, o.beam_width, o.beam_width));
    const std::int64_t B = o.pool.block_size;
    for (std::size_t i = 0; i < requests.size(); ++i) {
        const ServeRequest& r = requests[i];
        if (r.n < 0) throw UsageError(fmt::format("serve: request {} has \"n\" {}; expected at least 1", i, r.n));
        if (r.n > 0 && o.beam_width > 1)
            throw UsageError(fmt::format("serve: request {} has \"n\" {} with --beam-width {}: every request's beams are the same width; expected one of them", i, r.n, o.beam_width));
        const std::int64_t W = r.n > 0 ? r.n : std::max(o.n, o.beam_width);
        if (W == 1) continue;
        check_width(cfg, o, W, r.n > 0 ? fmt::format("request {}'s \"n\"", i) : std::string(o.n > 1 ? "--n" : "--beam-width"));
        // its full prompt blocks once, the rest once per output
        const auto P = std::ssize(r.prompt);
        const std::int64_t blocks = (P + r.max_tokens - 1 + B - 1) / B, shared = P / B;
        if ((shared + W * (blocks - shared)) * B > o.pool.n_rows)
            throw UsageError(fmt::format("--kv-budget/--kv-blocks: the pool holds {} token rows; request {} with {} outputs may need {} "
                                         "({} shared prompt blocks + {} x {} of its own); expected a larger budget or fewer outputs",
                                         o.pool.n_rows, i, W, (shared + W * (blocks - shared)) * B, shared, W, blocks - shared));
    }
}

std::optional<FinishReason> early_stop(const ServeOptions& o, std::int64_t request, std::span<const TokenId> generated) {
    if (generated.empty() || !o.stop_rule) return std::nullopt;
    return o.stop_rule(request, generated);
}

Outputs::Outputs(const ServeOptions& o, std::span<const ServeRequest> requests, std::int64_t n_vocab)
    : o_(o), n_requests_(std::ssize(requests)), n_vocab_(n_vocab), width_(std::max(o.n, o.beam_width)), beam_(o.beam_width > 1),
      groups_(requests.size()) {
    for (const ServeRequest& r : requests) {
        seeds_.push_back(r.seed);
        widths_.push_back(r.n > 0 ? r.n : width_);
    }
    for (const std::int64_t w : widths_) width_ = std::max(width_, w);
}

std::int64_t Outputs::active(std::int64_t id) const {
    const Group& g = groups_[static_cast<std::size_t>(id)];
    if (!g.forked) return width(id);
    return std::count_if(g.outs.begin(), g.outs.end(), [](const Output& out) { return !out.done; });
}

bool Outputs::finished(std::int64_t id, std::int64_t max_tokens) const {
    const Group& g = groups_[static_cast<std::size_t>(id)];
    if (!g.forked) return false;
    for (const Output& out : g.outs)
        if (!out.done) return std::ssize(out.tokens) - g.prompt_len >= max_tokens;  // the outputs still going have one length
    return true;
}

// Sampling: an output that has just stopped early gives its rows back (blocks it shares stay with the others).
void Outputs::stop_if_done(std::int64_t id, std::int64_t slot, Output& out, KvAllocator& alloc) const {
    if (beam_) return;
    const std::span<const TokenId> generated(out.tokens.data() + groups_[static_cast<std::size_t>(id)].prompt_len,
                                             out.tokens.size() - static_cast<std::size_t>(groups_[static_cast<std::size_t>(id)].prompt_len));
    const std::optional<FinishReason> why = early_stop(o_, id, generated);
    if (!why) return;
    out.done = true;
    out.reason = *why;
    alloc.release(seq(id, slot));
}

SeqId Outputs::seq(std::int64_t id, std::int64_t slot) const { return slot == 0 ? id : n_requests_ + id * (width_ - 1) + slot - 1; }

std::int64_t Outputs::request_of(SeqId s) const { return s < n_requests_ ? s : (s - n_requests_) / (width_ - 1); }

void Outputs::owners_to_requests(std::vector<KvPoolCell>& map) const {
    for (KvPoolCell& c : map)
        if (c.owner >= 0) c.owner = request_of(c.owner);
}

Sampler Outputs::fresh_sampler(std::int64_t id, std::int64_t slot) const {
    SamplerOptions so = o_.sampling;
    const std::optional<std::uint64_t>& own = seeds_[static_cast<std::size_t>(id)];
    if (own) so.seed = slot == 0 ? *own : splitmix64(*own + static_cast<std::uint64_t>(slot));
    else so.seed = splitmix64(o_.sampling.seed + static_cast<std::uint64_t>(id * width_ + slot));
    return Sampler(so, n_vocab_);
}

TokenId Outputs::choose(std::int64_t id, const VectorF& logits) {
    Group& g = groups_[static_cast<std::size_t>(id)];
    if (g.samplers.empty()) g.samplers.push_back(fresh_sampler(id, 0));
    return g.samplers[0].sample(logits);
}

void Outputs::start(std::int64_t id, const VectorF& row, KvAllocator& alloc, bool keep_logits, const std::vector<TokenId>& prompt) {
    Group& g = groups_[static_cast<std::size_t>(id)];
    g.prompt_len = std::ssize(prompt);
    const std::int64_t W = width(id);
    g.outs.assign(static_cast<std::size_t>(W), Output{prompt, 0.0, {}});
    g.rank.resize(static_cast<std::size_t>(W));
    std::iota(g.rank.begin(), g.rank.end(), 0);
    std::vector<std::vector<double>> lp(1);
    log_softmax(row, lp[0]);
    const std::vector<double> zero{0.0};
    const std::vector<Candidate> first = beam_ ? beam_select(zero, lp, width_) : std::vector<Candidate>{};
    g.samplers.clear();
    for (std::int64_t k = 0; k < W; ++k) {
        Output& out = g.outs[static_cast<std::size_t>(k)];
        if (!beam_) g.samplers.push_back(fresh_sampler(id, k));
        const TokenId t = beam_ ? first[static_cast<std::size_t>(k)].token : g.samplers.back().sample(row);
        out.tokens.push_back(t);
        out.score = lp[0][static_cast<std::size_t>(t)];
        if (keep_logits) out.logits.push_back(row);
        if (k > 0) alloc.fork(seq(id, 0), seq(id, k));  // the prompt's blocks, every one shared
    }
    g.forked = true;
    for (std::int64_t k = 0; k < W; ++k) stop_if_done(id, k, g.outs[static_cast<std::size_t>(k)], alloc);
}

// One step of beam search (the header's definition): the W best candidates become the beams; a beam with
// no candidate is pruned (its rows freed, its slot reused), a beam with several is forked.
void Outputs::beam_step(Group& g, std::int64_t id, const MatrixRM& logits, std::int64_t m, KvAllocator& alloc, bool keep_logits) {
    const auto W = static_cast<std::size_t>(width_);
    std::vector<double> scores(W);
    std::vector<std::vector<double>> lp(W);
    std::vector<VectorF> rows(keep_logits ? W : 0);
    for (std::size_t r = 0; r < W; ++r) {
        const std::int64_t slot = g.rank[r];
        row_ = logits.row(m + slot).transpose();
        log_softmax(row_, lp[r]);
        scores[r] = g.outs[static_cast<std::size_t>(slot)].score;
        if (keep_logits) rows[r] = row_;
    }
    const std::vector<Candidate> next = beam_select(scores, lp, width_);
    std::vector<int> children(W, 0);
    for (const Candidate& c : next) ++children[static_cast<std::size_t>(c.parent)];
    std::vector<std::int64_t> free_slots;
    for (std::size_t r = 0; r < W; ++r)
        if (children[r] == 0) {
            alloc.release(seq(id, g.rank[r]));
            free_slots.push_back(g.rank[r]);
        }
    std::vector<Output> outs(W);
    std::vector<bool> claimed(W, false);
    std::vector<std::int64_t> rank;
    for (const Candidate& c : next) {
        const auto parent = static_cast<std::size_t>(c.parent);
        const std::int64_t parent_slot = g.rank[parent];
        std::int64_t slot = parent_slot;  // the parent's first child continues in its sequence
        if (claimed[parent]) {
            slot = free_slots.back();
            free_slots.pop_back();
            alloc.fork(seq(id, parent_slot), seq(id, slot));
        }
        claimed[parent] = true;
        Output& out = outs[static_cast<std::size_t>(slot)];
        out = g.outs[static_cast<std::size_t>(parent_slot)];
        out.tokens.push_back(c.token);
        out.score = c.score;
        if (keep_logits) out.logits.push_back(rows[parent]);
        rank.push_back(slot);
    }
    g.outs = std::move(outs);
    g.rank = std::move(rank);
}

std::int64_t Outputs::choose_all(std::int64_t id, const MatrixRM& logits, std::int64_t m, KvAllocator& alloc, bool keep_logits,
                                 std::vector<TokenId>& tokens, std::vector<TokenId>& generated) {
    Group& g = groups_[static_cast<std::size_t>(id)];
    if (!g.forked) {
        row_ = logits.row(m++).transpose();
        start(id, row_, alloc, keep_logits, tokens);
    } else if (beam_) {
        beam_step(g, id, logits, m, alloc, keep_logits);
        m += width_;
    } else {
        for (std::int64_t k = 0; k < width(id); ++k) {  // the outputs still going, a logits row each
            Output& out = g.outs[static_cast<std::size_t>(k)];
            if (out.done) continue;
            row_ = logits.row(m++).transpose();
            const TokenId t = g.samplers[static_cast<std::size_t>(k)].sample(row_);
            out.tokens.push_back(t);
            out.score += log_prob(row_, t);
            if (keep_logits) out.logits.push_back(row_);
            stop_if_done(id, k, out, alloc);
        }
    }
    const Output& best = g.outs[static_cast<std::size_t>(g.rank[0])];
    generated.assign(best.tokens.begin() + g.prompt_len, best.tokens.end());
    // the request's tokens set its position: an output still going (they have one length), else the best's
    const auto going = std::find_if(g.outs.begin(), g.outs.end(), [](const Output& out) { return !out.done; });
    tokens = going != g.outs.end() ? going->tokens : best.tokens;
    return m;
}

bool Outputs::take_rows(std::int64_t id, std::int64_t n_computed, std::int64_t need_rows, KvAllocator& alloc, KvPool& pool) {
    Group& g = groups_[static_cast<std::size_t>(id)];
    for (std::int64_t k = 0; k < width(id); ++k) {
        if (g.outs[static_cast<std::size_t>(k)].done) continue;
        if (!alloc.reserve(seq(id, k), need_rows)) return false;
        const auto copies = alloc.make_writable(seq(id, k), n_computed, 1);
        if (!copies) return false;
        for (const RowCopy& c : *copies) pool.copy(c);
        g.cow += std::ssize(*copies);
    }
    return true;
}

void Outputs::add_to_batch(std::int64_t id, std::int64_t n_computed, const KvAllocator& alloc, std::vector<TokenId>& tokens,
                           std::vector<SeqStep>& batch) const {
    const Group& g = groups_[static_cast<std::size_t>(id)];
    for (std::int64_t k = 0; k < width(id); ++k) {
        if (g.outs[static_cast<std::size_t>(k)].done) continue;
        tokens.push_back(g.outs[static_cast<std::size_t>(k)].tokens[static_cast<std::size_t>(n_computed)]);
        batch.push_back({1, n_computed, alloc.rows(seq(id, k)), true});
    }
}

void Outputs::commit(std::int64_t id, std::int64_t n_valid_rows, KvAllocator& alloc) const {
    const Group& g = groups_[static_cast<std::size_t>(id)];
    for (std::int64_t k = 0; k < width(id); ++k)
        if (!g.outs[static_cast<std::size_t>(k)].done) alloc.commit(seq(id, k), g.outs[static_cast<std::size_t>(k)].tokens, n_valid_rows);
}

void Outputs::measure(std::span<const std::int64_t> running, const KvAllocator& alloc, ServeStep& rec) {
    if (width_ == 1) return;
    std::vector<SeqId> seqs;
    for (const std::int64_t id : running) {
        if (width(id) == 1) continue;
        Group& g = groups_[static_cast<std::size_t>(id)];
        seqs.clear();
        for (std::int64_t k = 0; k < (g.forked ? width(id) : 1); ++k)
            if (!g.forked || !g.outs[static_cast<std::size_t>(k)].done) seqs.push_back(seq(id, k));
        KvAllocator::BlocksHeld b = alloc.blocks_held(seqs);
        if (!g.forked) b.unshared *= width(id);  // its prompt, before the outputs fork: one copy per output unshared
        rec.out_blocks += b.held;
        rec.out_blocks_unshared += b.unshared;
        g.peak_held = std::max(g.peak_held, b.held);
        g.peak_unshared = std::max(g.peak_unshared, b.unshared);
    }
}

void Outputs::release(std::int64_t id, KvAllocator& alloc, bool finished, ServeRequestResult& out) {
    Group& g = groups_[static_cast<std::size_t>(id)];
    if (width(id) == 1) {
        alloc.release(id);
        if (finished) g = Group{};
        return;
    }
    for (std::int64_t k = 0; k < width(id); ++k) alloc.release(seq(id, k));
    if (finished) {
        for (const std::int64_t slot : g.rank) {
            Output& o = g.outs[static_cast<std::size_t>(slot)];
            out.outputs.emplace_back(o.tokens.begin() + g.prompt_len, o.tokens.end());
            out.scores.push_back(o.score);
            out.finish_reasons.push_back(o.reason);
            g.done_logits.push_back(std::move(o.logits));
        }
        out.finish_reason = out.finish_reasons.front();
        out.peak_blocks = g.peak_held;
        out.peak_blocks_unshared = g.peak_unshared;
        out.cow_copies = g.cow;
    }
    g.outs.clear();
    g.rank.clear();
    g.samplers.clear();
    g.forked = false;
}

void Outputs::check(const ModelConfig& cfg, Transformer& solo, const ServeRequest& req, std::int64_t id, ServeRequestResult& out) {
    Group& g = groups_[static_cast<std::size_t>(id)];
    const auto P = std::ssize(req.prompt);
    out.checked = true;
    const std::vector<std::vector<TokenId>> isolated =
        beam_ ? solo_beam_search(cfg, solo, req.prompt, width_, req.max_tokens) : std::vector<std::vector<TokenId>>{};
    for (std::size_t r = 0; r < out.outputs.size(); ++r) {
        const std::vector<TokenId>& gen = out.outputs[r];
        KvCache cache(cfg, P + req.max_tokens - 1);
        Sampler replay = fresh_sampler(id, static_cast<std::int64_t>(r));  // sampling: rank r is slot r
        for (std::size_t i = 0; i < gen.size(); ++i) {
            const VectorF ref = i == 0 ? solo.forward_cached(req.prompt, 0, cache, nullptr)
                                       : solo.forward_cached(std::span<const TokenId>(&gen[i - 1], 1), P + static_cast<std::int64_t>(i) - 1, cache, nullptr);
            const double d = (ref - g.done_logits[r][i]).cwiseAbs().maxCoeff(), tol = logit_tolerance(ref);
            const bool agree = beam_ ? isolated[r][i] == gen[i] : replay.sample(ref) == gen[i];
            if (agree) ++out.solo_agree;
            if (d > out.max_abs_dlogit) {
                out.max_abs_dlogit = d;
                out.tolerance = tol;
            }
            if (d > tol) out.within_tolerance = false;
        }
    }
    g = Group{};
}

}  // namespace kvlab
