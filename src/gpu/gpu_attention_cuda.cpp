// The device half of include/gpu/gpu_attention.hpp in builds with CUDA: checks each call on the host,
// then hands it to the CUDA module (src/gpu/cuda/module_api.hpp), opened with dlopen on the first call.
#include <dlfcn.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gpu/cuda/module_api.hpp"
#include "kvlab/core/error.hpp"
#include "gpu/gpu_attention.hpp"

namespace kvlab {

namespace {

// Where the module may be, in order: beside the running kvlab (the build tree), the install location, and
// the build tree by absolute path (for the test binaries, which live in a subfolder).
std::vector<std::string> module_paths() {
    std::vector<std::string> paths;
    auto add = [&](const std::string& path) {
        if (std::find(paths.begin(), paths.end(), path) == paths.end()) paths.push_back(path);
    };
    std::error_code ec;
    const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (!ec) add((exe.parent_path() / KVLAB_CUDA_MODULE_NAME).string());
    add(KVLAB_CUDA_MODULE_INSTALLED);
    add(KVLAB_CUDA_MODULE_BUILT);
    return paths;
}

const cuda::ModuleApi& load_module() {
    std::string tried;
    for (const std::string& path : module_paths()) {
        void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);  // never closed: the module lives as long as kvlab
        if (lib == nullptr) {
            const char* why = ::dlerror();
            tried += fmt::format("{}{}", tried.empty() ? "" : "; ", why ? why : path);
            continue;
        }
        const auto entry = reinterpret_cast<cuda::ModuleEntry>(::dlsym(lib, cuda::module_entry));
        if (entry == nullptr)
            throw UnavailableError(fmt::format("{} is not a kvlab CUDA module (it has no {})", path, cuda::module_entry));
        const cuda::ModuleApi* api = entry();
        if (api->version != cuda::module_version)
            throw UnavailableError(fmt::format("{} is CUDA module version {}, this kvlab needs version {}: rebuild or "
                                               "reinstall kvlab",
                                               path, api->version, cuda::module_version));
        return *api;
    }
    throw UnavailableError(fmt::format("this kvlab was built with CUDA but cannot load its CUDA module {} ({})",
                                       KVLAB_CUDA_MODULE_NAME, tried));
}

const cuda::ModuleApi& module() {
    static const cuda::ModuleApi& api = load_module();  // a throw leaves it unset: the next call tries again
    return api;
}

// Calls a module function and throws what it reports as the kvlab error of the same kind.
template <typename Fn, typename... Args>
void call(Fn fn, Args&&... args) {
    cuda::Status status;
    fn(status, std::forward<Args>(args)...);
    switch (status.kind) {
    case cuda::ErrorKind::none: return;
    case cuda::ErrorKind::usage: throw UsageError(status.message);
    case cuda::ErrorKind::unavailable: throw UnavailableError(status.message);
    case cuda::ErrorKind::io: throw IoError(status.message);
    }
    throw IoError(fmt::format("the CUDA module reported an unknown error kind: {}", status.message));
}

void expect_size(const std::vector<float>& v, std::uint64_t n, const char* name) {
    if (v.size() != n)
        throw UsageError(fmt::format("gpu_attention_run: {} has {} values, expected {}", name, v.size(), n));
}

}  // namespace

bool cuda_built() { return true; }

CudaDevice cuda_device() {
    CudaDevice d;
    call(module().device, d);
    return d;
}

GpuAttentionOutputs gpu_attention_run(const GpuAttentionProblem& p, const GpuAttentionInputs& in, int n_split) {
    validate_gpu_attention_problem(p, "gpu_attention_run");
    (void)gpu_attention_cost(p);  // overflow-checks every product below (it throws OverflowError)
    const auto d_kv = static_cast<std::uint64_t>(p.shape.n_head_kv * p.shape.d_head);
    const auto rows = static_cast<std::uint64_t>(p.n_batch * p.n_tokens);
    expect_size(in.q, static_cast<std::uint64_t>(p.n_batch * p.shape.n_head * p.shape.d_head), "q");
    expect_size(in.k, rows * d_kv, "k");
    expect_size(in.v, rows * d_kv, "v");
    expect_size(in.x, rows * static_cast<std::uint64_t>(p.d_model), "x");
    expect_size(in.w_kv, static_cast<std::uint64_t>(p.d_model) * 2 * d_kv, "w_kv");
    if (p.kv_fp8 && (in.k_fp8.size() != rows * d_kv || in.v_fp8.size() != rows * d_kv))
        throw UsageError(fmt::format("gpu_attention_run: k_fp8 / v_fp8 have {} / {} codes, expected {}", in.k_fp8.size(),
                                     in.v_fp8.size(), rows * d_kv));
    if (p.block_size > 0) {
        const auto n_table = static_cast<std::uint64_t>(p.n_batch) *
                             static_cast<std::uint64_t>((p.n_tokens + p.block_size - 1) / p.block_size);
        if (in.block_table.size() != n_table)
            throw UsageError(fmt::format("gpu_attention_run: the block table has {} entries, expected {}",
                                         in.block_table.size(), n_table));
    }
    GpuAttentionOutputs out;
    call(module().attention_run, p, in, n_split, out);
    return out;
}

GpuTiming gpu_attention_time(const GpuAttentionProblem& p, GpuAttentionPath path, int n_warmup, int n_repeat) {
    validate_gpu_attention_problem(p, "gpu_attention_time");
    const CudaDevice dev = cuda_device();
    const GpuAttentionCost cost = gpu_attention_cost(p);
    const std::uint64_t flush_bytes = 2 * dev.l2_bytes;  // twice L2 evicts everything the last run left there
    const std::uint64_t need =
        (path == GpuAttentionPath::cached ? cost.cached_device_bytes : cost.uncached_device_bytes) + flush_bytes;
    if (need > dev.memory_free_bytes)
        throw UsageError(fmt::format("batch {} x context {}: the {} step needs {} bytes of device memory, {} are free",
                                     p.n_batch, p.n_tokens, gpu_attention_path_name(path), need, dev.memory_free_bytes));
    GpuTiming t;
    call(module().attention_time, p, path, dev.n_sm, flush_bytes, n_warmup, n_repeat, t);
    return t;
}

GpuTiming cuda_copy_time(std::uint64_t bytes, int n_warmup, int n_repeat) {
    GpuTiming t;
    call(module().copy_time, bytes, n_warmup, n_repeat, t);
    return t;
}

GpuTiming cuda_read_time(std::uint64_t bytes, int n_warmup, int n_repeat) {
    GpuTiming t;
    call(module().read_time, bytes, n_warmup, n_repeat, t);
    return t;
}

}  // namespace kvlab
