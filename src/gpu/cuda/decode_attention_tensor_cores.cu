// The tensor-core decode attention kernel: q.K^T and P.V as mma.sync m16n8k16 on 16-head tiles, K and V
// staged through shared memory by cp.async. Scores are kept in log2 units (q.k * log2(e)/sqrt(D)) so that
// exp2f does the softmax; products and sums are fp32, q and out fp16 or bf16.
//
// K and V are stored as q's type, or as fp8 e4m3 codes (one byte a value): the copies to shared memory move
// the stored bytes, and a lane widens its 8 codes of a fragment to 8 values of q's type after its shared
// load (exact: every e4m3 value is an fp16 and a bf16 value), so the mma is the same. K's scale is folded
// into the score scale and V's into the sums at the end. Paged caches are read through the block table,
// one lookup per 16-token chunk (a chunk never straddles a block: blocks hold a multiple of 16 tokens).
#include "decode_attention_device.cuh"

#include <atomic>
#include <cmath>
#include <string>
#include <type_traits>

#include "kvlab/core/error.hpp"

namespace kvlab::cuda {

namespace {

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
//
// fp8 rows are D bytes: a 16-byte unit holds 16 values, and a lane reads its 8 values of a fragment with one
// 8-byte shared load (K: dims 32i+8c, unit 2i + c/2, half c%2; V: dims 64i+8g, unit 4i + g/2, half g%2).
// 8-byte loads are served a half-warp (16 lanes) at a time, conflict-free when the 16 lanes cover the 32
// banks. The same swizzle does it at D 128 (8 units a row, a row per 128-byte line): K's rows 0, 1, 4, 5 of a
// half-warp read units 2i, 2i+1 (32 bytes), XOR f = 0, 4, 2, 6, i.e. the four 32-byte quarters of the line;
// V's rows 4c+r read units 4i + {0, 1} XOR 2c ^ 4(r%2): pair 2i ^ c ^ 2(r%2), four quarters as c runs. At
// D 64 (4 units a row, two rows a line) the swizzle is taken mod 4 (f & 3 = 2((r/4) % 2)): K stays
// conflict-free, V's four rows of a half-warp share a line half, 2-way conflicts.
constexpr int kTcStagingBytes = 64 * 1024;

template <int D, int VB>
struct TcLayout {
    static constexpr int kD = D;
    static constexpr int kRowBytes = VB * D;                  // one K or V row (VB bytes a value)
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
    static constexpr int kUnits = kRowBytes / 16;  // 16-byte units per row
    static constexpr int kUnitValues = 16 / VB;    // values per unit
    static constexpr int kCopyRows = 32 / kUnits;  // rows one pass of the warp's copies covers
    static_assert(kStages >= 2, "kTcStagingBytes too small for two stages");
    static_assert(kTcHeads * kOStride * 4 <= kWarpBytes, "a warp's p.v sums must fit in its stages");
    static_assert(kMinBlocks >= 1, "kTcStagingBytes too large for a multiprocessor");
    static_assert(kCopyRows <= 16, "a pass of copies must fit in a chunk");
    // Column XOR of row r of a stage (see above), within the row's units.
    __device__ static constexpr int swizzle(int r) { return (((r >> 2) << 1) ^ ((r & 1) << 2)) & (kUnits - 1); }
};

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

// Where this thread sits: block (tile + n_gtile*split, KV head, sequence), warp, fragment row group g = lane/4
// and lane c = lane%4 within it.
struct TcPlace {
    int split, kvh, b, n_g, h0, warp, lane, g, c;
};

__device__ __forceinline__ TcPlace tc_place(const KernelParams& p) {
    TcPlace at;
    const int tile = blockIdx.x % p.n_gtile;
    at.split = blockIdx.x / p.n_gtile;
    at.kvh = blockIdx.y;
    at.b = blockIdx.z;
    const int n_group = p.n_head / p.n_head_kv;
    at.n_g = min(kTcHeads, n_group - tile * kTcHeads);  // heads of this tile; rows past it are zero
    at.h0 = at.kvh * n_group + tile * kTcHeads;
    at.warp = threadIdx.x / 32;
    at.lane = threadIdx.x % 32;
    at.g = at.lane / 4;
    at.c = at.lane % 4;
    return at;
}

// A warp's flash-decoding state: Q's fragments (heads g and g+8 of the tile, dims 32i+8c .. +7), O's C
// fragments (tile 8i+j holds dims 64i+8(2c)+j, 64i+8(2c+1)+j of rows g, g+8), the running max of rows g and
// g+8 (the same in the 4 lanes of a group) and this lane's share of their sums of weights.
template <int D>
struct TcState {
    uint4 qa[D / 32];
    uint4 qb[D / 32];
    float o[D / 8][4];
    float m0, m1, l0, l1;
};

template <typename T, int D>
__device__ __forceinline__ void tc_init(const KernelParams& p, const TcPlace& at, TcState<D>& st) {
    const uint4 zero = make_uint4(0, 0, 0, 0);  // +0 in fp16 and bf16
    const T* q_t = static_cast<const T*>(p.q) + (static_cast<long long>(at.b) * p.n_head + at.h0) * D + 8 * at.c;
#pragma unroll
    for (int i = 0; i < D / 32; ++i) {
        st.qa[i] = at.g < at.n_g ? load16(q_t + at.g * D + 32 * i) : zero;
        st.qb[i] = at.g + 8 < at.n_g ? load16(q_t + (at.g + 8) * D + 32 * i) : zero;
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n) st.o[n][0] = st.o[n][1] = st.o[n][2] = st.o[n][3] = 0.0f;
    st.m0 = st.m1 = -INFINITY;
    st.l0 = st.l1 = 0.0f;
}

// This lane's copies of a chunk: unit cu of rows cr + kCopyRows*j, to the same place in every stage; rows at
// or past t_end as zeros (source size 0, from the chunk's first row, which is valid). Commits nothing.
template <typename L, typename V, bool PAGED>
struct TcCopier {
    const V* k_lane;
    const V* v_lane;
    KvRows<PAGED> rows;
    int cr, cu;

