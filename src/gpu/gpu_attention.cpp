// The host side of the GPU attention timing: validation, byte and FLOP counts, attention variants,
// fp16/bf16 rounding and the correctness check against the CPU reference. Built with or without CUDA.
#include "gpu/gpu_attention.hpp"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <utility>

#include <Eigen/Core>
#include <fmt/format.h>

#include "calc/attention_variant.hpp"
#include "kvlab/core/checked.hpp"
#include "kvlab/core/text.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/kv/kv_cache.hpp"
#include "kvlab/kv/kv_format.hpp"

namespace kvlab {

namespace {

// A split of T holds whole pieces of this many tokens (src/gpu/cuda/decode_attention.cu kSplitRows), so
// ceil(T / 64) bounds the number of splits.
constexpr std::uint64_t split_tokens = 64;

// Round-to-nearest-even to a binary format with `n_mantissa` stored bits, smallest subnormal step
// 2^min_ulp_exp and largest finite value `max_finite`, returned as float. Overflow becomes infinity
// as on the device.
std::uint64_t u64(std::int64_t value) { return static_cast<std::uint64_t>(value); }

}  // namespace

std::string gpu_attention_layout_name(std::int64_t block_size) {
    return block_size == 0 ? std::string("contiguous") : fmt::format("paged {}", block_size);
}

std::uint64_t gpu_attention_kv_value_bytes(const GpuAttentionProblem& problem) {
    return problem.kv_fp8 ? 1 : row_bytes(problem.dtype, 1);
}

bool gpu_attention_has_uncached(const GpuAttentionProblem& problem) {
    return problem.block_size == 0 && !problem.kv_fp8;
}

std::string_view gpu_attention_path_name(GpuAttentionPath path) {
    return path == GpuAttentionPath::cached ? "cached" : "uncached";
}

std::string_view gpu_attention_kernel_name(GpuAttentionKernel kernel) {
    switch (kernel) {
    case GpuAttentionKernel::automatic: return "auto";
    case GpuAttentionKernel::cuda_cores: return "cuda-cores";
    case GpuAttentionKernel::tensor_cores: return "tensor-cores";
    }
    return "?";
}

GpuAttentionKernel parse_gpu_attention_kernel(std::string_view name, std::string_view flag) {
    for (const GpuAttentionKernel k :
         {GpuAttentionKernel::automatic, GpuAttentionKernel::cuda_cores, GpuAttentionKernel::tensor_cores})
        if (name == gpu_attention_kernel_name(k)) return k;
    throw UsageError(fmt::format("{} {}: expected auto, cuda-cores or tensor-cores", flag, quote(name)));
}

void validate_gpu_attention_problem(const GpuAttentionProblem& p, std::string_view flag_hint) {
    if (p.dtype != DType::fp16 && p.dtype != DType::bf16)
        throw UsageError(fmt::format("{}: dtype {} is not supported on the GPU path; expected fp16 or bf16",
                                     flag_hint, dtype_name(p.dtype)));
    // 16 and up: the tensor-core kernel's 16-token chunks never straddle a block; powers of two: a token's
    // block and row are a shift and a mask.
    if (p.block_size != 0 && (p.block_size < gpu_attention_min_block || p.block_size > gpu_attention_max_block ||
                              (p.block_size & (p.block_size - 1)) != 0))
        throw UsageError(fmt::format("{}: block size {} is not supported; expected a power of two from {} to {} tokens",
                                     flag_hint, p.block_size, gpu_attention_min_block, gpu_attention_max_block));
    const AttentionShape& s = p.shape;
    if (s.n_head < 1 || s.n_head_kv < 1 || s.d_head < 1 || s.n_head % s.n_head_kv != 0)
        throw UsageError(fmt::format("{}: heads {} / KV heads {} / head dim {}: expected positive numbers with "
                                     "heads a multiple of KV heads", flag_hint, s.n_head, s.n_head_kv, s.d_head));
    if (s.d_head % 8 != 0 || s.d_head > gpu_attention_max_d_head)
        throw UsageError(fmt::format("{}: head dim {} is not supported by the CUDA kernel; expected a multiple "
                                     "of 8 up to {}", flag_hint, s.d_head, gpu_attention_max_d_head));
    // The tensor-core kernel holds a 16-head tile's q (16 x D) and output sums (16 x D fp32) in registers
    // and lays V's columns out in blocks of 64: D 64 or 128.
    if (p.kernel == GpuAttentionKernel::tensor_cores && s.d_head != 64 && s.d_head != 128)
        throw UsageError(fmt::format("{}: head dim {} is not supported by the tensor-core kernel; expected 64 or 128 "
                                     "(--kernel cuda-cores takes multiples of 8 up to {})",
                                     flag_hint, s.d_head, gpu_attention_max_d_head));
    if (s.n_head > 65535 || s.n_head_kv > 65535 || p.n_batch < 1 || p.n_batch > 65535)
        throw UsageError(fmt::format("{}: batch {}, heads {} and KV heads {} must each be 1..65535 (CUDA grid limit)",
                                     flag_hint, p.n_batch, s.n_head, s.n_head_kv));
    if (p.n_tokens < 1 || p.d_model < 1 || p.d_model > INT_MAX)
        throw UsageError(fmt::format("{}: context {} and hidden size {} must be positive (hidden size < 2^31)",
                                     flag_hint, p.n_tokens, p.d_model));
    // cuBLAS takes int dimensions: the uncached GEMM has B*T rows.
    if (p.n_tokens > INT_MAX / p.n_batch)
        throw UsageError(fmt::format("{}: batch {} x context {} = {} rows exceeds the 2^31-1 rows a cuBLAS GEMM takes",
                                     flag_hint, p.n_batch, p.n_tokens, static_cast<long double>(p.n_batch) * p.n_tokens));
}

GpuAttentionCost gpu_attention_cost(const GpuAttentionProblem& p) {
    const std::uint64_t b = row_bytes(p.dtype, 1);
    const std::uint64_t d_kv = checked_mul(u64(p.shape.n_head_kv), u64(p.shape.d_head), "KV width");
    const std::uint64_t rows = checked_mul(u64(p.n_batch), u64(p.n_tokens), "batch x context");
    // K and V of one token as stored (1-byte values for fp8), and of the contiguous 16-bit cache the
    // uncached step writes in the dtype whatever the cached step's storage.
    const std::uint64_t kv_row = checked_mul(d_kv, 2 * gpu_attention_kv_value_bytes(p), "KV row bytes");
    const std::uint64_t kv_dtype_bytes = checked_mul(checked_mul(rows, d_kv, "KV values"), 2 * b, "KV bytes");
    GpuAttentionCost c;
    c.kv_bytes = checked_mul(rows, kv_row, "KV bytes");
    std::uint64_t pool_bytes = c.kv_bytes;  // contiguous: the cache itself
    if (p.block_size > 0) {
        // B * ceil(T / block) blocks, each sequence's last one padded: the pool holds the padding rows, the
        // step reads only the T real rows of each sequence (and the table).
        const std::uint64_t n_blocks =
            checked_mul(u64(p.n_batch), ceil_div(u64(p.n_tokens), u64(p.block_size)), "pool blocks");
        c.table_bytes = checked_mul(n_blocks, sizeof(std::int32_t), "block table bytes");
        pool_bytes = checked_mul(checked_mul(n_blocks, u64(p.block_size), "pool rows"), kv_row, "pool bytes");
    }
    const std::uint64_t q_bytes =
        checked_mul(checked_mul(checked_mul(u64(p.n_batch), u64(p.shape.n_head), "query heads"), u64(p.shape.d_head), "query values"),
                    b, "query bytes");
    // q read + out written, same size
    c.cached_bytes = checked_add(checked_add(c.kv_bytes, c.table_bytes, "cached step bytes"), 2 * q_bytes, "cached step bytes");
    const std::uint64_t x_bytes = checked_mul(checked_mul(rows, u64(p.d_model), "hidden values"), b, "hidden bytes");
    const std::uint64_t w_bytes = checked_mul(checked_mul(u64(p.d_model), 2 * d_kv, "W_kv values"), b, "W_kv bytes");
    c.uncached_bytes = checked_add(checked_add(x_bytes, w_bytes, "uncached step bytes"),
                                   checked_add(checked_mul(kv_dtype_bytes, 2, "uncached step bytes"), 2 * q_bytes,
                                               "uncached step bytes"),
                                   "uncached step bytes");
    const double attention_flops = 4.0 * static_cast<double>(p.n_batch) * static_cast<double>(p.shape.n_head) *
                                   static_cast<double>(p.shape.d_head) * static_cast<double>(p.n_tokens);
    c.cached_flops = attention_flops;
    c.uncached_flops = 2.0 * static_cast<double>(rows) * static_cast<double>(p.d_model) * 2.0 * static_cast<double>(d_kv) +
                       attention_flops;
    // Split partials: per (sequence, query head, split) D fp32 sums plus a running max and sum.
    const std::uint64_t partial_bytes = checked_mul(
        checked_mul(checked_mul(u64(p.n_batch), u64(p.shape.n_head), "partials"), ceil_div(u64(p.n_tokens), split_tokens),
                    "partials"),
        (u64(p.shape.d_head) + 2) * 4, "partial bytes");
    const std::uint64_t step_io = checked_add(2 * q_bytes, partial_bytes, "cached device bytes");
    c.cached_device_bytes = checked_add(checked_add(pool_bytes, c.table_bytes, "cached device bytes"), step_io,
                                        "cached device bytes");
    // The uncached step holds X, W and the fused K|V it computes (contiguous, in the dtype) in place of the cache.
    c.uncached_device_bytes = checked_add(checked_add(x_bytes, w_bytes, "uncached device bytes"),
                                          checked_add(kv_dtype_bytes, step_io, "uncached device bytes"),
                                          "uncached device bytes");
    return c;
}

AttentionShape attention_variant(const AttentionShape& native, std::string_view spec, std::string_view flag) {
    AttentionShape s = native;
    s.n_head_kv = variant_kv_heads(parse_attention_variant(spec, flag), native.n_head, native.n_head_kv, flag);
    return s;
}

float round_to_dtype(float x, DType dtype) {
    // Eigen 3.4's Eigen::half and Eigen::bfloat16 narrow with round-to-nearest-even, as the GPU stores
    // (fp16: 10 stored mantissa bits, subnormal step 2^-24, overflow to inf from 65520; bf16: 7 bits and
    // the fp32 exponent range)
    if (dtype == DType::fp16) return static_cast<float>(Eigen::half(x));
    if (dtype == DType::bf16) return static_cast<float>(Eigen::bfloat16(x));
    throw UsageError(fmt::format("round_to_dtype: dtype {} is not fp16 or bf16", dtype_name(dtype)));
}

double gpu_attention_tolerance(DType dtype, double max_abs_ref) {
    const double ulp_at_one = dtype == DType::fp16 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);
    return 2.0 * ulp_at_one * std::max(1.0, max_abs_ref);
}

