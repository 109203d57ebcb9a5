// Kernels behind decode_attention.cuh. Scores are kept in log2 units (q.k * log2(e)/sqrt(D)) so that
// exp2f does the softmax; products and sums are fp32, storage fp16 or bf16.
#include "decode_attention.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <type_traits>

#include "kvlab/core/error.hpp"

namespace kvlab::cuda {

namespace {

constexpr int kThreads = 256;  // threads per attention block: 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kSplitRows = 64; // a split of T holds a whole number of 64-token pieces
constexpr int kReduceThreads = 128;

struct KernelParams {
    const void* q;
    const void* k;
    const void* v;
    void* out;
    float* partials;          // (B, H, n_split, D+2): D unnormalised sums, their max, their sum of weights
    long long ld_kv;
    long long n_tokens;
    long long split_rows;     // tokens per split (the last may hold fewer)
    int n_head;
    int n_head_kv;
    int d_head;
    int n_split;
    int n_gtile;              // tiles of GT query heads per KV head
    float scale_log2;         // log2(e) / sqrt(D)
};

// 8 values from 16 bytes of storage.
__device__ inline void unpack8(const uint4& raw, float (&f)[8], const __half*) {
    const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 t = __half22float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

__device__ inline void unpack8(const uint4& raw, float (&f)[8], const __nv_bfloat16*) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 t = __bfloat1622float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

// 16 bytes with the cache-streaming hint (__ldcs): K and V are read once per step, so they should not
// push other lines out of L1 and L2.
template <typename T>
__device__ inline uint4 load16(const T* p) {
    return __ldcs(reinterpret_cast<const uint4*>(p));
}

__device__ inline void store(__half* p, float x) { *p = __float2half_rn(x); }
__device__ inline void store(__nv_bfloat16* p, float x) { *p = __float2bfloat16_rn(x); }

// Block (gtile + n_gtile*split, KV head, sequence): GT query heads of one KV head over one split of T.
//
// Every warp is an independent flash-decoding worker: it takes kRows consecutive tokens at a time (warp w
// the w-th, (w+8)-th, ... group of the split), loads their K and V rows together (a group of LANES lanes
// reads one row of the head, 8 values per lane, so a warp reads 32/LANES rows per 16-byte load), and folds
// them into its own running max, sum of weights and p.v sums for each of the GT query heads. Nothing
// synchronises the warps until the split is done, so while one warp computes, the others' loads are in
// flight. Each K and V row is read once for all GT heads (GQA/MQA-aware). At the end the 8 warps' states
// are merged through shared memory, one head at a time.
//
// Tiles of up to 4 heads are held to 128 registers so that two blocks (16 warps) share a multiprocessor,
// which the measured bandwidth rewarded despite a few bytes of spill (docs/cuda-timing.md). 8-head tiles need their registers (capped, they spill), so one block per SM.
template <typename T, int LANES, int GT, int U>
__global__ void __launch_bounds__(kThreads, GT >= 8 ? 1 : 2) decode_attention_kernel(const KernelParams p) {
    constexpr int kGroups = 32 / LANES;  // rows one 16-byte load of the warp covers
    constexpr int kRows = kGroups * U;   // rows a warp takes per step
    constexpr int d_max = 8 * LANES;
    __shared__ float m_s[kWarps][GT];    // each warp's max score (log2 units), per head
    __shared__ float l_s[kWarps][GT];    // each warp's sum of exp2(score - max), per head
    __shared__ float acc_s[kWarps][d_max];  // each warp's p.v sums for the head being merged

    const int tile = blockIdx.x % p.n_gtile;
    const int split = blockIdx.x / p.n_gtile;
    const int kvh = blockIdx.y;
    const int b = blockIdx.z;
    const int n_group = p.n_head / p.n_head_kv;
    const int n_g = min(GT, n_group - tile * GT);
    const int h0 = kvh * n_group + tile * GT;
    const int warp = threadIdx.x / 32;
    const int warp_lane = threadIdx.x % 32;
    const int lane = warp_lane % LANES;  // this lane holds values lane*8 .. lane*8+7 of a row
    const int row = warp_lane / LANES;   // which of the kGroups rows of a load
    const bool lane_on = lane * 8 < p.d_head;

    // This lane's 8 query values of each head, scaled so that q.k comes out in log2 units.
    float q[GT][8];
    const T* q_b = static_cast<const T*>(p.q) + (static_cast<long long>(b) * p.n_head + h0) * p.d_head + lane * 8;
#pragma unroll
    for (int g = 0; g < GT; ++g) {
        float f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (g < n_g && lane_on) unpack8(load16(q_b + g * p.d_head), f, q_b);
#pragma unroll
        for (int i = 0; i < 8; ++i) q[g][i] = f[i] * p.scale_log2;
    }

    float acc[GT][8];  // sum over this lane's rows of p * v (its 8 columns)
    float m[GT];       // running max score of the warp's rows (the same in every lane)
    float l[GT];       // sum over this lane's rows of p = exp2(score - m)
#pragma unroll
    for (int g = 0; g < GT; ++g) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] = 0.0f;
    }

    const long long t_begin = static_cast<long long>(split) * p.split_rows;
    const long long t_end = min(p.n_tokens, t_begin + p.split_rows);
    const long long col = static_cast<long long>(kvh) * p.d_head + lane * 8;
    const T* k_seq = static_cast<const T*>(p.k) + static_cast<long long>(b) * p.n_tokens * p.ld_kv + col;
    const T* v_seq = static_cast<const T*>(p.v) + static_cast<long long>(b) * p.n_tokens * p.ld_kv + col;

