// The GPU attention path: host-side counts, variants and rounding everywhere; the kernels against the
// CPU reference only where a CUDA device is present (elsewhere the device test says why it skipped).
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "kvlab/core/error.hpp"
#include "gpu/gpu_attention.hpp"
#include "gpu/gpu_attention_report.hpp"

using namespace kvlab;

namespace {

GpuAttentionProblem llama3_8b_problem() {
    GpuAttentionProblem p;
    p.shape = AttentionShape{32, 8, 128};  // Llama-3-8B: 32 query heads, 8 KV heads, head dim 128
    p.d_model = 4096;
    p.n_batch = 64;
    p.n_tokens = 8192;
    p.dtype = DType::fp16;
    return p;
}

// True when this build has CUDA and a device answers; otherwise `why` says which is missing.
bool device_present(std::string& why) {
    try {
        (void)cuda_device();
        return true;
    } catch (const UnavailableError& e) {
        why = e.what();
        return false;
    }
}

}  // namespace

TEST_CASE("The cached and uncached step costs of a Llama-3-8B layer at batch 64 and 8k context are counted exactly") {
    const GpuAttentionCost c = gpu_attention_cost(llama3_8b_problem());
    CHECK(c.kv_bytes == 2147483648ull);          // 64 B * 8192 T * 8 Hkv * 128 D * 2 (K,V) * 2 B = 2 GiB
    CHECK(c.cached_bytes == 2148532224ull);      // + q and out, 64*32*128*2 B = 512 KiB each
    CHECK(c.cached_flops == 8589934592.0);       // 4 * 64 * 32 * 128 * 8192
    // X 64*8192*4096*2 B + W 4096*2048*2 B + K,V written and read 2 * 2 GiB + q + out
    CHECK(c.uncached_bytes == 8607760384ull);
    CHECK(c.uncached_flops == 8804682956800.0);  // GEMM 2*(64*8192)*4096*(2*1024) + attention 4*64*32*128*8192
    CHECK(c.uncached_device_bytes > c.cached_device_bytes);
}

TEST_CASE("The cost of an fp16 step does not depend on the hidden size for the cached path") {
    GpuAttentionProblem a = llama3_8b_problem();
    GpuAttentionProblem b = a;
    b.d_model = 8192;
    CHECK(gpu_attention_cost(a).cached_bytes == gpu_attention_cost(b).cached_bytes);
    CHECK(gpu_attention_cost(a).uncached_bytes < gpu_attention_cost(b).uncached_bytes);
}

TEST_CASE("Attention variants set the KV head count and reject counts that do not divide the query heads") {
    const AttentionShape native{32, 8, 128};
    CHECK(attention_variant(native, "native", "--attention").n_head_kv == 8);
    CHECK(attention_variant(native, "mha", "--attention").n_head_kv == 32);
    CHECK(attention_variant(native, "mqa", "--attention").n_head_kv == 1);
    CHECK(attention_variant(native, "gqa:4", "--attention").n_head_kv == 4);
    CHECK(attention_variant(native, "gqa:4", "--attention").d_head == 128);
    CHECK_THROWS_AS(attention_variant(native, "gqa:5", "--attention"), UsageError);   // 32 % 5 != 0
    CHECK_THROWS_AS(attention_variant(native, "gqa:64", "--attention"), UsageError);  // more KV heads than heads
    CHECK_THROWS_AS(attention_variant(native, "gqa:x", "--attention"), UsageError);
    CHECK_THROWS_WITH_AS(attention_variant(native, "mla", "--attention"),
                         doctest::Contains("unknown attention variant 'mla'"), UsageError);
}

TEST_CASE("Problems the kernel cannot run are rejected before any device work") {
    GpuAttentionProblem p = llama3_8b_problem();
    CHECK_NOTHROW(validate_gpu_attention_problem(p, "--test"));
    p.dtype = DType::fp32;
    CHECK_THROWS_WITH_AS(validate_gpu_attention_problem(p, "--dtype"), doctest::Contains("expected fp16 or bf16"),
                         UsageError);
    p = llama3_8b_problem();
    p.shape.d_head = 100;  // not a multiple of 8
    CHECK_THROWS_AS(validate_gpu_attention_problem(p, "--head-dim"), UsageError);
    p.shape.d_head = 512;  // above the 256 the kernel handles
    CHECK_THROWS_AS(validate_gpu_attention_problem(p, "--head-dim"), UsageError);
    p = llama3_8b_problem();
    p.shape.n_head_kv = 3;  // 32 % 3 != 0
    CHECK_THROWS_AS(validate_gpu_attention_problem(p, "--kv-heads"), UsageError);
    p = llama3_8b_problem();
    p.n_tokens = 1ll << 30;  // 64 * 2^30 rows exceed cuBLAS's int
    CHECK_THROWS_AS(validate_gpu_attention_problem(p, "--context"), UsageError);
}

