// Kernels behind decode_attention.cuh. Scores are kept in log2 units (q.k * log2(e)/sqrt(D)) so that
// exp2f does the softmax; products and sums are fp32, storage fp16 or bf16.
#include "decode_attention.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.hpp"

namespace kvlab::cuda {

namespace {

constexpr int kThreads = 256;  // threads per attention block: 8 warps
constexpr int kChunk = 256;    // tokens scored per pass; their scores stay in shared memory
constexpr int kUnroll = 4;     // 16-byte loads each thread issues before using the first
constexpr int kReduceThreads = 128;

struct KernelParams {
    const void* q;
    const void* k;
    const void* v;
    void* out;
    float* partials;          // (B, H, n_split, D+2): D unnormalised sums, running max, running sum
    long long ld_kv;
    long long n_tokens;
    int n_head;
    int n_head_kv;
    int d_head;
    int n_split;
    int chunks_per_split;
    int n_gtile;              // tiles of GT query heads per KV head
    float scale_log2;         // log2(e) / sqrt(D)
};

__device__ inline void load8(const __half* p, float (&f)[8]) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 t = __half22float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

__device__ inline void load8(const __nv_bfloat16* p, float (&f)[8]) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 t = __bfloat1622float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

__device__ inline float to_float(__half x) { return __half2float(x); }
__device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline void store(__half* p, float x) { *p = __float2half_rn(x); }
__device__ inline void store(__nv_bfloat16* p, float x) { *p = __float2bfloat16_rn(x); }

// Block (gtile + n_gtile*split, KV head, sequence): GT query heads of one KV head over one split of T.
// A group of LANES lanes reads one K or V row of the head (8 values per lane), so each row is read once
// for all GT heads.
template <typename T, int LANES, int GT>
__global__ void __launch_bounds__(kThreads) decode_attention_kernel(const KernelParams p) {
    static_assert(GT <= kThreads / 32, "the softmax gives each query head of a tile one warp");
    constexpr int n_groups = kThreads / LANES;
    constexpr int d_max = 8 * LANES;
    __shared__ float q_s[GT][d_max];    // the tile's queries
    __shared__ float p_s[GT][kChunk];   // scores, then probabilities, of the current chunk
    __shared__ float acc_s[GT][d_max];  // the block's sum of p.v
    __shared__ float m_s[GT];           // running max score (log2 units)
    __shared__ float l_s[GT];           // running sum of exp2(score - max)
    __shared__ float alpha_s[GT];       // rescale of earlier sums when the max grows

    const int tile = blockIdx.x % p.n_gtile;
    const int split = blockIdx.x / p.n_gtile;
    const int kvh = blockIdx.y;
    const int b = blockIdx.z;
    const int n_group = p.n_head / p.n_head_kv;
    const int n_g = min(GT, n_group - tile * GT);
    const int h0 = kvh * n_group + tile * GT;
    const int lane = threadIdx.x % LANES;
    const int grp = threadIdx.x / LANES;
    const bool lane_on = lane * 8 < p.d_head;

    const T* q = static_cast<const T*>(p.q) + (static_cast<long long>(b) * p.n_head + h0) * p.d_head;
    for (int i = threadIdx.x; i < GT * d_max; i += kThreads) {
        const int g = i / d_max;
        const int d = i % d_max;
        q_s[g][d] = (g < n_g && d < p.d_head) ? to_float(q[g * p.d_head + d]) : 0.0f;
        acc_s[g][d] = 0.0f;
    }
    if (threadIdx.x < GT) {
        m_s[threadIdx.x] = -INFINITY;
        l_s[threadIdx.x] = 0.0f;
        alpha_s[threadIdx.x] = 1.0f;
    }
    __syncthreads();

    const long long t_begin = static_cast<long long>(split) * p.chunks_per_split * kChunk;
    const long long t_end = min(p.n_tokens, t_begin + static_cast<long long>(p.chunks_per_split) * kChunk);
    const long long col = static_cast<long long>(kvh) * p.d_head + lane * 8;
    const T* k_seq = static_cast<const T*>(p.k) + static_cast<long long>(b) * p.n_tokens * p.ld_kv + col;
    const T* v_seq = static_cast<const T*>(p.v) + static_cast<long long>(b) * p.n_tokens * p.ld_kv + col;
    const int warp = threadIdx.x / 32;
    const int warp_lane = threadIdx.x % 32;

    float acc[GT][8];  // this thread's share of p.v: its 8 columns, its tokens
#pragma unroll
    for (int g = 0; g < GT; ++g)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] = 0.0f;