    for (long long t0 = t_begin + warp * kRows; t0 < t_end; t0 += kWarps * kRows) {
        // 1. all loads of the step first: U rows of K and of V per lane
        uint4 k_raw[U];
        uint4 v_raw[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const long long t = t0 + u * kGroups + row;
            if (lane_on && t < t_end) {
                k_raw[u] = load16(k_seq + t * p.ld_kv);
                v_raw[u] = load16(v_seq + t * p.ld_kv);
            } else {
                k_raw[u] = make_uint4(0, 0, 0, 0);  // +0 in fp16 and bf16
                v_raw[u] = make_uint4(0, 0, 0, 0);
            }
        }
        // 2. scores s = q.k in log2 units, summed over the LANES lanes of a row; -inf past the split
        float s[GT][U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            float kf[8];
            unpack8(k_raw[u], kf, k_seq);
            const bool valid = t0 + u * kGroups + row < t_end;
#pragma unroll
            for (int g = 0; g < GT; ++g) {
                float d = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; ++i) d += q[g][i] * kf[i];
#pragma unroll
                for (int off = LANES / 2; off > 0; off /= 2) d += __shfl_xor_sync(0xffffffffu, d, off);
                s[g][u] = valid ? d : -INFINITY;
            }
        }
        // 3. online softmax over the warp's kRows rows: new max (row t0 is valid, so it is finite),
        //    weights, and the rescale of the earlier sums
#pragma unroll
        for (int g = 0; g < GT; ++g) {
            float m_step = s[g][0];
#pragma unroll
            for (int u = 1; u < U; ++u) m_step = fmaxf(m_step, s[g][u]);
#pragma unroll
            for (int off = LANES; off < 32; off *= 2) m_step = fmaxf(m_step, __shfl_xor_sync(0xffffffffu, m_step, off));
            const float m_new = fmaxf(m[g], m_step);
            const float alpha = exp2f(m[g] - m_new);  // 0 on the first step (m = -inf)
            m[g] = m_new;
            float sum = 0.0f;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                s[g][u] = exp2f(s[g][u] - m_new);
                sum += s[g][u];
            }
            l[g] = l[g] * alpha + sum;
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[g][i] *= alpha;
        }
        // 4. acc += p * v
#pragma unroll
        for (int u = 0; u < U; ++u) {
            float vf[8];
            unpack8(v_raw[u], vf, v_seq);
#pragma unroll
            for (int g = 0; g < GT; ++g)
#pragma unroll
                for (int i = 0; i < 8; ++i) acc[g][i] += s[g][u] * vf[i];
        }
    }

    // The warp's state: sums over its kGroups row groups (m is already the warp's).
#pragma unroll
    for (int g = 0; g < GT; ++g)
#pragma unroll
        for (int off = LANES; off < 32; off *= 2) {
            l[g] += __shfl_xor_sync(0xffffffffu, l[g], off);
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[g][i] += __shfl_xor_sync(0xffffffffu, acc[g][i], off);
        }
    if (warp_lane == 0)
#pragma unroll
        for (int g = 0; g < GT; ++g) {
            m_s[warp][g] = m[g];
            l_s[warp][g] = l[g];
        }

    // Merge the warps, one head at a time: weights exp2(m_w - M) with M the largest warp max (finite:
    // warp 0 always has rows). A warp without rows has m = -inf, l = 0, sums 0 and weight 0.
#pragma unroll
    for (int g = 0; g < GT; ++g) {
        if (g >= n_g) break;  // the same for the whole block
        if (row == 0 && lane_on)
#pragma unroll
            for (int i = 0; i < 8; ++i) acc_s[warp][lane * 8 + i] = acc[g][i];
        __syncthreads();
        float m_all = -INFINITY;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) m_all = fmaxf(m_all, m_s[w][g]);
        const long long head = static_cast<long long>(b) * p.n_head + h0 + g;
        for (int d = threadIdx.x; d < p.d_head; d += kThreads) {
            float num = 0.0f;
            float den = 0.0f;
#pragma unroll
            for (int w = 0; w < kWarps; ++w) {
                const float weight = exp2f(m_s[w][g] - m_all);
                num += weight * acc_s[w][d];
                den += weight * l_s[w][g];
            }
            if (p.n_split == 1) {
                store(static_cast<T*>(p.out) + head * p.d_head + d, num / den);
            } else {
                float* rec = p.partials + (head * p.n_split + split) * (p.d_head + 2);
                rec[d] = num;
                if (d == 0) {
                    rec[p.d_head] = m_all;
                    rec[p.d_head + 1] = den;
                }
            }
        }
        __syncthreads();  // acc_s is rewritten for the next head
    }
}

