// llama.cpp's KV cache at release b8668 (rules unchanged since b6975, PR #17046), read from
// src/llama-context.cpp (context padding), src/llama-kv-cache.cpp (tensors per layer, the size line),
// src/llama-kv-cache-iswa.cpp (the sliding-window cache) and src/llama-model.cpp (which layers slide).
//
//   n_ctx     = PAD(-c, 256); cells per stream = n_ctx (unified, -kvu) or PAD(n_ctx / -np, 256); streams = 1 or -np
//   SWA cells = PAD(min(cells, n_swa x (unified ? -np : 1) + n_ubatch), 256)   (--swa-full: cells)
// Older releases pad by another rule (cell_padding below): up to b6851 P = 256 with flash attention, 32 without
// (get_padding), cells = PAD(-c, P) or PAD(ceil(-c / -np), P) per stream, SWA cells = min(cells, PAD(n_swa x k + n_ubatch, P));
// b6870-b6974 (PR #16812 until PR #17046) pad nothing.
//   bytes     = sum over the cache's layers of row_size(type, n_embd_k_gqa) x cells x streams (and V alike)
//   MLA (DeepSeek GGUFs with the MLA split): K rows of kv_lora_rank + rope dims, no V tensor (b7832, PR #19067)
#include "kvlab/calc/engine.hpp"

#include <algorithm>
#include <array>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

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
    std::vector<std::uint64_t> device_bytes;  // K + V bytes on each device (-sm layer), when split
};

// K and V widths per layer, as ggml_row_size(type, n_embd_{k,v}_gqa), by the release's MLA rule.
std::pair<std::uint64_t, std::uint64_t> kv_rows(const ModelConfig& cfg, DType dtype, std::uint64_t version) {
    if (cfg.mla && (cfg.gguf_mla_full_kv || version < 5137)) {  // every head's key (nope + rope) and value, as an unsplit GGUF loads
        const auto heads = static_cast<std::uint64_t>(cfg.n_head_kv);
        return {row_bytes(dtype, checked_mul(heads, static_cast<std::uint64_t>(cfg.mla->qk_nope_head_dim + cfg.mla->qk_rope_head_dim), "K row")),
                row_bytes(dtype, checked_mul(heads, static_cast<std::uint64_t>(cfg.mla->v_head_dim), "V row"))};
    }
    if (cfg.mla)  // b5137-b7831 also kept a V of kv_lora_rank per layer; b7832 (PR #19067) none
        return {row_bytes(dtype, static_cast<std::uint64_t>(cfg.mla->kv_lora_rank + cfg.mla->qk_rope_head_dim)),
                version < 7832 ? row_bytes(dtype, static_cast<std::uint64_t>(cfg.mla->kv_lora_rank)) : 0};
    if (cfg.lora_attention) {  // MiniCPM3: every head's K (nope + rope) and V at its own width, which vLLM pads to K's
        const auto heads = static_cast<std::uint64_t>(cfg.n_head_kv);
        return {row_bytes(dtype, checked_mul(heads, static_cast<std::uint64_t>(cfg.d_head), "K row")),
                row_bytes(dtype, checked_mul(heads, static_cast<std::uint64_t>(cfg.lora_attention->v_head_dim), "V row"))};
    }
    const auto row = row_bytes(dtype, static_cast<std::uint64_t>(cfg.d_kv()));
    return {row, row};
}

// The size line as the release prints it: the prefix is the cache constructor's __func__, llama_kv_cache_unified until
// PR #15467 renamed the class (tag-bracketed b6218..b6250, engine_versions.cpp), and the seqs column (%2u seqs before
// b5913, PR #14363's build, so b5912 is the last without it; %2u/%2u until b6081 (tag-bracketed from b6018); %2u/%u since).
constexpr std::uint64_t renamed_cache = 6250;

// The release's cache padding and its cells per stream. Up to b6851 llama_kv_cache(_unified)::get_padding gave 256 cells
// with flash attention and 32 without, and create_memory (src/llama-model.cpp) padded -c, or ceil(-c / -np) per stream, to
// it; PR #16812 (b6870) dropped the padding (n_pad 1); PR #17046 (b6975) pads -c, then -c / -np, to 256 again.
// Flash attention as create_memory saw it: -fa on; -fa auto too (the memory is made before auto resolves, PR #26460's
// description); not given: off before b6327 (PR #15434 made auto the default), auto since.
struct CellRule {
    std::uint64_t pad = 256;
    std::uint64_t cells = 0;  // per stream
    bool flash = true;        // as the padding saw it
};

