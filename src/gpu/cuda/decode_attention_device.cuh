// What the decode attention kernels share (decode_attention_cuda_cores.cu, decode_attention_tensor_cores.cu,
// decode_attention.cu): the launch parameters, where a token's K and V rows live (contiguous or paged), and
// the loads and conversions of stored values (fp16, bf16, fp8 e4m3). Device code and the launchers' declarations.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace kvlab::cuda {

constexpr int kSplitRows = 64;  // a split of T holds a whole number of 64-token pieces

struct KernelParams {
    const void* q;
    const void* k;             // contiguous: (B*T rows, ld_kv); paged: the pool, (blocks * block size rows, ld_kv)
    const void* v;             // same layout as k
    void* out;
    float* partials;           // (B, H, n_split, D+2): D unnormalised sums, their max, their sum of weights
    const int* block_table;    // paged: (B, n_blocks), the pool block of each sequence's j-th block
    long long ld_kv;           // values between consecutive rows of k and v
    long long n_tokens;
    long long split_rows;      // tokens per split (the last may hold fewer)
    long long n_blocks;        // paged: blocks per sequence in the table
    int block_shift;           // paged: log2 of the tokens per block
    int n_head;
    int n_head_kv;
    int d_head;
    int n_split;
    int n_gtile;               // tiles of query heads per KV head
    float scale_log2;          // log2(e) / sqrt(D), times K's scale (fp8; 1 otherwise): q.k comes out in log2 units
    float v_scale;             // V's scale (fp8; 1 otherwise), applied to the p.v sums once, at the end
};

// Where token t of one sequence keeps its K (or V) row, in values from the start of the sequence's rows
// (contiguous) or of the pool (paged). A paged block holds 2^shift consecutive tokens; the block table maps a
// sequence's j-th block to a pool block, as vLLM's PagedAttention does.
template <bool PAGED>
struct KvRows {
    const int* table;   // this sequence's row of the block table (paged)
    long long ld;       // values per row
    int shift;          // log2(block size) (paged)

    __device__ __forceinline__ long long offset(long long t) const {
        if constexpr (PAGED) {
            const long long block = __ldg(table + (t >> shift));
            return ((block << shift) + (t & ((1LL << shift) - 1))) * ld;
        } else {
            return t * ld;
        }
    }
};

// The sequence's start in K and V (contiguous: b*T rows in; paged: the pool's start) and its rows.
template <bool PAGED>
__device__ __forceinline__ KvRows<PAGED> kv_rows(const KernelParams& p, int b, long long& seq_start) {
    if constexpr (PAGED) {
        seq_start = 0;
        return KvRows<PAGED>{p.block_table + static_cast<long long>(b) * p.n_blocks, p.ld_kv, p.block_shift};
    } else {
        seq_start = static_cast<long long>(b) * p.n_tokens * p.ld_kv;
        return KvRows<PAGED>{nullptr, p.ld_kv, 0};
    }
}

// Stored K and V values: T (fp16, bf16) or one byte each (fp8 e4m3). A lane handles 8 values at a time:
// 16 bytes of T, 8 bytes of fp8.
template <typename T, bool FP8>
struct KvStore {
    using Value = std::conditional_t<FP8, std::uint8_t, T>;
    using Raw8 = std::conditional_t<FP8, uint2, uint4>;  // 8 stored values
    static constexpr int kValueBytes = sizeof(Value);
};

// 16 (or 8) bytes with the cache-streaming hint (__ldcs): K and V are read once per step, so they should not
// push other lines out of L1 and L2.
template <typename T>
__device__ __forceinline__ uint4 load16(const T* p) {
    return __ldcs(reinterpret_cast<const uint4*>(p));
}
__device__ __forceinline__ uint2 load8(const std::uint8_t* p) { return __ldcs(reinterpret_cast<const uint2*>(p)); }

// 8 values from 16 bytes of storage.
__device__ __forceinline__ void unpack8(const uint4& raw, float (&f)[8], const __half*) {
    const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 t = __half22float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

__device__ __forceinline__ void unpack8(const uint4& raw, float (&f)[8], const __nv_bfloat16*) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 t = __bfloat1622float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

// Two e4m3 codes (the first in the low byte) as two fp16 values: exact, since every e4m3 value (3 mantissa
// bits, exponents 2^-9 .. 2^8) is an fp16 value.
__device__ __forceinline__ __half2 fp8x2_to_half2(unsigned short codes) {
    return __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes), __NV_E4M3));
}

// 8 values from 8 bytes of e4m3 codes.
__device__ __forceinline__ void unpack8(const uint2& raw, float (&f)[8], const std::uint8_t*) {
    const unsigned words[2] = {raw.x, raw.y};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned short codes = static_cast<unsigned short>(words[i / 2] >> (16 * (i % 2)));
        const float2 t = __half22float2(fp8x2_to_half2(codes));
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

// 8 e4m3 codes widened to 8 values of T (fp16 or bf16) in the order they were stored, as a 16-byte load
// of T would give them: exact in both (e4m3's values are fp16 values, and bf16 has more exponent range and
// 7 mantissa bits).
template <typename T>
__device__ __forceinline__ uint4 widen8(const uint2& raw) {
    const unsigned words[2] = {raw.x, raw.y};
    unsigned out[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned short codes = static_cast<unsigned short>(words[i / 2] >> (16 * (i % 2)));
        const __half2 h = fp8x2_to_half2(codes);
        if constexpr (std::is_same_v<T, __half>) {
            out[i] = *reinterpret_cast<const unsigned*>(&h);
        } else {
            const __nv_bfloat162 b = __float22bfloat162_rn(__half22float2(h));
            out[i] = *reinterpret_cast<const unsigned*>(&b);
        }
    }
    return make_uint4(out[0], out[1], out[2], out[3]);
}

__device__ __forceinline__ void store(__half* p, float x) { *p = __float2half_rn(x); }
__device__ __forceinline__ void store(__nv_bfloat16* p, float x) { *p = __float2bfloat16_rn(x); }

// Writes head `head`'s merged value of dim d (num already carries V's scale): the output (one split), or
// the split's record for the reduce kernel.
template <typename T>
__device__ __forceinline__ void write_result(const KernelParams& p, long long head, int split, int d, float num,
                                             float den, float m_all) {
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

// The launchers of the two attention kernels (grid: (tile + n_gtile * split, KV head, sequence)). `bf16`
// picks the storage type of q and out (fp16 otherwise); `fp8` stores K and V as e4m3; `paged` reads them
// through the block table.
// CUDA cores: `lanes` (8, 16 or 32) lanes per row, `gt` (1, 2, 4 or 8) query heads per block.
void launch_cuda_cores(const KernelParams& kp, bool bf16, bool fp8, bool paged, int lanes, int gt, dim3 grid,
                       cudaStream_t stream);
// Tensor cores: head dim 64 or 128, 16 query heads per block. Throws IoError when the device refuses the
// kernel's shared memory.
void launch_tensor_cores(const KernelParams& kp, bool bf16, bool fp8, bool paged, int d_head, dim3 grid,
                         cudaStream_t stream);
constexpr int kTcHeads = 16;  // query heads per tensor-core tile: an mma's 16 rows
// The tensor-core kernel's attributes (ptxVersion says whether this module holds its mma.sync).
cudaError_t tensor_core_attributes(cudaFuncAttributes* attr);

}  // namespace kvlab::cuda
