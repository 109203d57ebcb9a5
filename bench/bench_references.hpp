// The references every bench speed is divided by, measured in the same run with the same threads: a
// STREAM-style read bandwidth (the best of several patterns over a buffer far larger than the LLC) and
// FLOP/s (the best of Eigen GEMMs at a few sizes, shared or one per thread, and the FMA peak). The
// cached decode's own ceiling, its replay, is in decode_replay.hpp. docs/performance.md explains why
// each is a ceiling and how a run checks that it was one.
#pragma once
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <Eigen/Core>
#include <immintrin.h>
#include <omp.h>

#include "kvlab/core/error.hpp"
#include "kvlab/core/huge_pages.hpp"
#include "kvlab/weights/weights.hpp"

namespace kvlab::bench {

using clock_type = std::chrono::steady_clock;

inline double seconds_since(clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count();
}

struct Stat {
    double median = 0, min = 0, max = 0;
    std::size_t n = 0;  // samples
};

inline Stat stat_of(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    const std::size_t n = values.size();
    const double median = n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
    return {median, values.front(), values.back(), n};
}

// The read kernel of every bandwidth reference.
constexpr std::int64_t kLine = 16;            // floats per 64-byte line
constexpr std::int64_t kStep = 4 * kLine;     // floats each stream advances per visit (4 lines)
constexpr std::int64_t kPrefetchAhead = 512;  // floats (2 KiB, 32 lines) ahead in each stream
// x[0] + ... + x[n-1], read as S contiguous sub-ranges side by side, 4 lines of each in turn, summed in
// pairs and then into the stream's one accumulator (the tail after the last whole step of every
// sub-range is summed alone). S is a template argument so that the accumulators stay in registers:
// with a run-time count they lived on the stack, every add waited on a store, and the decode met or
// beat the ceiling built on it (docs/performance.md, "Why the references are what they are", step 6).
template <int S, bool Prefetch>
double sum_streams(const float* x, std::int64_t n) {
    using Line = Eigen::Array<float, kLine, 1>;
    using Map = Eigen::Map<const Line>;
    const std::int64_t per = n / (S * kStep) * kStep;  // floats per sub-range
    Line acc[S];
    for (Line& a : acc) a.setZero();
    for (std::int64_t i = 0; i < per; i += kStep)
        for (int s = 0; s < S; ++s) {
            const float* p = x + s * per + i;
            if constexpr (Prefetch) __builtin_prefetch(p + kPrefetchAhead);
            acc[s] += (Map(p) + Map(p + kLine)) + (Map(p + 2 * kLine) + Map(p + 3 * kLine));
        }
    double sum = 0.0;
    for (const Line& a : acc) sum += static_cast<double>(a.sum());
    for (std::int64_t i = S * per; i < n; ++i) sum += x[i];
    return sum;
}

// The references every speed is divided by, sampled right before the measurement they divide, so the
// slow phases of a shared machine hit both alike. A reference must be a ceiling on any x86 host: no
// real workload may exceed it. Read bandwidth is therefore the best of several patterns, each thread
// summing its static share of a buffer far larger than the last-level cache (first touched by the same
// thread): 1, 2, 4 or 8 sub-ranges read side by side (a core keeps more misses in flight over several
// streams on some parts, fewer on others), with and without software prefetch. Every sample tries every
// pattern and keeps the best, since which one wins moves with the host's phases (on the Zen 5 host the
// winner of one sample read 26 % below another pattern a few minutes later). FLOP/s is the best of
// Eigen's (n, n) @ (n, n) at a few sizes (one product on Eigen's threads, or one per thread at once) and
// the FMA units' own rate in registers, where the build has vector FMA.
struct ReadPattern {
    int streams;
    bool prefetch;
};
constexpr ReadPattern kReadPatterns[] = {{1, false}, {2, false}, {4, false}, {8, false},
                                         {1, true},  {2, true},  {4, true},  {8, true}};
constexpr std::size_t kNumPatterns = std::size(kReadPatterns);
inline std::string pattern_name(ReadPattern p) {
    return std::to_string(p.streams) + (p.streams > 1 ? " streams" : " stream") + " per thread" + (p.prefetch ? ", prefetch" : "");
}
// sum_streams instantiated for every entry of kReadPatterns, in its order.
template <std::size_t P>
double sum_with(const float* x, std::int64_t n) {
    return sum_streams<kReadPatterns[P].streams, kReadPatterns[P].prefetch>(x, n);
}
template <std::size_t... P>
constexpr auto sum_table(std::index_sequence<P...>) {
    return std::array<double (*)(const float*, std::int64_t), sizeof...(P)>{&sum_with<P>...};
}
inline constexpr auto kSumWith = sum_table(std::make_index_sequence<kNumPatterns>{});
// sum_streams with pattern kReadPatterns[p].
inline double sum_pattern(std::size_t p, const float* x, std::int64_t n) {
    if (p >= kNumPatterns) throw Error("read pattern: no such pattern");
    return kSumWith[p](x, n);
}
// The pattern that won the most samples, given each pattern's count (ties: the first).
inline std::size_t most_won(const std::size_t (&wins)[kNumPatterns]) {
    return static_cast<std::size_t>(std::max_element(std::begin(wins), std::end(wins)) - std::begin(wins));
}

class References {
public:
    References(std::int64_t stream_mib, const std::vector<std::int64_t>& gemm_sizes)
        : n_stream_(stream_mib * 1024 * 1024 / static_cast<std::int64_t>(sizeof(float))),
          stream_(new float[static_cast<std::size_t>(n_stream_)]) {
        float* data = stream_.get();
        const std::int64_t n = n_stream_;
        // huge pages where the host gives them, as kvlab's weights and caches get (core/huge_pages.hpp):
        // a reference read from 4 KiB pages would not be the best the machine does
        advise_huge_pages(data, static_cast<std::size_t>(n) * sizeof(float));
#pragma omp parallel for schedule(static)
        for (std::int64_t i = 0; i < n; ++i) data[i] = 1.0f;
        // every read pattern: one warm-up, then three samples; the best median wins
        for (std::size_t p = 0; p < kNumPatterns; ++p) {
            read_rate(p);
            std::vector<double> v;
            for (int k = 0; k < 3; ++k) v.push_back(read_rate(p));
            pattern_bw[p] = stat_of(v).median;
            if (pattern_bw[p] > pattern_bw[best_pattern]) best_pattern = p;
        }
        // every GEMM size, both ways: one product on Eigen's threads, and one product per thread at once
        // (no hand-off between threads: each core's own GEMM rate, summed); then the FMA units' own rate
        const int n_threads = omp_get_max_threads();
        for (const std::int64_t g : gemm_sizes)
            for (const bool per_thread : {false, true}) {
                if (per_thread && n_threads == 1) continue;  // the same as the shared product
                gemm_cases.push_back({g, per_thread});
                std::vector<Gemm>& set = gemms_.emplace_back(per_thread ? n_threads : 1);
                for (Gemm& m : set) m = {MatrixRM::Random(g, g), MatrixRM::Random(g, g), MatrixRM(g, g)};
            }
        if (has_fma_peak()) {
            gemm_cases.push_back({0, true});  // the FMA peak
            gemms_.emplace_back();
        }
        for (std::size_t i = 0; i < gemm_cases.size(); ++i) {
            gemm_once(i);
            std::vector<double> v;
            for (int k = 0; k < 3; ++k) v.push_back(gemm_once(i));
            gemm_case_rate.push_back(stat_of(v).median);
            if (gemm_case_rate.back() > gemm_case_rate[best_gemm]) best_gemm = i;
        }
        for (std::size_t i = 0; i < gemms_.size(); ++i)
            if (i != best_gemm) gemms_[i] = {};  // only the winner is sampled again
    }

