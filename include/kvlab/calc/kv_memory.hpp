// KV-cache sizes: the ONE place they are computed. kvcalc prints them; the simulator allocates them.
// Formula (docs/kv-memory.md): bytes = sum over layers of tokens_held(layer, T) * (K row + V row),
// row = row_bytes(dtype, Hkv*D); MLA caches one latent row of (kv_lora_rank + qk_rope_head_dim), no V.
#pragma once
#include <cstdint>

#include "kvlab/core/choice.hpp"
#include "kvlab/core/dtype.hpp"
#include "kvlab/calc/model_config.hpp"

namespace kvlab {

enum class WindowMode { cap, ignore };  // cap: windowed layers hold min(W, T) tokens; ignore: T
inline constexpr std::array<Choice<WindowMode>, 2> window_mode_choices{{{"cap", WindowMode::cap}, {"ignore", WindowMode::ignore}}};

struct KvBytes {
    std::uint64_t k = 0;  // bytes of keys (MLA: the latent)
    std::uint64_t v = 0;  // bytes of values (MLA: 0)
    std::uint64_t total() const;
};

// One token, one layer: K row and V row.
KvBytes kv_bytes_per_token_layer(const ModelConfig& cfg, DType dtype);
// One token across all layers (every layer holds it: no window applied).
KvBytes kv_bytes_per_token(const ModelConfig& cfg, DType dtype);
// Tokens layer `layer` keeps resident after T positions.
std::uint64_t kv_tokens_held(const ModelConfig& cfg, std::int64_t layer, std::uint64_t n_tokens, WindowMode mode);
// An encoder-decoder model's cross-attention cache for one sequence: encoder_len rows (rounded up to whole
// blocks of `block_size`; 0: no paging) per decoder layer, K and V; {0, 0} for a decoder-only model.
// Throws UsageError naming --encoder-len when the config does not say the encoder's length.
KvBytes kv_bytes_cross(const ModelConfig& cfg, DType dtype, std::uint64_t block_size = 0);
// One sequence of T tokens, all layers, windows applied per `mode` (an encoder-decoder model: T generated
// tokens in the self-attention cache plus its cross-attention cache).
KvBytes kv_bytes_sequence(const ModelConfig& cfg, DType dtype, std::uint64_t n_tokens, WindowMode mode);
// Tokens rounded up to whole blocks of `block_size` (0: no paging, T itself).
std::uint64_t allocated_tokens(std::uint64_t n_tokens, std::uint64_t block_size);
// Token slots layer `layer` holds after T positions in blocks of `block_size` tokens (0: no paging,
// = kv_tokens_held): its held tokens rounded up to whole blocks, a full layer ceil(T / N) blocks and a
// windowed one ceil(min(W, T) / N), kept as a ring of blocks (as kvlab serve keeps it).
std::uint64_t kv_slots_held(const ModelConfig& cfg, std::int64_t layer, std::uint64_t n_tokens, WindowMode mode, std::uint64_t block_size);
// One sequence in blocks: kv_bytes_sequence with kv_slots_held per layer.
KvBytes kv_bytes_sequence_paged(const ModelConfig& cfg, DType dtype, std::uint64_t n_tokens, WindowMode mode, std::uint64_t block_size);

// A what-if copy of `cfg` with `n_head_kv` KV heads (MHA = n_head, MQA = 1). Drops MLA.
// Throws UsageError when n_head is not a multiple of n_head_kv.
ModelConfig with_kv_heads(const ModelConfig& cfg, std::int64_t n_head_kv);

}  // namespace kvlab