namespace {

struct CheckInputs {
    GpuAttentionProblem problem;
    GpuAttentionInputs in;
};

CheckInputs random_inputs(const GpuAttentionProblem& shape_of, std::int64_t n_batch, std::int64_t n_tokens,
                          std::mt19937_64& rng) {
    CheckInputs c;
    c.problem = shape_of;
    c.problem.n_batch = n_batch;
    c.problem.n_tokens = n_tokens;
    // A small hidden width keeps the CPU GEMM quick; the kernel paths do not depend on d.
    c.problem.d_model = std::min<std::int64_t>(shape_of.d_model, 128);
    const AttentionShape& s = c.problem.shape;
    const std::int64_t d_kv = s.n_head_kv * s.d_head;
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    auto fill = [&](std::vector<float>& buf, std::size_t n, float scale) {
        buf.resize(n);
        for (float& value : buf) value = round_to_dtype(scale * unit(rng), c.problem.dtype);
    };
    fill(c.in.q, static_cast<std::size_t>(n_batch * s.n_head * s.d_head), 1.0f);
    fill(c.in.k, static_cast<std::size_t>(n_batch * n_tokens * d_kv), 1.0f);
    fill(c.in.v, static_cast<std::size_t>(n_batch * n_tokens * d_kv), 1.0f);
    fill(c.in.x, static_cast<std::size_t>(n_batch * n_tokens * c.problem.d_model), 1.0f);
    // W scaled by 1/sqrt(d) keeps K and V = X W near unit size.
    fill(c.in.w_kv, static_cast<std::size_t>(c.problem.d_model * 2 * d_kv),
         1.0f / std::sqrt(static_cast<float>(c.problem.d_model)));
    return c;
}

// out (B, H*D) = attention_decode_ref per sequence over k, v (B, T, Hkv*D).
std::vector<float> reference_outputs(const GpuAttentionProblem& p, const std::vector<float>& q,
                                     const std::vector<float>& k, const std::vector<float>& v) {
    const AttentionShape& s = p.shape;
    const std::int64_t d_kv = s.n_head_kv * s.d_head;
    std::vector<float> out(static_cast<std::size_t>(p.n_batch * s.n_head * s.d_head));
    std::vector<float> scores(static_cast<std::size_t>(p.n_tokens));
    for (std::int64_t b = 0; b < p.n_batch; ++b)
        attention_decode_ref(s, q.data() + b * s.n_head * s.d_head, k.data() + b * p.n_tokens * d_kv,
                             v.data() + b * p.n_tokens * d_kv, p.n_tokens, out.data() + b * s.n_head * s.d_head,
                             scores.data());
    return out;
}

GpuAttentionCheck compare(GpuAttentionPath path, const GpuAttentionProblem& p, int n_split,
                          const std::vector<float>& got, const std::vector<float>& ref) {
    GpuAttentionCheck c;
    c.path = path;
    c.n_batch = p.n_batch;
    c.n_tokens = p.n_tokens;
    c.d_model = p.d_model;
    c.n_split = n_split;
    c.fp8_error = NAN;  // set by the caller for fp8 caches
    double max_abs_ref = 0;
    bool all_finite = got.size() == ref.size();
    for (std::size_t i = 0; i < ref.size() && all_finite; ++i) {
        if (!std::isfinite(got[i])) all_finite = false;
        max_abs_ref = std::max(max_abs_ref, static_cast<double>(std::fabs(ref[i])));
        c.max_abs_error = std::max(c.max_abs_error, static_cast<double>(std::fabs(got[i] - ref[i])));
    }
    if (!all_finite) c.max_abs_error = INFINITY;
    c.tolerance = gpu_attention_tolerance(p.dtype, max_abs_ref);
    c.passed = all_finite && c.max_abs_error <= c.tolerance;
    return c;
}

// Uncached reference K, V (each (B, T, Hkv*D)): X W_kv in fp32, rounded to the dtype as the GEMM stores them.
std::pair<std::vector<float>, std::vector<float>> uncached_kv(const GpuAttentionProblem& p, const GpuAttentionInputs& in) {
    const std::int64_t d_kv = p.shape.n_head_kv * p.shape.d_head;
    const std::int64_t rows = p.n_batch * p.n_tokens;
    std::vector<float> kv(static_cast<std::size_t>(rows * 2 * d_kv), 0.0f);  // (B*T, 2*Hkv*D) = X (B*T, d) W (d, 2*Hkv*D)
    for (std::int64_t r = 0; r < rows; ++r) {
        float* kv_r = kv.data() + r * 2 * d_kv;
        for (std::int64_t j = 0; j < p.d_model; ++j) {
            const float x_rj = in.x[static_cast<std::size_t>(r * p.d_model + j)];
            const float* w_j = in.w_kv.data() + j * 2 * d_kv;
            for (std::int64_t col = 0; col < 2 * d_kv; ++col) kv_r[col] += x_rj * w_j[col];
        }
    }
    std::vector<float> k(static_cast<std::size_t>(rows * d_kv));
    std::vector<float> v(k.size());
    for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t j = 0; j < d_kv; ++j) {
            k[static_cast<std::size_t>(r * d_kv + j)] = round_to_dtype(kv[static_cast<std::size_t>(r * 2 * d_kv + j)], p.dtype);
            v[static_cast<std::size_t>(r * d_kv + j)] =
                round_to_dtype(kv[static_cast<std::size_t>(r * 2 * d_kv + d_kv + j)], p.dtype);
        }
    return {std::move(k), std::move(v)};
}