// ---- the tensor-core kernel ----
//
// One warp computes S = Q K^T for 16 query heads (rows) and 16 tokens (columns) as two mma.sync m16n8k16
// per 16 dims, then O += P V as one mma per 8 output columns. The PTX ISA fixes which elements of each
// fragment a lane holds (g = lane/4, c = lane%4):
//   A (16x16, row-major): a0 (row g, k 2c, 2c+1), a1 (row g+8, same k), a2 (row g, k 2c+8, 2c+9), a3 (row g+8)
//   B (16x8, by column):  b0 (k 2c, 2c+1 of column g), b1 (k 2c+8, 2c+9 of column g)
//   C (16x8, fp32):       c0, c1 (row g, columns 2c, 2c+1), c2, c3 (row g+8, same columns)
// The sums over k do not depend on the order of k, and the columns of B and C may be any permutation as long
// as both use it, so the roles are laid on the data as 16-byte loads deliver it:
// - q.k: lane (g, c) loads 8 consecutive dims 32i+8c .. 32i+8c+7 of a K row; the first mma of that block of
//   32 dims takes dims +0,1 (k 2c, 2c+1) and +2,3 (k 2c+8, 2c+9), the second +4,5 and +6,7. Q's rows are
//   loaded the same way, so both sides pair the same dims.
// - S's columns: in tile 0, column n is token 4(n/2) + n%2 of the 16; in tile 1, that + 2. So a lane's four
//   scores of a row (c0, c1 of both tiles) are tokens 4c, 4c+1, 4c+2, 4c+3.
// - p.v: P's A fragment is S's C fragments as they stand (k 2c, 2c+1 = tokens 4c, 4c+1; k 2c+8, 2c+9 =
//   tokens 4c+2, 4c+3), so lane (g, c) needs V's rows 4c .. 4c+3, and loads 8 consecutive dims 64i+8g ..
//   64i+8g+7 of each; the j-th of the 8 mmas of that block of 64 dims takes dim 64i+8g+j as its column g,
//   two tokens' values paired by a byte permute. Its output column n is then dim 64i+8n+j.
// Scores are in log2 units; P is rounded to the storage type for the mma and the sum of weights adds the
// rounded values, so numerator and denominator weigh each token alike.

constexpr int kTcThreads = 128;  // 4 warps, each an independent flash-decoding worker over 16-token chunks
constexpr int kTcWarps = kTcThreads / 32;
constexpr int kTcHeads = 16;     // query heads per tile: an mma's 16 rows

// D += A B for one m16n8k16 tile (fp16 or bf16 inputs by T, fp32 sums); compiled for compute capability 8.0+
template <typename T>
__device__ inline void mma_16816(float (&d)[4], std::uint32_t a0, std::uint32_t a1, std::uint32_t a2, std::uint32_t a3,
                                 std::uint32_t b0, std::uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (std::is_same_v<T, __half>)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    __trap();  // not reached: decode_attention_use_tensor_cores refuses modules compiled for less than 8.0
#endif
}

// Two values rounded to T, the first in the low 16 bits (the lower k or column of a fragment register);
// lo_r and hi_r get the rounded values back.
template <typename T>
__device__ inline std::uint32_t pack2(float lo, float hi, float& lo_r, float& hi_r) {
    std::uint32_t bits = 0;
    float2 back;
    if constexpr (std::is_same_v<T, __half>) {
        const __half2 h = __floats2half2_rn(lo, hi);
        back = __half22float2(h);
        bits = *reinterpret_cast<const std::uint32_t*>(&h);
    } else {
        const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        back = __bfloat1622float2(h);
        bits = *reinterpret_cast<const std::uint32_t*>(&h);
    }
    lo_r = back.x;
    hi_r = back.y;
    return bits;
}

// The 32-bit word holding 16-bit element j (0..7) of a 16-byte load.
__device__ inline std::uint32_t word_of(const uint4& x, int j) {
    const int w = j / 2;
    return w == 0 ? x.x : (w == 1 ? x.y : (w == 2 ? x.z : x.w));
}

// ---- K and V staged through shared memory by cp.async ----
//
// A warp cannot compute a chunk before its K and V rows have arrived. Loading them straight into the fragment
// registers made every warp wait for each chunk in turn, and loading the next chunk into registers while
// computing this one cost a block per multiprocessor and was no faster (docs/cuda-timing.md). So the rows go
// to shared memory instead, by cp.async.cg (16 bytes from global to shared memory through L2, no register
// involved), and a warp keeps chunks in flight while it computes, with the registers of the arithmetic only.
//
// The pipeline: every warp is an independent flash-decoding worker over 16-token chunks (t_begin + 16w,
// + 64, ...) and owns a ring of kStages stages, each the 16 K rows and the 16 V rows of one chunk. Before its
// first chunk a warp issues chunks 0 .. kStages-2, one commit group each. At the top of the step for chunk k
// it issues chunk k+kStages-1 into the stage chunk k-1 used (after a __syncwarp: every lane has read that
// stage's fragments), commits, waits until at most kStages-1 groups are outstanding (so chunk k's group is
// done: groups are chunks in order), and passes a second __syncwarp so that every lane sees every other lane's
// copies. A chunk at or past t_end still commits an empty group, so there is one group per chunk to the end.
// While waiting for chunk k, kStages chunks are in flight; while computing it, kStages-1. The stages are the
// warp's own, so no barrier stops the other warps. Rows past t_end are copied with a source size of 0 (16
// zero bytes; the address is the chunk's first row, which is valid, so none past the split is formed).
//
// A lane copies 16-byte unit u of row r (8 values, dims 8u .. 8u+7) for r = lane/(D/8) + (32/(D/8))j, so the
// warp copies whole rows, and reads back the fragments of the layout above: K units 4i+c of rows tk and tk+2,
// V units 8i+g of rows 4c .. 4c+3.
//
// Bank conflicts: a warp's 16-byte shared-memory accesses are served a quarter-warp (8 lanes: g = 2q, 2q+1,
// c = 0..3) at a time, conflict-free when the 8 lanes' addresses fall in the 8 different 16-byte columns
// of a 128-byte line. Rows are D*2 bytes, a multiple of 128, so unpadded every row starts in column 0:
// K's two rows 4q, 4q+1 of a quarter would both take columns c+4i (2-way), V's rows 4c+r would all take
// column g (4-way). Padding rows cannot cure V: its lanes c and c+2 are 8 rows apart, and 8 rows of any
// stride R move by 8R/16 columns = 0 mod 8 when R is a multiple of 16 bytes. So unit u of row r is stored
// in column (u mod 8) XOR f(r), f(r) = 2(r/4) XOR 4(r%2) (a permutation of the row's units within each
// aligned 8 of them):
// - K, rows 4q and 4q+1 (or 4q+2 and 4q+3): f = 2q and 2q^4. Units c+4i (c = 0..3) are an aligned 4 of
//   columns; XOR keeps them an aligned 4, whose half (bit 2) the two rows' f flips apart: 8 columns.
// - V, row 4c+r, unit 8i+g: column g ^ 2c ^ 4(r%2) = 2(q^c) + g%2, XOR 4(r%2): q^c runs over 0..3 as c does,
//   so the 8 lanes take 8 columns.
// The copies write 8 consecutive units of one row per quarter-warp, XOR f(r): 8 columns too.
//
// Shared memory: kStages stages x 16 rows x D*2 bytes x 2 (K, V) x 4 warps = 64 KiB (D 128: 2 stages; D 64: 4),
// so that three blocks share an H100's 228 KiB, as many as the registers allow (96 KiB, 3 stages at D 128 and
// two blocks per SM, timed no faster). At the end a warp writes its p.v sums over its own stages (a row stride
// of D+1 floats: 2-way bank conflicts), so it needs only its own __syncwarp before the block's merge.
constexpr int kTcStagingBytes = 64 * 1024;

