// Weights stored narrower than fp32 (simulate --weight-dtype): bf16, fp16 or llama.cpp's q8_0 rows,
// widened to fp32 inside the matmul kernels, so a decode step reads only the narrow bytes. The
// matrices the forward pass multiplies by (q, k, v, o, the MLP's and the classifier) are stored
// narrow; the token embedding stays fp32 (a step reads one row of it per token), as do the norms and
// biases. Rounding: bf16 and fp16 round to nearest even (Eigen); q8_0 as ggml's quantize_row_q8_0_ref
// (kv/kv_format.hpp), 32 consecutive weights of a row per block. docs/performance.md.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "kvlab/core/dtype.hpp"
#include "kvlab/core/huge_pages.hpp"
#include "kernels/matmul.hpp"
#include "kvlab/weights/weights.hpp"

namespace kvlab {

// Throws UsageError for a dtype weights cannot be stored in here (fp32 needs no copy; fp8, int8,
// int4 and q4_0 are not offered), naming --weight-dtype.
void check_weight_dtype(DType dtype);
// Throws UsageError when q8_0 is asked of a config whose matrix rows do not split into blocks of 32
// (d_model, H*D and d_ff must be multiples of 32), naming the width; before anything is allocated.
void check_weight_shapes(const ModelConfig& cfg, DType dtype);

// One (rows, cols) weight matrix, row-major, each row `row_bytes` bytes (q8_0: cols / 32 blocks).
class NarrowMatrix {
public:
    NarrowMatrix() = default;
    // Encodes w into bytes(dtype, w's shape) taken from `arena`, which must outlive it. Throws UsageError
    // when q8_0 is asked of a row that does not split into blocks of 32 (before taking anything).
    NarrowMatrix(const WeightMatrix& w, DType dtype, const char* name, HugeArena& arena);
    static std::uint64_t bytes(DType dtype, std::int64_t rows, std::int64_t cols);
    std::int64_t rows() const { return rows_; }
    std::int64_t cols() const { return cols_; }
    DType dtype() const { return dtype_; }
    std::uint64_t bytes() const { return n_bytes_; }
    const std::uint8_t* row_data(std::int64_t r) const { return data_ + static_cast<std::size_t>(r) * row_bytes_; }
    // Columns c0..c0+n-1 of row r widened into out (n floats); for q8_0, c0 and n are multiples of 32.
    void decode(std::int64_t r, std::int64_t c0, std::int64_t n, float* out) const;

private:
    DType dtype_ = DType::fp32;
    std::int64_t rows_ = 0, cols_ = 0;
    std::uint64_t row_bytes_ = 0, n_bytes_ = 0;
    std::uint8_t* data_ = nullptr;  // rows x row_bytes_, in the arena
};

struct NarrowLayer {
    NarrowMatrix wq, wk, wv, wo, w1, w3, w2;  // w3 empty for gpt2
};

struct NarrowWeights {
    DType dtype = DType::fp32;
    std::shared_ptr<HugeArena> arena;  // every matrix's bytes, back to back in forward order
    std::vector<NarrowLayer> layers;
    NarrowMatrix classifier;  // lm_head, or the tied token embedding
    std::uint64_t bytes() const;
};

// The matmul kernels over a narrow matrix, for its rows r0..r0+rows-1 (kernels/matmul.hpp's, on widened rows):
// one token: y[i] = w_i . x, `streams` rows side by side (4 or 8; narrow_gemv_streams by default),
// widened in registers (AVX2; elsewhere 512 columns at a time into an L1 buffer for the fp32 kernel);
// neither the stream count nor where the rows start changes a bit of y;
// n tokens: out (n, rows) = x W^T, a panel of rows widened into `panel` (narrow_panel_floats) and
// multiplied by gemm_rows with its `scratch` (gemm_scratch_floats).
void gemv_narrow(const NarrowMatrix& w, std::int64_t r0, std::int64_t rows, const float* x, float* y, int streams);
void gemv_narrow(const NarrowMatrix& w, std::int64_t r0, std::int64_t rows, const float* x, float* y);
// The rows gemv_narrow reads side by side for a dtype on this CPU: bf16 and fp16 as many as gemv_rows
// reads fp32 (gemv_streams(): 4 on AMD, 8 elsewhere); q8_0 8 everywhere: its per-block arithmetic gains
// from more independent rows (docs/performance-log.md).
int narrow_gemv_streams(DType dtype);
std::int64_t narrow_panel_floats(std::int64_t cols);
void gemm_narrow(const NarrowMatrix& w, std::int64_t r0, std::int64_t rows, const float* x, std::int64_t ldx, std::int64_t n,
                 float* out, std::int64_t ldo, float* panel, float* scratch);

// Every matmul weight of w stored as `dtype` (the biases, norms and the embedding table stay fp32).
NarrowWeights narrow_weights(const Weights& w, DType dtype);

// Bytes the narrow copy of a config's weights takes (what narrow_weights allocates), overflow-checked.
std::uint64_t narrow_weights_bytes(const ModelConfig& cfg, DType dtype);

}  // namespace kvlab
