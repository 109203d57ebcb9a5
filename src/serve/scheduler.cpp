#include "kvlab/serve/scheduler.hpp"

#include <algorithm>
#include <chrono>
#include <deque>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>

#include "kvlab/core/checked.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/sim/sampler.hpp"
#include "kvlab/sim/simulator.hpp"
#include "kvlab/model/transformer.hpp"
#include "serve/swap.hpp"
#include "serve/outputs.hpp"

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
void check_against_solo(const ModelConfig& cfg, Transformer& solo, const ServeRequest& req, const Live& live, Sampler replay, ServeRequestResult& out) {
    KvCache cache(cfg, request_positions(req));
    const auto P = static_cast<std::int64_t>(req.prompt.size());
    out.checked = true;
    for (std::size_t i = 0; i < out.generated.size(); ++i) {
        const VectorF& ref = i == 0 ? solo.forward_cached(req.prompt, 0, cache, nullptr)
                                    : solo.forward_cached(std::span<const TokenId>(&out.generated[i - 1], 1), P + static_cast<std::int64_t>(i) - 1, cache, nullptr);
        const double d = (ref - live.logits[i]).cwiseAbs().maxCoeff();
        const double tol = logit_tolerance(ref);
        if (replay.sample(ref) == out.generated[i]) ++out.solo_agree;  // the same sampler, from the start
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
    check_outputs_options(cfg, requests, o);
}

namespace {

// One serving run: the pool, the model and the queues, and one method per part of a step: arrive, schedule
// the running sequences, admit waiting requests, run the forward, finish (tokens, finished requests).
class Scheduler {
public:
    Scheduler(const ModelConfig& cfg, const Weights& weights, std::span<const ServeRequest> requests, const ServeOptions& o);
    ServeResult run();

private:
    struct Scheduled {  // a sequence in this step's forward: its n tokens from n_computed on
        std::int64_t id, n;
        bool decode;
    };
    void arrive(std::int64_t step);
    void schedule_running(ServeStep& rec);
    void admit_waiting(ServeStep& rec);
    const MatrixRM& run_forward(ServeStep& rec);
    std::int64_t finish(ServeStep& rec, const MatrixRM& logits, Clock::time_point t_start);
    bool take_rows(std::int64_t id, std::int64_t n);
    void preempt(std::int64_t id, ServeStep& rec);
    void swap_out(std::int64_t id, ServeStep& rec);
    void swap_in(std::int64_t id, ServeStep& rec);
    const ServeRequest& request(std::int64_t id) const { return requests_[static_cast<std::size_t>(id)]; }
    Live& live(std::int64_t id) { return lives_[static_cast<std::size_t>(id)]; }
    ServeRequestResult& result_of(std::int64_t id) { return result_.requests[static_cast<std::size_t>(id)]; }

    const ModelConfig& cfg_;
    std::span<const ServeRequest> requests_;
    const ServeOptions& o_;
    const bool paged_;
    KvAllocator alloc_;
    KvPool pool_;
    Transformer model_;
    std::optional<Transformer> solo_;  // --check: the single-sequence path
    std::optional<HostKvTier> host_;   // --preempt swap: the host memory swapped-out K and V wait in
    Outputs outputs_;                  // each request's outputs: sampling, beams (src/serve/outputs.hpp)
    ServeResult result_;
    std::vector<std::int64_t> order_;  // arrival order: by step, then by index
    std::vector<Live> lives_;
    std::deque<std::int64_t> waiting_;   // request ids: preempted ones at the front
    std::vector<std::int64_t> running_;  // admission order: the newest last
    std::size_t next_arrival_ = 0, n_finished_ = 0;
    std::int64_t clock_ns_ = 0;  // the run's time: steps only (not the checks)
    std::vector<Scheduled> scheduled_;
    std::int64_t budget_ = 0;    // tokens the step may still take
    std::vector<TokenId> batch_tokens_;
    std::vector<SeqStep> batch_;
    VectorF row_;  // one sequence's logits
};

TransformerSize solo_size(std::span<const ServeRequest> requests, const ServeOptions& o) {
    std::int64_t longest_prompt = 1;
    for (const ServeRequest& r : requests) longest_prompt = std::max<std::int64_t>(longest_prompt, std::ssize(r.prompt));
    return TransformerSize{o.max_model_len, longest_prompt, false};
}

Scheduler::Scheduler(const ModelConfig& cfg, const Weights& weights, std::span<const ServeRequest> requests, const ServeOptions& o)
    : cfg_(cfg), requests_(requests), o_(o), paged_(o.pool.layout == KvLayout::paged), alloc_(o.pool), pool_(cfg, o.pool.n_rows, o.kv_storage),
      model_(cfg, weights, TransformerSize{o.max_model_len, o.max_batched_tokens, false, false, o.max_seqs}),
      outputs_(o, requests, cfg.n_vocab), lives_(requests.size()),
      row_(cfg.n_vocab) {
    if (o.check) solo_.emplace(cfg, weights, solo_size(requests, o));
    if (o.preempt == PreemptMode::swap) host_.emplace(cfg, o.host_kv_bytes);
    result_.pool_rows = o.pool.n_rows;
    result_.kv_row_bytes = pool_.stored_row_bytes();
    result_.kv_dtype = o.kv_storage.dtype;
    result_.host_bytes_per_s = o.host_bytes_per_s;
    result_.pool_bytes = pool_.bytes();
    result_.requests.resize(requests.size());
    for (std::size_t i = 0; i < requests.size(); ++i) {
        result_.requests[i].arrival_step = requests[i].arrival_step;
        result_.requests[i].prompt_len = std::ssize(requests[i].prompt);
        result_.requests[i].max_tokens = requests[i].max_tokens;
    }
    order_.resize(requests.size());
    for (std::size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<std::int64_t>(i);
    std::stable_sort(order_.begin(), order_.end(), [&](std::int64_t a, std::int64_t b) {
        return requests[static_cast<std::size_t>(a)].arrival_step < requests[static_cast<std::size_t>(b)].arrival_step;
    });
    batch_tokens_.reserve(static_cast<std::size_t>(o.max_batched_tokens));
    batch_.reserve(static_cast<std::size_t>(o.max_seqs));
}

ServeResult Scheduler::run() {
    const CoreUseClock core_clock;
    for (std::int64_t step = 0; n_finished_ < requests_.size(); ++step) {
        if (o_.stop && o_.stop->load()) {
            result_.interrupted = true;
            break;
        }
        if (running_.empty() && waiting_.empty() && next_arrival_ < order_.size())  // idle: on to the next arrival
            step = std::max(step, request(order_[next_arrival_]).arrival_step);
        const Clock::time_point t_start = Clock::now();
        const std::int64_t cow_before = alloc_.counters().cow_copies;
        arrive(step);
        ServeStep rec;
        rec.step = step;
        rec.start_ns = clock_ns_;
        budget_ = o_.max_batched_tokens;
        scheduled_.clear();
        schedule_running(rec);
        admit_waiting(rec);
        if (scheduled_.empty()) {
            if (running_.empty() && waiting_.empty()) continue;
            throw std::logic_error(fmt::format("serve: step {} scheduled nothing with {} running and {} waiting", step, running_.size(), waiting_.size()));
        }
        const MatrixRM& logits = run_forward(rec);
        rec.cow_copies = alloc_.counters().cow_copies - cow_before;
        const std::int64_t check_ns = finish(rec, logits, t_start);
        const std::int64_t step_ns = ns_between(t_start, Clock::now()) - check_ns;
        rec.schedule_ns = step_ns - rec.forward_ns;
        clock_ns_ += step_ns;
        rec.n_running = std::ssize(running_);
        rec.n_waiting = std::ssize(waiting_);
        result_.steps.push_back(std::move(rec));
    }
    result_.core_use = core_clock.elapsed();
    result_.counters = alloc_.counters();
    result_.rows_left_in_use = alloc_.rows_in_use();
    if (host_) result_.host_peak_bytes = host_->peak_bytes();
    return std::move(result_);
}

// Requests whose arrival step has come join the back of the queue.
void Scheduler::arrive(std::int64_t step) {
    while (next_arrival_ < order_.size() && request(order_[next_arrival_]).arrival_step <= step) {
        const std::int64_t id = order_[next_arrival_++];
        live(id).id = id;
        live(id).tokens = request(id).prompt;
        result_of(id).arrival_ns = clock_ns_;
        waiting_.push_back(id);
    }
}

// 1. Running sequences, oldest first: the next token (decode) or prompt chunk of each, while the step has
// tokens left. One that cannot get rows preempts the newest running sequence, or waits itself if newest.
void Scheduler::schedule_running(ServeStep& rec) {
    for (std::size_t i = 0; i < running_.size() && budget_ > 0; ++i) {
        const std::int64_t id = running_[i];
        const Live& s = live(id);
        const std::int64_t n = std::min(std::ssize(s.tokens) - s.n_computed, budget_);
        const std::int64_t step_tokens = outputs_.forked(id) ? outputs_.active(id) : n;  // a forked request: a token per output still going
        if (step_tokens > budget_) break;
        bool got = take_rows(id, n);
        while (!got && running_.back() != id) {  // the newest running sequence gives its rows back
            preempt(running_.back(), rec);
            got = take_rows(id, n);
        }
        if (!got) {  // it is the newest: it waits itself
            preempt(id, rec);
            break;
        }
        // a decode: one generated token fed back (a recomputation after preemption is a prefill)
        const bool decode = n == 1 && s.n_computed == std::ssize(s.tokens) - 1 && s.n_computed >= std::ssize(request(id).prompt);
        scheduled_.push_back({id, n, decode});
        budget_ -= step_tokens;
    }
}

// 2. Waiting requests, first come first served, while the step has tokens and sequence slots and the pool
// has rows; none in a step that preempted. A prefix-cache hit starts it past the cached tokens.
void Scheduler::admit_waiting(ServeStep& rec) {
    std::int64_t seqs = 0;  // the running requests' sequences (an output each)
    for (const std::int64_t id : running_) seqs += outputs_.width(id);
    while (rec.n_preempted == 0 && !waiting_.empty() && seqs + outputs_.width(waiting_.front()) <= o_.max_seqs && budget_ > 0) {
        const std::int64_t id = waiting_.front();
        Live& s = live(id);
        const bool swapped = host_ && host_->holds(id);  // its K and V wait on the host: n_computed kept
        const std::int64_t hit = swapped ? 0 : alloc_.match_prefix(id, s.tokens);
        if (!swapped) s.n_computed = std::min(hit, std::ssize(s.tokens) - 1);  // the last token runs: its logits are needed
        const std::int64_t n = std::min(std::ssize(s.tokens) - s.n_computed, budget_);
        if (!take_rows(id, n)) {
            alloc_.release(id);
            if (!swapped) s.n_computed = 0;
            break;
        }
        if (swapped) swap_in(id, rec);
        waiting_.pop_front();
        running_.push_back(id);
        seqs += outputs_.width(id);
        ServeRequestResult& rr = result_of(id);
        if (!swapped) rr.prefix_hit_tokens += s.n_computed;  // counted once admitted (a failed attempt gave its blocks back)
        if (hit > 0) result_.prefix_hit_blocks += hit / o_.pool.block_size;  // (only a paged pool finds any)
        if (rr.first_step < 0) rr.first_step = rec.step;
        // swapped back in: its next token is a decode, as it would have been without the preemption
        const bool decode = swapped && n == 1 && s.n_computed == std::ssize(s.tokens) - 1 && s.n_computed >= std::ssize(request(id).prompt);
        scheduled_.push_back({id, n, decode});
        budget_ -= n;
    }
}

// 3. One forward over every scheduled sequence's tokens; then the pool as the step left it (before
// finished requests give their rows back).
const MatrixRM& Scheduler::run_forward(ServeStep& rec) {
    batch_tokens_.clear();
    batch_.clear();
    for (const Scheduled& sc : scheduled_) {
        const Live& s = live(sc.id);
        if (outputs_.forked(sc.id)) {  // a token per output, each its own sequence
            outputs_.add_to_batch(sc.id, s.n_computed, alloc_, batch_tokens_, batch_);
            rec.n_tokens += outputs_.active(sc.id);
            rec.n_decode += outputs_.active(sc.id);
            continue;
        }
        batch_tokens_.insert(batch_tokens_.end(), s.tokens.begin() + s.n_computed, s.tokens.begin() + s.n_computed + sc.n);
        batch_.push_back({sc.n, s.n_computed, alloc_.rows(sc.id), s.n_computed + sc.n == std::ssize(s.tokens)});
        rec.n_tokens += sc.n;
        rec.n_decode += sc.decode ? 1 : 0;
    }
    rec.n_seqs = std::ssize(batch_);
    const Clock::time_point t_fwd = Clock::now();
    const MatrixRM& logits = model_.forward_batch(batch_tokens_, batch_, pool_, &rec.cost);
    rec.forward_ns = ns_between(t_fwd, Clock::now());
    for (const Scheduled& sc : scheduled_) {
        Live& s = live(sc.id);
        s.n_computed += sc.n;
        if (outputs_.forked(sc.id)) outputs_.commit(sc.id, kv_seq_rows(cfg_, s.n_computed), alloc_);
        else alloc_.commit(sc.id, s.tokens, kv_seq_rows(cfg_, s.n_computed));
        result_of(sc.id).events.push_back({rec.step, sc.decode ? ServeEventKind::decode : ServeEventKind::prefill, sc.n});
    }
    rec.rows_in_use = alloc_.rows_in_use();
    rec.rows_tokens = alloc_.rows_holding_tokens();
    rec.rows_cached = alloc_.rows_cached();
    rec.largest_free = alloc_.largest_free_range();
    outputs_.measure(running_, alloc_, rec);
    if (o_.record_pool_map) {
        rec.pool_map = alloc_.pool_map();
        outputs_.owners_to_requests(rec.pool_map);
    }
    return logits;
}

// 4. Each sequence that asked for logits gets its next token; a request with all its tokens, or that
// stopped early (end-of-text, a stop string), finishes and gives its rows back (--check: compared with its solo run). Returns the checks' time.
std::int64_t Scheduler::finish(ServeStep& rec, const MatrixRM& logits, Clock::time_point t_start) {
    std::int64_t m = 0, check_ns = 0;
    for (const Scheduled& sc : scheduled_) {
        Live& s = live(sc.id);
        ServeRequestResult& rr = result_of(sc.id);
        if (s.n_computed < std::ssize(s.tokens)) continue;  // a prompt chunk with more to come
        bool done = false;
        if (outputs_.width(sc.id) > 1) {  // the next token of every output still going
            const std::int64_t going = outputs_.active(sc.id);
            rec.n_generated += going;
            m = outputs_.choose_all(sc.id, logits, m, alloc_, o_.check, s.tokens, rr.generated);
            rec.n_stopped += going - outputs_.active(sc.id);
            done = outputs_.finished(sc.id, request(sc.id).max_tokens);
        } else {
            row_ = logits.row(m++).transpose();
            const TokenId token = outputs_.choose(sc.id, row_);
            if (o_.check) s.logits.push_back(row_);
            s.tokens.push_back(token);
            rr.generated.push_back(token);
            ++rec.n_generated;
            const std::optional<FinishReason> why = early_stop(o_, sc.id, rr.generated);
            if (why) {
                rr.finish_reason = *why;
                ++rec.n_stopped;
            }
            done = why || std::ssize(rr.generated) >= request(sc.id).max_tokens;
        }
        const std::int64_t now_ns = clock_ns_ + ns_between(t_start, Clock::now()) - check_ns;
        if (rr.first_token_step < 0) {
            rr.first_token_step = rec.step;
            rr.first_token_ns = now_ns;
        }
        if (!done) continue;
        rr.finish_step = rec.step;
        rr.finish_ns = now_ns;
        outputs_.release(sc.id, alloc_, true, rr);
        running_.erase(std::find(running_.begin(), running_.end(), sc.id));
        ++n_finished_;
        if (o_.check) {
            const Clock::time_point t_check = Clock::now();
            if (outputs_.width(sc.id) > 1) outputs_.check(cfg_, *solo_, request(sc.id), sc.id, rr);
            else check_against_solo(cfg_, *solo_, request(sc.id), s, outputs_.fresh_sampler(sc.id, 0), rr);
            s.logits = {};
            check_ns += ns_between(t_check, Clock::now());
        }
    }
    return check_ns;
}

// Rows seq `id` needs to hold n more tokens, taken from the pool (and made private where shared).
bool Scheduler::take_rows(std::int64_t id, std::int64_t n) {
    const Live& s = live(id);
    const std::int64_t need = paged_ ? kv_seq_rows(cfg_, s.n_computed + n) : reservation_rows(cfg_, request(id), o_);
    if (outputs_.forked(id)) return outputs_.take_rows(id, s.n_computed, need, alloc_, pool_);
    if (!alloc_.reserve(id, need)) return false;
    const auto copies = alloc_.make_writable(id, s.n_computed, n);
    if (!copies) return false;
    for (const RowCopy& c : *copies) pool_.copy(c);
    return true;
}

// Its rows back to the pool, its K and V to be recomputed, or (--preempt swap, while the host has room)
// copied to host memory first: to the front of the queue.
void Scheduler::preempt(std::int64_t id, ServeStep& rec) {
    Live& s = live(id);
    ServeRequestResult& rr = result_of(id);
    ++rr.preemptions;
    ++result_.preemptions;
    ++rec.n_preempted;
    // a request with several outputs (--n, --beam-width) is not swapped: its outputs start over from the prompt
    if (host_ && outputs_.width(id) == 1 && s.n_computed > 0 && host_->fits(pool_, s.n_computed)) {
        swap_out(id, rec);
        alloc_.release(id);
    } else {
        if (host_ && s.n_computed > 0) ++result_.swap_fallbacks;
        if (s.n_computed > 0) result_.recompute_flops += recompute_cost(cfg_, s.n_computed, pool_.narrow() ? pool_.stored_row_bytes() : 0).total().flops;
        rr.recomputed_tokens += s.n_computed;
        rr.events.push_back({rec.step, ServeEventKind::preempted, s.n_computed});
        outputs_.release(id, alloc_, false, rr);
        if (outputs_.width(id) > 1) {
            s.tokens = request(id).prompt;
            rr.generated.clear();
        }
        s.n_computed = 0;
    }
    running_.erase(std::find(running_.begin(), running_.end(), id));
    waiting_.push_front(id);
}

// --preempt swap: the sequence's K and V rows copied to the host tier (it keeps n_computed), and back
// into the rows it was given at admission.
void Scheduler::swap_out(std::int64_t id, ServeStep& rec) {
    const Clock::time_point t0 = Clock::now();
    const Live& s = live(id);
    rec.swap_out_bytes += static_cast<std::int64_t>(host_->swap_out(id, pool_, alloc_.rows(id), s.n_computed));
    ++rec.n_swapped_out;
    ++result_of(id).swaps;
    result_of(id).events.push_back({rec.step, ServeEventKind::swapped_out, s.n_computed});
    rec.swap_ns += ns_between(t0, Clock::now());
}

void Scheduler::swap_in(std::int64_t id, ServeStep& rec) {
    const Clock::time_point t0 = Clock::now();
    rec.swap_in_bytes += static_cast<std::int64_t>(host_->swap_in(id, pool_, alloc_.rows(id)));
    ++rec.n_swapped_in;
    rec.swap_ns += ns_between(t0, Clock::now());
}

}  // namespace

ServeResult run_serving(const ModelConfig& cfg, const Weights& weights, std::span<const ServeRequest> requests, const ServeOptions& o) {
    check_serve_workload(cfg, requests, o);
    return Scheduler(cfg, weights, requests, o).run();
}

}  // namespace kvlab
