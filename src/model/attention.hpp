// Reference decode attention on the CPU: one query position attends to T cached positions.
// The simulator's attention and the CUDA path's correctness check both use it.
#pragma once
#include <cstdint>

namespace kvlab {

struct AttentionShape {
    std::int64_t n_head = 0;     // H query heads
    std::int64_t n_head_kv = 0;  // Hkv KV heads; query head h reads KV head h / (H / Hkv)
    std::int64_t d_head = 0;     // D
};

// q (H*D) for one position; k, v (T, Hkv*D) row-major, rows 0..T-1 are the attended keys;
// out (H*D); scores (T) scratch. softmax(q k^T / sqrt(D)) v, per head, in fp32.
void attention_decode_ref(const AttentionShape& shape, const float* q, const float* k, const float* v,
                          std::int64_t n_tokens, float* out, float* scores);

}  // namespace kvlab
