#include "serve/scheduler.hpp"

#include <algorithm>
#include <chrono>
#include <deque>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>

#include "core/checked.hpp"
#include "core/error.hpp"
#include "sim/sampler.hpp"
#include "sim/simulator.hpp"
#include "model/transformer.hpp"

namespace kvlab {

namespace {

using Clock = std::chrono::steady_clock;

std::int64_t ns_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
}

// Positions a request uses: its prompt and every generated token but the last (never fed back).
std::int64_t request_positions(const ServeRequest& r) { return static_cast<std::int64_t>(r.prompt.size()) + r.max_tokens - 1; }

// Contiguous: the rows a request reserves at admission.
std::int64_t reservation_rows(const ModelConfig& cfg, const ServeRequest& r, const ServeOptions& o) {
    return kv_seq_rows(cfg, o.reserve == ReserveRule::max_len ? o.max_model_len : request_positions(r));
}

// A request in the system: its tokens so far (prompt, then generated), how many of them have K and V in
// the pool, and (check) the logits that chose each generated token.
struct Live {
    std::int64_t id = 0;
    std::vector<TokenId> tokens;
    std::int64_t n_computed = 0;
    std::vector<VectorF> logits;
};

// One request's solo run on the single-sequence path, teacher-forced on the tokens serving chose: the
// prompt as one prefill, then one decode call per generated token.
void check_against_solo(const ModelConfig& cfg, Transformer& solo, const ServeRequest& req, const Live& live, ServeRequestResult& out) {
    KvCache cache(cfg, request_positions(req));
    const auto P = static_cast<std::int64_t>(req.prompt.size());
    out.checked = true;
    for (std::size_t i = 0; i < out.generated.size(); ++i) {
        const VectorF& ref = i == 0 ? solo.forward_cached(req.prompt, 0, cache, nullptr)
                                    : solo.forward_cached(std::span<const TokenId>(&out.generated[i - 1], 1), P + static_cast<std::int64_t>(i) - 1, cache, nullptr);
        const double d = (ref - live.logits[i]).cwiseAbs().maxCoeff();
        const double tol = logit_tolerance(ref);
        if (argmax(ref) == out.generated[i]) ++out.solo_agree;
        if (d > out.max_abs_dlogit) {
            out.max_abs_dlogit = d;
            out.tolerance = tol;
        }
        if (d > tol) out.within_tolerance = false;
    }
}

}  // namespace

void check_serve_workload(const ModelConfig& cfg, std::span<const ServeRequest> requests, const ServeOptions& o) {
    if (o.max_batched_tokens < 1) throw UsageError(fmt::format("--max-batched-tokens: {}; expected at least 1", o.max_batched_tokens));
    if (o.max_seqs < 1) throw UsageError(fmt::format("--max-seqs: {}; expected at least 1", o.max_seqs));
    if (o.max_model_len < 1 || o.max_model_len > cfg.n_ctx_max)
        throw UsageError(fmt::format("--max-model-len: {}; expected 1..{} (the context of {})", o.max_model_len, cfg.n_ctx_max, cfg.name));
    if (requests.empty()) throw UsageError("serve: no requests; expected at least one");
    const bool paged = o.pool.layout == KvLayout::paged;
    bool windowed = false;
    for (std::int64_t l = 0; l < cfg.n_layer; ++l) windowed = windowed || cfg.layer_window(l) > 0;
    if (paged && o.pool.prefix_cache && windowed)
        throw UsageError(fmt::format("--prefix-cache: {} has sliding-window layers, whose ring overwrites a shared block's rows; "
                                     "expected a model without windows (or no --prefix-cache)", cfg.name));
    for (std::size_t i = 0; i < requests.size(); ++i) {
        const ServeRequest& r = requests[i];
        if (r.prompt.empty() || r.max_tokens < 1)
            throw UsageError(fmt::format("serve: request {} has {} prompt tokens and max_tokens {}; expected at least 1 of each", i,
                                         r.prompt.size(), r.max_tokens));
        for (const TokenId t : r.prompt)
            if (t < 0 || t >= cfg.n_vocab)
                throw UsageError(fmt::format("serve: request {}: token id {} is outside the vocabulary [0, {})", i, t, cfg.n_vocab));
        // max_tokens may be any 64-bit count: compared without adding
        if (r.max_tokens > o.max_model_len - std::ssize(r.prompt) + 1)
        {
            std::int64_t positions = 0;
            const bool fits64 = !__builtin_add_overflow(std::ssize(r.prompt), r.max_tokens - 1, &positions);
            throw UsageError(fmt::format("serve: request {} needs {} prompt + {} generated - 1 = {} positions; --max-model-len is {}", i,
                                         r.prompt.size(), r.max_tokens, fits64 ? std::to_string(positions) : std::string("over 2^63"),
                                         o.max_model_len));
        }
        if (r.arrival_step < 0 || r.arrival_step > max_arrival_step)
            throw UsageError(fmt::format("serve: request {} arrives at step {}; expected 0..2^40", i, r.arrival_step));
        const std::int64_t rows = paged ? kv_seq_rows(cfg, request_positions(r)) : reservation_rows(cfg, r, o);
        const std::int64_t whole = paged ? (rows + o.pool.block_size - 1) / o.pool.block_size * o.pool.block_size : rows;
        if (whole > o.pool.n_rows)
            throw UsageError(fmt::format("--kv-budget/--kv-blocks: the pool holds {} token rows; request {} alone needs {} ({} layout{}), so it could "
                                         "never run; expected a larger budget or shorter requests",
                                         o.pool.n_rows, i, whole, paged ? "paged" : "contiguous",
                                         paged ? "" : o.reserve == ReserveRule::max_len ? ", --reserve max-len" : ", --reserve request"));
    }
}