    for (long long c0 = t_begin; c0 < t_end; c0 += kChunk) {
        const int n_c = static_cast<int>(min(static_cast<long long>(kChunk), t_end - c0));

        // 1. scores: p_s[g][t] = q_g . k_t * log2(e)/sqrt(D); loop bounds are warp-uniform for the shuffles
        for (int tb = 0; tb < n_c; tb += n_groups * kUnroll) {
            float kf[kUnroll][8];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int t = tb + u * n_groups + grp;
                if (lane_on && t < n_c) {
                    load8(k_seq + (c0 + t) * p.ld_kv, kf[u]);
                } else {
#pragma unroll
                    for (int i = 0; i < 8; ++i) kf[u][i] = 0.0f;
                }
            }
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int t = tb + u * n_groups + grp;
#pragma unroll
                for (int g = 0; g < GT; ++g) {
                    if (g < n_g) {
                        float s = 0.0f;
#pragma unroll
                        for (int i = 0; i < 8; ++i) s += q_s[g][lane * 8 + i] * kf[u][i];
#pragma unroll
                        for (int off = LANES / 2; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
                        if (lane == 0 && t < n_c) p_s[g][t] = s * p.scale_log2;
                    }
                }
            }
        }
        __syncthreads();

        // 2. online softmax, one warp per query head: new max, probabilities, rescale factor
        if (warp < n_g) {
            const float m_old = m_s[warp];
            float c_max = -INFINITY;
            for (int t = warp_lane; t < n_c; t += 32) c_max = fmaxf(c_max, p_s[warp][t]);
#pragma unroll
            for (int off = 16; off > 0; off /= 2) c_max = fmaxf(c_max, __shfl_xor_sync(0xffffffffu, c_max, off));
            const float m_new = fmaxf(m_old, c_max);
            float sum = 0.0f;
            for (int t = warp_lane; t < n_c; t += 32) {
                const float e = exp2f(p_s[warp][t] - m_new);
                p_s[warp][t] = e;
                sum += e;
            }
#pragma unroll
            for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
            if (warp_lane == 0) {
                const float alpha = exp2f(m_old - m_new);  // 0 on the first chunk (m_old = -inf)
                alpha_s[warp] = alpha;
                l_s[warp] = l_s[warp] * alpha + sum;
                m_s[warp] = m_new;
            }
        }
        __syncthreads();