    __device__ __forceinline__ void issue(long long t0, long long t_end, unsigned char* stage) const {
        const long long first = rows.offset(t0);  // a chunk lies within one block: rows follow on
        const long long rows_valid = t_end - t0;  // >= 1
#pragma unroll
        for (int j = 0; j < 16 / L::kCopyRows; ++j) {
            const int r = cr + L::kCopyRows * j;
            const bool ok = r < rows_valid;
            const long long src = first + (ok ? r : 0) * rows.ld;
            const int dst = r * L::kRowBytes + 16 * (cu ^ L::swizzle(r));
            cp_async16(stage + dst, k_lane + src, ok ? 16 : 0);
            cp_async16(stage + L::kHalfStageBytes + dst, v_lane + src, ok ? 16 : 0);
        }
    }
};

// Byte offsets of this lane's fragment reads in a stage (unit u of row r at r*R + 16*(u ^ swizzle(r))).
// 16-bit: K row rk (tile 1: rk + 2, the same swizzle), unit 4i+c = 4(i ^ kb) + (c ^ (sk & 3)) with kb = bit 2
// of sk: k_off[i % 2] + 64 (i - i % 2); V row 4c+r, unit 8i+g at v_off[r % 2] + r R + 128 i.
// fp8: K unit 2i + c/2, half c%2: k_off[0] + 16 (2i ^ sk); V unit 4i + g/2, half g%2 of row 4c+r:
// v_off[r % 2] + r R + 16 ((4i + g/2) ^ swizzle(4c+r)), the XOR taken in tc_v_frags.
template <typename L>
struct TcFragOffsets {
    int k_off[2];
    int v_off[2];
    int sk;