// K and V as the problem stores them: fp8 codes and scales (in.k and in.v then hold the decoded values,
// what the kernel reads) and, for a paged pool, a shuffled block table.
void store_kv(const GpuAttentionProblem& p, GpuAttentionInputs& in, std::mt19937_64& rng) {
    if (p.kv_fp8) {
        in.k_scale = gpu_attention_quantize_fp8(in.k, in.k_fp8);
        in.v_scale = gpu_attention_quantize_fp8(in.v, in.v_fp8);
    }
    if (p.block_size > 0) {
        const auto n_blocks = static_cast<std::int64_t>(ceil_div(u64(p.n_tokens), u64(p.block_size)));
        const std::uint64_t seed = rng();  // drawn either way, so the inputs that follow do not depend on the order
        if (p.shuffled_blocks) {
            in.block_table = gpu_attention_block_table(p.n_batch, n_blocks, seed);
        } else {  // in order: sequence b's blocks b*n .. b*n+n-1
            in.block_table.resize(static_cast<std::size_t>(p.n_batch * n_blocks));
            std::iota(in.block_table.begin(), in.block_table.end(), 0);
        }
    }
}

// max |got - ref|, infinity when a value is not finite or the sizes differ.
double max_abs_difference(const std::vector<float>& got, const std::vector<float>& ref) {
    if (got.size() != ref.size()) return INFINITY;
    double worst = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
        if (!std::isfinite(got[i])) return INFINITY;
        worst = std::max(worst, static_cast<double>(std::fabs(got[i] - ref[i])));
    }
    return worst;
}

}  // namespace

