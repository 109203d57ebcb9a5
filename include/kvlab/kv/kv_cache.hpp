// KvCache: the simulator's preallocated K and V buffers, per layer, keys stored after RoPE.
// Sliding-window layers keep only the last W positions in a ring buffer. Non-goal: batching, paging.
//
// Storage: fp32 matrices, or one of the narrow formats of kv/kv_format.hpp (KvStorage). A narrow
// layer keeps its rows encoded (KvRowStore: the bytes and their scales are all it holds of them);
// attention decodes them a chunk of rows at a time as it reads them (kernels/attention.hpp).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "kvlab/calc/model_config.hpp"
#include "kvlab/core/choice.hpp"
#include "kvlab/core/dtype.hpp"
#include "kvlab/core/matrix.hpp"
#include "kvlab/kv/kv_view.hpp"

namespace kvlab {

// fp8 and int8 scales: one per layer for K and one for V, set from the absolute max of the first rows
// written (the prefill), as TensorRT-LLM's kv_cache_scaling_factor; or one per token per KV head, set
// when the token is written. fp16, bf16, q8_0 and q4_0 take none (q8_0 and q4_0 carry block scales).
enum class KvScale { tensor, token_head };
inline constexpr std::array<Choice<KvScale>, 2> kv_scale_choices{{{"tensor", KvScale::tensor}, {"token-head", KvScale::token_head}}};

struct KvStorage {
    DType dtype = DType::fp32;
    KvScale scale = KvScale::tensor;
    bool scaled() const { return dtype == DType::fp8_e4m3 || dtype == DType::fp8_e5m2 || dtype == DType::int8; }
};
// The scale a scaled format stores for values whose absolute max is amax: amax / the format's largest value
// (fp8 e4m3 448, e5m2 57344, int8 127), so the largest value maps onto it; 1 when amax is 0 or not finite.
float amax_to_scale(float amax, DType dtype);
// Throws UsageError for a dtype the cache cannot store (int4) or a row q8_0/q4_0 cannot split into 32s.
void check_kv_storage(const KvStorage& storage, std::int64_t d_kv);

// Bytes one K (or V) row of Hkv x D values takes: the values at the stored width (q8_0, q4_0 with their
// block scales: row_bytes of core/dtype, the function kvcalc sizes with), plus one fp32 scale per KV head
// for token-head scaling. Per-tensor scales are per layer, not per row (KvCache::bytes counts them).
std::uint64_t kv_stored_row_bytes(const KvStorage& storage, std::int64_t n_head_kv, std::int64_t d_head);
// One token's K and V over every layer at the stored width: 2 x layers x kv_stored_row_bytes.
std::uint64_t kv_stored_token_bytes(const KvStorage& storage, const ModelConfig& cfg);

// Bytes a cache stored as `storage` holds after n_tokens positions: every layer's held rows at the stored
// width (scales included) and the per-tensor scales; equals KvCache::bytes() when the cache is full.
std::uint64_t kv_resident_bytes(const ModelConfig& cfg, const KvStorage& storage, std::uint64_t n_tokens);

// One layer's K (or V) rows in a narrow format.
class KvRowStore {
public:
    KvRowStore(const KvStorage& storage, std::int64_t n_rows, std::int64_t n_head_kv, std::int64_t d_head);
    // Per-tensor scale from the absolute max of rows 0..n-1 of x (the first write); later writes reuse it.
    void calibrate(const MatrixRM& x, std::int64_t n);
    bool calibrated() const { return calibrated_; }
    void write(std::int64_t row, const float* x);   // encode Hkv*D values into `row`
    void read(std::int64_t row, float* out) const;  // decode `row` into Hkv*D floats
    // Decode KV head h of rows row0..row0+n-1 into out, (n, D) row-major: the chunks attention reads.
    void read_head(std::int64_t row0, std::int64_t n, std::int64_t h, float* out) const;
    std::uint64_t bytes() const;                    // values and every scale held
    float tensor_scale() const { return tensor_scale_; }
    // A row as stored: its encoded values, then (token-head scaling) its Hkv fp32 scales; stored_row_bytes
    // each. What a serving pool copies (copy-on-write) and swaps to host memory, bit for bit.
    std::uint64_t stored_row_bytes() const { return row_bytes_ + sizeof(float) * (head_scales_.empty() ? 0 : static_cast<std::uint64_t>(n_head_kv_)); }
    void save_rows(std::int64_t row0, std::int64_t n, std::uint8_t* out) const;
    void load_rows(std::int64_t row0, std::int64_t n, const std::uint8_t* in);
    void copy_rows(std::int64_t src, std::int64_t dst, std::int64_t n);

private:
    KvStorage storage_;
    std::int64_t n_head_kv_, d_head_, width_;
    std::uint64_t row_bytes_;            // encoded values of one row (no per-row scales)
    std::uint64_t n_data_ = 0;
    std::unique_ptr<std::uint8_t[]> data_;  // n_rows x row_bytes_, zeroed; huge pages advised (as fp32 caches get)
    std::vector<float> head_scales_;     // token-head: n_rows x Hkv
    float tensor_scale_ = 1.0f;
    bool calibrated_ = false;
    bool holds_nan_ = false;             // a NaN code was written (fp8 e4m3 decodes faster without)
};

class KvCache {
public:
    // Room for positions 0..n_tokens_max-1; layer l holds kv_tokens_held(cfg, l, n_tokens_max, cap)
    // rows, so bytes() == kv_bytes_sequence(cfg, dtype, n_tokens_max, cap).total() (+ per-tensor scales).
    KvCache(const ModelConfig& cfg, std::int64_t n_tokens_max, const KvStorage& storage = {});