TEST_CASE("The tensor-core kernel is asked for by name and takes head dims 64 and 128 only") {
    CHECK(parse_gpu_attention_kernel("auto", "--kernel") == GpuAttentionKernel::automatic);
    CHECK(parse_gpu_attention_kernel("cuda-cores", "--kernel") == GpuAttentionKernel::cuda_cores);
    CHECK(parse_gpu_attention_kernel("tensor-cores", "--kernel") == GpuAttentionKernel::tensor_cores);
    CHECK_THROWS_WITH_AS(parse_gpu_attention_kernel("wmma", "--kernel"),
                         "--kernel 'wmma': expected auto, cuda-cores or tensor-cores", UsageError);
    for (const GpuAttentionKernel k :
         {GpuAttentionKernel::automatic, GpuAttentionKernel::cuda_cores, GpuAttentionKernel::tensor_cores})
        CHECK(parse_gpu_attention_kernel(gpu_attention_kernel_name(k), "--kernel") == k);  // names round-trip
    GpuAttentionProblem p = llama3_8b_problem();
    p.kernel = GpuAttentionKernel::tensor_cores;
    CHECK_NOTHROW(validate_gpu_attention_problem(p, "--kernel"));  // D 128
    p.shape.d_head = 64;
    CHECK_NOTHROW(validate_gpu_attention_problem(p, "--kernel"));
    for (const std::int64_t d : {8, 96, 256}) {  // fine for the CUDA cores, not for the tensor-core tiles
        p.shape.d_head = d;
        p.kernel = GpuAttentionKernel::cuda_cores;
        CHECK_NOTHROW(validate_gpu_attention_problem(p, "--kernel"));
        p.kernel = GpuAttentionKernel::automatic;
        CHECK_NOTHROW(validate_gpu_attention_problem(p, "--kernel"));
        p.kernel = GpuAttentionKernel::tensor_cores;
        CHECK_THROWS_WITH_AS(validate_gpu_attention_problem(p, "--kernel"), doctest::Contains("expected 64 or 128"),
                             UsageError);
    }
}

TEST_CASE("Rounding to fp16 and bf16 is round-to-nearest-even as the device stores values") {
    CHECK(round_to_dtype(1.0f, DType::fp16) == 1.0f);
    CHECK(round_to_dtype(1.0f + std::ldexp(1.0f, -11), DType::fp16) == 1.0f);  // halfway, ties to even 1.0
    // 1 + 3*2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even)
    CHECK(round_to_dtype(1.0f + 3 * std::ldexp(1.0f, -11), DType::fp16) == 1.0f + std::ldexp(1.0f, -9));
    CHECK(round_to_dtype(65519.0f, DType::fp16) == 65504.0f);  // fp16 max; half an ulp (16) above it overflows
    CHECK(std::isinf(round_to_dtype(65520.0f, DType::fp16)));
    CHECK(round_to_dtype(std::ldexp(1.0f, -24), DType::fp16) == std::ldexp(1.0f, -24));  // smallest subnormal
    CHECK(round_to_dtype(std::ldexp(1.0f, -26), DType::fp16) == 0.0f);
    CHECK(round_to_dtype(-1.0f - std::ldexp(1.0f, -8), DType::bf16) == -1.0f);  // halfway, ties to even
    CHECK(round_to_dtype(1.0f + 3 * std::ldexp(1.0f, -8), DType::bf16) == 1.0f + std::ldexp(1.0f, -6));
    // 3e38 = 1.7632 * 2^127; 1.7632 * 128 = 225.69 rounds to 226: 226 * 2^120
    CHECK(round_to_dtype(3.0e38f, DType::bf16) == std::ldexp(226.0f, 120));
    CHECK(std::isinf(round_to_dtype(3.4e38f, DType::bf16)));  // 1.998 * 2^127 rounds up to 2^128: overflow
    CHECK_THROWS_AS(round_to_dtype(1.0f, DType::fp32), UsageError);
}

TEST_CASE("The check tolerance is two fp16 or bf16 ulps at the output's magnitude") {
    CHECK(gpu_attention_tolerance(DType::fp16, 0.5) == std::ldexp(1.0, -9));   // 2 * 2^-10, floor at 1
    CHECK(gpu_attention_tolerance(DType::bf16, 0.5) == std::ldexp(1.0, -6));   // 2 * 2^-7
    CHECK(gpu_attention_tolerance(DType::fp16, 4.0) == std::ldexp(1.0, -7));   // 4 * 2 * 2^-10
}

TEST_CASE("The timing table says when a cached step beat the read reference, and only then") {
    // The H100 run of docs/cuda-timing.md: MHA at B 64 read 100.6 % and 101.0 % of the reference.
    const std::string note = read_reference_note({60.2, 100.6, 95.0, 101.0});
    CHECK(note.find("2 of 4 cached steps") != std::string::npos);
    CHECK(note.find("up to 101.0 %") != std::string::npos);
    CHECK(read_reference_note({96.2, 100.0}).empty());  // equal to the reference is not above it
    CHECK(read_reference_note({}).empty());
}

