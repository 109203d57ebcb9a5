// The forward pass's two matmul kernels, y = x W^T for row-major weights W (out, in), written so that
// reading the weights from memory overlaps the arithmetic instead of preceding it.
//
// - gemv_rows, one token (decode): memory-bound. A core's DRAM bandwidth is bounded by how many
//   cache-line misses it keeps in flight, and the hardware prefetchers keep more in flight when several
//   sequential streams are read at once: on the 2-core development VM one thread reading one stream gets
//   ~8 GB/s, eight interleaved streams ~12 GB/s (docs/performance.md). So the rows are split into
//   kGemvStreams contiguous sub-blocks and one row of each is computed per iteration.
// - gemm_rows, a few tokens (prefill, uncached steps): compute-bound once the weights are in cache, but
//   a general GEMM (Eigen's) first copies ("packs") each weight block, a pass that waits on memory with
//   no arithmetic to hide it. Here the tokens are packed instead (x^T, a few KiB to a few MiB, cache
//   resident) and the weights are read in place, a few rows side by side, each weight broadcast against
//   a register of tokens: the weight streams are consumed at a few GB/s per core while the FMAs run.
#pragma once
#include <cstdint>

namespace kvlab {

inline constexpr int kGemvStreams = 8;  // concurrent row streams per gemv_rows call

// y[i] = sum_j w[i*ldw + j] * x[j] for rows i in [0, rows): w (rows, cols) row-major with row stride
// ldw, x (cols), y (rows). fp32 sums, one accumulator per row, in SIMD-width chunks of x then the tail.
void gemv_rows(const float* w, std::int64_t ldw, std::int64_t rows, std::int64_t cols, const float* x, float* y);

// Tokens per tile of gemm_rows: four SIMD registers of tokens (64 with AVX-512, 32 with AVX).
std::int64_t gemm_tile_tokens();
// Floats of scratch gemm_rows needs for `cols` input features and up to n_max tokens per call: the
// packed tile x^T (cols, tokens of the widest tile, rounded up to whole SIMD registers).
std::int64_t gemm_scratch_floats(std::int64_t cols, std::int64_t n_max);

// out[t*ldo + i] = sum_j x[t*ldx + j] * w[i*ldw + j] for tokens t in [0, n), rows i in [0, rows):
// x (n, cols) row-major (stride ldx), w (rows, cols) row-major (stride ldw), out (n, rows) row-major
// (stride ldo). fp32 sums over j in order, one accumulator per output. `scratch`:
// gemm_scratch_floats(cols, n_max >= n) floats, aligned as Eigen aligns its allocations (the build's
// SIMD width).
void gemm_rows(const float* w, std::int64_t ldw, std::int64_t rows, std::int64_t cols, const float* x, std::int64_t ldx,
               std::int64_t n, float* out, std::int64_t ldo, float* scratch);

}  // namespace kvlab
