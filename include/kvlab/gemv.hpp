// Matrix-vector product for one decode token: y = W x over a range of W's rows, written to read the
// weights at the memory system's speed rather than at one stream's.
//
// A core's DRAM bandwidth is bounded by how many cache-line misses it keeps in flight, and the hardware
// prefetchers keep more in flight when several sequential streams are read at once: on the 2-core
// development VM one thread reading one stream gets ~8 GB/s, reading eight interleaved streams ~12 GB/s
// (docs/performance.md). gemv_rows therefore splits its rows into kGemvStreams contiguous sub-blocks
// and computes one row of each per iteration, so eight rows far apart are read together.
#pragma once
#include <cstdint>

namespace kvlab {

inline constexpr int kGemvStreams = 8;  // concurrent row streams per call

// y[i] = sum_j w[i*ld + j] * x[j] for rows i in [0, rows): w (rows, cols) row-major with row stride ld,
// x (cols), y (rows). fp32 sums, one accumulator per row, in packet-sized chunks of x then the tail.
void gemv_rows(const float* w, std::int64_t ld, std::int64_t rows, std::int64_t cols, const float* x, float* y);

}  // namespace kvlab
