#include "kvlab/core/dtype.hpp"
#include "kvlab/core/text.hpp"

#include <fmt/format.h>

#include "kvlab/core/checked.hpp"
#include "kvlab/core/error.hpp"

namespace kvlab {

const std::vector<DTypeInfo>& all_dtypes() {
    static const std::vector<DTypeInfo> table = {
        {DType::fp32, "fp32", 1, 4, "IEEE float32"},
        {DType::fp16, "fp16", 1, 2, "IEEE float16"},
        {DType::bf16, "bf16", 1, 2, "bfloat16"},
        {DType::fp8_e4m3, "fp8_e4m3", 1, 1, "FP8 E4M3 (vLLM --kv-cache-dtype fp8)"},
        {DType::fp8_e5m2, "fp8_e5m2", 1, 1, "FP8 E5M2"},
        {DType::int8, "int8", 1, 1, "8-bit integer, scales not counted"},
        {DType::int4, "int4", 2, 1, "4-bit integer, two per byte, scales not counted"},
        {DType::q8_0, "q8_0", 32, 34, "llama.cpp q8_0: 32 int8 + fp16 scale = 34 B"},
        {DType::q4_0, "q4_0", 32, 18, "llama.cpp q4_0: 32 nibbles + fp16 scale = 18 B"},
    };
    return table;
}

const DTypeInfo& dtype_info(DType dtype) {
    for (const auto& info : all_dtypes())
        if (info.dtype == dtype) return info;
    throw Error("internal: dtype missing from the table");
}

std::string_view dtype_name(DType dtype) { return dtype_info(dtype).name; }

DType parse_dtype(std::string_view name, std::string_view flag) {
    struct Alias { std::string_view alias; DType dtype; };
    static const Alias aliases[] = {
        {"fp32", DType::fp32}, {"f32", DType::fp32}, {"float32", DType::fp32}, {"float", DType::fp32},
        {"fp16", DType::fp16}, {"f16", DType::fp16}, {"float16", DType::fp16}, {"half", DType::fp16},
        {"bf16", DType::bf16}, {"bfloat16", DType::bf16},
        {"fp8", DType::fp8_e4m3}, {"fp8_e4m3", DType::fp8_e4m3}, {"e4m3", DType::fp8_e4m3},
        {"fp8_e5m2", DType::fp8_e5m2}, {"e5m2", DType::fp8_e5m2},
        {"int8", DType::int8}, {"i8", DType::int8}, {"int4", DType::int4}, {"i4", DType::int4},
        {"q8_0", DType::q8_0}, {"q4_0", DType::q4_0},
    };
    for (const auto& a : aliases)
        if (a.alias == name) return a.dtype;
    throw UsageError(fmt::format("{}: unknown dtype {}; expected one of fp32, fp16, bf16, fp8 (fp8_e4m3), fp8_e5m2, int8, int4, q8_0, q4_0", flag, quote(name)));
}

std::uint64_t row_bytes(DType dtype, std::uint64_t n_values) {
    const auto& info = dtype_info(dtype);
    return checked_mul(ceil_div(n_values, info.block_values), info.block_bytes, "row bytes");
}

bool whole_blocks(DType dtype, std::uint64_t n_values) {
    return (dtype != DType::q8_0 && dtype != DType::q4_0) || n_values % dtype_info(dtype).block_values == 0;
}

}  // namespace kvlab