ServeResult run_serving(const ModelConfig& cfg, const Weights& weights, std::span<const ServeRequest> requests, const ServeOptions& o) {
    check_serve_workload(cfg, requests, o);
    const bool paged = o.pool.layout == KvLayout::paged;
    KvAllocator alloc(o.pool);
    KvPool pool(cfg, o.pool.n_rows);
    Transformer model(cfg, weights, TransformerSize{o.max_model_len, o.max_batched_tokens, false, false, o.max_seqs});
    std::optional<Transformer> solo;
    if (o.check) {
        std::int64_t longest_prompt = 1;
        for (const ServeRequest& r : requests) longest_prompt = std::max<std::int64_t>(longest_prompt, std::ssize(r.prompt));
        solo.emplace(cfg, weights, TransformerSize{o.max_model_len, longest_prompt, false});
    }

    ServeResult result;
    result.pool_rows = o.pool.n_rows;
    result.pool_bytes = pool.bytes();
    result.requests.resize(requests.size());
    for (std::size_t i = 0; i < requests.size(); ++i) {
        result.requests[i].arrival_step = requests[i].arrival_step;
        result.requests[i].prompt_len = std::ssize(requests[i].prompt);
        result.requests[i].max_tokens = requests[i].max_tokens;
    }
    // arrival order: by step, then by index
    std::vector<std::int64_t> order(requests.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int64_t>(i);
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
        return requests[static_cast<std::size_t>(a)].arrival_step < requests[static_cast<std::size_t>(b)].arrival_step;
    });

    std::vector<Live> lives(requests.size());
    std::deque<std::int64_t> waiting;   // request ids: preempted ones at the front
    std::vector<std::int64_t> running;  // admission order: the newest last
    std::size_t next_arrival = 0, n_finished = 0;
    std::int64_t clock_ns = 0;           // the run's time: steps only (not the checks)
    std::vector<TokenId> batch_tokens;
    std::vector<SeqStep> batch;
    struct Scheduled {
        std::int64_t id, n;
        bool decode;
    };
    std::vector<Scheduled> scheduled;
    VectorF row(cfg.n_vocab);  // one sequence's logits
    batch_tokens.reserve(static_cast<std::size_t>(o.max_batched_tokens));
    batch.reserve(static_cast<std::size_t>(o.max_seqs));

    // rows seq `id` needs to hold n more tokens, taken from the pool (and made private where shared)
    auto take_rows = [&](std::int64_t id, std::int64_t n) {
        const Live& s = lives[static_cast<std::size_t>(id)];
        const ServeRequest& r = requests[static_cast<std::size_t>(id)];
        const std::int64_t need = paged ? kv_seq_rows(cfg, s.n_computed + n) : reservation_rows(cfg, r, o);
        if (!alloc.reserve(id, need)) return false;
        const auto copies = alloc.make_writable(id, s.n_computed, n);
        if (!copies) return false;
        for (const RowCopy& c : *copies) pool.copy(c);
        return true;
    };
    std::int64_t step_now = 0;
    auto preempt = [&](std::int64_t id) {
        Live& s = lives[static_cast<std::size_t>(id)];
        ServeRequestResult& rr = result.requests[static_cast<std::size_t>(id)];
        ++rr.preemptions;
        ++result.preemptions;
        rr.recomputed_tokens += s.n_computed;
        rr.events.push_back({step_now, ServeEventKind::preempted, s.n_computed});
        alloc.release(id);
        s.n_computed = 0;
        running.erase(std::find(running.begin(), running.end(), id));
        waiting.push_front(id);
    };

    const CoreUseClock core_clock;
    for (std::int64_t step = 0; n_finished < requests.size(); ++step) {
        if (o.stop && o.stop->load()) {
            result.interrupted = true;
            break;
        }
        if (running.empty() && waiting.empty() && next_arrival < order.size())  // idle: on to the next arrival
            step = std::max(step, requests[static_cast<std::size_t>(order[next_arrival])].arrival_step);
        const Clock::time_point t_start = Clock::now();
        while (next_arrival < order.size() && requests[static_cast<std::size_t>(order[next_arrival])].arrival_step <= step) {
            const std::int64_t id = order[next_arrival++];
            lives[static_cast<std::size_t>(id)].id = id;
            lives[static_cast<std::size_t>(id)].tokens = requests[static_cast<std::size_t>(id)].prompt;
            result.requests[static_cast<std::size_t>(id)].arrival_ns = clock_ns;
            waiting.push_back(id);
        }
        ServeStep rec;
        rec.step = step_now = step;
        rec.start_ns = clock_ns;
        std::int64_t budget = o.max_batched_tokens;
        scheduled.clear();
        // 1. running sequences, oldest first
        for (std::size_t i = 0; i < running.size() && budget > 0; ++i) {
            const std::int64_t id = running[i];
            Live& s = lives[static_cast<std::size_t>(id)];
            const std::int64_t n = std::min(std::ssize(s.tokens) - s.n_computed, budget);
            bool got = take_rows(id, n);
            while (!got && running.back() != id) {  // the newest running sequence gives its rows back
                preempt(running.back());
                ++rec.n_preempted;
                got = take_rows(id, n);
            }
            if (!got) {  // it is the newest: it waits itself
                preempt(id);
                ++rec.n_preempted;
                break;
            }
            // a decode: one generated token fed back (a recomputation after preemption is a prefill)
            const bool decode = n == 1 && s.n_computed == std::ssize(s.tokens) - 1 &&
                                s.n_computed >= std::ssize(requests[static_cast<std::size_t>(id)].prompt);
            scheduled.push_back({id, n, decode});
            budget -= n;
        }
        // 2. waiting requests, first come first served; none in a step that preempted
        while (rec.n_preempted == 0 && !waiting.empty() && std::ssize(running) < o.max_seqs && budget > 0) {
            const std::int64_t id = waiting.front();
            Live& s = lives[static_cast<std::size_t>(id)];
            const std::int64_t hit = alloc.match_prefix(id, s.tokens);
            s.n_computed = std::min(hit, std::ssize(s.tokens) - 1);  // the last token runs: its logits are needed
            const std::int64_t n = std::min(std::ssize(s.tokens) - s.n_computed, budget);
            if (!take_rows(id, n)) {
                alloc.release(id);
                s.n_computed = 0;
                break;
            }
            waiting.pop_front();
            running.push_back(id);
            ServeRequestResult& rr = result.requests[static_cast<std::size_t>(id)];
            rr.prefix_hit_tokens += s.n_computed;  // counted once admitted (a failed attempt gave its blocks back)
            if (hit > 0) result.prefix_hit_blocks += hit / o.pool.block_size;  // (only a paged pool finds any)
            if (rr.first_step < 0) rr.first_step = step;
            scheduled.push_back({id, n, false});
            budget -= n;
        }
        if (scheduled.empty()) {
            if (running.empty() && waiting.empty()) continue;
            throw std::logic_error(fmt::format("serve: step {} scheduled nothing with {} running and {} waiting", step, running.size(), waiting.size()));
        }

        // one forward over every scheduled sequence's tokens
        batch_tokens.clear();
        batch.clear();
        for (const Scheduled& sc : scheduled) {
            const Live& s = lives[static_cast<std::size_t>(sc.id)];
            batch_tokens.insert(batch_tokens.end(), s.tokens.begin() + s.n_computed, s.tokens.begin() + s.n_computed + sc.n);
            batch.push_back({sc.n, s.n_computed, alloc.rows(sc.id), s.n_computed + sc.n == std::ssize(s.tokens)});
            rec.n_tokens += sc.n;
            rec.n_decode += sc.decode ? 1 : 0;
        }
        rec.n_seqs = std::ssize(scheduled);
        const Clock::time_point t_fwd = Clock::now();
        const MatrixRM& logits = model.forward_batch(batch_tokens, batch, pool, &rec.cost);
        const Clock::time_point t_fwd_end = Clock::now();
        rec.forward_ns = ns_between(t_fwd, t_fwd_end);

        // the K and V written: the pool as the step used it
        for (const Scheduled& sc : scheduled) {
            Live& s = lives[static_cast<std::size_t>(sc.id)];
            s.n_computed += sc.n;
            alloc.commit(sc.id, s.tokens, kv_seq_rows(cfg, s.n_computed));
            result.requests[static_cast<std::size_t>(sc.id)].events.push_back(
                {step, sc.decode ? ServeEventKind::decode : ServeEventKind::prefill, sc.n});
        }
        rec.rows_in_use = alloc.rows_in_use();
        rec.rows_tokens = alloc.rows_holding_tokens();
        rec.rows_cached = alloc.rows_cached();
        rec.largest_free = alloc.largest_free_range();

        // the tokens: each sequence that asked for logits gets its next one
        std::int64_t m = 0, check_ns = 0;
        for (const Scheduled& sc : scheduled) {
            Live& s = lives[static_cast<std::size_t>(sc.id)];
            const ServeRequest& r = requests[static_cast<std::size_t>(sc.id)];
            ServeRequestResult& rr = result.requests[static_cast<std::size_t>(sc.id)];
            if (s.n_computed < std::ssize(s.tokens)) continue;  // a prompt chunk with more to come
            row = logits.row(m++).transpose();
            const TokenId token = argmax(row);
            if (o.check) s.logits.push_back(row);
            s.tokens.push_back(token);
            rr.generated.push_back(token);
            ++rec.n_generated;
            const std::int64_t now_ns = clock_ns + ns_between(t_start, Clock::now()) - check_ns;
            if (rr.first_token_step < 0) {
                rr.first_token_step = step;
                rr.first_token_ns = now_ns;
            }
            if (std::ssize(rr.generated) < r.max_tokens) continue;
            rr.finish_step = step;
            rr.finish_ns = now_ns;
            alloc.release(sc.id);
            running.erase(std::find(running.begin(), running.end(), sc.id));
            ++n_finished;
            if (o.check) {
                const Clock::time_point t_check = Clock::now();
                check_against_solo(cfg, *solo, r, s, rr);
                s.logits = {};
                check_ns += ns_between(t_check, Clock::now());
            }
        }
        const std::int64_t step_ns = ns_between(t_start, Clock::now()) - check_ns;
        rec.schedule_ns = step_ns - rec.forward_ns;
        clock_ns += step_ns;
        rec.n_running = std::ssize(running);
        rec.n_waiting = std::ssize(waiting);
        result.steps.push_back(rec);
    }
    result.core_use = core_clock.elapsed();
    result.counters = alloc.counters();
    result.rows_left_in_use = alloc.rows_in_use();
    return result;
}

}  // namespace kvlab
