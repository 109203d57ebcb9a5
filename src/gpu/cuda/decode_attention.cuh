// Cached decode attention on the GPU: one query token per sequence over T cached keys and values,
// GQA-aware (one block serves a KV head's whole group of query heads) and split over T
// (flash-decoding) with a reduce kernel. Non-goals: paged caches, masks, fp8 storage.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

#include "model/attention.hpp"
#include "core/dtype.hpp"

namespace kvlab::cuda {

struct DecodeAttentionArgs {
    const void* q = nullptr;    // (B, H*D)
    const void* k = nullptr;    // (B*T rows, ld_kv); KV head j of row b*T+t at columns j*D .. j*D+D-1
    const void* v = nullptr;    // same layout as k
    std::int64_t ld_kv = 0;     // elements between consecutive rows of k and v
    void* out = nullptr;        // (B, H*D)
    float* partials = nullptr;  // (B, H, n_split, D+2) workspace when n_split > 1
    DType dtype = DType::fp16;  // fp16 or bf16 storage of q, k, v, out
    AttentionShape shape;
    std::int64_t n_batch = 0;
    std::int64_t n_tokens = 0;
    int n_split = 1;            // from decode_attention_splits
};

// How many pieces to split T into: `wanted` (0: enough blocks to fill `n_sm` multiprocessors a few
// times over), rounded so that every piece holds whole 64-token pieces and none is empty.
int decode_attention_splits(const AttentionShape& shape, std::int64_t n_batch, std::int64_t n_tokens, int n_sm,
                            int wanted);
// Bytes of the workspace `partials` needs.
std::uint64_t decode_attention_workspace_bytes(const AttentionShape& shape, std::int64_t n_batch, int n_split);
// Enqueues the attention (and the reduce when split) on `stream`; throws IoError on a launch error.
void decode_attention_launch(const DecodeAttentionArgs& args, cudaStream_t stream);

}  // namespace kvlab::cuda
