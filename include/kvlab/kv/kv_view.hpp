// KvView: where one layer's K and V rows of one sequence live, and in what format. It is what attention
// writes a new token's key and value to and reads the attended keys and values from, whoever holds the
// rows: the single-sequence cache (KvCache::view), a serving pool's blocks (KvAllocator::rows says which,
// KvPool fills in its matrices), or the current layer's activations (uncached mode: nothing is kept).
#pragma once
#include <cstdint>
#include <limits>
#include <span>

#include "kvlab/core/matrix.hpp"

namespace kvlab {

class KvRowStore;  // kv/kv_cache.hpp: a narrow cache's encoded rows

// The row of a layer's cache holding position `pos`: pos itself while it fits, then a ring over the rows
// after the first n_sink (StreamingLLM's sinks stay put): n_sink + (pos - n_sink) mod (n_rows - n_sink).
inline std::int64_t kv_ring_row(std::int64_t pos, std::int64_t n_rows, std::int64_t n_sink) {
    return pos < n_rows ? pos : n_sink + (pos - n_sink) % (n_rows - n_sink);
}

struct KvView {
    // What the rows are, for the cost model: the KV cache (cached mode) or activations (uncached mode).
    enum class Place { cache, activations };
    Place place = Place::cache;
    // The rows, each Hkv*D values: fp32 matrices, or a narrow cache's encoded rows (k and v null then).
    MatrixRM* k = nullptr;
    MatrixRM* v = nullptr;
    KvRowStore* k_store = nullptr;
    KvRowStore* v_store = nullptr;
    std::uint64_t row_bytes = 0;  // bytes of one stored row (0: fp32)
    // Which row holds position p (row_of): a cache keeps p in row p while it fits, then a ring over its
    // rows after the first n_sink (a window; StreamingLLM's sinks stay put); activations hold p in row p.
    std::int64_t n_rows = std::numeric_limits<std::int64_t>::max();
    std::int64_t n_sink = 0;
    // Paged (a serving pool): the sequence's row r is k's row block_rows[r / block_size] + r % block_size,
    // and no chunk of rows attention reads crosses a block. Empty: row r. A contiguous reservation is one
    // block of its size.
    std::span<const std::int64_t> block_rows;
    std::int64_t block_size = 0;

    // The matrix (or store) row holding the sequence's row r.
    std::int64_t pool_row(std::int64_t r) const {
        return block_rows.empty() ? r : block_rows[static_cast<std::size_t>(r / block_size)] + r % block_size;
    }
    // The sequence's row holding position pos, then its matrix row.
    std::int64_t row_of(std::int64_t pos) const {
        if (place == Place::activations) return pos;
        return pool_row(kv_ring_row(pos, n_rows, n_sink));
    }
};

}  // namespace kvlab
