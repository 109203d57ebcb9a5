#include "kvlab/calc/kv_memory.hpp"

#include <fmt/format.h>

#include "kvlab/core/checked.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/core/text.hpp"

namespace kvlab {

std::uint64_t KvBytes::total() const { return checked_add(k, v, "KV bytes"); }

KvBytes kv_bytes_per_token_layer(const ModelConfig& cfg, DType dtype) {
    if (cfg.mla) {
        // MLA caches the compressed latent plus the decoupled RoPE key: one row, no separate V.
        const auto width = static_cast<std::uint64_t>(cfg.mla->kv_lora_rank + cfg.mla->qk_rope_head_dim);
        return {row_bytes(dtype, width), 0};
    }
    const auto d_kv = checked_mul(static_cast<std::uint64_t>(cfg.n_head_kv), static_cast<std::uint64_t>(cfg.d_head), "KV row width");
    if (!whole_blocks(dtype, d_kv))  // the rule simulate's cache applies too (check_kv_storage)
        throw UsageError(fmt::format("{} cache of {}: a K/V row of {} values ({} KV heads x {}) does not split into blocks of 32; "
                                     "llama.cpp cannot store it (ggml rows hold whole blocks), nor can kvlab simulate",
                                     dtype_name(dtype), printable(cfg.display_name), d_kv, cfg.n_head_kv, cfg.d_head));
    const auto row = row_bytes(dtype, d_kv);
    return {row, row};
}

KvBytes kv_bytes_per_token(const ModelConfig& cfg, DType dtype) {
    const auto per_layer = kv_bytes_per_token_layer(cfg, dtype);
    const auto n_layer = static_cast<std::uint64_t>(cfg.n_layer);
    return {checked_mul(per_layer.k, n_layer, "KV bytes per token"), checked_mul(per_layer.v, n_layer, "KV bytes per token")};
}

std::uint64_t kv_tokens_held(const ModelConfig& cfg, std::int64_t layer, std::uint64_t n_tokens, WindowMode mode) {
    // a windowed layer holds its last `window` tokens (unsigned: n_tokens may be any user count)
    const auto window = static_cast<std::uint64_t>(cfg.layer_window(layer));
    return mode == WindowMode::cap && window > 0 && window < n_tokens ? window : n_tokens;
}

KvBytes kv_bytes_cross(const ModelConfig& cfg, DType dtype, std::uint64_t block_size) {
    if (!cfg.cross) return {};
    if (cfg.cross->encoder_len <= 0)
        throw UsageError(fmt::format("{}: its config does not say how long the encoder's input is ({}); give --encoder-len N", printable(cfg.name),
                                     cfg.cross->encoder_len_rule));
    const auto per_layer = kv_bytes_per_token_layer(cfg, dtype);
    const auto rows = checked_mul(allocated_tokens(static_cast<std::uint64_t>(cfg.cross->encoder_len), block_size),
                                  static_cast<std::uint64_t>(cfg.n_layer), "cross-attention KV rows");
    return {checked_mul(rows, per_layer.k, "cross-attention KV bytes"), checked_mul(rows, per_layer.v, "cross-attention KV bytes")};
}

KvBytes kv_bytes_sequence(const ModelConfig& cfg, DType dtype, std::uint64_t n_tokens, WindowMode mode) {
    const auto per_layer = kv_bytes_per_token_layer(cfg, dtype);
    KvBytes sum = kv_bytes_cross(cfg, dtype);
    for (std::int64_t layer = 0; layer < cfg.n_layer; ++layer) {
        const auto held = kv_tokens_held(cfg, layer, n_tokens, mode);
        sum.k = checked_add(sum.k, checked_mul(held, per_layer.k, "KV bytes per sequence"), "KV bytes per sequence");
        sum.v = checked_add(sum.v, checked_mul(held, per_layer.v, "KV bytes per sequence"), "KV bytes per sequence");
    }
    return sum;
}

std::uint64_t allocated_tokens(std::uint64_t n_tokens, std::uint64_t block_size) {
    if (block_size == 0) return n_tokens;
    return checked_mul(ceil_div(n_tokens, block_size), block_size, "paged tokens");
}

std::uint64_t kv_slots_held(const ModelConfig& cfg, std::int64_t layer, std::uint64_t n_tokens, WindowMode mode, std::uint64_t block_size) {
    return allocated_tokens(kv_tokens_held(cfg, layer, n_tokens, mode), block_size);
}

KvBytes kv_bytes_sequence_paged(const ModelConfig& cfg, DType dtype, std::uint64_t n_tokens, WindowMode mode, std::uint64_t block_size) {
    const auto per_layer = kv_bytes_per_token_layer(cfg, dtype);
    KvBytes sum = kv_bytes_cross(cfg, dtype, block_size);
    for (std::int64_t layer = 0; layer < cfg.n_layer; ++layer) {
        const auto held = kv_slots_held(cfg, layer, n_tokens, mode, block_size);
        sum.k = checked_add(sum.k, checked_mul(held, per_layer.k, "KV bytes per sequence"), "KV bytes per sequence");
        sum.v = checked_add(sum.v, checked_mul(held, per_layer.v, "KV bytes per sequence"), "KV bytes per sequence");
    }
    return sum;
}

ModelConfig with_kv_heads(const ModelConfig& cfg, std::int64_t n_head_kv) {
    if (n_head_kv <= 0 || cfg.n_head % n_head_kv != 0)
        throw UsageError(fmt::format("--attention/--kv-heads: {} KV heads for {} ({} query heads); expected a divisor of {}",
                                     n_head_kv, cfg.name, cfg.n_head, cfg.n_head));
    ModelConfig out = cfg;
    out.n_head_kv = n_head_kv;
    out.mla.reset();
    out.kv_heads_rule = fmt::format("{} KV heads (what-if override of {})", n_head_kv, cfg.attention_kind());
    return out;
}

}  // namespace kvlab
