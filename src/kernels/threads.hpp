// How the forward pass's ops split their work over OpenMP threads: tasks handed out one at a time
// (for_each_task), a body on every thread of a team (on_threads), and a matmul's output rows in shares
// (Shares: static blocks, or claimed as threads finish). No output depends on the split.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>

#include <omp.h>

namespace kvlab {

// f(i) for every task i in [0, n), handed out to the threads one at a time (tasks may differ in cost). One
// task, or one thread, runs here with no OpenMP region at all: libgomp allocates a new team for every
// one-thread region (an if() clause that serialises it included), and a decode step must not allocate.
template <typename TaskFn>
void for_each_task(std::int64_t n, TaskFn f) {
    if (!omp_in_parallel() && (n == 1 || omp_get_max_threads() == 1)) {
        for (std::int64_t i = 0; i < n; ++i) f(i);
        return;
    }
#pragma omp parallel for schedule(dynamic)
    for (std::int64_t i = 0; i < n; ++i) f(i);
}

// body() on every thread of a team, each taking its share by omp_get_thread_num (thread_block); with one
// thread it runs here, outside any region, since libgomp allocates a fresh team for every one-thread
// region. (Under --threads 0 libgomp may still size a team to one thread on a loaded machine.) Inside an
// enclosing region a nested region is kept, so thread_block sees a team of its own.
template <typename Body>
void on_threads(Body body) {
    if (omp_get_max_threads() == 1 && !omp_in_parallel()) {
        body();
        return;
    }
#pragma omp parallel
    body();
}

// A thread's share of [0, n) inside a parallel region: contiguous, starting at a multiple of 16 (one
// 64-byte line of floats), so each thread streams its own rows of a weight matrix.
struct Block {
    std::int64_t begin = 0, size = 0;
};

inline Block thread_block(std::int64_t n) {
    const std::int64_t n_threads = omp_get_num_threads(), t = omp_get_thread_num(), n_lines = (n + 15) / 16;
    const std::int64_t begin = std::min(n, n_lines * t / n_threads * 16), end = std::min(n, n_lines * (t + 1) / n_threads * 16);
    return {begin, end - begin};
}

// One op's rows, handed out to a team in shares (declared before the op's region, shared by its
// threads). A one-token step's GEMVs are memory-bound and the threads meet at the region's end, so a
// thread that runs slower (a shared host's vCPUs do, by tens of percent for seconds at a time) holds the
// others up. There each thread claims the next share when it is done with its last: what is left over
// the team's size, rounded up to whole lines of output (16 rows), at least kMinShareRows; the first
// shares are long runs of memory, the last ones small enough to even out the finish. Several tokens (a
// GEMM, compute-bound, packing the tokens per share) take the static thread_block. Every row is summed
// the same way whatever share it falls in, so no output depends on the split (kernels/matmul.hpp).
class Shares {
public:
    Shares(std::int64_t n_rows, bool claimed) : n_(n_rows), claimed_(claimed) {}

    // f(block) for each share this thread gets; call on every thread of the team
    template <typename F>
    void each(F f) {
        const std::int64_t n_threads = omp_get_num_threads();
        if (!claimed_ || n_threads == 1) {
            if (const Block b = thread_block(n_); b.size > 0) f(b);
            return;
        }
        std::int64_t begin = next_.load(std::memory_order_relaxed);
        for (;;) {
            std::int64_t size = 0;
            do {
                if (begin >= n_) return;
                const std::int64_t fair = ((n_ - begin) / n_threads + 15) / 16 * 16;  // in whole lines
                size = std::min(n_ - begin, std::max(kMinShareRows, fair));
            } while (!next_.compare_exchange_weak(begin, begin + size, std::memory_order_relaxed));
            f(Block{begin, size});
            begin = next_.load(std::memory_order_relaxed);
        }
    }

private:
    static constexpr std::int64_t kMinShareRows = 64;
    const std::int64_t n_;
    const bool claimed_;
    std::atomic<std::int64_t> next_{0};
};

}  // namespace kvlab
