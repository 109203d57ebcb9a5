// Attention for one query position over T stored positions: softmax(q K^T / sqrt(D)) V per head.
// attention_head is the forward pass's (Eigen, one head per call, so threads can take heads);
// attention_decode_ref is the same math in plain loops, the reference tests and the CUDA path's
// correctness check hold the fast versions to.
#pragma once
#include <cstdint>

namespace kvlab {

struct AttentionShape {
    std::int64_t n_head = 0;     // H query heads
    std::int64_t n_head_kv = 0;  // Hkv KV heads; query head h reads KV head h / (H / Hkv)
    std::int64_t d_head = 0;     // D
};

// Query head h: q (H*D) for one position; k, v (T, Hkv*D) row-major, rows 0..T-1 the attended keys
// (head h reads KV head h / (H / Hkv)); writes out[h*D .. h*D+D-1]; scores (T) scratch. fp32.
void attention_head(const AttentionShape& shape, std::int64_t h, const float* q, const float* k, const float* v,
                    std::int64_t n_tokens, float* out, float* scores);

// Every head, plain loops: q (H*D) for one position; k, v (T, Hkv*D) row-major, rows 0..T-1 are the attended keys;
// out (H*D); scores (T) scratch. softmax(q k^T / sqrt(D)) v, per head, in fp32.
void attention_decode_ref(const AttentionShape& shape, const float* q, const float* k, const float* v,
                          std::int64_t n_tokens, float* out, float* scores);

}  // namespace kvlab
