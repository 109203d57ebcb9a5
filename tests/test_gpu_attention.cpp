// The GPU attention path: host-side counts, variants and rounding everywhere; the kernels against the
// CPU reference only where a CUDA device is present (elsewhere the device test says why it skipped).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kvlab/core/error.hpp"
#include "gpu/gpu_attention.hpp"
#include "gpu/gpu_attention_report.hpp"
#include "gpu_device.hpp"

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

TEST_CASE("fp8 KV halves the bytes K and V move; a paged cache adds its block table and pads its last blocks") {
    GpuAttentionProblem fp8 = llama3_8b_problem();
    fp8.kv_fp8 = true;
    const GpuAttentionCost c8 = gpu_attention_cost(fp8);
    CHECK(c8.kv_bytes == 1073741824ull);      // 64 B * 8192 T * 8 Hkv * 128 D * 2 (K,V) * 1 B = 2^30 = 1 GiB
    CHECK(c8.table_bytes == 0);               // contiguous
    CHECK(c8.cached_bytes == 1074790400ull);  // + q and out in fp16, 512 KiB each: 2^30 + 2^20
    CHECK(c8.uncached_bytes == 8607760384ull);  // the uncached step writes K, V in fp16 whatever the cache stores
    const GpuAttentionCost c16 = gpu_attention_cost(llama3_8b_problem());
    GpuAttentionProblem paged = llama3_8b_problem();
    paged.block_size = 16;
    const GpuAttentionCost cp = gpu_attention_cost(paged);
    CHECK(cp.table_bytes == 131072ull);  // 64 sequences * 8192 / 16 = 512 blocks each * 4 B
    CHECK(cp.kv_bytes == c16.kv_bytes);
    CHECK(cp.cached_bytes == 2148663296ull);  // 2148532224 + 131072
    // 8192 is 512 whole blocks: no padding, the pool is the cache, the device holds the table besides
    CHECK(cp.cached_device_bytes == c16.cached_device_bytes + 131072ull);
    CHECK(cp.uncached_bytes == c16.uncached_bytes);
    CHECK(cp.uncached_device_bytes == c16.uncached_device_bytes);

    // T 1000, block 64: ceil(1000 / 64) = 16 blocks a sequence, the last holding 1000 - 15*64 = 40 tokens
    GpuAttentionProblem contiguous = llama3_8b_problem();
    contiguous.n_tokens = 1000;
    paged = contiguous;
    paged.block_size = 64;
    const GpuAttentionCost a = gpu_attention_cost(contiguous);
    const GpuAttentionCost b = gpu_attention_cost(paged);
    CHECK(b.table_bytes == 4096ull);                   // 64 * 16 * 4 B
    CHECK(b.kv_bytes == 262144000ull);                 // 64 * 1000 tokens * (8*128*2*2 = 4096 B a token)
    CHECK(b.cached_bytes == a.cached_bytes + 4096ull);  // the step reads only the 1000 real rows (and the table)
    // the pool holds 64 * 16 * 64 = 65536 rows: 64 * 24 padding rows * 4096 B = 6291456 B more, + the table
    CHECK(b.cached_device_bytes == a.cached_device_bytes + 6291456ull + 4096ull);
    paged.kv_fp8 = true;
    contiguous.kv_fp8 = true;
    // 2048 B a token in fp8: padding 64 * 24 * 2048 = 3145728 B, + the same 4096 B table
    CHECK(gpu_attention_cost(paged).cached_device_bytes == gpu_attention_cost(contiguous).cached_device_bytes + 3145728ull + 4096ull);
}

TEST_CASE("Paged caches take power-of-two blocks of 16 to 1024 tokens; layouts and KV storage are named") {
    GpuAttentionProblem p = llama3_8b_problem();
    for (const std::int64_t block : {0, 16, 64, 128, 1024}) {
        p.block_size = block;
        CHECK_NOTHROW(validate_gpu_attention_problem(p, "--block-size"));
    }
    for (const std::int64_t block : {8, 24, 2048, -16}) {  // below 16, not a power of two, above 1024, negative
        p.block_size = block;
        CHECK_THROWS_WITH_AS(validate_gpu_attention_problem(p, "--block-size"),
                             doctest::Contains(fmt::format("--block-size: block size {} is not supported; expected a "
                                                           "power of two from 16 to 1024", block).c_str()),
                             UsageError);
    }
    CHECK(gpu_attention_layout_name(0) == "contiguous");
    CHECK(gpu_attention_layout_name(16) == "paged 16");
    CHECK(gpu_attention_layout_name(128) == "paged 128");
    p = llama3_8b_problem();
    CHECK(gpu_attention_kv_value_bytes(p) == 2);
    CHECK(gpu_attention_has_uncached(p));
    p.dtype = DType::bf16;
    p.kv_fp8 = true;
    CHECK_NOTHROW(validate_gpu_attention_problem(p, "--kv-dtype"));  // fp8 K, V with a bf16 query
    CHECK(gpu_attention_kv_value_bytes(p) == 1);
    CHECK_FALSE(gpu_attention_has_uncached(p));
    p.kv_fp8 = false;
    p.block_size = 64;
    CHECK_FALSE(gpu_attention_has_uncached(p));
}

