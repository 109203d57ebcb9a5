// `kvlab gpu attention` as a library call: the native shape (from a model or explicit sizes), every
// list parsed and every problem validated before the device is touched, correctness against the CPU
// reference first, then the bandwidth reference and the timing grid, as one Report.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kvlab/core/printer.hpp"

namespace kvlab {

struct GpuAttentionRequest {
    std::string model;                 // preset name or config path; empty: the explicit sizes below
    std::int64_t n_head = 0;           // --heads
    std::int64_t n_head_kv = 0;        // --kv-heads (0: same as --heads)
    std::int64_t d_head = 0;           // --head-dim
    std::int64_t d_model = 0;          // --hidden (0: heads x head dim)
    std::string batch = "1,8,64";
    std::string context = "1k,8k";
    std::string dtype = "fp16";
    std::string attention = "native";
    std::string kernel = "auto";       // comma-separated: auto, cuda-cores, tensor-cores
    std::string kv_layout = "contiguous";  // comma-separated: contiguous, paged
    std::string block_order = "shuffled";  // paged: shuffled or in-order block tables
    std::string block_size = "16";     // tokens per block of the paged layout, comma-separated (vLLM's default 16)
    std::string kv_dtype = "dtype";    // comma-separated: dtype (the --dtype), fp16, bf16, fp8_e4m3 (alias fp8)
    int n_warmup = 3;
    int n_repeat = 20;
    std::uint64_t seed = 1;
};

// The report, and when a correctness check failed, why (the report then holds the checks only and no
// timings). Throws UsageError for bad requests, Error when the build has no CUDA or no device is present.
struct GpuAttentionRun {
    Report report;
    std::string failure;
};
GpuAttentionRun run_gpu_attention(const GpuAttentionRequest& request);

// The timing table's note when cached steps moved more bytes per second than the read reference (their
// "% of read" above 100): on that device the reference is then no ceiling. Empty when none did.
std::string read_reference_note(const std::vector<double>& read_percent);

}  // namespace kvlab
