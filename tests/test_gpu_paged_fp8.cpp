// The CUDA kernels reading K and V through a shuffled block table (paged) and as fp8 e4m3 codes with
// per-tensor scales, against the same CPU reference as the contiguous 16-bit kernels (attention_decode_ref
// over the values the kernel must read: the logical K, V of each sequence, decoded from the codes).
// Only where a CUDA device is present; elsewhere the test says why it skipped (ctest: gpu_device).
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "kvlab/core/error.hpp"
#include "gpu/gpu_attention.hpp"
#include "gpu_device.hpp"

using namespace kvlab;

TEST_CASE("The CUDA kernels match the CPU reference through a shuffled block table and with fp8 KV") {
    std::string why;
    if (!test::device_present(why)) {
        MESSAGE("skipped: " << why);
        return;
    }
    using Case = test::KernelCase;
    const GpuAttentionKernel cc = GpuAttentionKernel::cuda_cores;
    const GpuAttentionKernel tc = GpuAttentionKernel::tensor_cores;
    // CUDA cores: MHA D 64 (8 lanes a row), GQA-4 D 128 (16 lanes), MQA with 16 heads and D 96 (two 8-head
    // tiles, lanes past the head idle; fp8 rows of 96 bytes, 8-byte loads). Tensor cores: GQA-4 D 128 (fp8:
    // 8 units a row, conflict-free swizzle), MQA with 24 heads and D 64 (a full and a half tile; fp8: 4 units
    // a row, the swizzle taken mod 4), 12 heads D 128 (rows 12-15 of the tile zero).
    const Case cases[] = {{{4, 4, 64}, cc}, {{8, 2, 128}, cc}, {{16, 1, 96}, cc},
                          {{8, 2, 128}, tc}, {{24, 1, 64}, tc}, {{12, 1, 128}, tc}};
    struct Storage {
        std::int64_t block_size;  // 0: contiguous
        bool fp8;
    };
    // Block 16: a tensor-core chunk is a whole block, a 300-token sequence ends in a part-filled block;
    // 64 and 128: several chunks per block, a split (64-token pieces) within or across blocks.
    const Storage storages[] = {{16, false}, {64, false}, {128, false}, {0, true}, {16, true}, {64, true}};
    const bool tc_ok = test::tensor_cores_run();
    for (const DType dtype : {DType::fp16, DType::bf16})
        for (const Case& kase : cases)
            for (const Storage& st : storages) {
                if (kase.kernel == tc && !tc_ok) continue;
                GpuAttentionProblem p;
                p.shape = kase.shape;
                p.kernel = kase.kernel;
                p.d_model = 128;
                p.dtype = dtype;
                p.block_size = st.block_size;
                p.kv_fp8 = st.fp8;
                // INFO captures by reference: the layout's name must outlive the checks
                const std::string layout = gpu_attention_layout_name(p.block_size);
                for (const GpuAttentionCheck& c : gpu_attention_check(p, 11)) {
                    INFO(dtype_name(dtype) << " H=" << p.shape.n_head << " Hkv=" << p.shape.n_head_kv << " D="
                                           << p.shape.d_head << " " << gpu_attention_kernel_name(c.kernel) << " "
                                           << layout << (p.kv_fp8 ? " fp8" : "")
                                           << " B=" << c.n_batch << " T=" << c.n_tokens << " splits=" << c.n_split
                                           << " error=" << c.max_abs_error << " tolerance=" << c.tolerance
                                           << " fp8 error=" << c.fp8_error);
                    CHECK(c.kernel == kase.kernel);
                    CHECK(c.path == GpuAttentionPath::cached);  // no uncached step for paged or fp8 caches
                    CHECK(c.passed);
                    if (st.fp8 && c.n_tokens == 1) {
                        // One token: the output is that token's V row, decoded. e4m3 keeps 3 mantissa bits, so a
                        // value of [-1, 1) moves by up to half a step, 2^-4 of it; over 2 x H x D random values
                        // some move by far more than the kernel's 2-ulp tolerance (2^-9 in fp16): the fp8 run
                        // read codes, not the 16-bit values.
                        CHECK(c.fp8_error > c.tolerance);
                        CHECK(c.fp8_error <= 0.0625 + c.tolerance);
                    }
                }
            }
}