TEST_CASE("The check quantizes K and V to fp8 e4m3 with one scale per tensor, as the CPU KV cache does") {
    // amax 3.5: scale = 3.5 / 448 = 2^-7 exactly (448 = 3.5 * 128), so x / scale = x * 128 exactly.
    // e4m3 is 1 sign, 4 exponent (bias 7), 3 mantissa bits; value 1.mmm * 2^(e-7), subnormals 0.mmm * 2^-6.
    std::vector<float> values = {3.5f, 1.75f, -3.5f, 1.0f, 0.3f, 0.296875f, std::ldexp(1.0f, -16), 0.0f};
    std::vector<std::uint8_t> codes;
    const float scale = gpu_attention_quantize_fp8(values, codes);
    CHECK(scale == std::ldexp(1.0f, -7));
    REQUIRE(codes.size() == 8);
    CHECK(codes[0] == 0x7E);  // 448 = 1.75 * 2^8: exponent 8 + 7 = 15 = 1111, mantissa .75 = 110: 0 1111 110
    CHECK(codes[1] == 0x76);  // 224 = 1.75 * 2^7: 0 1110 110
    CHECK(codes[2] == 0xFE);  // -448: the sign bit set on 0x7E
    CHECK(codes[3] == 0x70);  // 128 = 1.0 * 2^7: 0 1110 000
    // 0.3 * 128 = 38.4 = 1.2 * 2^5: mantissa 1.2 is nearer 1.25 (010) than 1.125 (001): 0 1100 010, value 40
    CHECK(codes[4] == 0x62);
    // 0.296875 * 128 = 38 = 1.1875 * 2^5, halfway between 1.125 (001, odd) and 1.25 (010, even): ties to even, 40
    CHECK(codes[5] == 0x62);
    CHECK(codes[6] == 0x01);  // 2^-16 * 128 = 2^-9 = 0.001 * 2^-6, the smallest subnormal
    CHECK(codes[7] == 0x00);
    // the values are replaced by what the kernel reads: code value * scale
    CHECK(values[0] == 3.5f);
    CHECK(values[1] == 1.75f);
    CHECK(values[2] == -3.5f);
    CHECK(values[3] == 1.0f);
    CHECK(values[4] == 0.3125f);  // 40 / 128
    CHECK(values[5] == 0.3125f);
    CHECK(values[6] == std::ldexp(1.0f, -16));
    CHECK(values[7] == 0.0f);
    std::vector<float> zeros(5, 0.0f);  // no amax: scale 1, as the CPU cache's amax_to_scale
    CHECK(gpu_attention_quantize_fp8(zeros, codes) == 1.0f);
    CHECK(codes == std::vector<std::uint8_t>(5, 0));
}

