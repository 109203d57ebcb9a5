// The CUDA-core decode attention kernel: q.k and p.v as fp32 multiply-adds. Scores are kept in log2 units
// (q.k * log2(e)/sqrt(D)) so that exp2f does the softmax.
//
// Block (gtile + n_gtile*split, KV head, sequence): GT query heads of one KV head over one split of T.
//
// Every warp is an independent flash-decoding worker: it takes kRows consecutive tokens at a time (warp w
// the w-th, (w+8)-th, ... group of the split), loads their K and V rows together (a group of LANES lanes
// reads one row of the head, 8 values per lane, so a warp reads 32/LANES rows per load), and folds them
// into its own running max, sum of weights and p.v sums for each of the GT query heads. Nothing
// synchronises the warps until the split is done, so while one warp computes, the others' loads are in
// flight. Each K and V row is read once for all GT heads (GQA/MQA-aware). At the end the 8 warps' states
// are merged through shared memory, one head at a time.
//
// Tiles of up to 4 heads are held to 128 registers so that two blocks (16 warps) share a multiprocessor,
// which the measured bandwidth rewarded despite a few bytes of spill (docs/cuda-timing.md). 8-head tiles
// need their registers (capped, they spill), so one block per SM.
//
// K and V are fp16/bf16 (16-byte loads of 8 values) or fp8 e4m3 (8-byte loads of 8 codes, widened in
// registers; K's scale is folded into q's, V's applied to the sums at the end). Contiguous or paged
// (KvRows: a block-table lookup per row).
#include "decode_attention_device.cuh"

#include <cmath>

namespace kvlab::cuda {

namespace {

constexpr int kThreads = 256;  // threads per attention block: 8 warps
constexpr int kWarps = kThreads / 32;

// Where this thread sits in its block.
template <int LANES, int GT>
struct CcPlace {
    int split, kvh, b, n_g, h0, warp, warp_lane, lane, row;
    bool lane_on;  // lane * 8 < D: this lane holds values lane*8 .. lane*8+7 of a row
};

template <int LANES, int GT>
__device__ __forceinline__ CcPlace<LANES, GT> cc_place(const KernelParams& p) {
    CcPlace<LANES, GT> at;
    const int tile = blockIdx.x % p.n_gtile;
    at.split = blockIdx.x / p.n_gtile;
    at.kvh = blockIdx.y;
    at.b = blockIdx.z;
    const int n_group = p.n_head / p.n_head_kv;
    at.n_g = min(GT, n_group - tile * GT);
    at.h0 = at.kvh * n_group + tile * GT;
    at.warp = threadIdx.x / 32;
    at.warp_lane = threadIdx.x % 32;
    at.lane = at.warp_lane % LANES;
    at.row = at.warp_lane / LANES;  // which of the 32/LANES rows of a load
    at.lane_on = at.lane * 8 < p.d_head;
    return at;
}

// A warp's flash-decoding state for GT heads: this lane's 8 query values of each head (scaled so that q.k
// comes out in log2 units), its p.v sums, the running max (the same in every lane) and its sum of weights.
template <int GT>
struct CcState {
    float q[GT][8];
    float acc[GT][8];
    float m[GT];
    float l[GT];
};

template <typename T, int LANES, int GT>
__device__ __forceinline__ void cc_init(const KernelParams& p, const CcPlace<LANES, GT>& at, CcState<GT>& st) {
    const T* q_b = static_cast<const T*>(p.q) + (static_cast<long long>(at.b) * p.n_head + at.h0) * p.d_head + at.lane * 8;
#pragma unroll
    for (int g = 0; g < GT; ++g) {
        float f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (g < at.n_g && at.lane_on) unpack8(load16(q_b + g * p.d_head), f, q_b);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            st.q[g][i] = f[i] * p.scale_log2;
            st.acc[g][i] = 0.0f;
        }
        st.m[g] = -INFINITY;
        st.l[g] = 0.0f;
    }
}

// 1. All loads of one step first: U rows of K and of V per lane (zeros past the split: +0 in every format).
template <typename S, bool PAGED, int U, int kGroups>
__device__ __forceinline__ void cc_load(const typename S::Value* k_seq, const typename S::Value* v_seq,
                                        const KvRows<PAGED>& rows, long long t0, long long t_end, int row, bool lane_on,
                                        typename S::Raw8 (&k_raw)[U], typename S::Raw8 (&v_raw)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const long long t = t0 + u * kGroups + row;
        if (lane_on && t < t_end) {
            const long long off = rows.offset(t);
            if constexpr (S::kValueBytes == 1) {
                k_raw[u] = load8(k_seq + off);
                v_raw[u] = load8(v_seq + off);
            } else {
                k_raw[u] = load16(k_seq + off);
                v_raw[u] = load16(v_seq + off);
            }
        } else {
            k_raw[u] = {};
            v_raw[u] = {};
        }
    }
}

