// llama.cpp's KV cache at release b8668 (rules unchanged since b6975, PR #17046), read from
// src/llama-context.cpp (context padding), src/llama-kv-cache.cpp (tensors per layer, the size line),
// src/llama-kv-cache-iswa.cpp (the sliding-window cache) and src/llama-model.cpp (which layers slide).
//
//   n_ctx     = PAD(-c, 256); cells per stream = n_ctx (unified, -kvu) or PAD(n_ctx / -np, 256); streams = 1 or -np
//   SWA cells = PAD(min(cells, n_swa x (unified ? -np : 1) + n_ubatch), 256)   (--swa-full: cells)
//   bytes     = sum over the cache's layers of row_size(type, n_embd_k_gqa) x cells x streams (and V alike)
//   MLA (DeepSeek GGUFs with the MLA split): K rows of kv_lora_rank + rope dims, no V tensor (b7832, PR #19067)
#include "kvlab/calc/engine.hpp"

#include <algorithm>
#include <array>
#include <utility>

#include <fmt/format.h>

#include "kvlab/core/checked.hpp"
#include "kvlab/core/error.hpp"

namespace kvlab {
namespace {

constexpr std::uint64_t pad(std::uint64_t x, std::uint64_t n) { return (x + n - 1) / n * n; }

// ggml's type names for the cache types kvlab sizes (common/arg.cpp lists -ctk/-ctv values)
constexpr std::array<std::pair<DType, std::string_view>, 5> ggml_cache_types{
    {{DType::fp32, "f32"}, {DType::fp16, "f16"}, {DType::bf16, "bf16"}, {DType::q8_0, "q8_0"}, {DType::q4_0, "q4_0"}}};

std::string_view ggml_type_name(DType dtype) {
    for (const auto& [d, name] : ggml_cache_types)
        if (d == dtype) return name;
    throw UsageError(fmt::format("--dtype {}: llama.cpp has no such cache type; its -ctk/-ctv take f32, f16, bf16, q8_0, q4_0 (and q4_1, q5_0, "
                                 "q5_1, iq4_nl, which kvlab does not size)",
                                 dtype_name(dtype)));
}

// The model types whose llama.cpp architecture builds the iSWA cache, and so the layers it windows
// (hparams.set_swa_pattern in llama-model.cpp): Gemma-2 and gpt-oss every other layer from the first,
// Gemma-3 five of every six. The config's own layer rule says the same for these types.
bool llamacpp_windows(const ModelConfig& cfg) {
    return cfg.model_type == "gemma2" || cfg.model_type == "gemma3_text" || cfg.model_type == "gemma3" || cfg.model_type == "gpt_oss";
}

struct Cache {
    std::uint64_t cells = 0;  // per stream
    std::uint64_t layers = 0;
    std::uint64_t k = 0, v = 0;  // bytes, all streams
};

}  // namespace

bool llamacpp_has_cache_type(DType dtype) {
    return std::any_of(ggml_cache_types.begin(), ggml_cache_types.end(), [&](const auto& t) { return t.first == dtype; });
}

EngineAnswer llamacpp_answer(const EngineCase& c, const EngineSettings& s) {
    const ModelConfig& cfg = *c.model;
    const auto type = ggml_type_name(c.dtype);
    if (c.tp > 1)
        throw UsageError(fmt::format("--tp {}: llama.cpp splits layers across GPUs (-sm layer), not heads; size it with --tp 1", c.tp));
    const std::uint64_t n_seq = c.batch;
    const std::uint64_t n_ctx = checked_mul(c.context, n_seq, "llama.cpp -c");
    const std::uint64_t n_ctx_pad = pad(n_ctx, 256);
    const std::uint64_t streams = s.kv_unified ? 1 : n_seq;
    const std::uint64_t cells = s.kv_unified ? n_ctx_pad : pad(n_ctx_pad / n_seq, 256);

    // K and V widths per layer, as ggml_row_size(type, n_embd_{k,v}_gqa)
    std::uint64_t k_row = 0, v_row = 0;
    if (cfg.mla && cfg.gguf_mla_full_kv) {  // every head's key (nope + rope) and value, as an unsplit GGUF loads
        const auto heads = static_cast<std::uint64_t>(cfg.n_head_kv);
        k_row = row_bytes(c.dtype, checked_mul(heads, static_cast<std::uint64_t>(cfg.mla->qk_nope_head_dim + cfg.mla->qk_rope_head_dim), "K row"));
        v_row = row_bytes(c.dtype, checked_mul(heads, static_cast<std::uint64_t>(cfg.mla->v_head_dim), "V row"));
    } else if (cfg.mla) {
        k_row = row_bytes(c.dtype, static_cast<std::uint64_t>(cfg.mla->kv_lora_rank + cfg.mla->qk_rope_head_dim));
    } else if (cfg.lora_attention) {  // MiniCPM3: every head's K (nope + rope) and V at its own width, which vLLM pads to K's
        const auto heads = static_cast<std::uint64_t>(cfg.n_head_kv);
        k_row = row_bytes(c.dtype, checked_mul(heads, static_cast<std::uint64_t>(cfg.d_head), "K row"));
        v_row = row_bytes(c.dtype, checked_mul(heads, static_cast<std::uint64_t>(cfg.lora_attention->v_head_dim), "V row"));
    } else {
        k_row = v_row = row_bytes(c.dtype, static_cast<std::uint64_t>(cfg.d_kv()));
    }

    EngineAnswer a;
    const bool iswa = cfg.sliding_window && llamacpp_windows(cfg) &&
                      std::any_of(cfg.layer_windowed.begin(), cfg.layer_windowed.end(), [](bool w) { return w; });
    Cache base, swa;
    base.cells = cells;
    if (iswa) {
        const auto n_swa = static_cast<std::uint64_t>(*cfg.sliding_window);
        swa.cells = s.swa_full ? cells : pad(std::min(cells, checked_add(checked_mul(n_swa, s.kv_unified ? n_seq : 1, "SWA cells"), s.ubatch, "SWA cells")), 256);
    }
    for (std::int64_t l = 0; l < cfg.n_layer; ++l) {
        Cache& cache = iswa && cfg.layer_windowed[static_cast<std::size_t>(l)] ? swa : base;
        cache.layers += 1;
        cache.k = checked_add(cache.k, checked_mul(checked_mul(k_row, cache.cells, "KV bytes"), streams, "KV bytes"), "KV bytes");
        cache.v = checked_add(cache.v, checked_mul(checked_mul(v_row, cache.cells, "KV bytes"), streams, "KV bytes"), "KV bytes");
    }
    auto size_line = [&](const Cache& k) {
        return fmt::format("llama_kv_cache: size = {:7.2f} MiB ({:6} cells, {:3} layers, {:2}/{} seqs), K ({}): {:7.2f} MiB, V ({}): {:7.2f} MiB",
                           mib(k.k + k.v), k.cells, k.layers, n_seq, streams, type, mib(k.k), type, mib(k.v));
    };
    if (iswa) {
        a.log_lines.push_back(fmt::format("llama_kv_cache_iswa: creating non-SWA KV cache, size = {} cells", base.cells));
        a.log_lines.push_back(size_line(base));
        a.log_lines.push_back(fmt::format("llama_kv_cache_iswa: creating     SWA KV cache, size = {} cells", swa.cells));
        a.log_lines.push_back(size_line(swa));
    } else {
        a.log_lines.push_back(size_line(base));
    }
    a.settings = fmt::format("-c {} -np {}{} -ctk {} -ctv {}{}", n_ctx, n_seq, s.kv_unified ? " -kvu" : "", type, type,
                             iswa ? fmt::format(" -ub {}{}", s.ubatch, s.swa_full ? " --swa-full" : "") : "");
    a.bytes_allocated = base.k + base.v + swa.k + swa.v;
    a.token_capacity = checked_mul(base.cells, streams, "cells");
    if (n_ctx_pad != n_ctx || cells * streams != n_ctx)
        a.notes.push_back(fmt::format("llama.cpp pads -c {} to {} cells ({} per stream x {} stream{})", n_ctx, cells * streams, cells, streams,
                                      streams == 1 ? "" : "s"));
    if (cfg.sliding_window && !iswa)
        a.notes.push_back(fmt::format("{}: sliding window {} not applied: kvlab knows llama.cpp's sliding-window layers for gemma2, gemma3 "
                                      "and gpt-oss only, so every layer is sized with all cells",
                                      cfg.name, *cfg.sliding_window));
    if (cfg.mla && cfg.gguf_mla_full_kv)
        a.notes.push_back(fmt::format("{}: this GGUF has no MLA split (no key_length_mla: converted before llama.cpp b5137), so llama.cpp "
                                      "caches full K ({} x {}) and V ({} x {}) per layer, not the {}-wide latent",
                                      cfg.name, cfg.n_head_kv, cfg.mla->qk_nope_head_dim + cfg.mla->qk_rope_head_dim, cfg.n_head_kv,
                                      cfg.mla->v_head_dim, cfg.mla->kv_lora_rank + cfg.mla->qk_rope_head_dim));
    else if (cfg.lora_attention && cfg.lora_attention->v_head_dim != cfg.d_head)
        a.notes.push_back(fmt::format("{}: llama.cpp caches every head's K at {} (qk_nope + qk_rope) and V at its own {}, where vLLM pads "
                                      "V to {} (the kvcalc tables above)",
                                      cfg.name, cfg.d_head, cfg.lora_attention->v_head_dim, cfg.d_head));
    else if (cfg.mla)
        a.notes.push_back(fmt::format("{}: MLA cache of K rows of {} (kv_lora_rank + rope) and no V, as llama.cpp b7832+ stores GGUFs with "
                                      "the MLA split; GGUFs converted before b5137 store full K/V per head",
                                      cfg.name, cfg.mla->kv_lora_rank + cfg.mla->qk_rope_head_dim));
    return a;
}

}  // namespace kvlab