        // 3. acc = acc * alpha + sum_t p[g][t] v_t
#pragma unroll
        for (int g = 0; g < GT; ++g) {
            const float alpha = alpha_s[g];
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[g][i] *= alpha;
        }
        for (int tb = 0; tb < n_c; tb += n_groups * kUnroll) {
            float vf[kUnroll][8];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int t = tb + u * n_groups + grp;
                if (lane_on && t < n_c) {
                    load8(v_seq + (c0 + t) * p.ld_kv, vf[u]);
                } else {
#pragma unroll
                    for (int i = 0; i < 8; ++i) vf[u][i] = 0.0f;
                }
            }
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int t = tb + u * n_groups + grp;
                if (t < n_c) {
#pragma unroll
                    for (int g = 0; g < GT; ++g) {
                        if (g < n_g) {
                            const float pg = p_s[g][t];
#pragma unroll
                            for (int i = 0; i < 8; ++i) acc[g][i] += pg * vf[u][i];
                        }
                    }
                }
            }
        }
        __syncthreads();  // the next chunk overwrites p_s
    }

    // Sum the token groups' shares, then write the output or this split's partial record.
    if (lane_on) {
#pragma unroll
        for (int g = 0; g < GT; ++g)
            if (g < n_g)
#pragma unroll
                for (int i = 0; i < 8; ++i) atomicAdd(&acc_s[g][lane * 8 + i], acc[g][i]);
    }
    __syncthreads();
    if (p.n_split == 1) {
        T* out = static_cast<T*>(p.out) + (static_cast<long long>(b) * p.n_head + h0) * p.d_head;
        for (int i = threadIdx.x; i < n_g * p.d_head; i += kThreads) {
            const int g = i / p.d_head;
            store(out + i, acc_s[g][i % p.d_head] / l_s[g]);
        }
    } else {
        const int n_rec = p.d_head + 2;
        for (int i = threadIdx.x; i < n_g * n_rec; i += kThreads) {
            const int g = i / n_rec;
            const int d = i % n_rec;
            const float value = d < p.d_head ? acc_s[g][d] : (d == p.d_head ? m_s[g] : l_s[g]);
            p.partials[((static_cast<long long>(b) * p.n_head + h0 + g) * p.n_split + split) * n_rec + d] = value;
        }
    }
}

// Block (query head, sequence): merges the splits' records, each weighted by exp2(its max - overall max).
template <typename T>
__global__ void __launch_bounds__(kReduceThreads)
    decode_attention_reduce_kernel(const float* partials, T* out, int n_head, int d_head, int n_split) {
    const int h = blockIdx.x;
    const int b = blockIdx.y;
    const int n_rec = d_head + 2;
    const float* rec = partials + (static_cast<long long>(b) * n_head + h) * n_split * n_rec;
    float m = -INFINITY;
    for (int s = 0; s < n_split; ++s) m = fmaxf(m, rec[s * n_rec + d_head]);
    for (int d = threadIdx.x; d < d_head; d += kReduceThreads) {
        float num = 0.0f;
        float den = 0.0f;
        for (int s = 0; s < n_split; ++s) {
            const float* r = rec + s * n_rec;
            const float w = exp2f(r[d_head] - m);
            num += w * r[d];
            den += w * r[d_head + 1];
        }
        store(out + (static_cast<long long>(b) * n_head + h) * d_head + d, num / den);
    }
}

int lanes_for(std::int64_t d_head) {
    const std::int64_t need = (d_head + 7) / 8;
    return need <= 8 ? 8 : (need <= 16 ? 16 : 32);
}

int gtile_for(std::int64_t n_group) {
    const std::int64_t g = std::min<std::int64_t>(n_group, 8);
    return g <= 1 ? 1 : (g <= 2 ? 2 : (g <= 4 ? 4 : 8));
}

long long n_chunks_for(std::int64_t n_tokens) { return (n_tokens + kChunk - 1) / kChunk; }

template <typename T, int LANES>
void launch_lanes(const KernelParams& kp, dim3 grid, int gt, cudaStream_t stream) {
    switch (gt) {
        case 1: decode_attention_kernel<T, LANES, 1><<<grid, kThreads, 0, stream>>>(kp); break;
        case 2: decode_attention_kernel<T, LANES, 2><<<grid, kThreads, 0, stream>>>(kp); break;
        case 4: decode_attention_kernel<T, LANES, 4><<<grid, kThreads, 0, stream>>>(kp); break;
        default: decode_attention_kernel<T, LANES, 8><<<grid, kThreads, 0, stream>>>(kp); break;
    }
}