    __device__ __forceinline__ TcFragOffsets(int g, int c) {
        constexpr int R = L::kRowBytes;
        const int rk = 4 * (g / 2) + g % 2;
        sk = L::swizzle(rk);
        if constexpr (L::kUnitValues == 8) {
            const int kb = (sk >> 2) & 1;
            k_off[0] = rk * R + 16 * (4 * kb + (c ^ (sk & 3)));
            k_off[1] = rk * R + 16 * (4 * (kb ^ 1) + (c ^ (sk & 3)));
            v_off[0] = 4 * c * R + 16 * (g ^ (2 * c));
            v_off[1] = 4 * c * R + 16 * (g ^ (2 * c) ^ 4);
        } else {
            k_off[0] = k_off[1] = rk * R + 16 * (c >> 1) + 8 * (c & 1);
            v_off[0] = v_off[1] = 4 * c * R + 8 * (g & 1);
        }
    }
};

// K's fragments of a chunk as 8 values of T per lane and block of 32 dims: tile 0 (tokens 4(n/2) + n%2) in k0,
// tile 1 (those + 2) in k1.
template <typename T, typename L>
__device__ __forceinline__ void tc_k_frags(const unsigned char* ks, const TcFragOffsets<L>& f, uint4 (&k0)[L::kD / 32],
                                           uint4 (&k1)[L::kD / 32]) {
    constexpr int R = L::kRowBytes;
#pragma unroll
    for (int i = 0; i < L::kD / 32; ++i) {
        if constexpr (L::kUnitValues == 8) {
            k0[i] = *reinterpret_cast<const uint4*>(ks + f.k_off[i % 2] + 64 * (i - i % 2));
            k1[i] = *reinterpret_cast<const uint4*>(ks + f.k_off[i % 2] + 64 * (i - i % 2) + 2 * R);
        } else {  // sk is even, so (2i + c/2) ^ sk = (2i ^ sk) + c/2, and c/2 is in k_off
            const int off = f.k_off[0] + 16 * ((2 * i) ^ f.sk);
            k0[i] = widen8<T>(*reinterpret_cast<const uint2*>(ks + off));
            k1[i] = widen8<T>(*reinterpret_cast<const uint2*>(ks + off + 2 * R));
        }
    }
}

// V's fragments of block i of 64 dims: rows 4c .. 4c+3, dims 64i+8g .. +7, as 8 values of T each.
template <typename T, typename L>
__device__ __forceinline__ void tc_v_frags(const unsigned char* vs, const TcFragOffsets<L>& f, int g, int c, int i,
                                           uint4 (&v)[4]) {
    constexpr int R = L::kRowBytes;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        if constexpr (L::kUnitValues == 8) {
            v[r] = *reinterpret_cast<const uint4*>(vs + f.v_off[r % 2] + r * R + 128 * i);
        } else {
            const int unit = (4 * i + (g >> 1)) ^ L::swizzle(4 * c + r);
            v[r] = widen8<T>(*reinterpret_cast<const uint2*>(vs + f.v_off[0] + r * R + 16 * unit));
        }
    }
}

// 2. S = Q K^T for the chunk, tile 0 (s0) and tile 1 (s1).
template <typename T, typename L>
__device__ __forceinline__ void tc_scores(const unsigned char* ks, const TcFragOffsets<L>& f, const TcState<L::kD>& st,
                                          float (&s0)[4], float (&s1)[4]) {
    constexpr int kKBlocks = L::kD / 32;
    uint4 k0[kKBlocks];
    uint4 k1[kKBlocks];
    tc_k_frags<T, L>(ks, f, k0, k1);
#pragma unroll
    for (int i = 0; i < kKBlocks; ++i) {
        const uint4& qa = st.qa[i];
        const uint4& qb = st.qb[i];
        mma_16816<T>(s0, qa.x, qb.x, qa.y, qb.y, k0[i].x, k0[i].y);
        mma_16816<T>(s1, qa.x, qb.x, qa.y, qb.y, k1[i].x, k1[i].y);
        mma_16816<T>(s0, qa.z, qb.z, qa.w, qb.w, k0[i].z, k0[i].w);
        mma_16816<T>(s1, qa.z, qb.z, qa.w, qb.w, k1[i].z, k1[i].w);
    }
}

// 3. Online softmax: this lane's scores of tokens 4c+r, rows g (x0) and g+8 (x1); -inf past the split. Gives
// P's A fragments (rounded to T; the sums of weights add the rounded values) and the rescale of O.
template <typename T, int D>
__device__ __forceinline__ void tc_softmax(const KernelParams& p, int c, long long t0, long long t_end,
                                           const float (&s0)[4], const float (&s1)[4], TcState<D>& st,
                                           std::uint32_t (&pa)[4], float& alpha0, float& alpha1) {
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
    const float m0_new = fmaxf(st.m0, mx0);
    const float m1_new = fmaxf(st.m1, mx1);
    alpha0 = exp2f(st.m0 - m0_new);  // 0 on the first chunk (m = -inf)
    alpha1 = exp2f(st.m1 - m1_new);
    st.m0 = m0_new;
    st.m1 = m1_new;
    float p0[4];
    float p1[4];
    pa[0] = pack2<T>(exp2f(x0[0] - m0_new), exp2f(x0[1] - m0_new), p0[0], p0[1]);  // row g, k 2c, 2c+1
    pa[1] = pack2<T>(exp2f(x1[0] - m1_new), exp2f(x1[1] - m1_new), p1[0], p1[1]);  // row g+8
    pa[2] = pack2<T>(exp2f(x0[2] - m0_new), exp2f(x0[3] - m0_new), p0[2], p0[3]);  // row g, k 2c+8, 2c+9
    pa[3] = pack2<T>(exp2f(x1[2] - m1_new), exp2f(x1[3] - m1_new), p1[2], p1[3]);  // row g+8
    st.l0 = st.l0 * alpha0 + (p0[0] + p0[1]) + (p0[2] + p0[3]);
    st.l1 = st.l1 * alpha1 + (p1[0] + p1[1]) + (p1[2] + p1[3]);
}

// 4. O = alpha O + P V, V's fragments from the stage.
template <typename T, typename L>
__device__ __forceinline__ void tc_pv(const unsigned char* vs, const TcFragOffsets<L>& f, int g, int c,
                                      const std::uint32_t (&pa)[4], float alpha0, float alpha1, TcState<L::kD>& st) {
#pragma unroll
    for (int i = 0; i < L::kD / 64; ++i) {
        uint4 v[4];
        tc_v_frags<T, L>(vs, f, g, c, i, v);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            float (&acc)[4] = st.o[8 * i + j];
            acc[0] *= alpha0;
            acc[1] *= alpha0;
            acc[2] *= alpha1;
            acc[3] *= alpha1;
            const unsigned sel = j % 2 == 0 ? 0x5410u : 0x7632u;  // element j of tokens 4c, 4c+1 (and +2, +3)
            const std::uint32_t b0 = __byte_perm(word_of(v[0], j), word_of(v[1], j), sel);
            const std::uint32_t b1 = __byte_perm(word_of(v[2], j), word_of(v[3], j), sel);
            mma_16816<T>(acc, pa[0], pa[1], pa[2], pa[3], b0, b1);
        }
    }
}

