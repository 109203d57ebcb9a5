// The forward pass's matmul kernels, out = x W^T for row-major weights W (out, in), written so that
// reading the weights overlaps the arithmetic: gemv_rows for one token (memory-bound), gemm_rows for a
// few (compute-bound once the weights are in cache). docs/performance.md explains both designs.
// Non-goals: a general BLAS; both compute one thread's block of rows, the caller splits the rows.
#pragma once
#include <cstdint>

namespace kvlab {

// Row streams gemv_rows reads side by side per thread. A core keeps more cache misses in flight over
// several sequential streams than over one, but how many pays differs by part: 8 on the Intel Xeon
// measured, 4 on AMD (Zen 4 measured; on Zen 3 one stream out-read eight), docs/performance.md, "The
// decode GEMV". gemv_streams() is this CPU's, picked once by vendor; the stream count never changes a
// result (each row's sum runs in the same order), only the speed.
inline constexpr int gemv_stream_choices[] = {4, 8};
int gemv_streams();

// y[i] = sum_j w[i*ldw + j] * x[j] for rows i in [0, rows): w (rows, cols) row-major with row stride
// ldw, x (cols), y (rows). fp32 sums, one accumulator per row, in SIMD-width chunks of x then the tail.
// Rows that start off a SIMD boundary, all by the same amount (ldw and cols whole SIMD widths; a llama2.c
// checkpoint read in place), are read in aligned chunks from the boundary before each row: their sums
// run in another order, so they differ from the same rows' aligned sums by rounding. Those chunks read
// up to a SIMD width before the first row and after the last, inside the same cache lines; their values
// never reach y. `streams`: one of gemv_stream_choices (else Error).
void gemv_rows(const float* w, std::int64_t ldw, std::int64_t rows, std::int64_t cols, const float* x, float* y,
               int streams = gemv_streams());

// Tokens per tile of gemm_rows: four SIMD registers of tokens (64 with AVX-512, 32 with AVX).
std::int64_t gemm_tile_tokens();
// Floats of scratch gemm_rows needs for `cols` input features and up to n_max tokens per call: the
// packed tiles x^T of up to four tiles (cols, tokens rounded up to whole SIMD registers) each.
std::int64_t gemm_scratch_floats(std::int64_t cols, std::int64_t n_max);

// out[t*ldo + i] = sum_j x[t*ldx + j] * w[i*ldw + j] for tokens t in [0, n), rows i in [0, rows):
// x (n, cols) row-major (stride ldx), w (rows, cols) row-major (stride ldw), out (n, rows) row-major
// (stride ldo). fp32 sums over j in order, one accumulator per output. `scratch`:
// gemm_scratch_floats(cols, n_max >= n) floats. Up to 4 tokens run GEMV-style, each weight loaded once for all
// of them (a token's outputs then equal a gemv_rows call's bit for bit, for rows on a SIMD boundary); more,
// as packed tiles.
void gemm_rows(const float* w, std::int64_t ldw, std::int64_t rows, std::int64_t cols, const float* x, std::int64_t ldx,
               std::int64_t n, float* out, std::int64_t ldo, float* scratch);

}  // namespace kvlab