template <typename T>
void launch_typed(const DecodeAttentionArgs& a, const KernelParams& kp, dim3 grid, int gt, cudaStream_t stream) {
    switch (lanes_for(a.shape.d_head)) {
        case 8: launch_lanes<T, 8>(kp, grid, gt, stream); break;
        case 16: launch_lanes<T, 16>(kp, grid, gt, stream); break;
        default: launch_lanes<T, 32>(kp, grid, gt, stream); break;
    }
    if (a.n_split > 1)
        decode_attention_reduce_kernel<T><<<dim3(static_cast<unsigned>(a.shape.n_head), static_cast<unsigned>(a.n_batch)),
                                             kReduceThreads, 0, stream>>>(
            a.partials, static_cast<T*>(a.out), static_cast<int>(a.shape.n_head), static_cast<int>(a.shape.d_head),
            a.n_split);
}

}  // namespace

int decode_attention_splits(const AttentionShape& shape, std::int64_t n_batch, std::int64_t n_tokens, int n_sm,
                            int wanted) {
    const long long n_chunks = n_chunks_for(n_tokens);
    long long want = wanted;
    if (want <= 0) {
        // Enough blocks for about eight resident 256-thread blocks per multiprocessor.
        const long long n_group = shape.n_head / shape.n_head_kv;
        const long long n_gtile = (n_group + gtile_for(n_group) - 1) / gtile_for(n_group);
        const long long base = static_cast<long long>(n_batch) * shape.n_head_kv * n_gtile;
        const long long target = 8LL * std::max(n_sm, 1);
        want = (target + base - 1) / base;
    }
    want = std::clamp(want, 1LL, n_chunks);
    const long long chunks_per_split = (n_chunks + want - 1) / want;
    return static_cast<int>((n_chunks + chunks_per_split - 1) / chunks_per_split);  // no empty split
}

std::uint64_t decode_attention_workspace_bytes(const AttentionShape& shape, std::int64_t n_batch, int n_split) {
    if (n_split <= 1) return 0;
    return static_cast<std::uint64_t>(n_batch) * static_cast<std::uint64_t>(shape.n_head) *
           static_cast<std::uint64_t>(n_split) * (static_cast<std::uint64_t>(shape.d_head) + 2) * sizeof(float);
}

void decode_attention_launch(const DecodeAttentionArgs& a, cudaStream_t stream) {
    const long long n_chunks = n_chunks_for(a.n_tokens);
    const long long chunks_per_split = (n_chunks + a.n_split - 1) / a.n_split;
    if (a.n_split < 1 || (a.n_split - 1) * chunks_per_split >= n_chunks)
        throw IoError("decode attention: split count " + std::to_string(a.n_split) + " leaves a split of " +
                      std::to_string(a.n_tokens) + " tokens empty; use decode_attention_splits");
    const long long n_group = a.shape.n_head / a.shape.n_head_kv;
    const int gt = gtile_for(n_group);
    KernelParams kp{};
    kp.q = a.q;
    kp.k = a.k;
    kp.v = a.v;
    kp.out = a.out;
    kp.partials = a.partials;
    kp.ld_kv = a.ld_kv;
    kp.n_tokens = a.n_tokens;
    kp.n_head = static_cast<int>(a.shape.n_head);
    kp.n_head_kv = static_cast<int>(a.shape.n_head_kv);
    kp.d_head = static_cast<int>(a.shape.d_head);
    kp.n_split = a.n_split;
    kp.chunks_per_split = static_cast<int>(chunks_per_split);
    kp.n_gtile = static_cast<int>((n_group + gt - 1) / gt);
    kp.scale_log2 = static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(a.shape.d_head)));
    const dim3 grid(static_cast<unsigned>(kp.n_gtile) * static_cast<unsigned>(a.n_split),
                    static_cast<unsigned>(a.shape.n_head_kv), static_cast<unsigned>(a.n_batch));
    if (a.dtype == DType::bf16)
        launch_typed<__nv_bfloat16>(a, kp, grid, gt, stream);
    else
        launch_typed<__half>(a, kp, grid, gt, stream);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) throw IoError(std::string("CUDA decode attention launch failed: ") + cudaGetErrorString(e));
}

}  // namespace kvlab::cuda