template <int D>
struct TcLayout {
    static constexpr int kRowBytes = 2 * D;                   // one K or V row (fp16 and bf16 are 2 bytes)
    static constexpr int kHalfStageBytes = 16 * kRowBytes;    // a chunk's 16 K rows (V's follow)
    static constexpr int kStageBytes = 2 * kHalfStageBytes;
    static constexpr int kStages = kTcStagingBytes / (kTcWarps * kStageBytes);
    static constexpr int kWarpBytes = kStages * kStageBytes;  // one warp's ring
    static constexpr int kSmemBytes = kTcWarps * kWarpBytes;  // dynamic shared memory per block
    static constexpr int kOStride = D + 1;                    // floats per row of a warp's p.v sums at the end
    // Blocks per SM on sm_90's 228 KiB (1 KiB reserved per block, 512 bytes of m_s and l_s), at most 3 (168
    // registers); the launch bound then caps the registers on every architecture, though an A100 (164 KiB)
    // fits 2 blocks and sm_86/89 (100 KiB) 1: slower there, not wrong.
    static constexpr int kFit = 228 * 1024 / (kSmemBytes + 1024 + 512);
    static constexpr int kMinBlocks = kFit < 3 ? kFit : 3;
    static constexpr int kUnits = D / 8;         // 16-byte units per row
    static constexpr int kCopyRows = 32 / kUnits;  // rows one pass of the warp's copies covers
    static_assert(kStages >= 2, "kTcStagingBytes too small for two stages");
    static_assert(kTcHeads * kOStride * 4 <= kWarpBytes, "a warp's p.v sums must fit in its stages");
    static_assert(kMinBlocks >= 1, "kTcStagingBytes too large for a multiprocessor");
};

// Column XOR of row r of a stage (see above).
__device__ __host__ constexpr int tc_swizzle(int r) { return ((r >> 2) << 1) ^ ((r & 1) << 2); }

// 16 bytes from global to shared memory, L2 only; src_bytes 0 writes 16 zero bytes (and reads nothing).
__device__ inline void cp_async16(void* smem_dst, const void* gmem_src, int src_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(src_bytes) : "memory");
#else
    __trap();  // not reached: decode_attention_use_tensor_cores refuses modules compiled for less than 8.0
#endif
}