CellRule cell_rule(std::uint64_t version, FlashAttn fa, std::uint64_t n_ctx, std::uint64_t n_seq, bool unified) {
    CellRule r;
    r.flash = fa == FlashAttn::on || fa == FlashAttn::automatic || (fa == FlashAttn::unset && version >= 6327);
    if (version >= 6975) {
        const std::uint64_t n_ctx_pad = pad(n_ctx, 256);
        r.cells = unified ? n_ctx_pad : pad(n_ctx_pad / n_seq, 256);
        return r;
    }
    r.pad = version >= 6870 ? 1 : r.flash ? 256 : 32;
    r.cells = pad(unified ? n_ctx : (n_ctx + n_seq - 1) / n_seq, r.pad);
    return r;
}

std::string size_line(std::uint64_t version, const Cache& k, std::uint64_t n_seq, std::uint64_t streams, std::string_view type) {
    const std::string seqs = version < 5913 ? fmt::format("{:2} seqs", n_seq)
                             : version < 6081 ? fmt::format("{:2}/{:2} seqs", n_seq, streams)
                                              : fmt::format("{:2}/{} seqs", n_seq, streams);
    return fmt::format("{}: size = {:7.2f} MiB ({:6} cells, {:3} layers, {}), K ({}): {:7.2f} MiB, V ({}): {:7.2f} MiB",
                       version < renamed_cache ? "llama_kv_cache_unified" : "llama_kv_cache", mib(k.k + k.v), k.cells, k.layers, seqs, type, mib(k.k), type,
                       mib(k.v));
}

// One cache's lines: the per-device buffers (when the layers are split over devices), then the size line.
void push_cache_lines(std::uint64_t version, const Cache& k, std::uint64_t n_seq, std::uint64_t streams, std::string_view type,
                      std::vector<std::string>& lines) {
    if (k.device_bytes.size() > 1)
        for (std::size_t d = 0; d < k.device_bytes.size(); ++d)
            lines.push_back(fmt::format("{}: {:>10} KV buffer size = {:8.2f} MiB", version < renamed_cache ? "llama_kv_cache_unified" : "llama_kv_cache",
                                        fmt::format("CUDA{}", d), static_cast<double>(k.device_bytes[d]) / 1024.0 / 1024.0));
    lines.push_back(size_line(version, k, n_seq, streams, type));
}

// The model's layers into the non-SWA cache and the SWA cache (iswa), each with its cells, bytes and per-device split.
void fill_caches(const ModelConfig& cfg, bool iswa, std::uint64_t k_row, std::uint64_t v_row, std::uint64_t streams,
                 const std::vector<std::uint64_t>& split, Cache& base, Cache& swa) {
    base.device_bytes.assign(split.size(), 0);
    swa.device_bytes.assign(split.size(), 0);
    std::size_t dev = 0;
    std::uint64_t left_on_dev = split.at(0);
    for (std::int64_t l = 0; l < cfg.n_layer; ++l) {
        while (left_on_dev == 0) left_on_dev = split.at(++dev);
        left_on_dev -= 1;
        Cache& cache = iswa && cfg.layer_windowed[static_cast<std::size_t>(l)] ? swa : base;
        cache.layers += 1;
        const auto k = checked_mul(checked_mul(k_row, cache.cells, "KV bytes"), streams, "KV bytes");
        const auto v = checked_mul(checked_mul(v_row, cache.cells, "KV bytes"), streams, "KV bytes");
        cache.k = checked_add(cache.k, k, "KV bytes");
        cache.v = checked_add(cache.v, v, "KV bytes");
        cache.device_bytes[dev] += k + v;
    }
}