// The warp's state to shared memory: sums of weights over the group's 4 lanes, O by its column map (over the
// warp's own ring, rows of D+1 floats).
template <typename L>
__device__ __forceinline__ void tc_publish(const TcPlace& at, TcState<L::kD>& st, unsigned char* ring,
                                           float (&m_s)[kTcWarps][kTcHeads], float (&l_s)[kTcWarps][kTcHeads]) {
#pragma unroll
    for (int off = 1; off < 4; off *= 2) {
        st.l0 += __shfl_xor_sync(0xffffffffu, st.l0, off);
        st.l1 += __shfl_xor_sync(0xffffffffu, st.l1, off);
    }
    const int g = at.g;
    if (at.c == 0) {
        m_s[at.warp][g] = st.m0;
        m_s[at.warp][g + 8] = st.m1;
        l_s[at.warp][g] = st.l0;
        l_s[at.warp][g + 8] = st.l1;
    }
    float* const o_w = reinterpret_cast<float*>(ring);
#pragma unroll
    for (int i = 0; i < L::kD / 64; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int d = 64 * i + 8 * (2 * at.c + e) + j;
                o_w[g * L::kOStride + d] = st.o[8 * i + j][e];
                o_w[(g + 8) * L::kOStride + d] = st.o[8 * i + j][2 + e];
            }
}

