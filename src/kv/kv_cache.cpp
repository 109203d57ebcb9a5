#include "kvlab/kv/kv_cache.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include <Eigen/Core>
#include <fmt/format.h>

#include "kvlab/calc/kv_memory.hpp"
#include "kvlab/core/checked.hpp"
#include "kvlab/core/huge_pages.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/kv/kv_format.hpp"

namespace kvlab {
namespace {

// The largest value each scaled format holds: a scale of amax / this maps the largest value onto it.
float format_max(DType dtype) {
    switch (dtype) {
    case DType::fp8_e4m3: return fp8_e4m3_max;
    case DType::fp8_e5m2: return fp8_e5m2_max;
    case DType::int8: return int8_max;
    default: return 1.0f;
    }
}

}  // namespace

float amax_to_scale(float amax, DType dtype) { return amax > 0.0f && std::isfinite(amax) ? amax / format_max(dtype) : 1.0f; }

void check_kv_storage(const KvStorage& s, std::int64_t d_kv) {
    if (s.dtype == DType::int4)
        throw UsageError("--kv-dtype int4: the cache stores fp32, fp16, bf16, fp8_e4m3, fp8_e5m2, int8, q8_0 and q4_0; int4 is a kvcalc what-if only");
    if (!whole_blocks(s.dtype, static_cast<std::uint64_t>(d_kv)))
        throw UsageError(fmt::format("--kv-dtype {}: a K/V row of {} values (an MLA latent row: its rank + RoPE dims) does not split into blocks of 32", dtype_name(s.dtype), d_kv));
}

std::uint64_t kv_stored_row_bytes(const KvStorage& s, std::int64_t n_head_kv, std::int64_t d_head) {
    const auto values = row_bytes(s.dtype, static_cast<std::uint64_t>(n_head_kv * d_head));
    return s.scaled() && s.scale == KvScale::token_head ? values + sizeof(float) * static_cast<std::uint64_t>(n_head_kv) : values;
}

std::uint64_t kv_stored_token_bytes(const KvStorage& storage, const ModelConfig& cfg) {
    return checked_mul(static_cast<std::uint64_t>(kv_rows_per_token(cfg) * cfg.n_layer),
                       kv_stored_row_bytes(storage, kv_row_heads(cfg), kv_row_head_dim(cfg)), "KV bytes per token");
}

std::uint64_t kv_resident_bytes(const ModelConfig& cfg, const KvStorage& storage, std::uint64_t n_tokens) {
    // MLA: one latent row per token, so one per-tensor scale per layer
    const std::uint64_t rows_per_token = static_cast<std::uint64_t>(kv_rows_per_token(cfg));
    const std::uint64_t row = kv_stored_row_bytes(storage, kv_row_heads(cfg), kv_row_head_dim(cfg));
    const std::uint64_t per_layer_scales = storage.scaled() && storage.scale == KvScale::tensor ? rows_per_token * sizeof(float) : 0;
    std::uint64_t sum = 0;
    for (std::int64_t l = 0; l < cfg.n_layer; ++l)
        sum = checked_add(sum, checked_add(checked_mul(rows_per_token * row, kv_tokens_held(cfg, l, n_tokens, WindowMode::cap), "KV bytes"), per_layer_scales,
                                           "KV bytes"), "KV bytes");
    return sum;
}

KvRowStore::KvRowStore(const KvStorage& storage, std::int64_t n_rows, std::int64_t n_head_kv, std::int64_t d_head)
    : storage_(storage), n_head_kv_(n_head_kv), d_head_(d_head), width_(n_head_kv * d_head),
      row_bytes_(row_bytes(storage.dtype, static_cast<std::uint64_t>(n_head_kv * d_head))) {
    n_data_ = checked_mul(row_bytes_, static_cast<std::uint64_t>(n_rows), "KV cache bytes");
    data_.reset(new std::uint8_t[n_data_]);  // advised before the zeroing touches it
    advise_huge_pages(data_.get(), n_data_);
    std::memset(data_.get(), 0, n_data_);
    if (storage_.scaled() && storage_.scale == KvScale::token_head) head_scales_.assign(static_cast<std::size_t>(n_rows * n_head_kv), 1.0f);
}

void KvRowStore::calibrate(const MatrixRM& x, std::int64_t n) {
    calibrated_ = true;
    if (!storage_.scaled() || storage_.scale != KvScale::tensor) return;
    tensor_scale_ = amax_to_scale(x.topRows(n).cwiseAbs().maxCoeff(), storage_.dtype);
}

void KvRowStore::write(std::int64_t row, const float* x) {
    std::uint8_t* out = data_.get() + static_cast<std::size_t>(row) * row_bytes_;
    switch (storage_.dtype) {
    case DType::fp16:
    case DType::bf16:
        for (std::int64_t i = 0; i < width_; ++i) {
            const std::uint16_t c = storage_.dtype == DType::fp16 ? fp16_encode(x[i]) : bf16_encode(x[i]);
            std::memcpy(out + 2 * i, &c, 2);
        }
        return;
    case DType::fp8_e4m3:
    case DType::fp8_e5m2:
    case DType::int8:
        for (std::int64_t h = 0; h < n_head_kv_; ++h) {
            const float* xh = x + h * d_head_;
            float scale = tensor_scale_;
            if (storage_.scale == KvScale::token_head) {  // this token's head: its own absolute max
                float amax = 0.0f;
                for (std::int64_t i = 0; i < d_head_; ++i) amax = std::max(amax, std::fabs(xh[i]));
                scale = head_scales_[static_cast<std::size_t>(row * n_head_kv_ + h)] = amax_to_scale(amax, storage_.dtype);
            }
            const float inv = 1.0f / scale;  // quantize as x x (1 / scale), as TensorRT-LLM does
            std::uint8_t* oh = out + h * d_head_;
            for (std::int64_t i = 0; i < d_head_; ++i) {
                const float y = xh[i] * inv;
                oh[i] = storage_.dtype == DType::fp8_e4m3   ? fp8_e4m3_encode(y)
                        : storage_.dtype == DType::fp8_e5m2 ? fp8_e5m2_encode(y)
                                                            : static_cast<std::uint8_t>(int8_encode(y));
                holds_nan_ = holds_nan_ || std::isnan(y);
            }
        }
        return;
    case DType::q8_0:
    case DType::q4_0:
        for (std::int64_t b = 0; b < width_ / kv_block_values; ++b) {
            const std::span<const float, 32> block(x + b * kv_block_values, 32);
            if (storage_.dtype == DType::q8_0) {
                const BlockQ8_0 q = quantize_q8_0(block);
                std::memcpy(out + b * sizeof(BlockQ8_0), &q, sizeof q);
            } else {
                const BlockQ4_0 q = quantize_q4_0(block);
                std::memcpy(out + b * sizeof(BlockQ4_0), &q, sizeof q);
            }
        }
        return;
    default: throw std::logic_error("KvRowStore: unchecked storage dtype");
    }
}

void KvRowStore::read(std::int64_t row, float* x) const {
    for (std::int64_t h = 0; h < n_head_kv_; ++h) read_head(row, 1, h, x + h * d_head_);
}

void KvRowStore::read_head(std::int64_t row0, std::int64_t n, std::int64_t h, float* out) const {
    // attention decodes every held value each step: one format per call, and for each row one loop the
    // compiler vectorizes or a decoder of kv_format (F16C)
    const std::int64_t D = d_head_, first = h * D;  // this head's values: first .. first+D-1 of the row
    const bool row_scales = !head_scales_.empty();
    const std::uint8_t* data = data_.get();
    const float* scales = head_scales_.data();
    const std::uint64_t row_bytes = row_bytes_;
    const std::int64_t n_head_kv = n_head_kv_;
    const float tensor_scale = tensor_scale_;
    auto each_row = [=](auto decode) {  // copies: nothing the decoder writes can alias them
        float* o = out;
        for (std::int64_t r = row0; r < row0 + n; ++r, o += D)
            decode(data + static_cast<std::size_t>(r) * row_bytes, row_scales ? scales[r * n_head_kv + h] : tensor_scale, o);
    };
    switch (storage_.dtype) {
    case DType::fp16: return each_row([=](const std::uint8_t* in, float, float* out) { fp16_decode_n(reinterpret_cast<const std::uint16_t*>(in) + first, out, D); });
    case DType::bf16: return each_row([=](const std::uint8_t* in, float, float* out) { bf16_decode_n(reinterpret_cast<const std::uint16_t*>(in) + first, out, D); });
    case DType::fp8_e4m3:
        if (holds_nan_) return each_row([=](const std::uint8_t* in, float scale, float* out) { fp8_e4m3_decode_n(in + first, out, D, scale); });
        return each_row([=](const std::uint8_t* in, float scale, float* out) { fp8_e4m3_decode_n_finite(in + first, out, D, scale); });
    case DType::fp8_e5m2: return each_row([=](const std::uint8_t* in, float scale, float* out) { fp8_e5m2_decode_n(in + first, out, D, scale); });
    case DType::int8:
        return each_row([=](const std::uint8_t* in, float scale, float* out) {
            const auto* c = reinterpret_cast<const std::int8_t*>(in) + first;
            for (std::int64_t i = 0; i < D; ++i) out[i] = static_cast<float>(c[i]) * scale;
        });
    case DType::q8_0:
    case DType::q4_0:
        return each_row([=, q8 = storage_.dtype == DType::q8_0](const std::uint8_t* in, float, float* out) {
            // the blocks of 32 that hold values first..first+D-1 (a head need not start a block)
            for (std::int64_t b = first / kv_block_values; b * kv_block_values < first + D; ++b) {
                const std::int64_t b0 = b * kv_block_values, lo = std::max(first, b0), hi = std::min(first + D, b0 + kv_block_values);
                std::array<float, kv_block_values> block;
                const bool whole = lo == b0 && hi == b0 + kv_block_values;
                float* dst = whole ? out + (b0 - first) : block.data();
                const std::uint8_t* blk = in + b * static_cast<std::int64_t>(q8 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0));
                if (q8) q8_0_decode_block(blk, dst);
                else q4_0_decode_block(blk, dst);
                if (!whole) std::copy(block.data() + (lo - b0), block.data() + (hi - b0), out + (lo - first));
            }
        });
    default: throw std::logic_error("KvRowStore: unchecked storage dtype");
    }
}

