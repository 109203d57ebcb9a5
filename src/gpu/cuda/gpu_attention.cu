// The CUDA module (libkvlab_cuda.so, opened by src/gpu/gpu_attention_cuda.cpp through module_api.hpp): device
// query, buffers, the cuBLAS K,V projection, the correctness run and the event timing with an L2 flush
// before every repeat.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "decode_attention.cuh"
#include "kvlab/core/error.hpp"
#include "gpu/gpu_attention.hpp"
#include "module_api.hpp"

namespace kvlab {

namespace {

void check_cuda(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw IoError(std::string("CUDA ") + what + " failed: " + cudaGetErrorString(e));
}

// cuBLAS is opened on first use rather than linked: a linked libcublas maps about 200 MiB into every
// kvlab process (kvcalc and simulate included), which the memory targets of `simulate` cannot afford.
struct CublasApi {
    cublasStatus_t (*create)(cublasHandle_t*);
    cublasStatus_t (*destroy)(cublasHandle_t);
    const char* (*status_string)(cublasStatus_t);
    cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*, const void*,
                              cudaDataType, int, const void*, cudaDataType, int, const void*, void*, cudaDataType, int,
                              cublasComputeType_t, cublasGemmAlgo_t);
};

const CublasApi& cublas() {
    static const CublasApi api = [] {
        const std::string soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
        void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (lib == nullptr) lib = dlopen(KVLAB_CUBLAS_DIR "/" "libcublas.so", RTLD_NOW | RTLD_LOCAL);
        if (lib == nullptr)
            throw UnavailableError("cannot load cuBLAS (" + soname + "), needed by the uncached step: " + dlerror());
        auto symbol = [&](const char* name) {
            void* p = dlsym(lib, name);
            if (p == nullptr) throw UnavailableError(soname + " has no symbol " + name);
            return p;
        };
        CublasApi a{};
        a.create = reinterpret_cast<decltype(a.create)>(symbol("cublasCreate_v2"));
        a.destroy = reinterpret_cast<decltype(a.destroy)>(symbol("cublasDestroy_v2"));
        a.status_string = reinterpret_cast<decltype(a.status_string)>(symbol("cublasGetStatusString"));
        a.gemm_ex = reinterpret_cast<decltype(a.gemm_ex)>(symbol("cublasGemmEx"));
        return a;
    }();
    return api;
}

void check_blas(cublasStatus_t s, const char* what) {
    if (s != CUBLAS_STATUS_SUCCESS) throw IoError(std::string("cuBLAS ") + what + " failed: " + cublas().status_string(s));
}

class DeviceBuffer {
public:
    DeviceBuffer(std::uint64_t bytes, const char* what) : bytes_(bytes) {
        if (bytes == 0) return;
        const cudaError_t e = cudaMalloc(&ptr_, bytes);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();  // an allocation failure is not sticky; clear it
            throw UnavailableError(std::string("CUDA could not allocate ") + std::to_string(bytes) + " bytes for " +
                                   what + ": " + cudaGetErrorString(e));
        }
    }
    ~DeviceBuffer() {
        if (ptr_ != nullptr) (void)cudaFree(ptr_);
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    void* get() const { return ptr_; }
    std::uint64_t bytes() const { return bytes_; }

private:
    void* ptr_ = nullptr;
    std::uint64_t bytes_ = 0;
};

class Event {
public:
    Event() { check_cuda(cudaEventCreate(&event_), "cudaEventCreate"); }
    ~Event() { (void)cudaEventDestroy(event_); }
    Event(const Event&) = delete;
    Event& operator=(const Event&) = delete;
    cudaEvent_t get() const { return event_; }

private:
    cudaEvent_t event_{};
};

class Blas {
public:
    Blas() { check_blas(cublas().create(&handle_), "cublasCreate"); }
    ~Blas() { (void)cublas().destroy(handle_); }
    Blas(const Blas&) = delete;
    Blas& operator=(const Blas&) = delete;
    cublasHandle_t get() const { return handle_; }

private:
    cublasHandle_t handle_{};
};

std::uint64_t element_bytes() { return 2; }  // fp16 and bf16

__device__ inline void store(__half* p, float x) { *p = __float2half_rn(x); }
__device__ inline void store(__nv_bfloat16* p, float x) { *p = __float2bfloat16_rn(x); }

// 64 well-mixed bits of x (splitmix64's finalizer): element i's random bits, from i + seed.
__device__ inline unsigned long long mix64(unsigned long long x) {
    unsigned long long h = x * 0x9E3779B97F4A7C15ull;
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
    return h ^ (h >> 31);
}

// x (n) of pseudo-random values in [-scale, scale): never zeros, which would hide unwritten or misread data.
template <typename T>
__global__ void fill_random_kernel(T* x, long long n, unsigned long long seed, float scale) {
    for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<long long>(gridDim.x) * blockDim.x) {
        const unsigned long long h = mix64(static_cast<unsigned long long>(i) + seed);
        const float u = static_cast<float>(h >> 40) * (2.0f / 16777216.0f) - 1.0f;  // 24 random bits
        store(x + i, scale * u);
    }
}