    // One sample of read bandwidth (every pattern, the best kept) and of FLOP/s (the winning size); every
    // sample is kept.
    double read_bandwidth() {
        bw_samples.push_back(best_read_rate(n_stream_));
        return bw_samples.back();
    }
    // The read bandwidth over the first `bytes` of the buffer, read again and again as a decode step
    // re-reads a model's weights: the ceiling for a working set of that size, which is the cache's when it
    // fits the last-level cache. Every pattern, the best kept.
    double read_bandwidth_over(std::uint64_t bytes) {
        return best_read_rate(std::min<std::int64_t>(n_stream_, static_cast<std::int64_t>(bytes / sizeof(float))));
    }
    double gemm_rate() {
        gemm_samples.push_back(gemm_once(best_gemm));
        return gemm_samples.back();
    }
    struct GemmCase {
        std::int64_t n;   // (n, n) @ (n, n); 0: the FMA peak (fma_peak_rate)
        bool per_thread;  // one product per thread at once, each single-threaded; else one on every thread
    };
    static std::string gemm_name(GemmCase c) {
        if (c.n == 0) return "FMA peak (registers only, every thread)";
        return "Eigen " + std::to_string(c.n) + "^3" + (c.per_thread ? ", one per thread" : ", shared by the threads");
    }
    std::vector<GemmCase> gemm_cases;