TEST_CASE("The check's block table names every pool block once, shuffled") {
    // 2 sequences of 19 blocks (T 300 at block 16: ceil(300 / 16) = 19), small pools of 4 blocks, and 2
    // blocks (B 2, T 1), which a shuffle leaves in order half the time
    for (const auto& shape : {std::pair<std::int64_t, std::int64_t>{2, 19}, {1, 4}, {2, 2}, {4, 1}, {2, 1}}) {
        // named, not a structured binding: clang cannot capture one in INFO's lambda
        const std::int64_t n_batch = shape.first;
        const std::int64_t n_blocks = shape.second;
        for (std::uint64_t seed = 1; seed <= 30; ++seed) {
            const std::vector<std::int32_t> table = gpu_attention_block_table(n_batch, n_blocks, seed);
            std::vector<std::int32_t> identity(static_cast<std::size_t>(n_batch * n_blocks));
            std::iota(identity.begin(), identity.end(), 0);
            INFO("B=" << n_batch << " blocks=" << n_blocks << " seed=" << seed);
            CHECK(table != identity);  // never in order (1 in 24 shuffles of 4 blocks are, seed 7's for one)
            std::vector<std::int32_t> sorted = table;
            std::sort(sorted.begin(), sorted.end());
            CHECK(sorted == identity);  // a permutation: every block exactly once
        }
    }
    // shuffled, not just moved: seeds give different tables (38 blocks: 38! orders)
    CHECK(gpu_attention_block_table(2, 19, 1) != gpu_attention_block_table(2, 19, 2));
    CHECK(gpu_attention_block_table(3, 5, 9) == gpu_attention_block_table(3, 5, 9));  // seeded
    CHECK(gpu_attention_block_table(0, 5, 9).empty());
    CHECK(gpu_attention_block_table(1, 1, 9) == std::vector<std::int32_t>{0});
    CHECK_THROWS_AS(gpu_attention_block_table(65535, 65536, 1), UsageError);  // 2^32 - 2^16 blocks exceed int32
}

TEST_CASE("gpu attention refuses bad layouts, block sizes and KV dtypes before the device is touched") {
    GpuAttentionRequest r;
    r.n_head = 8;
    r.n_head_kv = 2;
    r.d_head = 64;
    r.batch = "2";
    r.context = "300";
    auto refused = [&](GpuAttentionRequest req, const std::string& message) {
        CHECK_THROWS_WITH_AS(run_gpu_attention(req), doctest::Contains(message.c_str()), UsageError);
    };
    GpuAttentionRequest bad = r;
    bad.block_size = "16,24";
    refused(bad, "--block-size: block size 24 is not supported");
    bad = r;
    bad.kv_layout = "contiguous,ring";
    refused(bad, "--kv-layout 'ring': expected contiguous or paged");
    bad = r;
    bad.kv_dtype = "int4";
    refused(bad, "--kv-dtype 'int4': expected dtype (the --dtype), fp16, bf16, fp8_e4m3 or fp8");
    bad = r;
    bad.kv_dtype = "bf16";  // the query is fp16
    refused(bad, "--kv-dtype bf16: K and V are stored in the --dtype or in fp8_e4m3, and --dtype fp16 is not bf16");
    bad.dtype = "bf16,fp16";
    refused(bad, "and --dtype fp16 is not bf16");
    std::string why;
    if (test::device_present(why)) return;
    // Valid paged and fp8 requests get as far as the device.
    GpuAttentionRequest good = r;
    good.kv_layout = "contiguous,paged";
    good.block_size = "16,64,128";
    good.kv_dtype = "dtype,fp8,fp16,fp8_e4m3";  // fp16 = the --dtype, fp8_e4m3 = fp8
    CHECK_THROWS_AS(run_gpu_attention(good), UnavailableError);
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
    if (test::device_present(why)) {
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
    if (!test::device_present(why)) {
        MESSAGE("skipped: " << why);
        return;
    }
    // CUDA cores: MHA with D=64 (8 lanes, one head per block), GQA-4 with D=128, MQA with 16 query heads
    // (two tiles of 8) and D=96 (lanes beyond the head idle), and D=256 (32 lanes).
    // Tensor cores (16-head tiles): MHA with D=64 (one head in a tile, 15 zero rows), GQA-4 with D=128,
    // MQA with 32 heads (two full tiles), with 24 heads and D=64 (a full tile and a half one), and with 12
    // heads (rows 8-11 of the second half-tile real, 12-15 zero).
    using Case = test::KernelCase;
    const GpuAttentionKernel cc = GpuAttentionKernel::cuda_cores;
    const GpuAttentionKernel tc = GpuAttentionKernel::tensor_cores;
    const Case cases[] = {{{4, 4, 64}, cc},   {{8, 2, 128}, cc},  {{16, 1, 96}, cc},  {{6, 3, 256}, cc},
                          {{4, 4, 64}, tc},   {{8, 2, 128}, tc},  {{32, 1, 128}, tc}, {{24, 1, 64}, tc},
                          {{12, 1, 128}, tc}};
    // Whether this device and module run the tensor-core kernel (compute capability 8.0+, a module compiled for
    // it): asked of the module itself, which refuses --kernel tensor-cores with a usage error otherwise.
    const bool tc_runs = test::tensor_cores_run();
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
    if (!test::device_present(why)) {
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