void fill_random(void* x, std::uint64_t n, DType dtype, unsigned long long seed, float scale) {
    if (n == 0) return;
    const long long count = static_cast<long long>(n);
    if (dtype == DType::bf16)
        fill_random_kernel<<<1024, 256>>>(static_cast<__nv_bfloat16*>(x), count, seed, scale);
    else
        fill_random_kernel<<<1024, 256>>>(static_cast<__half*>(x), count, seed, scale);
    check_cuda(cudaGetLastError(), "fill_random launch");
}

std::vector<std::uint16_t> to_device_bits(const std::vector<float>& values, DType dtype) {
    std::vector<std::uint16_t> bits(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
        if (dtype == DType::bf16) {
            const __nv_bfloat16 h = __float2bfloat16_rn(values[i]);
            std::memcpy(&bits[i], &h, 2);
        } else {
            const __half h = __float2half_rn(values[i]);
            std::memcpy(&bits[i], &h, 2);
        }
    }
    return bits;
}

std::vector<float> from_device_bits(const std::vector<std::uint16_t>& bits, DType dtype) {
    std::vector<float> values(bits.size());
    for (std::size_t i = 0; i < bits.size(); ++i) {
        if (dtype == DType::bf16) {
            __nv_bfloat16 h;
            std::memcpy(&h, &bits[i], 2);
            values[i] = __bfloat162float(h);
        } else {
            __half h;
            std::memcpy(&h, &bits[i], 2);
            values[i] = __half2float(h);
        }
    }
    return values;
}

