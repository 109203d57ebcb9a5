// The device half of include/gpu/gpu_attention.hpp for builds without CUDA: every call says so.
#include "kvlab/core/error.hpp"
#include "gpu/gpu_attention.hpp"

namespace kvlab {

namespace {

[[noreturn]] void throw_no_cuda() {
    throw UnavailableError("this kvlab was built without CUDA (configure with -DKVLAB_CUDA=ON on a machine with nvcc)");
}

}  // namespace

bool cuda_built() { return false; }

CudaDevice cuda_device() { throw_no_cuda(); }

GpuAttentionOutputs gpu_attention_run(const GpuAttentionProblem&, const GpuAttentionInputs&, int) { throw_no_cuda(); }

GpuTiming gpu_attention_time(const GpuAttentionProblem&, GpuAttentionPath, int, int) { throw_no_cuda(); }

GpuTiming cuda_copy_time(std::uint64_t, int, int) { throw_no_cuda(); }
GpuTiming cuda_read_time(std::uint64_t, int, int) { throw_no_cuda(); }

}  // namespace kvlab