// 2. Scores s = q.k in log2 units, summed over the LANES lanes of a row; -inf past the split.
template <typename S, int LANES, int GT, int U, int kGroups>
__device__ __forceinline__ void cc_scores(const CcState<GT>& st, const typename S::Raw8 (&k_raw)[U], long long t0,
                                          long long t_end, int row, float (&s)[GT][U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        float kf[8];
        unpack8(k_raw[u], kf, static_cast<const typename S::Value*>(nullptr));
        const bool valid = t0 + u * kGroups + row < t_end;
#pragma unroll
        for (int g = 0; g < GT; ++g) {
            float d = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; ++i) d += st.q[g][i] * kf[i];
#pragma unroll
            for (int off = LANES / 2; off > 0; off /= 2) d += __shfl_xor_sync(0xffffffffu, d, off);
            s[g][u] = valid ? d : -INFINITY;
        }
    }
}

// 3. Online softmax over the warp's rows: new max (row t0 is valid, so it is finite), weights (into s), and
// the rescale of the earlier sums. 4. acc += p * v.
template <typename S, int LANES, int GT, int U>
__device__ __forceinline__ void cc_fold(CcState<GT>& st, float (&s)[GT][U], const typename S::Raw8 (&v_raw)[U]) {
#pragma unroll
    for (int g = 0; g < GT; ++g) {
        float m_step = s[g][0];
#pragma unroll
        for (int u = 1; u < U; ++u) m_step = fmaxf(m_step, s[g][u]);
#pragma unroll
        for (int off = LANES; off < 32; off *= 2) m_step = fmaxf(m_step, __shfl_xor_sync(0xffffffffu, m_step, off));
        const float m_new = fmaxf(st.m[g], m_step);
        const float alpha = exp2f(st.m[g] - m_new);  // 0 on the first step (m = -inf)
        st.m[g] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int u = 0; u < U; ++u) {
            s[g][u] = exp2f(s[g][u] - m_new);
            sum += s[g][u];
        }
        st.l[g] = st.l[g] * alpha + sum;
#pragma unroll
        for (int i = 0; i < 8; ++i) st.acc[g][i] *= alpha;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
        float vf[8];
        unpack8(v_raw[u], vf, static_cast<const typename S::Value*>(nullptr));
#pragma unroll
        for (int g = 0; g < GT; ++g)
#pragma unroll
            for (int i = 0; i < 8; ++i) st.acc[g][i] += s[g][u] * vf[i];
    }
}

// The warp's state: sums over its row groups (m is already the warp's); lane 0 publishes m and l.
template <int LANES, int GT>
__device__ __forceinline__ void cc_warp_sums(CcState<GT>& st, int warp, int warp_lane, float (&m_s)[kWarps][GT],
                                             float (&l_s)[kWarps][GT]) {
#pragma unroll
    for (int g = 0; g < GT; ++g)
#pragma unroll
        for (int off = LANES; off < 32; off *= 2) {
            st.l[g] += __shfl_xor_sync(0xffffffffu, st.l[g], off);
#pragma unroll
            for (int i = 0; i < 8; ++i) st.acc[g][i] += __shfl_xor_sync(0xffffffffu, st.acc[g][i], off);
        }
    if (warp_lane == 0)
#pragma unroll
        for (int g = 0; g < GT; ++g) {
            m_s[warp][g] = st.m[g];
            l_s[warp][g] = st.l[g];
        }
}

// Merge the warps, one head at a time: weights exp2(m_w - M) with M the largest warp max (finite: warp 0
// always has rows). A warp without rows has m = -inf, l = 0, sums 0 and weight 0. V's scale multiplies the sums.
template <typename T, int LANES, int GT, int kDMax>
__device__ __forceinline__ void cc_merge(const KernelParams& p, const CcPlace<LANES, GT>& at, const CcState<GT>& st,
                                         const float (&m_s)[kWarps][GT], const float (&l_s)[kWarps][GT],
                                         float (&acc_s)[kWarps][kDMax]) {
#pragma unroll
    for (int g = 0; g < GT; ++g) {
        if (g >= at.n_g) break;  // the same for the whole block
        if (at.row == 0 && at.lane_on)
#pragma unroll
            for (int i = 0; i < 8; ++i) acc_s[at.warp][at.lane * 8 + i] = st.acc[g][i];
        __syncthreads();
        float m_all = -INFINITY;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) m_all = fmaxf(m_all, m_s[w][g]);
        const long long head = static_cast<long long>(at.b) * p.n_head + at.h0 + g;
        for (int d = threadIdx.x; d < p.d_head; d += kThreads) {
            float num = 0.0f;
            float den = 0.0f;
#pragma unroll
            for (int w = 0; w < kWarps; ++w) {
                const float weight = exp2f(m_s[w][g] - m_all);
                num += weight * acc_s[w][d];
                den += weight * l_s[w][g];
            }
            write_result<T>(p, head, at.split, d, num * p.v_scale, den, m_all);
        }
        __syncthreads();  // acc_s is rewritten for the next head
    }
}