void upload(const DeviceBuffer& dst, const std::vector<float>& values, DType dtype) {
    const std::vector<std::uint16_t> bits = to_device_bits(values, dtype);
    check_cuda(cudaMemcpy(dst.get(), bits.data(), bits.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy upload");
}

std::vector<float> download(const DeviceBuffer& src, std::size_t n, DType dtype) {
    std::vector<std::uint16_t> bits(n);
    check_cuda(cudaMemcpy(bits.data(), src.get(), n * 2, cudaMemcpyDeviceToHost), "cudaMemcpy download");
    return from_device_bits(bits, dtype);
}

// kv (rows, n_cols) = x (rows, d) w (d, n_cols), all row-major, fp32 accumulation. cuBLAS is
// column-major, so this is the column-major product kv^T (n_cols, rows) = w^T (n_cols, d) x^T (d, rows).
void project_kv(cublasHandle_t blas, DType dtype, const void* x, const void* w, void* kv, int rows, int d, int n_cols) {
    const cudaDataType_t t = dtype == DType::bf16 ? CUDA_R_16BF : CUDA_R_16F;
    const float alpha = 1.0f;
    const float beta = 0.0f;
    check_blas(cublas().gemm_ex(blas, CUBLAS_OP_N, CUBLAS_OP_N, n_cols, rows, d, &alpha, w, t, n_cols, x, t, d, &beta, kv, t,
                            n_cols, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx K,V = X W_kv");
}

// Where a problem keeps K and V on the device (the module's own copies of gpu_attention.cpp's rules: the
// module links nothing from kvlab).
bool paged(const GpuAttentionProblem& p) { return p.block_size > 0; }
std::uint64_t kv_value_bytes(const GpuAttentionProblem& p) { return p.kv_fp8 ? 1 : element_bytes(); }
bool has_uncached(const GpuAttentionProblem& p) { return !paged(p) && !p.kv_fp8; }
std::uint64_t blocks_per_sequence(const GpuAttentionProblem& p) {
    return paged(p) ? static_cast<std::uint64_t>((p.n_tokens + p.block_size - 1) / p.block_size) : 0;
}
// Rows each of K and V holds: B*T contiguous, B * ceil(T / block) * block in a paged pool.
std::uint64_t stored_rows(const GpuAttentionProblem& p) {
    return paged(p) ? static_cast<std::uint64_t>(p.n_batch) * blocks_per_sequence(p) * static_cast<std::uint64_t>(p.block_size)
                    : static_cast<std::uint64_t>(p.n_batch * p.n_tokens);
}
std::uint64_t round_up_256(std::uint64_t bytes) { return (bytes + 255) / 256 * 256; }

// Buffers of one problem on the device.
struct ProblemBuffers {
    ProblemBuffers(const GpuAttentionProblem& p, GpuAttentionPath path, int n_split)
        : n_q(static_cast<std::uint64_t>(p.n_batch * p.shape.n_head * p.shape.d_head)),
          n_kv(path == GpuAttentionPath::cached ? stored_rows(p) * static_cast<std::uint64_t>(p.shape.n_head_kv * p.shape.d_head)
                                                : static_cast<std::uint64_t>(p.n_batch * p.n_tokens * p.shape.n_head_kv * p.shape.d_head)),
          n_x(path == GpuAttentionPath::uncached ? static_cast<std::uint64_t>(p.n_batch * p.n_tokens * p.d_model) : 0),
          n_w(path == GpuAttentionPath::uncached
                  ? static_cast<std::uint64_t>(p.d_model * 2 * p.shape.n_head_kv * p.shape.d_head)
                  : 0),
          n_table(path == GpuAttentionPath::cached ? static_cast<std::uint64_t>(p.n_batch) * blocks_per_sequence(p) : 0),
          v_offset(path == GpuAttentionPath::cached ? round_up_256(n_kv * kv_value_bytes(p)) : 0),
          q(n_q * element_bytes(), "q (B, H*D)"),
          kv(path == GpuAttentionPath::cached ? v_offset + n_kv * kv_value_bytes(p) : 2 * n_kv * element_bytes(),
             paged(p) ? "the K and V block pools" : "K and V (B*T, 2*Hkv*D)"),
          out(n_q * element_bytes(), "out (B, H*D)"),
          x(n_x * element_bytes(), "hidden states X (B*T, d)"),
          w(n_w * element_bytes(), "W_kv (d, 2*Hkv*D)"),
          table(n_table * sizeof(std::int32_t), "the block table"),
          partials(cuda::decode_attention_workspace_bytes(p.shape, p.n_batch, n_split), "split partials") {}
    std::uint64_t n_q;       // B*H*D
    std::uint64_t n_kv;      // values of each of K and V: cached, stored_rows * Hkv*D; uncached, B*T*Hkv*D
    std::uint64_t n_x;       // B*T*d (uncached only)
    std::uint64_t n_w;       // d*2*Hkv*D (uncached only)
    std::uint64_t n_table;   // B * ceil(T / block) (paged only)
    std::uint64_t v_offset;  // cached: bytes from K's start to V's (256-byte aligned)
    DeviceBuffer q;
    DeviceBuffer kv;         // cached: K, then V at v_offset; uncached: rows [K | V] of width 2*Hkv*D
    DeviceBuffer out;
    DeviceBuffer x;
    DeviceBuffer w;
    DeviceBuffer table;
    DeviceBuffer partials;
};

cuda::DecodeAttentionArgs attention_args(const GpuAttentionProblem& p, GpuAttentionPath path, const ProblemBuffers& b,
                                         int n_split, bool tensor_cores, float k_scale, float v_scale) {
    const std::int64_t d_kv = p.shape.n_head_kv * p.shape.d_head;
    char* kv = static_cast<char*>(b.kv.get());
    cuda::DecodeAttentionArgs a;
    a.q = b.q.get();
    if (path == GpuAttentionPath::cached) {
        a.k = kv;
        a.v = kv + b.v_offset;
        a.ld_kv = d_kv;
        a.block_table = static_cast<const std::int32_t*>(b.table.get());
        a.n_blocks = static_cast<std::int64_t>(blocks_per_sequence(p));
        a.block_size = p.block_size;
        a.kv_fp8 = p.kv_fp8;
        a.k_scale = k_scale;
        a.v_scale = v_scale;
    } else {
        a.k = kv;
        a.v = kv + static_cast<std::uint64_t>(d_kv) * element_bytes();
        a.ld_kv = 2 * d_kv;
    }
    a.out = b.out.get();
    a.partials = static_cast<float*>(b.partials.get());
    a.dtype = p.dtype;
    a.shape = p.shape;
    a.n_batch = p.n_batch;
    a.n_tokens = p.n_tokens;
    a.n_split = n_split;
    a.tensor_cores = tensor_cores;
    return a;
}

// One step of `path`: for uncached, the GEMM that recomputes K and V, then the attention.
void enqueue_step(const GpuAttentionProblem& p, GpuAttentionPath path, const ProblemBuffers& b, cublasHandle_t blas,
                  const cuda::DecodeAttentionArgs& args) {
    if (path == GpuAttentionPath::uncached)
        project_kv(blas, p.dtype, b.x.get(), b.w.get(), b.kv.get(), static_cast<int>(p.n_batch * p.n_tokens),
                   static_cast<int>(p.d_model), static_cast<int>(2 * p.shape.n_head_kv * p.shape.d_head));
    cuda::decode_attention_launch(args, nullptr);
}

double median_of(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    const std::size_t n = values.size();
    return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Times `enqueue` n_repeat times after n_warmup untimed runs; before each timed run `before` (untimed).
template <typename Enqueue, typename Before>
GpuTiming time_events(int n_warmup, int n_repeat, Enqueue enqueue, Before before) {
    if (n_repeat < 1) throw UsageError("--repeats " + std::to_string(n_repeat) + ": expected at least 1");
    for (int i = 0; i < n_warmup; ++i) enqueue();
    check_cuda(cudaDeviceSynchronize(), "warm-up");
    Event start;
    Event stop;
    std::vector<double> times_ns;
    for (int r = 0; r < n_repeat; ++r) {
        before(r);
        check_cuda(cudaEventRecord(start.get(), nullptr), "cudaEventRecord");
        enqueue();
        check_cuda(cudaEventRecord(stop.get(), nullptr), "cudaEventRecord");
        check_cuda(cudaEventSynchronize(stop.get()), "timed run");
        float ms = 0.0f;
        check_cuda(cudaEventElapsedTime(&ms, start.get(), stop.get()), "cudaEventElapsedTime");
        times_ns.push_back(static_cast<double>(ms) * 1e6);
    }
    GpuTiming t;
    t.n_repeat = n_repeat;
    t.min_ns = *std::min_element(times_ns.begin(), times_ns.end());
    t.median_ns = median_of(times_ns);
    return t;
}

CudaDevice device_info() {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        throw UnavailableError(std::string("no CUDA device present (cudaGetDeviceCount: ") +
                               (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") + ")");
    }
    check_cuda(cudaSetDevice(0), "cudaSetDevice");
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    int l2 = 0;
    check_cuda(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0), "cudaDeviceGetAttribute(L2)");
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    CudaDevice d;
    d.name = prop.name;
    d.cc_major = prop.major;
    d.cc_minor = prop.minor;
    d.n_sm = prop.multiProcessorCount;
    d.l2_bytes = static_cast<std::uint64_t>(l2);
    d.memory_bytes = total_bytes;
    d.memory_free_bytes = free_bytes;
    return d;
}

// K's (or V's) rows as the device stores them: values in the dtype's bits (or fp8 codes) at row b*T+t, or
// at row table[b*n_blocks + t/block]*block + t%block of the pool; rows no token uses hold all-ones bytes
// (NaN in fp16, bf16 and e4m3), so a kernel that reads one fails the check.
std::vector<unsigned char> stored_bytes(const GpuAttentionProblem& p, const GpuAttentionInputs& in, bool values_of_v) {
    const std::uint64_t d_kv = static_cast<std::uint64_t>(p.shape.n_head_kv * p.shape.d_head);
    const std::uint64_t row_bytes = d_kv * kv_value_bytes(p);
    std::vector<unsigned char> out(stored_rows(p) * row_bytes, 0xFF);
    const std::vector<float>& values = values_of_v ? in.v : in.k;
    const std::vector<std::uint8_t>& codes = values_of_v ? in.v_fp8 : in.k_fp8;
    const std::uint64_t n_logical = static_cast<std::uint64_t>(p.n_batch * p.n_tokens);
    if (values.size() != n_logical * d_kv || (p.kv_fp8 && codes.size() != values.size()) ||
        (paged(p) && in.block_table.size() != static_cast<std::uint64_t>(p.n_batch) * blocks_per_sequence(p)))
        throw IoError("gpu attention run: the inputs do not match the problem's batch, context, layout or KV dtype");
    const std::uint64_t n_pool = static_cast<std::uint64_t>(p.n_batch) * blocks_per_sequence(p);
    for (std::uint64_t row = 0; row < n_logical; ++row) {
        const std::uint64_t b = row / static_cast<std::uint64_t>(p.n_tokens);
        const std::uint64_t t = row % static_cast<std::uint64_t>(p.n_tokens);
        std::uint64_t dst = row;
        if (paged(p)) {
            const std::uint64_t bs = static_cast<std::uint64_t>(p.block_size);
            const std::int32_t block = in.block_table[b * blocks_per_sequence(p) + t / bs];
            if (block < 0 || static_cast<std::uint64_t>(block) >= n_pool)
                throw IoError("gpu attention run: block table entry " + std::to_string(block) + " is outside the pool");
            dst = static_cast<std::uint64_t>(block) * bs + t % bs;
        }
        if (p.kv_fp8) {
            std::memcpy(out.data() + dst * row_bytes, codes.data() + row * d_kv, row_bytes);
        } else {
            const std::vector<float> one(values.begin() + static_cast<std::ptrdiff_t>(row * d_kv),
                                         values.begin() + static_cast<std::ptrdiff_t>((row + 1) * d_kv));
            const std::vector<std::uint16_t> bits = to_device_bits(one, p.dtype);
            std::memcpy(out.data() + dst * row_bytes, bits.data(), row_bytes);
        }
    }
    return out;
}

void upload_bytes(void* dst, const void* src, std::uint64_t bytes) {
    check_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy upload");
}

// The cached path's inputs on the device: K and V where the layout puts them, and the block table.
void upload_cached(const GpuAttentionProblem& p, const GpuAttentionInputs& in, const ProblemBuffers& b) {
    if (!paged(p) && !p.kv_fp8) {
        std::vector<float> kv = in.k;
        kv.insert(kv.end(), in.v.begin(), in.v.end());
        const std::vector<std::uint16_t> bits = to_device_bits(kv, p.dtype);
        upload_bytes(b.kv.get(), bits.data(), b.n_kv * 2);
        upload_bytes(static_cast<char*>(b.kv.get()) + b.v_offset, bits.data() + b.n_kv, b.n_kv * 2);
    } else {
        const std::vector<unsigned char> k = stored_bytes(p, in, false);
        const std::vector<unsigned char> v = stored_bytes(p, in, true);
        upload_bytes(b.kv.get(), k.data(), k.size());
        upload_bytes(static_cast<char*>(b.kv.get()) + b.v_offset, v.data(), v.size());
    }
    if (paged(p)) upload_bytes(b.table.get(), in.block_table.data(), b.table.bytes());
}

// Both paths once on the given inputs (the uncached one only where the problem has it).
GpuAttentionOutputs attention_run(const GpuAttentionProblem& p, const GpuAttentionInputs& in, int n_split) {
    const CudaDevice dev = device_info();
    GpuAttentionOutputs result;
    const bool tensor_cores = cuda::decode_attention_use_tensor_cores(p.kernel, p.shape);
    result.kernel = tensor_cores ? GpuAttentionKernel::tensor_cores : GpuAttentionKernel::cuda_cores;
    result.n_split = cuda::decode_attention_splits(p.shape, p.n_batch, p.n_tokens, dev.n_sm, n_split, tensor_cores);
    for (const GpuAttentionPath path : {GpuAttentionPath::cached, GpuAttentionPath::uncached}) {
        if (path == GpuAttentionPath::uncached && !has_uncached(p)) break;
        const ProblemBuffers b(p, path, result.n_split);
        upload(b.q, in.q, p.dtype);
        if (path == GpuAttentionPath::cached) {
            upload_cached(p, in, b);
        } else {
            upload(b.x, in.x, p.dtype);
            upload(b.w, in.w_kv, p.dtype);
            check_cuda(cudaMemset(b.kv.get(), 0xFF, b.kv.bytes()), "cudaMemset");  // NaN until the GEMM writes it
        }
        // All-ones bits are NaN in fp16 and bf16: an output the kernels leave unwritten fails the check.
        check_cuda(cudaMemset(b.out.get(), 0xFF, b.out.bytes()), "cudaMemset");
        const cuda::DecodeAttentionArgs args = attention_args(p, path, b, result.n_split, tensor_cores, in.k_scale, in.v_scale);
        if (path == GpuAttentionPath::uncached) {
            Blas blas;
            enqueue_step(p, path, b, blas.get(), args);
        } else {
            enqueue_step(p, path, b, nullptr, args);
        }
        check_cuda(cudaDeviceSynchronize(), "attention run");
        std::vector<float> out = download(b.out, b.n_q, p.dtype);
        (path == GpuAttentionPath::cached ? result.out_cached : result.out_uncached) = std::move(out);
    }
    return result;
}

// x (n) of pseudo-random e4m3 codes, every code but the two NaNs (S.1111.111 becomes S.1111.110, 448).
__global__ void fill_fp8_kernel(std::uint8_t* x, long long n, unsigned long long seed) {
    for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<long long>(gridDim.x) * blockDim.x) {
        const unsigned long long h = mix64(static_cast<unsigned long long>(i) + seed);
        const unsigned code = static_cast<unsigned>(h >> 56);
        x[i] = static_cast<std::uint8_t>((code & 0x7Fu) == 0x7Fu ? code - 1 : code);
    }
}

// The timed cached path's K and V: random values (or codes) over the whole store, and for a paged cache a
// block table that is a shuffled permutation of the pool, as a pool that has served many requests is (or,
// with shuffled_blocks false, each sequence's blocks in order).
void fill_cached(const GpuAttentionProblem& p, const ProblemBuffers& b) {
    char* kv = static_cast<char*>(b.kv.get());
    for (const std::uint64_t offset : {std::uint64_t{0}, b.v_offset}) {
        if (p.kv_fp8) {
            fill_fp8_kernel<<<1024, 256>>>(reinterpret_cast<std::uint8_t*>(kv + offset), static_cast<long long>(b.n_kv), 2 + offset);
            check_cuda(cudaGetLastError(), "fill_fp8 launch");
        } else {
            fill_random(kv + offset, b.n_kv, p.dtype, 2 + offset, 1.0f);
        }
    }
    if (paged(p)) {
        std::vector<std::int32_t> table(b.n_table);
        for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<std::int32_t>(i);
        if (p.shuffled_blocks) {
            std::mt19937_64 rng(0x5eed);
            std::shuffle(table.begin(), table.end(), rng);
        }
        upload_bytes(b.table.get(), table.data(), b.table.bytes());
    }
}

GpuTiming attention_time(const GpuAttentionProblem& p, GpuAttentionPath path, int n_sm, std::uint64_t flush_bytes,
                         int n_warmup, int n_repeat) {
    if (path == GpuAttentionPath::uncached && !has_uncached(p))
        throw UsageError("gpu attention: the uncached step is timed for contiguous 16-bit caches only");
    const bool tensor_cores = cuda::decode_attention_use_tensor_cores(p.kernel, p.shape);
    const int n_split = cuda::decode_attention_splits(p.shape, p.n_batch, p.n_tokens, n_sm, 0, tensor_cores);
    if (paged(p) && static_cast<std::uint64_t>(p.n_batch) * blocks_per_sequence(p) > 0x7fffffffu)
        throw UsageError("gpu attention: more pool blocks than an int32 block table can name");
    const ProblemBuffers b(p, path, n_split);
    DeviceBuffer flush(flush_bytes, "the L2 flush buffer");
    fill_random(b.q.get(), b.n_q, p.dtype, 1, 1.0f);
    if (path == GpuAttentionPath::cached) {
        fill_cached(p, b);
    } else {
        fill_random(b.x.get(), b.n_x, p.dtype, 3, 1.0f);
        fill_random(b.w.get(), b.n_w, p.dtype, 4, 1.0f / std::sqrt(static_cast<float>(p.d_model)));
    }
    check_cuda(cudaDeviceSynchronize(), "random fill");
    // fp8 codes span +-448: a scale of 1/448 keeps K and V in [-1, 1] as the 16-bit fills are
    const float scale = p.kv_fp8 ? 1.0f / 448.0f : 1.0f;
    const cuda::DecodeAttentionArgs args = attention_args(p, path, b, n_split, tensor_cores, scale, scale);
    std::optional<Blas> blas;
    if (path == GpuAttentionPath::uncached) blas.emplace();
    GpuTiming t = time_events(
        n_warmup, n_repeat, [&] { enqueue_step(p, path, b, blas ? blas->get() : nullptr, args); },
        [&](int r) {
            check_cuda(cudaMemsetAsync(flush.get(), r & 0xFF, flush.bytes(), nullptr), "L2 flush");
        });
    t.n_split = n_split;
    t.kernel = tensor_cores ? GpuAttentionKernel::tensor_cores : GpuAttentionKernel::cuda_cores;
    return t;
}

GpuTiming copy_time(std::uint64_t bytes, int n_warmup, int n_repeat) {
    device_info();
    DeviceBuffer src(bytes, "the copy source");
    DeviceBuffer dst(bytes, "the copy destination");
    fill_random(src.get(), bytes / 2, DType::fp16, 5, 1.0f);
    check_cuda(cudaDeviceSynchronize(), "random fill");
    return time_events(
        n_warmup, n_repeat,
        [&] { check_cuda(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, nullptr), "copy"); },
        [](int) {});
}

// Reads x (n 16-byte words) in a grid-stride loop unrolled U times (U independent loads per step; how
// many the compiler keeps in flight is its choice); each warp writes the XOR of every word it read to
// sink[warp], so no load can be dropped and the host can check that every byte was read.
template <int U>
__global__ void read_kernel(const uint4* x, long long n, unsigned* sink) {
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
    long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
    unsigned acc = 0;
    for (; i + (U - 1) * stride < n; i += U * stride) {
        uint4 w[U];
#pragma unroll
        for (int u = 0; u < U; ++u) w[u] = __ldcs(x + i + u * stride);
#pragma unroll
        for (int u = 0; u < U; ++u) acc ^= w[u].x ^ w[u].y ^ w[u].z ^ w[u].w;
    }
    for (; i < n; i += stride) {
        const uint4 w = __ldcs(x + i);
        acc ^= w.x ^ w.y ^ w.z ^ w.w;
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) acc ^= __shfl_xor_sync(0xffffffffu, acc, off);
    if (threadIdx.x % 32 == 0) sink[(blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x) / 32] = acc;
}

// The fastest of three read patterns (the loop unrolled 4, 8, 16 times), a grid of 8 blocks of 256
// threads per multiprocessor. Each pattern's sink must XOR to the XOR of the buffer's words, computed on
// the host from a copy.
GpuTiming read_time(std::uint64_t bytes, int n_warmup, int n_repeat) {
    const CudaDevice dev = device_info();
    const std::uint64_t n_words = bytes / 16;
    if (n_words == 0) throw UsageError("the read reference needs at least 16 bytes");
    DeviceBuffer src(n_words * 16, "the read source");
    const unsigned n_blocks = 8u * static_cast<unsigned>(std::max(dev.n_sm, 1));
    const std::uint64_t n_warps = static_cast<std::uint64_t>(n_blocks) * (256 / 32);
    DeviceBuffer sink(n_warps * sizeof(unsigned), "the read sink");
    fill_random(src.get(), n_words * 8, DType::fp16, 6, 1.0f);
    check_cuda(cudaDeviceSynchronize(), "random fill");
    unsigned expect = 0;  // XOR of the buffer's words, on the host, 64 MiB at a time
    std::vector<unsigned> host(std::min<std::uint64_t>(n_words, 1 << 22) * 4);
    for (std::uint64_t w0 = 0; w0 < n_words; w0 += host.size() / 4) {
        const std::uint64_t n_piece = std::min<std::uint64_t>(host.size() / 4, n_words - w0);
        check_cuda(cudaMemcpy(host.data(), static_cast<const char*>(src.get()) + w0 * 16, n_piece * 16,
                              cudaMemcpyDeviceToHost),
                   "cudaMemcpy read source");
        for (std::uint64_t i = 0; i < n_piece * 4; ++i) expect ^= host[i];
    }
    host = {};
    const auto* x = static_cast<const uint4*>(src.get());
    auto* out = static_cast<unsigned*>(sink.get());
    const long long n = static_cast<long long>(n_words);
    GpuTiming best;
    for (const int u : {4, 8, 16}) {
        const auto launch = [&] {
            if (u == 4) read_kernel<4><<<n_blocks, 256>>>(x, n, out);
            else if (u == 8) read_kernel<8><<<n_blocks, 256>>>(x, n, out);
            else read_kernel<16><<<n_blocks, 256>>>(x, n, out);
            check_cuda(cudaGetLastError(), "read kernel launch");
        };
        check_cuda(cudaMemset(sink.get(), 0, sink.bytes()), "cudaMemset");
        GpuTiming t = time_events(n_warmup, n_repeat, launch, [](int) {});
        std::vector<unsigned> got(n_warps);
        check_cuda(cudaMemcpy(got.data(), sink.get(), sink.bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy read sink");
        unsigned sum = 0;
        for (const unsigned w : got) sum ^= w;
        if (sum != expect)
            throw IoError("the read reference with " + std::to_string(u) + " loads per thread did not read every byte");
        t.unroll = u;
        if (best.n_repeat == 0 || t.median_ns < best.median_ns) best = t;
    }
    return best;
}

// Runs `f`, handing what it throws back as a Status (module_api.hpp: no exception leaves the module).
template <typename F>
void guarded(cuda::Status& status, F&& f) noexcept {
    try {
        f();
    } catch (const InputError& e) {
        status = {cuda::ErrorKind::usage, e.what()};
    } catch (const UnavailableError& e) {
        status = {cuda::ErrorKind::unavailable, e.what()};
    } catch (const std::exception& e) {
        status = {cuda::ErrorKind::io, e.what()};
    } catch (...) {
        status = {cuda::ErrorKind::io, "the CUDA module failed with an unknown exception"};
    }
}

}  // namespace

}  // namespace kvlab

extern "C" __attribute__((visibility("default"))) const kvlab::cuda::ModuleApi* kvlab_cuda_module() {
    using namespace kvlab;
    using cuda::Status;
    static const cuda::ModuleApi api{
        cuda::module_version,
        [](Status& s, CudaDevice& out) { guarded(s, [&] { out = device_info(); }); },
        [](Status& s, const GpuAttentionProblem& p, const GpuAttentionInputs& in, int n_split, GpuAttentionOutputs& out) {
            guarded(s, [&] { out = attention_run(p, in, n_split); });
        },
        [](Status& s, const GpuAttentionProblem& p, GpuAttentionPath path, int n_sm, std::uint64_t flush_bytes,
           int n_warmup, int n_repeat, GpuTiming& out) {
            guarded(s, [&] { out = attention_time(p, path, n_sm, flush_bytes, n_warmup, n_repeat); });
        },
        [](Status& s, std::uint64_t bytes, int n_warmup, int n_repeat, GpuTiming& out) {
            guarded(s, [&] { out = copy_time(bytes, n_warmup, n_repeat); });
        },
        [](Status& s, std::uint64_t bytes, int n_warmup, int n_repeat, GpuTiming& out) {
            guarded(s, [&] { out = read_time(bytes, n_warmup, n_repeat); });
        },
    };
    return &api;
}