    double pattern_bw[kNumPatterns] = {};      // median bytes/s of each pattern at the start
    std::size_t best_pattern = 0;               // the best of them
    std::size_t bw_wins[kNumPatterns] = {};     // read_bandwidth() samples each pattern won
    std::vector<double> gemm_case_rate;         // median FLOP/s of each GEMM case at the start
    std::size_t best_gemm = 0;
    std::vector<double> bw_samples, gemm_samples;

private:
    struct Gemm {
        MatrixRM a, b, c;
    };

    // FLOP/s of one sample of case i: all its products, timed together (inside an OpenMP parallel region
    // Eigen runs each product on its caller's thread alone)
    double gemm_once(std::size_t i) {
        if (gemm_cases[i].n == 0) return fma_peak_rate();
        std::vector<Gemm>& set = gemms_[i];
        const auto n_set = static_cast<int>(set.size());
        const auto t0 = clock_type::now();
        if (n_set == 1) {
            set[0].c.noalias() = set[0].a * set[0].b;
        } else {
#pragma omp parallel for num_threads(n_set) schedule(static, 1)
            for (int t = 0; t < n_set; ++t) set[static_cast<std::size_t>(t)].c.noalias() = set[static_cast<std::size_t>(t)].a * set[static_cast<std::size_t>(t)].b;
        }
        const double s = seconds_since(t0);
        for (const Gemm& g : set)
            if (!std::isfinite(g.c(0, 0))) throw Error("GEMM reference: non-finite result");
        const auto n = static_cast<double>(set[0].a.rows());
        return n_set * 2.0 * n * n * n / s;
    }