// llama-server -md: every slot (-np) gets its own draft context (llama_init_from_model per slot), one sequence, at
// -ctkd/-ctvd (default f16), of -cd cells, else (-cd 0, kvlab's case) the target's context per sequence:
//   tools/server/server-context.cpp: params_dft.n_ctx = n_ctx == 0 ? llama_n_ctx_seq(ctx) : n_ctx, where
//   src/llama-context.cpp makes n_ctx_seq = n_ctx (-kvu) or PAD(n_ctx / n_seq_max, 256): -kvu gives every slot's
//   draft all -c cells; kvlab applies it from b6975 (PR #17046, whose review the n_ctx_seq code cites; the server
//   commit that switched was not identified)
//   older tools/server/server.cpp: params_dft.n_ctx = n_ctx / n_parallel (-c / -np, -kvu or not), padded to 256
void add_llamacpp_draft(const ModelConfig& draft, const EngineCase& c, const EngineSettings& s, std::uint64_t version, std::uint64_t n_ctx,
                        std::uint64_t n_ctx_seq, EngineAnswer& a) {
    const auto [k_row, v_row] = kv_rows(draft, DType::fp16, version);
    Cache d;
    d.cells = version >= 6975 ? n_ctx_seq : cell_rule(version, s.flash_attn, std::max<std::uint64_t>(n_ctx / c.batch, 1), 1, true).cells;
    Cache unused;
    fill_caches(draft, false, k_row, v_row, 1, {static_cast<std::uint64_t>(draft.n_layer)}, d, unused);
    a.log_lines.push_back(size_line(version, d, 1, 1, "f16"));
    a.bytes_allocated = checked_add(*a.bytes_allocated, checked_mul(d.k + d.v, c.batch, "draft KV"), "draft KV");
    a.notes.push_back(fmt::format("draft {} (-md): its own context per slot, {} slot{} x {} cells x {} layers at f16 (-ctkd/-ctvd): {} B in all, "
                                  "counted in engine allocates{}",
                                  draft.name, c.batch, c.batch == 1 ? "" : "s", d.cells, d.layers, (d.k + d.v) * c.batch,
                                  s.pp > 1 ? " (on the fullest device, as if it were there)" : ""));
}

// The notes on padding, windows and the MLA layout the release caches.
void add_llamacpp_notes(const ModelConfig& cfg, std::uint64_t version, std::uint64_t n_ctx, const CellRule& rule, std::uint64_t streams, bool iswa,
                        EngineAnswer& a) {
    const std::uint64_t cells = rule.cells;
    if (cells * streams != n_ctx)
        a.notes.push_back(fmt::format("llama.cpp pads -c {} to {} cells ({} per stream x {} stream{})", n_ctx, cells * streams, cells, streams,
                                      streams == 1 ? "" : "s"));
    if (version < 6975)
        a.notes.push_back(version >= 6870 ? fmt::format("llama.cpp b{} pads no cache (PR #16812 dropped the padding; PR #17046, b6975, padded to 256 again)", version)
                                          : fmt::format("llama.cpp b{} pads the cache to {} cells: flash attention {} (-fa {}; get_padding: 256 with it, 32 "
                                                        "without, until PR #16812, b6870)",
                                                        version, rule.pad, rule.flash ? "on" : "off",
                                                        rule.flash ? (version >= 6327 ? "on or auto, auto the default since b6327" : "given")
                                                                   : (version >= 6327 ? "off" : "not given: off by default before b6327")));
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
    else if (cfg.mla && version < 5137)
        a.notes.push_back(fmt::format("{}: llama.cpp before b5137 caches every head's K and V, not the MLA latent", cfg.name));
    else if (cfg.mla)
        a.notes.push_back(fmt::format("{}: MLA cache of K rows of {} (kv_lora_rank + rope) and {}; GGUFs converted before b5137 store full K/V "
                                      "per head",
                                      cfg.name, cfg.mla->kv_lora_rank + cfg.mla->qk_rope_head_dim,
                                      version < 7832 ? fmt::format("V rows of {} (kv_lora_rank), as llama.cpp b5137-b7831 kept", cfg.mla->kv_lora_rank)
                                                     : std::string("no V, as llama.cpp b7832+ stores GGUFs with the MLA split")));
}

}  // namespace

bool llamacpp_has_cache_type(DType dtype) {
    return std::any_of(ggml_cache_types.begin(), ggml_cache_types.end(), [&](const auto& t) { return t.first == dtype; });
}

