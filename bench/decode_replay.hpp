// The ceiling of a cached decode step, measured: the bytes the step reads, in the order the forward pass
// reads them, and nothing else. docs/performance.md ("The decode replay") explains why it replaced a
// plain read over a buffer of the working set's size, which the decode beat on every host tried.
#pragma once
#include <cstdint>
#include <vector>

#include <omp.h>

#include "bench_references.hpp"
#include "calc/model_config.hpp"
#include "core/error.hpp"
#include "model/weights.hpp"

namespace kvlab::bench {

// A decode step at position `pos` reads, layer by layer, wq, wk, wv, the layer's cached keys and values
// (keys_attended(l, pos) rows of each), wo, then w1, w3, w2; after the last layer, the classifier. The
// replay reads those very matrices (the model's own memory) and a KV cache of the model's shape, for
// the same positions as the measured decode. Each thread sums its static share of every span with the
// best read pattern (found on the first sample) and never waits for the other threads; a real decode
// must wait after every matrix for the vector the next one multiplies. So the replay's steps per second
// are a measured ceiling for the decode, with the caches' help (the KV rows re-read each step, what the
// last-level cache keeps of the weights) measured rather than assumed; each run checks that no decode
// beat it. Left out (< 0.1 % of the bytes): the KV rows written, the embedding row, norms and biases.
class DecodeReplay {
public:
    // Positions first_pos .. first_pos + n_steps - 1, one decode step each.
    DecodeReplay(const ModelConfig& cfg, const Weights& w, std::int64_t first_pos, std::int64_t n_steps)
        : n_steps_(n_steps) {
        if (n_steps < 1 || first_pos < 0) throw Error("decode replay: needs at least one step at a position >= 0");
        const std::int64_t n_keys_max = first_pos + n_steps;
        const std::int64_t row = cfg.d_kv();
        for (std::int64_t i = 0; i < 2 * cfg.n_layer; ++i) {
            kv_.push_back(large_matrix(n_keys_max, row));  // allocated as kvlab's caches are (model/weights.hpp)
            kv_.back().setOnes();
        }
        for (std::int64_t pos = first_pos; pos < first_pos + n_steps; ++pos) {
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

    // One sample: every step replayed once; returns steps per second. The first call tries every read
    // pattern on the first steps (at most 16) and keeps the fastest.
    double steps_per_s() {
        if (!picked_) {
            const std::size_t n = spans_.size() / static_cast<std::size_t>(n_steps_) * static_cast<std::size_t>(std::min<std::int64_t>(n_steps_, 16));
            double best = 0;
            for (std::size_t p = 0; p < kNumPatterns; ++p) {
                replay(p, n);  // warm-up
                if (const double s = replay(p, n); best == 0 || s < best) best = s, pattern_ = p;
            }
            picked_ = true;
        }
        samples.push_back(static_cast<double>(n_steps_) / replay(pattern_, spans_.size()));
        return samples.back();
    }
    // One sample of the same reads with the decode's waits: every thread stops at a barrier wherever the
    // decode's threads wait for each other (5 per layer and one after the classifier), with the pattern the
    // first steps_per_s() picked. Not a ceiling for the decode (its threads split the attention by heads,
    // not by rows), but the part of the gap between the decode and its replay that waiting alone explains.
    double waits_steps_per_s() {
        if (!picked_) throw Error("decode replay: the read pattern is picked by the first steps_per_s()");
        wait_samples.push_back(static_cast<double>(n_steps_) / replay(pattern_, spans_.size(), true));
        return wait_samples.back();
    }
    std::uint64_t bytes() const { return bytes_; }  // read by one replay of every step
    std::int64_t waits_per_step() const { return n_waits_ / n_steps_; }
    ReadPattern pattern() const { return kReadPatterns[pattern_]; }
    std::size_t pattern_index() const { return pattern_; }  // into kReadPatterns
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

    // Seconds to read the first n spans with pattern p, each thread its share of each; no barrier between
    // them, or (`waits`) a barrier after each span the decode waits after.
    double replay(std::size_t p, std::size_t n, bool waits = false) const {
        const ReadPattern pattern = kReadPatterns[p];
        const auto t0 = clock_type::now();
        double sum = 0.0;
#pragma omp parallel reduction(+ : sum)
        {
            const std::int64_t n_threads = omp_get_num_threads(), t = omp_get_thread_num();
            for (std::size_t i = 0; i < n; ++i) {
                const Span& s = spans_[i];
                const std::int64_t i0 = s.n * t / n_threads, i1 = s.n * (t + 1) / n_threads;
                sum += pattern.prefetch ? sum_streams<true>(s.data + i0, i1 - i0, pattern.streams)
                                        : sum_streams<false>(s.data + i0, i1 - i0, pattern.streams);
                if (waits && s.wait) {
#pragma omp barrier
                }
            }
        }
        const double seconds = seconds_since(t0);
        if (!std::isfinite(sum)) throw Error("decode replay: the sum is not finite");  // keeps the reads live
        return seconds;
    }

    std::int64_t n_steps_;
    std::vector<MatrixRM> kv_;  // 2L buffers (T, Hkv*D): layer l's keys (2l) and values (2l + 1), ones
    std::vector<Span> spans_;            // every step's reads, in order
    std::uint64_t bytes_ = 0;
    std::int64_t n_waits_ = 0;  // spans marked wait, over every step
    std::size_t pattern_ = 0;
    bool picked_ = false;
};

}  // namespace kvlab::bench
