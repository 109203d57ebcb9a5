// The boundary between kvlab and its CUDA module, libkvlab_cuda.so. The host opens the module with dlopen
// on the first call that needs the GPU (src/gpu/gpu_attention_cuda.cpp), so a process that never does, such
// as `kvlab simulate`, maps neither the CUDA runtime nor the kernels: their code pages would otherwise sit
// in its resident set, which simulate's memory target counts. Host and module compile this header in the
// same build; the module reports the version it was built with. No exception crosses the boundary: every
// call catches in the module and hands back what it caught as a Status, which the host throws again as
// the same kind of kvlab error.
#pragma once
#include <cstdint>
#include <string>

#include "gpu/gpu_attention.hpp"

namespace kvlab::cuda {

inline constexpr int module_version = 6;                 // bump when ModuleApi or a type it passes changes
inline constexpr const char* module_entry = "kvlab_cuda_module";  // extern "C" () -> const ModuleApi*

enum class ErrorKind { none, usage, io, unavailable };   // UsageError, IoError, UnavailableError

struct Status {
    ErrorKind kind = ErrorKind::none;
    std::string message;
};

// The device halves of the calls include/gpu/gpu_attention.hpp declares. The host has already checked
// the problem (validate_gpu_attention_problem), the input sizes and the device memory a timing needs.
struct ModuleApi {
    int version = 0;
    void (*device)(Status& status, CudaDevice& out) = nullptr;
    void (*attention_run)(Status& status, const GpuAttentionProblem& problem, const GpuAttentionInputs& inputs,
                          int n_split, GpuAttentionOutputs& out) = nullptr;
    // n_sm: the device's multiprocessors (CudaDevice, already queried by the host); flush_bytes: the
    // buffer written before every repeat to evict L2
    void (*attention_time)(Status& status, const GpuAttentionProblem& problem, GpuAttentionPath path, int n_sm,
                           std::uint64_t flush_bytes, int n_warmup, int n_repeat, GpuTiming& out) = nullptr;
    void (*copy_time)(Status& status, std::uint64_t bytes, int n_warmup, int n_repeat, GpuTiming& out) = nullptr;
    void (*read_time)(Status& status, std::uint64_t bytes, int n_warmup, int n_repeat, GpuTiming& out) = nullptr;
};

using ModuleEntry = const ModuleApi* (*)();

}  // namespace kvlab::cuda