void KvRowStore::save_rows(std::int64_t row0, std::int64_t n, std::uint8_t* out) const {
    for (std::int64_t r = row0; r < row0 + n; ++r, out += stored_row_bytes()) {
        std::memcpy(out, data_.get() + static_cast<std::size_t>(r) * row_bytes_, row_bytes_);
        if (!head_scales_.empty())
            std::memcpy(out + row_bytes_, head_scales_.data() + r * n_head_kv_, sizeof(float) * static_cast<std::size_t>(n_head_kv_));
    }
}

void KvRowStore::load_rows(std::int64_t row0, std::int64_t n, const std::uint8_t* in) {
    for (std::int64_t r = row0; r < row0 + n; ++r, in += stored_row_bytes()) {
        std::memcpy(data_.get() + static_cast<std::size_t>(r) * row_bytes_, in, row_bytes_);
        if (!head_scales_.empty())
            std::memcpy(head_scales_.data() + r * n_head_kv_, in + row_bytes_, sizeof(float) * static_cast<std::size_t>(n_head_kv_));
    }
}

void KvRowStore::copy_rows(std::int64_t src, std::int64_t dst, std::int64_t n) {
    std::memmove(data_.get() + static_cast<std::size_t>(dst) * row_bytes_, data_.get() + static_cast<std::size_t>(src) * row_bytes_,
                 static_cast<std::size_t>(n) * row_bytes_);
    if (!head_scales_.empty())
        std::copy_n(head_scales_.begin() + src * n_head_kv_, n * n_head_kv_, head_scales_.begin() + dst * n_head_kv_);
}