__device__ inline void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Wait until at most N of this thread's commit groups are outstanding.
template <int N>
__device__ inline void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Block (tile + n_gtile*split, KV head, sequence): 16 query heads of one KV head over one split of T, with
// TcLayout<D>::kSmemBytes of dynamic shared memory.
template <typename T, int D>
__global__ void __launch_bounds__(kTcThreads, TcLayout<D>::kMinBlocks)
    decode_attention_tc_kernel(const KernelParams p) {
    using L = TcLayout<D>;
    static_assert(sizeof(T) == 2, "16-bit storage");
    constexpr int kKBlocks = D / 32;  // a lane's 16-byte pieces of a K row (dims 32i+8c .. +7)
    constexpr int kVBlocks = D / 64;  // a lane's 16-byte pieces of a V row (dims 64i+8g .. +7)
    constexpr int R = L::kRowBytes;
    constexpr int kStages = L::kStages;
    extern __shared__ __align__(16) unsigned char stage_s[];  // [warp][stage][K 16 rows, V 16 rows], swizzled
    __shared__ float m_s[kTcWarps][kTcHeads];
    __shared__ float l_s[kTcWarps][kTcHeads];

    const int tile = blockIdx.x % p.n_gtile;
    const int split = blockIdx.x / p.n_gtile;
    const int kvh = blockIdx.y;
    const int b = blockIdx.z;
    const int n_group = p.n_head / p.n_head_kv;
    const int n_g = min(kTcHeads, n_group - tile * kTcHeads);  // heads of this tile; rows past it are zero
    const int h0 = kvh * n_group + tile * kTcHeads;
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int g = lane / 4;  // fragment row group
    const int c = lane % 4;  // lane within the group
    unsigned char* const ring = stage_s + warp * L::kWarpBytes;

    // Q fragments: heads g and g+8 of the tile, dims 32i+8c .. +7.
    const uint4 zero = make_uint4(0, 0, 0, 0);  // +0 in fp16 and bf16
    uint4 qa[kKBlocks];
    uint4 qb[kKBlocks];
    const T* q_t = static_cast<const T*>(p.q) + (static_cast<long long>(b) * p.n_head + h0) * D + 8 * c;
#pragma unroll
    for (int i = 0; i < kKBlocks; ++i) {
        qa[i] = g < n_g ? load16(q_t + g * D + 32 * i) : zero;
        qb[i] = g + 8 < n_g ? load16(q_t + (g + 8) * D + 32 * i) : zero;
    }

    float o[D / 8][4];  // O's C fragments: tile 8i+j holds dims 64i+8(2c)+j, 64i+8(2c+1)+j of rows g, g+8
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY;  // running max of rows g and g+8 (the same in the 4 lanes of a group)
    float l0 = 0.0f, l1 = 0.0f;            // this lane's share of the sums of weights

    const long long t_begin = static_cast<long long>(split) * p.split_rows;
    const long long t_end = min(p.n_tokens, t_begin + p.split_rows);
    const long long seq = static_cast<long long>(b) * p.n_tokens * p.ld_kv + static_cast<long long>(kvh) * D;

    // This lane's copies: unit cu of rows cr + kCopyRows*j of a chunk, to the same place in every stage.
    const int cr = lane / L::kUnits;
    const int cu = lane % L::kUnits;
    const T* const k_lane = static_cast<const T*>(p.k) + seq + 8 * cu;
    const T* const v_lane = static_cast<const T*>(p.v) + seq + 8 * cu;
    // Issues chunk t0's K and V rows (rows at or past t_end as zeros) into one stage; commits nothing.
    const auto issue = [&](long long t0, unsigned char* stage) {
        const long long rows_valid = t_end - t0;  // >= 1
#pragma unroll
        for (int j = 0; j < 16 / L::kCopyRows; ++j) {
            const int r = cr + L::kCopyRows * j;
            const bool ok = r < rows_valid;
            const long long src = (t0 + (ok ? r : 0)) * p.ld_kv;
            const int dst = r * R + 16 * (cu ^ tc_swizzle(r));
            cp_async16(stage + dst, k_lane + src, ok ? 16 : 0);
            cp_async16(stage + L::kHalfStageBytes + dst, v_lane + src, ok ? 16 : 0);
        }
    };

    // This lane's fragment reads in a stage, by the swizzle (unit u of row r at r*R + 16*(u ^ tc_swizzle(r))):
    // K row rk (tile 1: rk + 2, the same swizzle), unit 4i+c = 4(i ^ kb) + (c ^ (sk & 3)) with kb = bit 2 of sk:
    // k_off[i % 2] + 64 (i - i % 2); V row 4c+r, unit 8i+g at v_off[r % 2] + r R + 128 i.
    const int rk = 4 * (g / 2) + g % 2;
    const int sk = tc_swizzle(rk);
    const int kb = (sk >> 2) & 1;
    const int k_off[2] = {rk * R + 16 * (4 * kb + (c ^ (sk & 3))), rk * R + 16 * (4 * (kb ^ 1) + (c ^ (sk & 3)))};
    const int v_off[2] = {4 * c * R + 16 * (g ^ (2 * c)), 4 * c * R + 16 * (g ^ (2 * c) ^ 4)};

    const long long t_first = t_begin + warp * 16;
    constexpr long long kStep = kTcWarps * 16;
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        const long long t0 = t_first + s * kStep;
        if (t0 < t_end) issue(t0, ring + s * L::kStageBytes);
        cp_async_commit();
    }
    int stage = 0;          // chunk k's stage
    int fill = kStages - 1; // chunk k+kStages-1's stage: chunk k-1's
    for (long long t0 = t_first; t0 < t_end; t0 += kStep) {
        // 1. refill the stage chunk k-1 used, then wait for chunk k (one commit group per chunk, in order)
        __syncwarp();  // every lane has read chunk k-1's fragments
        const long long t_next = t0 + (kStages - 1) * kStep;
        if (t_next < t_end) issue(t_next, ring + fill * L::kStageBytes);
        cp_async_commit();
        cp_async_wait<kStages - 1>();
        __syncwarp();  // every lane's copies of chunk k are visible to the warp
        const unsigned char* const ks = ring + stage * L::kStageBytes;
        const unsigned char* const vs = ks + L::kHalfStageBytes;
        stage = stage + 1 == kStages ? 0 : stage + 1;
        fill = fill + 1 == kStages ? 0 : fill + 1;

        // 2. S = Q K^T, tile 0 (s0) and tile 1 (s1); K's fragments from the stage
        uint4 k0[kKBlocks];
        uint4 k1[kKBlocks];
#pragma unroll
        for (int i = 0; i < kKBlocks; ++i) {
            k0[i] = *reinterpret_cast<const uint4*>(ks + k_off[i % 2] + 64 * (i - i % 2));
            k1[i] = *reinterpret_cast<const uint4*>(ks + k_off[i % 2] + 64 * (i - i % 2) + 2 * R);
        }
        float s0[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        float s1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < kKBlocks; ++i) {
            mma_16816<T>(s0, qa[i].x, qb[i].x, qa[i].y, qb[i].y, k0[i].x, k0[i].y);
            mma_16816<T>(s1, qa[i].x, qb[i].x, qa[i].y, qb[i].y, k1[i].x, k1[i].y);
            mma_16816<T>(s0, qa[i].z, qb[i].z, qa[i].w, qb[i].w, k0[i].z, k0[i].w);
            mma_16816<T>(s1, qa[i].z, qb[i].z, qa[i].w, qb[i].w, k1[i].z, k1[i].w);
        }
        // 3. online softmax: this lane's scores of tokens 4c+r, rows g (x0) and g+8 (x1); -inf past the split
        float x0[4] = {s0[0], s0[1], s1[0], s1[1]};
        float x1[4] = {s0[2], s0[3], s1[2], s1[3]};
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const bool valid = t0 + 4 * c + r < t_end;
            x0[r] = valid ? x0[r] * p.scale_log2 : -INFINITY;
            x1[r] = valid ? x1[r] * p.scale_log2 : -INFINITY;
            mx0 = fmaxf(mx0, x0[r]);
            mx1 = fmaxf(mx1, x1[r]);
        }