float gpu_attention_quantize_fp8(std::vector<float>& values, std::vector<std::uint8_t>& codes) {
    float amax = 0.0f;
    for (const float x : values) amax = std::max(amax, std::fabs(x));
    const float scale = amax_to_scale(amax, DType::fp8_e4m3);  // the CPU cache's per-tensor scale
    const float inv = 1.0f / scale;  // x * (1 / scale), as TensorRT-LLM and the CPU cache quantize
    codes.resize(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
        codes[i] = fp8_e4m3_encode(values[i] * inv);
        values[i] = fp8_e4m3_decode(codes[i]) * scale;
    }
    return scale;
}

std::vector<std::int32_t> gpu_attention_block_table(std::int64_t n_batch, std::int64_t n_blocks, std::uint64_t seed) {
    if (n_batch < 0 || n_blocks < 0 || (n_batch > 0 && n_blocks > INT32_MAX / n_batch))
        throw UsageError(fmt::format("block table: {} sequences x {} blocks do not fit int32 block numbers", n_batch, n_blocks));
    std::vector<std::int32_t> table(static_cast<std::size_t>(n_batch * n_blocks));
    std::iota(table.begin(), table.end(), 0);
    std::mt19937_64 rng(seed);
    std::shuffle(table.begin(), table.end(), rng);
    // Never the identity (a 2-block pool shuffles into it half the time): a kernel that ignored the table
    // would pass the check on it.
    if (table.size() >= 2 && std::is_sorted(table.begin(), table.end())) std::rotate(table.begin(), table.begin() + 1, table.end());
    return table;
}

