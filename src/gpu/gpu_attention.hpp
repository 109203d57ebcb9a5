// Decode attention timed on a CUDA GPU: the cached step (read the KV cache) against the uncached step
// (recompute K and V from hidden states with a GEMM, then attend). The core and the CLI see the CUDA
// code only through this header; builds without CUDA link src/gpu/gpu_attention_nocuda.cpp instead.
// K and V live contiguously or in a paged pool (a block table per sequence, as vLLM's PagedAttention), in
// the query's dtype or as fp8 e4m3 with one scale per tensor. Non-goals: a full forward pass on the GPU,
// training.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvlab/kernels/attention.hpp"
#include "kvlab/core/dtype.hpp"

namespace kvlab {

// Which attention kernel runs (src/gpu/cuda/decode_attention.cu):
// - cuda_cores: q.k and p.v as fp32 multiply-adds on the CUDA cores; any head dim the path takes.
// - tensor_cores: q.K^T and P.V as mma.sync m16n8k16 (fp16/bf16 inputs, fp32 sums), 16 query heads of a
//   KV head per tile; head dim 64 or 128, compute capability 8.0 or later. P is rounded to the storage
//   type before P.V, as FlashAttention does.
// - automatic: tensor cores where they can run and the group (query heads per KV head) is at least
//   gpu_attention_tensor_min_group, else CUDA cores.
enum class GpuAttentionKernel { automatic, cuda_cores, tensor_cores };
std::string_view gpu_attention_kernel_name(GpuAttentionKernel kernel);  // "auto", "cuda-cores", "tensor-cores"
// Throws UsageError naming `flag` and the names it takes.
GpuAttentionKernel parse_gpu_attention_kernel(std::string_view name, std::string_view flag);
// 4: at Llama-3-8B's group of 4 the tensor cores took as long as the CUDA cores on an H100 (-5 % to +1 %) and
// 13-27 % less time on an H200; at a group of 1 (MHA) they took 2-8 % longer, except the H200's bf16 at 8k
// (5 % less) (docs/cuda-timing.md).
inline constexpr std::int64_t gpu_attention_tensor_min_group = 4;

// One decode step of one attention layer for a batch of sequences.
struct GpuAttentionProblem {
    AttentionShape shape;         // H, Hkv, D
    std::int64_t d_model = 0;     // d: width of the hidden states the uncached step projects to K and V
    std::int64_t n_batch = 0;     // B sequences, one query token each
    std::int64_t n_tokens = 0;    // T cached positions each query attends to
    DType dtype = DType::fp16;    // storage of q, K, V, X, W and out: fp16 or bf16; arithmetic is fp32
    GpuAttentionKernel kernel = GpuAttentionKernel::automatic;
    // Where the cached K and V rows live: 0 for one contiguous (B, T, Hkv*D) array per tensor; else the
    // tokens per block of a paged pool (B * ceil(T / block_size) blocks of (block_size, Hkv*D) rows, one pool
    // for K and one for V), each sequence's blocks named by an int32 block table (B, ceil(T / block_size)).
    std::int64_t block_size = 0;
    // Paged: the block table is a shuffled permutation of the pool, as a pool that has served many requests
    // hands out blocks; false: sequence b's blocks in order (b*n .. b*n+n-1, n blocks per sequence), so the
    // rows lie as a contiguous cache's do and only the lookups differ (what the block table alone costs).
    bool shuffled_blocks = true;
    // K and V stored as fp8 e4m3 (1 byte a value) with one fp32 scale for all of K and one for V
    // (value = code * scale), dequantized in the kernel; q and out stay in `dtype`. Cached path only.
    bool kv_fp8 = false;
};

// Block sizes a paged cache takes: powers of two from 16 (the tensor-core kernel's 16-token chunks then
// never straddle a block) to 1024.
inline constexpr std::int64_t gpu_attention_min_block = 16;
inline constexpr std::int64_t gpu_attention_max_block = 1024;
// "contiguous", or "paged N" for N tokens per block.
std::string gpu_attention_layout_name(std::int64_t block_size);
// Bytes of one stored K or V value: 1 for fp8, else the dtype's 2.
std::uint64_t gpu_attention_kv_value_bytes(const GpuAttentionProblem& problem);
// Whether the uncached step (K, V recomputed by a GEMM in the dtype, in a contiguous layout) is timed and
// checked beside the cached one: for contiguous 16-bit caches only.
bool gpu_attention_has_uncached(const GpuAttentionProblem& problem);

enum class GpuAttentionPath { cached, uncached };
std::string_view gpu_attention_path_name(GpuAttentionPath path);

// Largest head dim the kernel handles (one 16-byte load of 8 values per lane, at most 32 lanes).
inline constexpr std::int64_t gpu_attention_max_d_head = 256;

// Throws UsageError naming `flag_hint` when the kernel cannot run the problem (dtype, D, H % Hkv; D 64 or
// 128 when tensor cores are asked for; block size). Whether the device has them is checked where it runs.
void validate_gpu_attention_problem(const GpuAttentionProblem& problem, std::string_view flag_hint);

// Counts from the shapes (a multiply-add is 2 FLOPs). Bytes are the fewest each step must move through
// device memory: every input read once, every output written once.
struct GpuAttentionCost {
    std::uint64_t kv_bytes = 0;           // K and V read by attention: B*T*Hkv*D*2*bkv (bkv 1 for fp8, else b)
    std::uint64_t table_bytes = 0;        // paged: the block table read, B*ceil(T/block)*4; contiguous: 0
    std::uint64_t cached_bytes = 0;       // kv_bytes + table_bytes + q B*H*D*b + out B*H*D*b
    std::uint64_t uncached_bytes = 0;     // X B*T*d*b + W d*2*Hkv*D*b + K,V written then read + q + out
    double cached_flops = 0;              // attention: 4*B*H*D*T (q.k and p.v, 2*H*D*T each)
    double uncached_flops = 0;            // GEMM 2*(B*T)*d*(2*Hkv*D) + attention
    std::uint64_t cached_device_bytes = 0;    // device memory the cached timing allocates
    std::uint64_t uncached_device_bytes = 0;  // device memory the uncached timing allocates
};
// Throws OverflowError when a count does not fit 64 bits.
GpuAttentionCost gpu_attention_cost(const GpuAttentionProblem& problem);

// An attention variant of a native shape, in calc/attention_variant.hpp's grammar: "native", "mha"
// (Hkv = H), "mqa" (Hkv = 1) or "gqa:N" (Hkv = N, N must divide H). Throws UsageError naming `flag`.
AttentionShape attention_variant(const AttentionShape& native, std::string_view spec, std::string_view flag);

// Round-to-nearest-even of x to fp16 or bf16 and back, as the GPU stores it. Throws UsageError for other dtypes.
float round_to_dtype(float x, DType dtype);

// Host copies of one problem's inputs, every value exactly representable in the problem's dtype.
struct GpuAttentionInputs {
    std::vector<float> q;      // (B, H*D)
    std::vector<float> k;      // (B, T, Hkv*D) cached keys; with kv_fp8 their decoded values, code * k_scale
    std::vector<float> v;      // (B, T, Hkv*D) cached values; with kv_fp8 code * v_scale
    std::vector<float> x;      // (B, T, d) hidden states the uncached step projects
    std::vector<float> w_kv;   // (d, 2*Hkv*D): [W_k | W_v], row-major
    // kv_fp8: the e4m3 codes of k and v (B, T, Hkv*D) and their per-tensor scales
    std::vector<std::uint8_t> k_fp8;
    std::vector<std::uint8_t> v_fp8;
    float k_scale = 1.0f;
    float v_scale = 1.0f;
    // paged: block_table[b * n_blocks + j] is the pool block that holds tokens j*block .. j*block+block-1
    // of sequence b (n_blocks = ceil(T / block)); a permutation of 0 .. B*n_blocks-1
    std::vector<std::int32_t> block_table;
};

struct GpuAttentionOutputs {
    std::vector<float> out_cached;    // (B, H*D) attention over the given K, V
    std::vector<float> out_uncached;  // (B, H*D) attention over K, V = X W_kv computed on the device
    int n_split = 0;                  // how many pieces T was split into (flash-decoding)
    GpuAttentionKernel kernel = GpuAttentionKernel::automatic;  // the kernel that ran (never automatic)
};

// One correctness comparison against attention_decode_ref.
struct GpuAttentionCheck {
    GpuAttentionPath path = GpuAttentionPath::cached;
    std::int64_t n_batch = 0;
    std::int64_t n_tokens = 0;
    std::int64_t d_model = 0;
    int n_split = 0;
    GpuAttentionKernel kernel = GpuAttentionKernel::automatic;  // the kernel that ran
    double max_abs_error = 0;
    double tolerance = 0;
    bool passed = false;
    // kv_fp8 (cached path): max |out - reference over the unquantized K, V|, what storing the cache in
    // fp8 cost the output (NaN otherwise). Reported, not checked: it is the format's error, not the kernel's.
    double fp8_error = 0;
};
// Tolerance on |out - ref| for outputs of magnitude <= max_abs_ref: 2 units in the last place of the
// dtype at max(1, max_abs_ref) (fp16 2^-10, bf16 2^-7), covering the output's own rounding plus fp32
// summation order; NaN never passes.
double gpu_attention_tolerance(DType dtype, double max_abs_ref);
// Runs both paths on small random problems with `shape_of`'s H, Hkv, D and dtype (hidden min(d, 128);
// T = 1, 300 and 1300, the last also with T unsplit), against the CPU reference on the same rounded inputs.
// With a block size, K and V go to a paged pool through a shuffled block table; with kv_fp8 they are
// quantized on the host as the CPU KV cache does (scale = amax / 448, code = e4m3(x * (1 / scale))) and
// the reference reads the decoded values. The uncached path is checked for contiguous 16-bit caches only.
// Throws UnavailableError without CUDA or a device.
std::vector<GpuAttentionCheck> gpu_attention_check(const GpuAttentionProblem& shape_of, std::uint64_t seed);

// The check's host-side storage steps, exposed for tests:
// - Quantizes `values` to fp8 e4m3 with one scale for the whole tensor, as the CPU KV cache does
//   (src/kv/kv_cache.cpp): scale = amax / 448 (1 when amax is 0 or not finite), code =
//   fp8_e4m3_encode(x * (1 / scale)). Puts the codes in `codes`, replaces each value by its decoded
//   value code * scale and returns the scale.
float gpu_attention_quantize_fp8(std::vector<float>& values, std::vector<std::uint8_t>& codes);
// - A block table for n_batch sequences of n_blocks blocks each: a permutation of 0 .. n_batch*n_blocks-1
//   shuffled by std::mt19937_64(seed), as a pool that has been allocated from and freed for a while hands
//   out blocks in no particular order; never the identity when it has 2 blocks or more.
std::vector<std::int32_t> gpu_attention_block_table(std::int64_t n_batch, std::int64_t n_blocks, std::uint64_t seed);

// ---- implemented by src/gpu/cuda/ (CUDA builds) or src/gpu/gpu_attention_nocuda.cpp ----

struct CudaDevice {
    std::string name;                  // e.g. "NVIDIA H100 80GB HBM3"
    int cc_major = 0;
    int cc_minor = 0;
    int n_sm = 0;
    std::uint64_t l2_bytes = 0;
    std::uint64_t memory_bytes = 0;
    std::uint64_t memory_free_bytes = 0;
};

struct GpuTiming {
    double median_ns = 0;   // median over repeats, CUDA events around the timed launches only
    double min_ns = 0;
    int n_repeat = 0;
    int n_split = 0;        // attention splits used (0 for a copy or a read)
    GpuAttentionKernel kernel = GpuAttentionKernel::automatic;  // the attention kernel that ran
    int unroll = 0;         // read reference: 16-byte loads per thread per loop step of the fastest pattern
};

bool cuda_built();
// Device 0. Throws UnavailableError when this build has no CUDA or no device is present.
CudaDevice cuda_device();
// Runs both paths once on `inputs` (the cached path only for paged or fp8 caches: out_uncached stays empty);
// n_split 0 picks the split count as timing does.
GpuAttentionOutputs gpu_attention_run(const GpuAttentionProblem& problem, const GpuAttentionInputs& inputs,
                                      int n_split);
// Times one path on device-generated random inputs; L2 is flushed before every repeat. A paged cache's
// block table is a shuffled permutation of the pool, as a pool fragments. Throws UsageError for the
// uncached path of a paged or fp8 cache.
GpuTiming gpu_attention_time(const GpuAttentionProblem& problem, GpuAttentionPath path, int n_warmup,
                             int n_repeat);
// Times a device-to-device copy of `bytes` (the bandwidth reference: 2*bytes moved per copy).
GpuTiming cuda_copy_time(std::uint64_t bytes, int n_warmup, int n_repeat);
// Times a kernel that only reads `bytes` (its grid-stride loop unrolled 4, 8 and 16 times; the fastest
// pattern is returned): the reference for kernels that read far more than they write, which a copy,
// writing as much as it reads, understates. Checks that every byte was read.
GpuTiming cuda_read_time(std::uint64_t bytes, int n_warmup, int n_repeat);

}  // namespace kvlab