#pragma unroll
        for (int off = 1; off < 4; off *= 2) {  // the row's max over the group's 4 lanes (token t0 is valid)
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
        }
        const float m0_new = fmaxf(m0, mx0);
        const float m1_new = fmaxf(m1, mx1);
        const float alpha0 = exp2f(m0 - m0_new);  // 0 on the first chunk (m = -inf)
        const float alpha1 = exp2f(m1 - m1_new);
        m0 = m0_new;
        m1 = m1_new;
        float p0[4];
        float p1[4];
        const std::uint32_t pa0 = pack2<T>(exp2f(x0[0] - m0), exp2f(x0[1] - m0), p0[0], p0[1]);  // row g, k 2c, 2c+1
        const std::uint32_t pa1 = pack2<T>(exp2f(x1[0] - m1), exp2f(x1[1] - m1), p1[0], p1[1]);  // row g+8
        const std::uint32_t pa2 = pack2<T>(exp2f(x0[2] - m0), exp2f(x0[3] - m0), p0[2], p0[3]);  // row g, k 2c+8, 2c+9
        const std::uint32_t pa3 = pack2<T>(exp2f(x1[2] - m1), exp2f(x1[3] - m1), p1[2], p1[3]);  // row g+8
        l0 = l0 * alpha0 + (p0[0] + p0[1]) + (p0[2] + p0[3]);
        l1 = l1 * alpha1 + (p1[0] + p1[1]) + (p1[2] + p1[3]);
        // 4. O = alpha O + P V; V's fragments (rows 4c .. 4c+3, dims 64i+8g .. +7) from the stage
#pragma unroll
        for (int i = 0; i < kVBlocks; ++i) {
            uint4 v[4];
#pragma unroll
            for (int r = 0; r < 4; ++r) v[r] = *reinterpret_cast<const uint4*>(vs + v_off[r % 2] + r * R + 128 * i);
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                float (&acc)[4] = o[8 * i + j];
                acc[0] *= alpha0;
                acc[1] *= alpha0;
                acc[2] *= alpha1;
                acc[3] *= alpha1;
                const unsigned sel = j % 2 == 0 ? 0x5410u : 0x7632u;  // element j of tokens 4c, 4c+1 (and +2, +3)
                const std::uint32_t b0 = __byte_perm(word_of(v[0], j), word_of(v[1], j), sel);
                const std::uint32_t b1 = __byte_perm(word_of(v[2], j), word_of(v[3], j), sel);
                mma_16816<T>(acc, pa0, pa1, pa2, pa3, b0, b1);
            }
        }
    }
    // Chunks at or past t_end committed empty groups; the rest were waited for. Nothing is outstanding, but
    // the ring is about to be overwritten, so say so.
    cp_async_wait<0>();
    __syncwarp();  // every lane has read the last chunk's fragments

    // The warp's state to shared memory: sums of weights over the group's 4 lanes, O by its column map
    // (over the warp's own ring, rows of D+1 floats).
#pragma unroll
    for (int off = 1; off < 4; off *= 2) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, off);
        l1 += __shfl_xor_sync(0xffffffffu, l1, off);
    }
    if (c == 0) {
        m_s[warp][g] = m0;
        m_s[warp][g + 8] = m1;
        l_s[warp][g] = l0;
        l_s[warp][g + 8] = l1;
    }
    float* const o_w = reinterpret_cast<float*>(ring);
