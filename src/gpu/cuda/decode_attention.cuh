// Cached decode attention on the GPU: one query token per sequence over T cached keys and values,
// GQA-aware (one block serves a KV head's whole group of query heads) and split over T
// (flash-decoding) with a reduce kernel. Two kernels: fp32 multiply-adds on the CUDA cores, and mma.sync
// on the tensor cores for large groups (gpu_attention.hpp, GpuAttentionKernel). K and V contiguous or paged
// (a block table), stored as q's type or as fp8 e4m3 with per-tensor scales. Non-goals: masks.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

#include "kvlab/core/dtype.hpp"
#include "gpu/gpu_attention.hpp"
#include "kvlab/kernels/attention.hpp"

namespace kvlab::cuda {

struct DecodeAttentionArgs {
    const void* q = nullptr;    // (B, H*D)
    const void* k = nullptr;    // (B*T rows, ld_kv); KV head j of row b*T+t at columns j*D .. j*D+D-1; paged:
                                // the pool, (blocks * block_size rows, ld_kv), token t of sequence b in row
                                // block_table[b * n_blocks + t / block_size] * block_size + t % block_size
    const void* v = nullptr;    // same layout as k
    std::int64_t ld_kv = 0;     // elements between consecutive rows of k and v
    const std::int32_t* block_table = nullptr;  // paged: (B, n_blocks) on the device
    std::int64_t n_blocks = 0;  // paged: blocks per sequence, ceil(T / block_size)
    std::int64_t block_size = 0;  // 0: contiguous; else a power of two >= 16
    bool kv_fp8 = false;        // K and V are e4m3 codes (1 byte), value = code * k_scale (v_scale)
    float k_scale = 1.0f;
    float v_scale = 1.0f;
    void* out = nullptr;        // (B, H*D)
    float* partials = nullptr;  // (B, H, n_split, D+2) workspace when n_split > 1
    DType dtype = DType::fp16;  // fp16 or bf16 storage of q and out (and of k, v unless kv_fp8)
    AttentionShape shape;
    std::int64_t n_batch = 0;
    std::int64_t n_tokens = 0;
    int n_split = 1;            // from decode_attention_splits
    bool tensor_cores = false;  // from decode_attention_use_tensor_cores
};

// Whether `requested` runs on the tensor cores for `shape` on the current device: automatic picks them for
// head dim 64 or 128, groups of at least gpu_attention_tensor_min_group query heads, and a device (and a
// module built for it) of compute capability 8.0 or later. Throws UsageError when tensor_cores is asked
// for and cannot run.
bool decode_attention_use_tensor_cores(GpuAttentionKernel requested, const AttentionShape& shape);

// How many pieces to split T into: `wanted` (0: enough blocks to fill `n_sm` multiprocessors a few
// times over), rounded so that every piece holds whole 64-token pieces and none is empty.
int decode_attention_splits(const AttentionShape& shape, std::int64_t n_batch, std::int64_t n_tokens, int n_sm,
                            int wanted, bool tensor_cores);
// Bytes of the workspace `partials` needs.
std::uint64_t decode_attention_workspace_bytes(const AttentionShape& shape, std::int64_t n_batch, int n_split);
// Enqueues the attention (and the reduce when split) on `stream`; throws IoError on a launch error.
void decode_attention_launch(const DecodeAttentionArgs& args, cudaStream_t stream);

}  // namespace kvlab::cuda