std::vector<GpuAttentionCheck> gpu_attention_check(const GpuAttentionProblem& shape_of, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    struct Case {
        std::int64_t n_batch;
        std::int64_t n_tokens;
        int n_split;  // 0: as timing picks it
    };
    // T = 1: a single key; 300: several 64-token pieces and a partial one, fewer rows than a block's
    // warps take in a step for some shapes; 1300: split across blocks, then forced into one block (each
    // warp then folds several steps into its running max and sums).
    const Case cases[] = {{2, 1, 0}, {3, 300, 0}, {2, 1300, 0}, {2, 1300, 1}};
    std::vector<GpuAttentionCheck> checks;
    for (const Case& kase : cases) {
        // The check's own batch and context, not the caller's (which may be unset): the first device run
        // refused a shape-only problem here as "batch 0".
        GpuAttentionProblem probe = shape_of;
        probe.n_batch = kase.n_batch;
        probe.n_tokens = kase.n_tokens;
        validate_gpu_attention_problem(probe, "gpu attention check");
        CheckInputs c = random_inputs(shape_of, kase.n_batch, kase.n_tokens, rng);
        const GpuAttentionProblem& p = c.problem;
        const std::vector<float> k_dtype = p.kv_fp8 ? c.in.k : std::vector<float>{};  // before fp8 rounding
        const std::vector<float> v_dtype = p.kv_fp8 ? c.in.v : std::vector<float>{};
        store_kv(p, c.in, rng);
        const GpuAttentionOutputs got = gpu_attention_run(p, c.in, kase.n_split);
        checks.push_back(compare(GpuAttentionPath::cached, p, got.n_split, got.out_cached,
                                 reference_outputs(p, c.in.q, c.in.k, c.in.v)));
        checks.back().kernel = got.kernel;
        if (p.kv_fp8) checks.back().fp8_error = max_abs_difference(got.out_cached, reference_outputs(p, c.in.q, k_dtype, v_dtype));
        if (!gpu_attention_has_uncached(p)) continue;
        const auto [k, v] = uncached_kv(p, c.in);
        checks.push_back(compare(GpuAttentionPath::uncached, p, got.n_split, got.out_uncached,
                                 reference_outputs(p, c.in.q, k, v)));
        checks.back().kernel = got.kernel;
    }
    return checks;
}

}  // namespace kvlab