#pragma unroll
    for (int i = 0; i < kVBlocks; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int d = 64 * i + 8 * (2 * c + e) + j;
                o_w[g * L::kOStride + d] = o[8 * i + j][e];
                o_w[(g + 8) * L::kOStride + d] = o[8 * i + j][2 + e];
            }
    __syncthreads();

    // Merge the warps, weights exp2(m_w - M) (M finite: warp 0 always has tokens; a warp without has m = -inf).
    for (int idx = threadIdx.x; idx < n_g * D; idx += kTcThreads) {
        const int row = idx / D;
        const int d = idx % D;
        float m_all = -INFINITY;
#pragma unroll
        for (int w = 0; w < kTcWarps; ++w) m_all = fmaxf(m_all, m_s[w][row]);
        float num = 0.0f;
        float den = 0.0f;
#pragma unroll
        for (int w = 0; w < kTcWarps; ++w) {
            const float weight = exp2f(m_s[w][row] - m_all);
            num += weight * reinterpret_cast<const float*>(stage_s + w * L::kWarpBytes)[row * L::kOStride + d];
            den += weight * l_s[w][row];
        }
        const long long head = static_cast<long long>(b) * p.n_head + h0 + row;
        if (p.n_split == 1) {
            store(static_cast<T*>(p.out) + head * D + d, num / den);
        } else {
            float* rec = p.partials + (head * p.n_split + split) * (D + 2);
            rec[d] = num;
            if (d == 0) {
                rec[D] = m_all;
                rec[D + 1] = den;
            }
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
    for (int s = 0; s < n_split; ++s) m = fmaxf(m, rec[static_cast<long long>(s) * n_rec + d_head]);
    for (int d = threadIdx.x; d < d_head; d += kReduceThreads) {
        float num = 0.0f;
        float den = 0.0f;
        for (int s = 0; s < n_split; ++s) {
            const float* r = rec + static_cast<long long>(s) * n_rec;
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

long long n_pieces_for(std::int64_t n_tokens) { return (n_tokens + kSplitRows - 1) / kSplitRows; }

// Rows per lane per step: 4 (8 loads of 16 bytes in flight per lane; 2 rows were slower and 8 rows do
// not fit two blocks per SM); 2 for 8-head tiles, whose q and sums already take 128 registers.
template <typename T, int LANES, int GT>
void launch_tile(const KernelParams& kp, dim3 grid, cudaStream_t stream) {
    constexpr int kU = GT >= 8 ? 2 : 4;
    decode_attention_kernel<T, LANES, GT, kU><<<grid, kThreads, 0, stream>>>(kp);
}

template <typename T, int LANES>
void launch_lanes(const KernelParams& kp, dim3 grid, int gt, cudaStream_t stream) {
    switch (gt) {
        case 1: launch_tile<T, LANES, 1>(kp, grid, stream); break;
        case 2: launch_tile<T, LANES, 2>(kp, grid, stream); break;
        case 4: launch_tile<T, LANES, 4>(kp, grid, stream); break;
        default: launch_tile<T, LANES, 8>(kp, grid, stream); break;
    }
}

// The tensor-core kernel takes more than the 48 KiB of dynamic shared memory a launch gets without asking, and
// as much of the L1/shared split as shared memory as it can (its K and V copies bypass L1). The attributes
// belong to the current device's context: they are set again whenever the device differs from the one they
// were last set for (kvlab uses one device, so once per instantiation), not before every launch, which would
// put two driver calls inside each timed step.
template <typename T, int D>
void launch_tc(const KernelParams& kp, dim3 grid, cudaStream_t stream) {
    constexpr int kBytes = TcLayout<D>::kSmemBytes;
    const auto kernel = decode_attention_tc_kernel<T, D>;
    static std::atomic<int> set_for{-1};  // the device the attributes were set for
    int device = 0;
    if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess)
        throw IoError(std::string("CUDA decode attention: cudaGetDevice failed: ") + cudaGetErrorString(e));
    if (set_for.load(std::memory_order_acquire) != device) {
        if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes); e != cudaSuccess)
            throw IoError("CUDA decode attention: " + std::to_string(kBytes) + " bytes of dynamic shared memory per block refused: " +
                          cudaGetErrorString(e));
        if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
            e != cudaSuccess)
            throw IoError(std::string("CUDA decode attention: the shared-memory carveout was refused: ") + cudaGetErrorString(e));
        set_for.store(device, std::memory_order_release);
    }
    kernel<<<grid, kTcThreads, kBytes, stream>>>(kp);
}

template <typename T>
void launch_typed(const DecodeAttentionArgs& a, const KernelParams& kp, dim3 grid, int gt, cudaStream_t stream) {
    if (a.tensor_cores) {
        if (a.shape.d_head == 64)
            launch_tc<T, 64>(kp, grid, stream);
        else
            launch_tc<T, 128>(kp, grid, stream);
    } else {
        switch (lanes_for(a.shape.d_head)) {
            case 8: launch_lanes<T, 8>(kp, grid, gt, stream); break;
            case 16: launch_lanes<T, 16>(kp, grid, gt, stream); break;
            default: launch_lanes<T, 32>(kp, grid, gt, stream); break;
        }
    }
    if (a.n_split > 1)
        decode_attention_reduce_kernel<T><<<dim3(static_cast<unsigned>(a.shape.n_head), static_cast<unsigned>(a.n_batch)),
                                             kReduceThreads, 0, stream>>>(
            a.partials, static_cast<T*>(a.out), static_cast<int>(a.shape.n_head), static_cast<int>(a.shape.d_head),
            a.n_split);
}

}  // namespace