TEST_CASE("Without CUDA in the build or a device, the device calls say which is missing") {
    std::string why;
    if (device_present(why)) {
        MESSAGE("a CUDA device is present: " << cuda_device().name);
        CHECK(cuda_built());
        return;
    }
    if (cuda_built())
        CHECK(why.find("no CUDA device present") != std::string::npos);
    else
        CHECK(why.find("built without CUDA") != std::string::npos);
    CHECK_THROWS_AS(cuda_copy_time(1 << 20, 1, 1), UnavailableError);
    CHECK_THROWS_AS(cuda_read_time(1 << 20, 1, 1), UnavailableError);
    CHECK_THROWS_AS(gpu_attention_time(llama3_8b_problem(), GpuAttentionPath::cached, 1, 1), UnavailableError);
    // The check sets its own batch and context: a problem that gives only the shape reaches the device
    // call (and says the device is missing), not a usage error about batch 0.
    GpuAttentionProblem shape_only;
    shape_only.shape = AttentionShape{8, 2, 128};
    shape_only.d_model = 192;
    shape_only.dtype = DType::fp16;
    CHECK_THROWS_AS(gpu_attention_check(shape_only, 7), UnavailableError);
}

TEST_CASE("The CUDA kernels match the CPU reference on small problems") {
    std::string why;
    if (!device_present(why)) {
        MESSAGE("skipped: " << why);
        return;
    }
    // CUDA cores: MHA with D=64 (8 lanes, one head per block), GQA-4 with D=128, MQA with 16 query heads
    // (two tiles of 8) and D=96 (lanes beyond the head idle), and D=256 (32 lanes).
    // Tensor cores (16-head tiles): MHA with D=64 (one head in a tile, 15 zero rows), GQA-4 with D=128,
    // MQA with 32 heads (two full tiles), with 24 heads and D=64 (a full tile and a half one), and with 12
    // heads (rows 8-11 of the second half-tile real, 12-15 zero).
    struct Case {
        AttentionShape shape;
        GpuAttentionKernel kernel;
    };
    const GpuAttentionKernel cc = GpuAttentionKernel::cuda_cores;
    const GpuAttentionKernel tc = GpuAttentionKernel::tensor_cores;
    const Case cases[] = {{{4, 4, 64}, cc},   {{8, 2, 128}, cc},  {{16, 1, 96}, cc},  {{6, 3, 256}, cc},
                          {{4, 4, 64}, tc},   {{8, 2, 128}, tc},  {{32, 1, 128}, tc}, {{24, 1, 64}, tc},
                          {{12, 1, 128}, tc}};
    // Whether this device and module run the tensor-core kernel (compute capability 8.0+, a module compiled for
    // it): asked of the module itself, which refuses --kernel tensor-cores with a usage error otherwise.
    bool tc_runs = true;
    try {
        GpuAttentionProblem probe;
        probe.shape = {16, 1, 64};
        probe.kernel = tc;
        probe.d_model = 64;
        (void)gpu_attention_check(probe, 1);
    } catch (const UsageError& e) {
        MESSAGE("tensor-core cases skipped: " << e.what());
        tc_runs = false;
    }
    for (const DType dtype : {DType::fp16, DType::bf16})
        for (const Case& kase : cases) {
            if (kase.kernel == tc && !tc_runs) continue;
            GpuAttentionProblem p;
            p.shape = kase.shape;
            p.kernel = kase.kernel;
            p.d_model = 192;
            p.dtype = dtype;
            for (const GpuAttentionCheck& c : gpu_attention_check(p, 7)) {
                INFO(dtype_name(dtype) << " H=" << p.shape.n_head << " Hkv=" << p.shape.n_head_kv << " D=" << p.shape.d_head
                                       << " " << gpu_attention_kernel_name(c.kernel) << " "
                                       << gpu_attention_path_name(c.path) << " B=" << c.n_batch
                                       << " T=" << c.n_tokens << " splits=" << c.n_split
                                       << " error=" << c.max_abs_error << " tolerance=" << c.tolerance);
                CHECK(c.kernel == kase.kernel);
                CHECK(c.passed);
            }
        }
    // auto: tensor cores for a group of 4 or more at D 128 (on 8.0+), CUDA cores for smaller groups and D 96.
    GpuAttentionProblem p;
    p.d_model = 128;
    p.shape = {32, 8, 128};
    CHECK(gpu_attention_check(p, 3).front().kernel == (tc_runs ? tc : cc));
    p.shape = {32, 16, 128};
    CHECK(gpu_attention_check(p, 3).front().kernel == cc);
    p.shape = {32, 1, 96};
    CHECK(gpu_attention_check(p, 3).front().kernel == cc);
}

TEST_CASE("The read bandwidth reference reads every byte and names its fastest pattern") {
    std::string why;
    if (!device_present(why)) {
        MESSAGE("skipped: " << why);
        return;
    }
    // 96 MiB plus 16 bytes: more than 16 grid strides on a 132-SM GPU (132 SMs x 8 blocks x 256 threads
    // x 16 B = 4.1 MiB a stride), so every unrolled loop runs, and the remainder paths too. The module
    // throws if the XOR of what any pattern read differs from the XOR of the buffer computed on the host.
    const GpuTiming t = cuda_read_time((96u << 20) + 16, 1, 3);
    CHECK(t.median_ns > 0);
    CHECK((t.unroll == 4 || t.unroll == 8 || t.unroll == 16));
}