// Merge the warps, weights exp2(m_w - M) (M finite: warp 0 always has tokens; a warp without has m = -inf).
// V's scale multiplies the sums.
template <typename T, typename L>
__device__ __forceinline__ void tc_merge(const KernelParams& p, const TcPlace& at, const unsigned char* stage_s,
                                         const float (&m_s)[kTcWarps][kTcHeads], const float (&l_s)[kTcWarps][kTcHeads]) {
    constexpr int D = L::kD;
    for (int idx = threadIdx.x; idx < at.n_g * D; idx += kTcThreads) {
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
        write_result<T>(p, static_cast<long long>(at.b) * p.n_head + at.h0 + row, at.split, d, num * p.v_scale, den, m_all);
    }
}

// Block (tile + n_gtile*split, KV head, sequence): 16 query heads of one KV head over one split of T, with
// TcLayout::kSmemBytes of dynamic shared memory. The pipeline and the fragment layout are described above.
template <typename T, int D, bool FP8, bool PAGED>
__global__ void __launch_bounds__(kTcThreads, TcLayout<D, FP8 ? 1 : 2>::kMinBlocks)
    decode_attention_tc_kernel(const KernelParams p) {
    using L = TcLayout<D, FP8 ? 1 : 2>;
    using V = typename KvStore<T, FP8>::Value;
    static_assert(sizeof(T) == 2, "16-bit q and out");
    constexpr int kStages = L::kStages;
    constexpr long long kStep = kTcWarps * 16;
    extern __shared__ __align__(16) unsigned char stage_s[];  // [warp][stage][K 16 rows, V 16 rows], swizzled
    __shared__ float m_s[kTcWarps][kTcHeads];
    __shared__ float l_s[kTcWarps][kTcHeads];

    const TcPlace at = tc_place(p);
    TcState<D> st;
    tc_init<T, D>(p, at, st);
    unsigned char* const ring = stage_s + at.warp * L::kWarpBytes;
    const long long t_begin = static_cast<long long>(at.split) * p.split_rows;
    const long long t_end = min(p.n_tokens, t_begin + p.split_rows);
    long long seq = 0;
    const KvRows<PAGED> rows = kv_rows<PAGED>(p, at.b, seq);
    const int cu = at.lane % L::kUnits;
    const long long lane_col = seq + static_cast<long long>(at.kvh) * D + L::kUnitValues * cu;
    const TcCopier<L, V, PAGED> copier{static_cast<const V*>(p.k) + lane_col, static_cast<const V*>(p.v) + lane_col,
                                       rows, at.lane / L::kUnits, cu};
    const TcFragOffsets<L> frag(at.g, at.c);

    // Chunks 0 .. kStages-2 in flight first, one commit group each (empty past t_end).
    const long long t_first = t_begin + at.warp * 16;
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (t_first + s * kStep < t_end) copier.issue(t_first + s * kStep, t_end, ring + s * L::kStageBytes);
        cp_async_commit();
    }
    int stage = 0;           // chunk k's stage
    int fill = kStages - 1;  // chunk k+kStages-1's stage: chunk k-1's
    for (long long t0 = t_first; t0 < t_end; t0 += kStep) {
        // 1. refill the stage chunk k-1 used, then wait for chunk k (one commit group per chunk, in order)
        __syncwarp();  // every lane has read chunk k-1's fragments
        const long long t_next = t0 + (kStages - 1) * kStep;
        if (t_next < t_end) copier.issue(t_next, t_end, ring + fill * L::kStageBytes);
        cp_async_commit();
        cp_async_wait<kStages - 1>();
        __syncwarp();  // every lane's copies of chunk k are visible to the warp
        const unsigned char* const ks = ring + stage * L::kStageBytes;
        stage = stage + 1 == kStages ? 0 : stage + 1;
        fill = fill + 1 == kStages ? 0 : fill + 1;
        float s0[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        float s1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        tc_scores<T, L>(ks, frag, st, s0, s1);
        std::uint32_t pa[4];
        float alpha0, alpha1;
        tc_softmax<T, D>(p, at.c, t0, t_end, s0, s1, st, pa, alpha0, alpha1);
        tc_pv<T, L>(ks + L::kHalfStageBytes, frag, at.g, at.c, pa, alpha0, alpha1, st);
    }
    // Chunks at or past t_end committed empty groups; the rest were waited for. Nothing is outstanding, but
    // the ring is about to be overwritten, so say so.
    cp_async_wait<0>();
    __syncwarp();  // every lane has read the last chunk's fragments
    tc_publish<L>(at, st, ring, m_s, l_s);
    __syncthreads();
    tc_merge<T, L>(p, at, stage_s, m_s, l_s);
}

