// What the CUDA device tests share (test_gpu_attention.cpp, test_gpu_paged_fp8.cpp): whether a device
// answers, and whether this device and module run the tensor-core kernel.
#pragma once
#include <doctest/doctest.h>

#include <string>

#include "kvlab/core/error.hpp"
#include "gpu/gpu_attention.hpp"

namespace kvlab::test {

// One device case: a shape and the kernel it must run on.
struct KernelCase {
    AttentionShape shape;
    GpuAttentionKernel kernel;
};

// True when this build has CUDA and a device answers; otherwise `why` says which is missing.
inline bool device_present(std::string& why) {
    try {
        (void)cuda_device();
        return true;
    } catch (const UnavailableError& e) {
        why = e.what();
        return false;
    }
}

// Whether the tensor-core kernel runs here (compute capability 8.0+, a module compiled for it): asked of the
// module itself, which refuses --kernel tensor-cores with a usage error otherwise (the test then says why).
inline bool tensor_cores_run() {
    GpuAttentionProblem probe;
    probe.shape = {16, 1, 64};
    probe.kernel = GpuAttentionKernel::tensor_cores;
    probe.d_model = 64;
    try {
        (void)gpu_attention_check(probe, 1);
        return true;
    } catch (const UsageError& e) {
        MESSAGE("tensor-core cases skipped: " << e.what());
        return false;
    }
}

}  // namespace kvlab::test
