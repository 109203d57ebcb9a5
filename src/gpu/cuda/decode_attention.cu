// decode_attention.cuh's entry points: the split count, the choice of kernel, the launch of one of the two
// attention kernels (decode_attention_cuda_cores.cu, decode_attention_tensor_cores.cu) and the reduce kernel
// that merges the splits. Scores are kept in log2 units (q.k * log2(e)/sqrt(D)) so that exp2f does the softmax.
#include "decode_attention.cuh"

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>

#include "decode_attention_device.cuh"
#include "kvlab/core/error.hpp"

namespace kvlab::cuda {

namespace {

constexpr int kReduceThreads = 128;

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

// What decode_attention_launch refuses before it touches the device: an empty split, misaligned buffers (the
// kernels read 16 bytes, or 8 of fp8, at a time), a head dim the tensor cores do not take, a block size that
// is no power of two of at least 16 (a tensor-core chunk of 16 tokens must lie in one block).
void check_args(const DecodeAttentionArgs& a, long long n_pieces, long long pieces_per_split) {
    if (a.n_split < 1 || (a.n_split - 1) * pieces_per_split >= n_pieces)
        throw IoError("decode attention: split count " + std::to_string(a.n_split) + " leaves a split of " +
                      std::to_string(a.n_tokens) + " tokens empty; use decode_attention_splits");
    const auto aligned = [](const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; };
    if (!aligned(a.q) || !aligned(a.k) || !aligned(a.v) || !aligned(a.out) || a.ld_kv % 8 != 0 || a.shape.d_head % 8 != 0)
        throw IoError("decode attention: q, K, V and out must be 16-byte aligned, with row strides and the head dim "
                      "multiples of 8 values");
    if (a.tensor_cores && a.shape.d_head != 64 && a.shape.d_head != 128)
        throw IoError("decode attention: the tensor-core kernel takes head dim 64 or 128, not " +
                      std::to_string(a.shape.d_head));
    if (a.block_size != 0 &&
        (a.block_size < 16 || !std::has_single_bit(static_cast<std::uint64_t>(a.block_size)) || a.block_table == nullptr ||
         a.n_blocks != (a.n_tokens + a.block_size - 1) / a.block_size))
        throw IoError("decode attention: a paged cache needs a block table of ceil(T / block) blocks per sequence and "
                      "a block size that is a power of two of at least 16, not " + std::to_string(a.block_size));
}

KernelParams kernel_params(const DecodeAttentionArgs& a, long long split_rows, long long n_gtile) {
    KernelParams kp{};
    kp.q = a.q;
    kp.k = a.k;
    kp.v = a.v;
    kp.out = a.out;
    kp.partials = a.partials;
    kp.block_table = a.block_table;
    kp.ld_kv = a.ld_kv;
    kp.n_tokens = a.n_tokens;
    kp.split_rows = split_rows;
    kp.n_blocks = a.block_size != 0 ? a.n_blocks : 0;
    kp.block_shift = a.block_size != 0 ? std::countr_zero(static_cast<std::uint64_t>(a.block_size)) : 0;
    kp.n_head = static_cast<int>(a.shape.n_head);
    kp.n_head_kv = static_cast<int>(a.shape.n_head_kv);
    kp.d_head = static_cast<int>(a.shape.d_head);
    kp.n_split = a.n_split;
    kp.n_gtile = static_cast<int>(n_gtile);
    // log2(e) / sqrt(D), times K's scale (exactly log2(e) / sqrt(D) when the scale is 1)
    kp.scale_log2 = static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(a.shape.d_head))) *
                    (a.kv_fp8 ? a.k_scale : 1.0f);
    kp.v_scale = a.kv_fp8 ? a.v_scale : 1.0f;
    return kp;
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
                         tensor_core_attributes(&attr) == cudaSuccess;
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
    check_args(a, n_pieces, pieces_per_split);
    const long long n_group = a.shape.n_head / a.shape.n_head_kv;
    const int gt = a.tensor_cores ? kTcHeads : gtile_for(n_group);
    const long long n_gtile = (n_group + gt - 1) / gt;
    if (n_gtile * a.n_split > 0x7fffffffLL)
        throw IoError("decode attention: " + std::to_string(n_gtile) + " head tiles x " + std::to_string(a.n_split) +
                      " splits exceed the grid's 2^31-1 blocks");
    const KernelParams kp = kernel_params(a, pieces_per_split * kSplitRows, n_gtile);
    const dim3 grid(static_cast<unsigned>(kp.n_gtile) * static_cast<unsigned>(a.n_split),
                    static_cast<unsigned>(a.shape.n_head_kv), static_cast<unsigned>(a.n_batch));
    const bool bf16 = a.dtype == DType::bf16;
    const bool paged = a.block_size != 0;
    if (a.tensor_cores)
        launch_tensor_cores(kp, bf16, a.kv_fp8, paged, static_cast<int>(a.shape.d_head), grid, stream);
    else
        launch_cuda_cores(kp, bf16, a.kv_fp8, paged, lanes_for(a.shape.d_head), gt, grid, stream);
    if (a.n_split > 1) {
        const dim3 reduce_grid(static_cast<unsigned>(a.shape.n_head), static_cast<unsigned>(a.n_batch));
        const int h = static_cast<int>(a.shape.n_head);
        const int d = static_cast<int>(a.shape.d_head);
        if (bf16)
            decode_attention_reduce_kernel<__nv_bfloat16><<<reduce_grid, kReduceThreads, 0, stream>>>(
                a.partials, static_cast<__nv_bfloat16*>(a.out), h, d, a.n_split);
        else
            decode_attention_reduce_kernel<__half><<<reduce_grid, kReduceThreads, 0, stream>>>(
                a.partials, static_cast<__half*>(a.out), h, d, a.n_split);
    }
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) throw IoError(std::string("CUDA decode attention launch failed: ") + cudaGetErrorString(e));
}

}  // namespace kvlab::cuda