// The tensor-core kernel takes more than the 48 KiB of dynamic shared memory a launch gets without asking, and
// as much of the L1/shared split as shared memory as it can (its K and V copies bypass L1). The attributes
// belong to the current device's context: they are set again whenever the device differs from the one they
// were last set for (kvlab uses one device, so once per instantiation), not before every launch, which would
// put two driver calls inside each timed step.
template <typename T, int D, bool FP8, bool PAGED>
void launch_tc(const KernelParams& kp, dim3 grid, cudaStream_t stream) {
    constexpr int kBytes = TcLayout<D, FP8 ? 1 : 2>::kSmemBytes;
    const auto kernel = decode_attention_tc_kernel<T, D, FP8, PAGED>;
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

template <typename T, bool FP8, bool PAGED>
void launch_d(const KernelParams& kp, int d_head, dim3 grid, cudaStream_t stream) {
    if (d_head == 64) launch_tc<T, 64, FP8, PAGED>(kp, grid, stream);
    else launch_tc<T, 128, FP8, PAGED>(kp, grid, stream);
}

template <typename T>
void launch_typed(const KernelParams& kp, bool fp8, bool paged, int d_head, dim3 grid, cudaStream_t stream) {
    if (fp8) {
        if (paged) launch_d<T, true, true>(kp, d_head, grid, stream);
        else launch_d<T, true, false>(kp, d_head, grid, stream);
    } else {
        if (paged) launch_d<T, false, true>(kp, d_head, grid, stream);
        else launch_d<T, false, false>(kp, d_head, grid, stream);
    }
}

}  // namespace

void launch_tensor_cores(const KernelParams& kp, bool bf16, bool fp8, bool paged, int d_head, dim3 grid,
                         cudaStream_t stream) {
    if (bf16) launch_typed<__nv_bfloat16>(kp, fp8, paged, d_head, grid, stream);
    else launch_typed<__half>(kp, fp8, paged, d_head, grid, stream);
}

cudaError_t tensor_core_attributes(cudaFuncAttributes* attr) {
    return cudaFuncGetAttributes(attr, decode_attention_tc_kernel<__half, 128, false, false>);
}

}  // namespace kvlab::cuda