template <typename T, bool FP8, bool PAGED, int LANES, int GT, int U>
__global__ void __launch_bounds__(kThreads, GT >= 8 ? 1 : 2) decode_attention_kernel(const KernelParams p) {
    using S = KvStore<T, FP8>;
    constexpr int kGroups = 32 / LANES;  // rows one load of the warp covers
    constexpr int kRows = kGroups * U;   // rows a warp takes per step
    __shared__ float m_s[kWarps][GT];    // each warp's max score (log2 units), per head
    __shared__ float l_s[kWarps][GT];    // each warp's sum of exp2(score - max), per head
    __shared__ float acc_s[kWarps][8 * LANES];  // each warp's p.v sums for the head being merged

    const CcPlace<LANES, GT> at = cc_place<LANES, GT>(p);
    CcState<GT> st;
    cc_init<T>(p, at, st);

    const long long t_begin = static_cast<long long>(at.split) * p.split_rows;
    const long long t_end = min(p.n_tokens, t_begin + p.split_rows);
    long long seq = 0;
    const KvRows<PAGED> rows = kv_rows<PAGED>(p, at.b, seq);
    const long long col = seq + static_cast<long long>(at.kvh) * p.d_head + at.lane * 8;
    const auto* k_seq = static_cast<const typename S::Value*>(p.k) + col;
    const auto* v_seq = static_cast<const typename S::Value*>(p.v) + col;

    for (long long t0 = t_begin + at.warp * kRows; t0 < t_end; t0 += kWarps * kRows) {
        typename S::Raw8 k_raw[U];
        typename S::Raw8 v_raw[U];
        cc_load<S, PAGED, U, kGroups>(k_seq, v_seq, rows, t0, t_end, at.row, at.lane_on, k_raw, v_raw);
        float s[GT][U];
        cc_scores<S, LANES, GT, U, kGroups>(st, k_raw, t0, t_end, at.row, s);
        cc_fold<S, LANES, GT, U>(st, s, v_raw);
    }
    cc_warp_sums<LANES, GT>(st, at.warp, at.warp_lane, m_s, l_s);
    cc_merge<T, LANES, GT>(p, at, st, m_s, l_s, acc_s);
}

// Rows per lane per step: 4 (8 loads in flight per lane; 2 rows were slower and 8 rows do not fit two
// blocks per SM); 2 for 8-head tiles, whose q and sums already take 128 registers.
template <typename T, bool FP8, bool PAGED, int LANES>
void launch_lanes(const KernelParams& kp, dim3 grid, int gt, cudaStream_t stream) {
    switch (gt) {
        case 1: decode_attention_kernel<T, FP8, PAGED, LANES, 1, 4><<<grid, kThreads, 0, stream>>>(kp); break;
        case 2: decode_attention_kernel<T, FP8, PAGED, LANES, 2, 4><<<grid, kThreads, 0, stream>>>(kp); break;
        case 4: decode_attention_kernel<T, FP8, PAGED, LANES, 4, 4><<<grid, kThreads, 0, stream>>>(kp); break;
        default: decode_attention_kernel<T, FP8, PAGED, LANES, 8, 2><<<grid, kThreads, 0, stream>>>(kp); break;
    }
}

template <typename T, bool FP8, bool PAGED>
void launch_storage(const KernelParams& kp, int lanes, int gt, dim3 grid, cudaStream_t stream) {
    switch (lanes) {
        case 8: launch_lanes<T, FP8, PAGED, 8>(kp, grid, gt, stream); break;
        case 16: launch_lanes<T, FP8, PAGED, 16>(kp, grid, gt, stream); break;
        default: launch_lanes<T, FP8, PAGED, 32>(kp, grid, gt, stream); break;
    }
}

template <typename T>
void launch_typed(const KernelParams& kp, bool fp8, bool paged, int lanes, int gt, dim3 grid, cudaStream_t stream) {
    if (fp8) {
        if (paged) launch_storage<T, true, true>(kp, lanes, gt, grid, stream);
        else launch_storage<T, true, false>(kp, lanes, gt, grid, stream);
    } else {
        if (paged) launch_storage<T, false, true>(kp, lanes, gt, grid, stream);
        else launch_storage<T, false, false>(kp, lanes, gt, grid, stream);
    }
}

}  // namespace

void launch_cuda_cores(const KernelParams& kp, bool bf16, bool fp8, bool paged, int lanes, int gt, dim3 grid,
                       cudaStream_t stream) {
    if (bf16) launch_typed<__nv_bfloat16>(kp, fp8, paged, lanes, gt, grid, stream);
    else launch_typed<__half>(kp, fp8, paged, lanes, gt, grid, stream);
}

}  // namespace kvlab::cuda