std::uint64_t KvRowStore::bytes() const {
    // (a store of no rows, MLA's absent values, holds no scale either)
    const std::uint64_t tensor = storage_.scaled() && storage_.scale == KvScale::tensor && n_data_ > 0 ? sizeof(float) : 0;
    return n_data_ + sizeof(float) * head_scales_.size() + tensor;
}

KvCache::KvCache(const ModelConfig& cfg, std::int64_t n_tokens_max, const KvStorage& storage)
    : n_tokens_max_(n_tokens_max), storage_(storage) {
    if (n_tokens_max <= 0)
        throw UsageError(fmt::format("KV cache: {} positions; expected at least 1", n_tokens_max));
    // MLA: the K rows hold the latent (one "head" of kv_lora_rank + qk_rope_head_dim), the V rows none
    const std::int64_t heads = kv_row_heads(cfg), width = kv_row_head_dim(cfg), v_rows = cfg.mla ? 0 : 1;
    check_kv_storage(storage, kv_row_values(cfg));
    row_bytes_ = kv_stored_row_bytes(storage, heads, width);
    for (std::int64_t l = 0; l < cfg.n_layer; ++l) {
        // the row count comes from the same function kvcalc sizes the cache with
        const auto rows = static_cast<std::int64_t>(kv_tokens_held(cfg, l, static_cast<std::uint64_t>(n_tokens_max), WindowMode::cap));
        rows_.push_back(rows);
        n_sink_.push_back(cfg.layer_window(l) > 0 ? cfg.sink_tokens : 0);
        if (narrow()) {
            k_store_.emplace_back(storage, rows, heads, width);
            v_store_.emplace_back(storage, rows * v_rows, heads, width);
        } else {
            k_.emplace_back(large_zero_matrix(rows, heads * width));
            v_.emplace_back(large_zero_matrix(rows * v_rows, heads * width));
        }
    }
}

std::uint64_t KvCache::bytes() const {
    std::uint64_t sum = 0;
    for (std::size_t l = 0; l < k_.size(); ++l) sum += sizeof(float) * static_cast<std::uint64_t>(k_[l].size() + v_[l].size());
    for (std::size_t l = 0; l < k_store_.size(); ++l) sum += k_store_[l].bytes() + v_store_[l].bytes();
    return sum;
}


KvView KvCache::view(std::int64_t layer) {
    KvView kv;
    kv.k = k(layer);
    kv.v = v(layer);
    kv.k_store = k_store(layer);
    kv.v_store = v_store(layer);
    kv.row_bytes = narrow() ? row_bytes_ : 0;
    kv.n_rows = n_rows(layer);
    kv.n_sink = n_sink(layer);
    return kv;
}

}  // namespace kvlab