    // Whether this build has fused multiply-adds on vectors (the FMA peak is measured only then).
    static constexpr bool has_fma_peak() {
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
        return true;
#else
        return false;
#endif
    }
    // FLOP/s of every thread running independent chains of fused multiply-adds on the widest vectors this
    // build has, in registers only, until 50 ms have gone by: a GEMM, whatever its blocking, does its
    // multiply-adds on the same units. (A chain needs one FMA latency per link; 2 pipes x 4-5 cycles on
    // current x86 cores need 8-10 chains. AVX-512 has 32 vector registers, so 16 chains; AVX2 has 16, so
    // 12, leaving room for the two constants: more would spill chains to the stack and halve the rate.)
    static double fma_peak_rate() {
#if defined(__AVX512F__)
        constexpr int kFmaChains = 16;
        using Vec = __m512;
        constexpr int kLanes = 16;
        auto fma = [](Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); };
        auto set1 = [](float x) { return _mm512_set1_ps(x); };
        auto lane_sum = [](Vec a) { return static_cast<double>(_mm512_reduce_add_ps(a)); };
#elif defined(__AVX2__) && defined(__FMA__)
        constexpr int kFmaChains = 12;
        using Vec = __m256;
        constexpr int kLanes = 8;
        auto fma = [](Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); };
        auto set1 = [](float x) { return _mm256_set1_ps(x); };
        auto lane_sum = [](Vec a) {
            alignas(32) float f[8];
            _mm256_store_ps(f, a);
            double s = 0;
            for (const float x : f) s += x;
            return s;
        };
#else
        return 0.0;  // never called: has_fma_peak() is false
#endif
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
        constexpr std::int64_t kRounds = 1 << 16;  // between clock reads
        const auto t0 = clock_type::now();
        std::int64_t rounds = 0;
        int team = 0;
        double sum = 0.0;
        do {
            team = 0;
#pragma omp parallel reduction(+ : sum, team)
            {
                team += 1;  // the threads that really ran (a dynamic team may be smaller than asked)
                // x <- x * 0.999999 + 1e-7 stays near its start: no overflow, no denormals
                const Vec m = set1(0.999999f), c = set1(1e-7f);
                Vec acc[kFmaChains];
                for (int k = 0; k < kFmaChains; ++k) acc[k] = set1(1.0f + 0.001f * static_cast<float>(k + omp_get_thread_num()));
                for (std::int64_t r = 0; r < kRounds; ++r)
                    for (int k = 0; k < kFmaChains; ++k) acc[k] = fma(acc[k], m, c);
                for (int k = 0; k < kFmaChains; ++k) sum += lane_sum(acc[k]);
            }
            ++rounds;
        } while (seconds_since(t0) < 0.05);
        const double s = seconds_since(t0);
        if (!std::isfinite(sum)) throw Error("FMA peak: the sum is not finite");  // keeps the chains live
        return 2.0 * static_cast<double>(rounds) * kRounds * kFmaChains * kLanes * team / s;
#endif
    }

    // bytes/s of every thread summing its static share of the first n floats with pattern p (the whole
    // buffer by default), in passes until 50 ms have gone by (one pass over a cache-sized set is short)
    double read_rate(std::size_t p, std::int64_t n = -1) const {
        const float* data = stream_.get();
        if (n < 0) n = n_stream_;
        const auto t0 = clock_type::now();
        double sum = 0.0;
        std::int64_t passes = 0;
        do {
#pragma omp parallel reduction(+ : sum)
            {
                const std::int64_t n_threads = omp_get_num_threads(), t = omp_get_thread_num();
                const std::int64_t i0 = n * t / n_threads, i1 = n * (t + 1) / n_threads;
                sum += sum_pattern(p, data + i0, i1 - i0);
            }
            ++passes;
        } while (seconds_since(t0) < 0.05);
        const double s = seconds_since(t0);
        if (!(sum > 0.0)) throw Error("read bandwidth: the sum of ones is not positive");  // keeps the reads live
        return static_cast<double>(passes) * static_cast<double>(n) * sizeof(float) / s;
    }
    // The best read_rate(p, n) of every pattern p; counts the winner in bw_wins when n is the whole buffer.
    double best_read_rate(std::int64_t n) {
        double best = 0;
        std::size_t won = 0;
        for (std::size_t p = 0; p < kNumPatterns; ++p)
            if (const double r = read_rate(p, n); r > best) best = r, won = p;
        if (n == n_stream_) ++bw_wins[won];
        return best;
    }

    std::int64_t n_stream_;
    std::unique_ptr<float[]> stream_;  // (n_stream_) ones
    std::vector<std::vector<Gemm>> gemms_;  // per case: its products (one, or one per thread)
};

}  // namespace kvlab::bench
