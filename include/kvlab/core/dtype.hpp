// The one table of storage types kvlab knows: how many bytes a run of n values takes.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvlab {

enum class DType { fp32, fp16, bf16, fp8_e4m3, fp8_e5m2, int8, int4, q8_0, q4_0 };

// Values are stored in blocks: `block_values` values take `block_bytes` bytes.
// Plain types are blocks of 1 value (int4: 2 values per byte); llama.cpp's q8_0 stores 32 int8
// values + one fp16 scale = 34 B, q4_0 stores 32 nibbles + one fp16 scale = 18 B (ggml-common.h).
struct DTypeInfo {
    DType dtype;
    std::string_view name;        // canonical CLI name, e.g. "fp8_e4m3"
    std::uint64_t block_values;
    std::uint64_t block_bytes;
    std::string_view description;
};

const DTypeInfo& dtype_info(DType dtype);
const std::vector<DTypeInfo>& all_dtypes();
// Accepts canonical names and aliases (fp8 = fp8_e4m3, f16, half, float32, ...). Throws UsageError.
DType parse_dtype(std::string_view name, std::string_view flag);
std::string_view dtype_name(DType dtype);
// Bytes for a row of n values: ceil(n / block_values) * block_bytes (ggml_row_size for block types).
std::uint64_t row_bytes(DType dtype, std::uint64_t n_values);
// Whether a row of n values is whole blocks of a llama.cpp block type (q8_0, q4_0: a multiple of 32;
// other types: always). ggml cannot make a tensor whose rows are not (ggml_row_size asserts
// ne % block size == 0), so llama.cpp cannot cache such a K/V row: kvcalc and simulate refuse it alike.
bool whole_blocks(DType dtype, std::uint64_t n_values);

}  // namespace kvlab