EngineAnswer llamacpp_answer(const EngineCase& c, const EngineSettings& s) {
    const ModelConfig& cfg = *c.model;
    const auto type = ggml_type_name(c.dtype);
    const std::uint64_t version = s.version ? s.version : 8668;
    if (c.tp > 1)
        throw UsageError(fmt::format("--tp {}: llama.cpp splits layers across GPUs (-sm layer), not heads; size it with --tp 1 (--pp N for N devices)", c.tp));
    const std::uint64_t n_seq = c.batch;
    const std::uint64_t n_ctx = s.n_ctx ? *s.n_ctx : checked_mul(c.context, n_seq, "llama.cpp -c");
    const bool unified = s.kv_unified || version < 5913;  // before KV streams (b5913) every sequence shared one cache
    const std::uint64_t streams = unified ? 1 : n_seq;
    const CellRule rule = cell_rule(version, s.flash_attn, n_ctx, n_seq, unified);
    const std::uint64_t cells = rule.cells;
    const auto [k_row, v_row] = kv_rows(cfg, c.dtype, version);

    EngineAnswer a;
    const bool iswa = cfg.sliding_window && llamacpp_windows(cfg) &&
                      std::any_of(cfg.layer_windowed.begin(), cfg.layer_windowed.end(), [](bool w) { return w; });
    Cache base, swa;
    base.cells = cells;
    if (iswa) {
        const auto n_swa = static_cast<std::uint64_t>(*cfg.sliding_window);
        const auto want = checked_add(checked_mul(n_swa, unified ? n_seq : 1, "SWA cells"), s.ubatch, "SWA cells");
        swa.cells = s.swa_full ? cells : version >= 6975 ? pad(std::min(cells, want), 256) : std::min(cells, pad(want, rule.pad));
    }
    const auto split = pp_layer_split(Engine::llamacpp, static_cast<std::uint64_t>(cfg.n_layer), s.pp);
    fill_caches(cfg, iswa, k_row, v_row, streams, split, base, swa);
    const std::string iswa_prefix = version < renamed_cache ? "llama_kv_cache_unified_iswa" : "llama_kv_cache_iswa";
    if (iswa) {
        a.log_lines.push_back(fmt::format("{}: creating non-SWA KV cache, size = {} cells", iswa_prefix, base.cells));
        push_cache_lines(version, base, n_seq, streams, type, a.log_lines);
        a.log_lines.push_back(fmt::format("{}: creating     SWA KV cache, size = {} cells", iswa_prefix, swa.cells));
        push_cache_lines(version, swa, n_seq, streams, type, a.log_lines);
    } else {
        push_cache_lines(version, base, n_seq, streams, type, a.log_lines);
    }
    const std::string_view fa_flag = version >= 6870 ? "" : version < 6327 ? (rule.flash ? " -fa" : "") : (rule.flash ? "" : " -fa off");
    a.settings = fmt::format("-c {} -np {}{} -ctk {} -ctv {}{}{}{}", n_ctx, n_seq, s.kv_unified ? " -kvu" : "", type, type, fa_flag,
                             iswa ? fmt::format(" -ub {}{}", s.ubatch, s.swa_full ? " --swa-full" : "") : "",
                             s.pp > 1 ? fmt::format(" -sm layer ({} devices)", s.pp) : "");
    a.bytes_allocated = base.k + base.v + swa.k + swa.v;
    if (s.pp > 1) {  // per GPU: the device holding the most
        std::uint64_t most = 0;
        for (std::size_t d = 0; d < split.size(); ++d) most = std::max(most, base.device_bytes[d] + swa.device_bytes[d]);
        a.bytes_allocated = most;
        a.notes.push_back(fmt::format("{}: layers split over {} devices as llama.cpp's -sm layer does with an equal -ts (the output layer counts "
                                      "as one more): {} layers each; engine allocates: the fullest device",
                                      cfg.name, s.pp, fmt::join(split, ", ")));
    }
    a.token_capacity = checked_mul(base.cells, streams, "cells");
    if (s.draft) add_llamacpp_draft(*s.draft, c, s, version, n_ctx, cells, a);
    add_llamacpp_notes(cfg, version, n_ctx, rule, streams, iswa, a);
    if (version < 5913 && n_seq > 1 && !s.kv_unified)
        a.notes.push_back(fmt::format("llama.cpp {} has no KV streams (b5913): the {} sequences share one cache of -c cells, as -kvu does later",
                                      fmt::format("b{}", version), n_seq));
    return a;
}

}  // namespace kvlab
