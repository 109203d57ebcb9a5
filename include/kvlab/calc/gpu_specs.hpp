// GPU presets (presets/gpus.json): memory size, bandwidth and dense FP16/BF16 FLOP/s, with sources.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvlab {

struct GpuSpec {
    std::string name;                 // e.g. "h100-sxm-80gb"
    std::string display_name;         // e.g. "NVIDIA H100 SXM 80GB"
    std::uint64_t memory_bytes = 0;           // nominal capacity ("80GB" = 80 GiB, see gpus.json)
    std::uint64_t driver_bytes = 0;           // nvidia-smi memory.total: what an engine sees; 0 = unknown
    std::vector<std::string> aliases;         // e.g. "h100"
    std::uint64_t bandwidth_bytes_per_s = 0;
    double fp16_dense_flops = 0;      // FLOP/s, dense (no sparsity)
    double bf16_dense_flops = 0;
    std::string source;
};

std::vector<GpuSpec> load_gpus();                 // throws ConfigError on a malformed gpus.json
// name or alias, in any letter case; UsageError with "did you mean" for unknown names, and for a count
// before the name ("2xh100") the advice to give the count with --gpus.
GpuSpec find_gpu(std::string_view name);
// A GPU count written before the name: "2xh100", "8x a100", "2*h100" -> {2, "h100", true}; {1, text, false} without one.
struct GpuCount {
    std::uint64_t n_gpus = 1;
    std::string name;
    bool counted = false;
};
GpuCount split_gpu_count(std::string_view text);
// Memory an engine can allocate from: the driver-reported total when known, else the nominal capacity.
std::uint64_t usable_gpu_bytes(const GpuSpec& gpu);
// Whether the GPU is an A100: its name or display name holds "a100", in any case, as vLLM tests the
// device name torch reports ("NVIDIA A100-SXM4-80GB").
bool gpu_is_a100(const GpuSpec& gpu);

// Modelled time of work on one GPU by the roofline model (Williams, Waterman and Patterson, CACM 2009):
// max(FLOPs / dense BF16 peak, bytes / memory bandwidth), the least time a kernel that overlaps compute
// and memory traffic perfectly can take. A model, not a measurement: real kernels take longer (launches,
// occupancy, imperfect overlap). docs/kv-memory.md, "Modelled GPU time".
struct RooflineTime {
    double compute_s = 0;   // FLOPs / peak
    double memory_s = 0;    // bytes / bandwidth
    double seconds() const { return compute_s > memory_s ? compute_s : memory_s; }
    bool memory_bound() const { return memory_s >= compute_s; }
};
// Throws UsageError when the GPU has no bandwidth or no BF16 peak (a --gpu-mem description).
RooflineTime roofline_time(const GpuSpec& gpu, double flops, double bytes);

}  // namespace kvlab