    std::int64_t n_tokens_max() const { return n_tokens_max_; }
    std::int64_t n_rows(std::int64_t layer) const { return rows_[static_cast<std::size_t>(layer)]; }
    // Row holding position `pos` in `layer`: pos itself, or its place in the ring (after the sinks).
    std::int64_t row_of(std::int64_t layer, std::int64_t pos) const { return kv_ring_row(pos, n_rows(layer), n_sink_[static_cast<std::size_t>(layer)]); }
    std::int64_t n_sink(std::int64_t layer) const { return n_sink_[static_cast<std::size_t>(layer)]; }
    const KvStorage& storage() const { return storage_; }
    bool narrow() const { return storage_.dtype != DType::fp32; }
    // fp32 storage only: the layer's rows (null for a narrow cache).
    MatrixRM* k(std::int64_t layer) { return narrow() ? nullptr : &k_[static_cast<std::size_t>(layer)]; }
    MatrixRM* v(std::int64_t layer) { return narrow() ? nullptr : &v_[static_cast<std::size_t>(layer)]; }
    // Narrow storage only: the layer's encoded rows.
    KvRowStore* k_store(std::int64_t layer) { return narrow() ? &k_store_[static_cast<std::size_t>(layer)] : nullptr; }
    KvRowStore* v_store(std::int64_t layer) { return narrow() ? &v_store_[static_cast<std::size_t>(layer)] : nullptr; }
    // Bytes one stored K (or V) row takes (the cost model's kv_row_bytes).
    std::uint64_t row_bytes() const { return row_bytes_; }
    // Where layer `layer`'s rows are, as attention reads and writes them.
    KvView view(std::int64_t layer);
    // Bytes held for K and V over all layers at the stored width, scales included.
    std::uint64_t bytes() const;

private:
    std::int64_t n_tokens_max_ = 0;
    KvStorage storage_;
    std::uint64_t row_bytes_ = 0;
    std::vector<std::int64_t> rows_;
    std::vector<std::int64_t> n_sink_;             // per layer: the config's sink_tokens on a windowed layer, else 0
    std::vector<MatrixRM> k_, v_;                  // fp32: L of (rows_l, Hkv*D)
    std::vector<KvRowStore> k_store_, v_store_;    // narrow: L of rows_l encoded rows
};

}  // namespace kvlab