bool decode_attention_use_tensor_cores(GpuAttentionKernel requested, const AttentionShape& shape) {
    if (requested == GpuAttentionKernel::cuda_cores) return false;
    const bool shape_ok = shape.d_head == 64 || shape.d_head == 128;
    // The device, and the code this module holds for it: the kernel's mma.sync exists only where it was compiled
    // for a virtual architecture of 8.0 or later, which ptxVersion gives (binaryVersion gives the device's own
    // architecture when the driver compiles older PTX for it, so it cannot tell an sm_75 build on an H100).
    int device = 0;
    int cc_major = 0;
    int cc_minor = 0;
    cudaFuncAttributes attr{};
    const bool queried = cudaGetDevice(&device) == cudaSuccess &&
                         cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
                         cudaDeviceGetAttribute(&cc_minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess &&
                         cudaFuncGetAttributes(&attr, decode_attention_tc_kernel<__half, 128>) == cudaSuccess;
    (void)cudaGetLastError();
    const bool device_ok = queried && cc_major >= 8 && attr.ptxVersion >= 80;
    if (requested == GpuAttentionKernel::automatic)
        return shape_ok && device_ok && shape.n_head / shape.n_head_kv >= gpu_attention_tensor_min_group;
    if (!shape_ok)
        throw UsageError("--kernel tensor-cores: head dim " + std::to_string(shape.d_head) + " is not supported; expected 64 or 128");
    if (!queried)
        throw UsageError("--kernel tensor-cores: the device's compute capability or the kernel's attributes could not be "
                         "read; use --kernel cuda-cores");
    if (cc_major < 8)
        throw UsageError("--kernel tensor-cores: the device's compute capability is " + std::to_string(cc_major) + "." +
                         std::to_string(cc_minor) + "; the kernel's mma.sync.m16n8k16 needs 8.0 or later (use --kernel cuda-cores)");
    if (!device_ok)
        throw UsageError("--kernel tensor-cores: this CUDA module was compiled for compute capability " +
                         std::to_string(attr.ptxVersion / 10) + "." + std::to_string(attr.ptxVersion % 10) +
                         ", without the kernel's mma.sync (8.0 or later): rebuild with CMAKE_CUDA_ARCHITECTURES including " +
                         std::to_string(cc_major) + std::to_string(cc_minor) + ", or use --kernel cuda-cores");
    return true;
}

int decode_attention_splits(const AttentionShape& shape, std::int64_t n_batch, std::int64_t n_tokens, int n_sm,
                            int wanted, bool tensor_cores) {
    if (n_tokens < 1 || n_batch < 1 || shape.n_head_kv < 1 || shape.n_head < shape.n_head_kv)
        throw IoError("decode attention: context " + std::to_string(n_tokens) + ", batch " + std::to_string(n_batch) +
                      ": expected at least one token, one sequence and a KV head per query group");
    const long long n_pieces = n_pieces_for(n_tokens);
    long long want = wanted;
    if (want <= 0) {
        // Enough blocks for about eight resident 256-thread blocks per multiprocessor.
        // (the tensor-core kernel's blocks are 128 threads, so twice as many of them)
        const long long n_group = shape.n_head / shape.n_head_kv;
        const long long tile = tensor_cores ? kTcHeads : gtile_for(n_group);
        const long long n_gtile = (n_group + tile - 1) / tile;
        const long long base = static_cast<long long>(n_batch) * shape.n_head_kv * n_gtile;
        const long long target = (tensor_cores ? 16LL : 8LL) * std::max(n_sm, 1);
        want = (target + base - 1) / base;
    }
    want = std::clamp(want, 1LL, n_pieces);
    const long long pieces_per_split = (n_pieces + want - 1) / want;
    return static_cast<int>((n_pieces + pieces_per_split - 1) / pieces_per_split);  // no empty split
}

std::uint64_t decode_attention_workspace_bytes(const AttentionShape& shape, std::int64_t n_batch, int n_split) {
    if (n_split <= 1) return 0;
    return static_cast<std::uint64_t>(n_batch) * static_cast<std::uint64_t>(shape.n_head) *
           static_cast<std::uint64_t>(n_split) * (static_cast<std::uint64_t>(shape.d_head) + 2) * sizeof(float);
}

void decode_attention_launch(const DecodeAttentionArgs& a, cudaStream_t stream) {
    const long long n_pieces = n_pieces_for(a.n_tokens);
    const long long pieces_per_split = a.n_split < 1 ? 0 : (n_pieces + a.n_split - 1) / a.n_split;
    if (a.n_split < 1 || (a.n_split - 1) * pieces_per_split >= n_pieces)
        throw IoError("decode attention: split count " + std::to_string(a.n_split) + " leaves a split of " +
                      std::to_string(a.n_tokens) + " tokens empty; use decode_attention_splits");
    // The kernel reads 16 bytes (8 values) at a time: every row and head must start on a 16-byte boundary.
    const auto aligned = [](const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; };
    if (!aligned(a.q) || !aligned(a.k) || !aligned(a.v) || !aligned(a.out) || a.ld_kv % 8 != 0 || a.shape.d_head % 8 != 0)
        throw IoError("decode attention: q, K, V and out must be 16-byte aligned, with row strides and the head dim "
                      "multiples of 8 values");
    if (a.tensor_cores && a.shape.d_head != 64 && a.shape.d_head != 128)
        throw IoError("decode attention: the tensor-core kernel takes head dim 64 or 128, not " +
                      std::to_string(a.shape.d_head));
    const long long n_group = a.shape.n_head / a.shape.n_head_kv;
    const int gt = a.tensor_cores ? kTcHeads : gtile_for(n_group);
    const long long n_gtile = (n_group + gt - 1) / gt;
    if (n_gtile * a.n_split > 0x7fffffffLL)
        throw IoError("decode attention: " + std::to_string(n_gtile) + " head tiles x " + std::to_string(a.n_split) +
                      " splits exceed the grid's 2^31-1 blocks");
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
    kp.split_rows = pieces_per_split * kSplitRows;
    kp.n_gtile = static_cast<int>(n_gtile);
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
