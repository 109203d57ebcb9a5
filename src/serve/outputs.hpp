// Several outputs per request in serve: parallel sampling (n > 1) and beam search (beam_width W > 1).
// A request runs its prompt as one sequence; the prompt's logits choose each output's first token, and
// the sequence is forked into one per output (KvAllocator::fork): every block of the prompt, the last
// partial one too, is shared by reference count. The outputs decode together, one token each per step;
// writing into a shared block copies it first (copy-on-write), so a full prompt block stays shared for
// the request's life and a partial one is copied once per output but the last.
//
// Beam search (the definition kvlab makes exact; HF generate's num_beams with do_sample=False, and vLLM's
// beam search, when no EOS is reached: serve never stops early, every request generates max_tokens):
//   a beam's score is its cumulative log-probability, the sum over its generated tokens of
//   log softmax(logits)[token] (float logits, double sums). Step 0: the prompt is the one beam. Each step,
//   every beam b is extended by every token v, score(b) + log p_b(v); the W best candidates (ties: the
//   better-ranked beam, then the lower token id) are the new beams, ranked. Beams no candidate extends are
//   pruned (their blocks freed); a beam extended twice is forked. All beams have the same length, so any
//   length penalty (HF: score / length^alpha) ranks them the same: none is applied. The result is the W
//   beams, best first; the request's `generated` is the best.
// Parallel sampling: output k of request i samples with its own Sampler, seeded splitmix64(seed + i*n + k)
// (a request with its own seed s: s for output 0, splitmix64(s + k) for output k > 0), so its tokens do not
// depend on the batch. Each output stops on its own (end-of-text, a stop string: early_stop) and gives its
// rows back at once (a shared block stays while another output holds it); the request ends when every
// output has stopped or reached max_tokens. Beams never stop early. A preempted request with several outputs starts over (its
// outputs are discarded; recomputed the same: beams are deterministic, samplers are seeded again).
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kvlab/calc/model_config.hpp"
#include "kvlab/kv/kv_pool.hpp"
#include "kvlab/model/transformer.hpp"
#include "kvlab/serve/scheduler.hpp"
#include "kvlab/sim/sampler.hpp"

namespace kvlab {

// Throws UsageError naming the flag for n or beam_width < 1, both above 1, more outputs than the
// vocabulary or the step's sequences or tokens, or several outputs in a contiguous pool.
void check_outputs_options(const ModelConfig& cfg, std::span<const ServeRequest> requests, const ServeOptions& o);

// Why an output that has just written the last of `generated` stops early (o.stop_rule), or nothing: it
// goes on (max_tokens is the caller's).
std::optional<FinishReason> early_stop(const ServeOptions& o, std::int64_t request, std::span<const TokenId> generated);

class Outputs {
public:
    Outputs(const ServeOptions& o, std::span<const ServeRequest> requests, std::int64_t n_vocab);
    std::int64_t width() const { return width_; }  // outputs of the widest request
    std::int64_t width(std::int64_t id) const { return widths_[static_cast<std::size_t>(id)]; }  // request id's outputs
    bool beam() const { return beam_; }
    bool forked(std::int64_t id) const { return groups_[static_cast<std::size_t>(id)].forked; }
    // Outputs still generating: before the fork, every one (the prompt runs once for all)
    std::int64_t active(std::int64_t id) const;
    // A forked request is done: every output stopped early, or those still going reached max_tokens.
    bool finished(std::int64_t id, std::int64_t max_tokens) const;
    // The allocator's sequence of output `slot` of request `id` (slot 0: the request's own id), and back.
    SeqId seq(std::int64_t id, std::int64_t slot) const;
    std::int64_t request_of(SeqId seq) const;
    void owners_to_requests(std::vector<KvPoolCell>& map) const;

    // One output (width 1): its next token from its Sampler (greedy: argmax).
    TokenId choose(std::int64_t id, const VectorF& logits);
    Sampler fresh_sampler(std::int64_t id, std::int64_t slot) const;  // as output `slot` of request `id` starts
    // Several: rows m.. of `logits` are the request's (one after its prompt, then one per output in slot
    // order); each output's next token, forking or pruning beams. `generated`: the best output's afterwards;
    // `tokens`: an output's still going (the request's position), else the best's. Returns the next row.
    std::int64_t choose_all(std::int64_t id, const MatrixRM& logits, std::int64_t m, KvAllocator& alloc, bool keep_logits,
                            std::vector<TokenId>& tokens, std::vector<TokenId>& generated);

    // A forked request's step: rows for every output (false: not all; those taken stay), its tokens in the
    // batch, its K and V committed.
    bool take_rows(std::int64_t id, std::int64_t n_computed, std::int64_t need_rows, KvAllocator& alloc, KvPool& pool);
    void add_to_batch(std::int64_t id, std::int64_t n_computed, const KvAllocator& alloc, std::vector<TokenId>& tokens,
                      std::vector<SeqStep>& batch) const;
    void commit(std::int64_t id, std::int64_t n_valid_rows, KvAllocator& alloc) const;
    // The step's figures over the running requests with several outputs (ServeStep::out_blocks...).
    void measure(std::span<const std::int64_t> running, const KvAllocator& alloc, ServeStep& rec);

    // Every row of the request back to the pool. `finished`: its outputs go to `out` first; else
    // (preempted) a forked request's outputs are discarded, to start over.
    void release(std::int64_t id, KvAllocator& alloc, bool finished, ServeRequestResult& out);
    // --check of a finished request with several outputs: each output teacher-forced on the solo path
    // (logits within tolerance; samples: the same token from a fresh sampler), beams against a beam search
    // on the solo path.
    void check(const ModelConfig& cfg, Transformer& solo, const ServeRequest& req, std::int64_t id, ServeRequestResult& out);

private:
    struct Output {
        std::vector<TokenId> tokens;   // prompt, then generated
        double score = 0.0;
        std::vector<VectorF> logits;   // --check: the logits that chose each generated token
        bool done = false;             // stopped early: its rows are back in the pool
        FinishReason reason = FinishReason::length;
    };
    struct Group {
        std::vector<Output> outs;      // by slot
        std::vector<std::int64_t> rank;  // slots, best first (sampling: slot order)
        std::vector<Sampler> samplers;   // by slot
        bool forked = false;
        std::int64_t prompt_len = 0;
        std::vector<std::vector<VectorF>> done_logits;  // --check: kept from release to check, by rank
        std::int64_t peak_held = 0, peak_unshared = 0, cow = 0;
    };
    void start(std::int64_t id, const VectorF& row, KvAllocator& alloc, bool keep_logits, const std::vector<TokenId>& prompt);
    void beam_step(Group& g, std::int64_t id, const MatrixRM& logits, std::int64_t m, KvAllocator& alloc, bool keep_logits);
    void stop_if_done(std::int64_t id, std::int64_t slot, Output& out, KvAllocator& alloc) const;

    ServeOptions o_;
    std::vector<std::optional<std::uint64_t>> seeds_;  // each request's own seed, if it has one
    std::vector<std::int64_t> widths_;                  // each request's outputs: its own n, else --n / --beam-width
    std::int64_t n_requests_, n_vocab_, width_;
    bool beam_;
    std::vector<Group> groups_;
    VectorF row_;
};

}  // namespace kvlab
