// The ceiling of a cached decode step, measured: the bytes the step reads, in the order the forward pass
// reads them, and nothing else. docs/performance.md ("The decode replay") explains why it replaced a
// plain read over a buffer of the working set's size, which the decode beat on every host tried.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include <omp.h>

#include "bench_references.hpp"
#include "kvlab/calc/model_config.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/weights/weights.hpp"

namespace kvlab::bench {

// A decode step at position `pos` reads, layer by layer, wq, wk, wv, the layer's cached keys and values
// (keys_attended(l, pos) rows of each), wo, then w1, w3, w2; after the last layer, the classifier. The
// replay reads those very matrices (the model's own memory) and a KV cache of the model's shape, for
// the same positions as the measured decode. Each thread sums its static share of every span and never
// waits for the other threads; every sample reads with each read pattern in turn and keeps the best
// (the winner moves with a shared host's phases: docs/performance.md). A real decode
// must wait after every matrix for the vector the next one multiplies. So the replay's steps per second
// are a measured ceiling for the decode, with the caches' help (the KV rows re-read each step, what the
// last-level cache keeps of the weights) measured rather than assumed; each run checks that no decode
// beat it. Left out (< 0.1 % of the bytes): the KV rows written, the embedding row, norms and biases.
class DecodeReplay {
public:
    static constexpr std::int64_t kSampleSteps = 16;

    // Positions first_pos .. first_pos + n_steps - 1, one decode step each; a sample replays kSampleSteps
    // of them (all of them, if fewer), evenly spaced, so that each read pattern reads a mix of steps like
    // the decode's in about the time one read of every step took.
    DecodeReplay(const ModelConfig& cfg, const Weights& w, std::int64_t first_pos, std::int64_t n_steps)
        : n_sample_(std::min(n_steps, kSampleSteps)) {
        if (n_steps < 1 || first_pos < 0) throw Error("decode replay: needs at least one step at a position >= 0");
        const std::int64_t n_keys_max = first_pos + n_steps;
        const std::int64_t row = cfg.d_kv();
        for (std::int64_t i = 0; i < 2 * cfg.n_layer; ++i) {
            kv_.push_back(large_matrix(n_keys_max, row));  // allocated as kvlab's caches are (weights/weights.hpp)
            kv_.back().setOnes();
        }
        for (std::int64_t k = 0; k < n_sample_; ++k) {
            const std::int64_t pos = first_pos + k * n_steps / n_sample_;
            for (std::int64_t l = 0; l < cfg.n_layer; ++l) {
                const LayerWeights& lw = w.layers[static_cast<std::size_t>(l)];
                const std::int64_t keys = cfg.keys_attended(l, pos);
                // the decode's threads wait for each other where a parallel region ends (model/ops.cpp):
                // after the q, k, v projections, the attention, wo, the w1 and w3 pair, and w2
                add(lw.wq), add(lw.wk), add(lw.wv), wait_here();
                add(kv_[static_cast<std::size_t>(2 * l)].data(), keys * row);
                add(kv_[static_cast<std::size_t>(2 * l + 1)].data(), keys * row), wait_here();
                add(lw.wo), wait_here();
                add(lw.w1), add(lw.w3), wait_here();
                add(lw.w2), wait_here();
            }
            add(w.classifier()), wait_here();
        }
    }

    // One sample: the sampled steps replayed with every read pattern in turn; returns the best steps per
    // second. The first call reads them once before, so that no pattern pays for first touches.
    double steps_per_s() {
        if (!warm_) replay(0), warm_ = true;
        double best = 0;
        for (std::size_t p = 0; p < kNumPatterns; ++p)
            if (const double r = static_cast<double>(n_sample_) / replay(p); r > best) best = r, last_pattern_ = p;
        ++wins_[last_pattern_];
        samples.push_back(best);
        return best;
    }
    // One sample of the same reads with the decode's waits: every thread stops at a barrier wherever the
    // decode's threads wait for each other (5 per layer and one after the classifier), with the pattern that
    // won the last steps_per_s(). Not a ceiling for the decode (its threads split the attention by heads,
    // not by rows), but the part of the gap between the decode and its replay that waiting explains. Its
    // shares are static, so a slower thread holds the others up at every barrier; the decode's matmuls
    // claim their rows as threads finish (model/ops.cpp), so it can lose less to waiting than this does.
    double waits_steps_per_s() {
        if (!warm_) throw Error("decode replay: waits_steps_per_s() follows a steps_per_s()");
        wait_samples.push_back(static_cast<double>(n_sample_) / replay(last_pattern_, true));
        return wait_samples.back();
    }
    // Read by one sample's steps, per step (their mean: a later step reads more cached keys).
    std::uint64_t bytes_per_step() const { return bytes_ / static_cast<std::uint64_t>(n_sample_); }
    std::int64_t sample_steps() const { return n_sample_; }
    std::int64_t waits_per_step() const { return n_waits_ / n_sample_; }
    // The pattern that won the most samples so far (ties: the first in kReadPatterns).
    std::size_t pattern_index() const { return most_won(wins_); }
    ReadPattern pattern() const { return kReadPatterns[pattern_index()]; }
    std::size_t wins(std::size_t p) const { return wins_[p]; }  // samples pattern p won
    std::vector<double> samples;       // steps per second
    std::vector<double> wait_samples;  // steps per second, with the decode's waits

private:
    struct Span {
        const float* data;
        std::int64_t n;  // floats
        bool wait = false;  // the decode's threads wait for each other after this span
    };
    void add(const float* data, std::int64_t n) {
        if (n <= 0) return;
        spans_.push_back({data, n});
        bytes_ += static_cast<std::uint64_t>(n) * sizeof(float);
    }
    void add(const WeightMatrix& m) { add(m.data(), m.size()); }
    void wait_here() {
        if (!spans_.empty() && !spans_.back().wait) spans_.back().wait = true, ++n_waits_;
    }

    // Seconds to read the sampled steps' spans with pattern p, each thread its share of each; no barrier
    // between them, or (`waits`) a barrier after each span the decode waits after.
    double replay(std::size_t p, bool waits = false) const {
        const auto t0 = clock_type::now();
        double sum = 0.0;
#pragma omp parallel reduction(+ : sum)
        {
            const std::int64_t n_threads = omp_get_num_threads(), t = omp_get_thread_num();
            for (const Span& s : spans_) {
                const std::int64_t i0 = s.n * t / n_threads, i1 = s.n * (t + 1) / n_threads;
                sum += sum_pattern(p, s.data + i0, i1 - i0);
                if (waits && s.wait) {
#pragma omp barrier
                }
            }
        }
        const double seconds = seconds_since(t0);
        if (!std::isfinite(sum)) throw Error("decode replay: the sum is not finite");  // keeps the reads live
        return seconds;
    }

    std::vector<MatrixRM> kv_;  // 2L buffers (T, Hkv*D): layer l's keys (2l) and values (2l + 1), ones
    std::int64_t n_sample_;      // steps sampled
    std::vector<Span> spans_;    // the sampled steps' reads, in order
    std::uint64_t bytes_ = 0;
    std::int64_t n_waits_ = 0;  // spans marked wait, over the sampled steps
    std::size_t wins_[kNumPatterns] = {};
    std::size_t last_pattern_ = 0;
    bool warm_ = false;
};

}  // namespace kvlab::bench
