// Attention for one query position over T stored positions: softmax(q K^T / sqrt(D)) V per head.
// attention_heads is the forward pass's: a range of query heads in one call, a chunk of rows at a time,
// so each key and value is read (and, from a narrow cache, decoded) once for the heads that share it and
// a row's slice of the call's KV heads is read in one run of memory;
// attention_decode_ref is the same math in plain loops, which the tests and the CUDA path's
// correctness check hold the fast version to.
#pragma once
#include <cstdint>

namespace kvlab {

struct KvView;  // kv/kv_view.hpp (not included: the CUDA module reads this header without Eigen)

struct AttentionShape {
    std::int64_t n_head = 0;     // H query heads
    std::int64_t n_head_kv = 0;  // Hkv KV heads; query head h reads KV head h / (H / Hkv)
    std::int64_t d_head = 0;     // D
};

// Floats of scratch one attention_heads call needs for up to n_keys keys: the scores of every query
// head, and one KV head's decoded chunk of rows; then H*D more for a query rotated for the sinks (ops.hpp).
std::int64_t attention_scratch_floats(const AttentionShape& shape, std::int64_t n_keys);

// Query heads h0..h0+nh-1 (any contiguous range: part of a group, whole groups, or both): q (H*D) for
// one position; the sequence's rows r0..r0+T-1 of kv are the attended keys and values (fp32 rows read in
// place, a narrow cache's decoded a chunk at a time); writes out[h*D .. h*D+D-1] for those heads. fp32
// arithmetic; a head's numbers do not depend on which heads share its call.
// q_sink (H*D), when given, scores the first n_sink_rows rows instead of q (StreamingLLM's sinks scored at
// their positions in the cache: ops.hpp, attention).
void attention_heads(const AttentionShape& shape, std::int64_t h0, std::int64_t nh, const float* q, const KvView& kv,
                     std::int64_t r0, std::int64_t n_tokens, float* out, float* scratch, const float* q_sink = nullptr,
                     std::int64_t n_sink_rows = 0);

// Every head, plain loops: q (H*D) for one position; k, v (T, Hkv*D) row-major, rows 0..T-1 are the attended keys;
// out (H*D); scores (T) scratch. softmax(q k^T / sqrt(D)) v, per head, in fp32.
void attention_decode_ref(const AttentionShape& shape, const float* q, const float* k, const float* v,
                          std::int64_t n_tokens, float* out, float* scores);

}  // namespace kvlab
