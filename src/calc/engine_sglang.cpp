// SGLang's KV pool at release v0.5.2, read from python/sglang/srt/model_executor/model_runner.py
// (profile_max_num_token, init_memory_pool) and python/sglang/srt/mem_cache/memory_pool.py
// (MHATokenToKVPool, MLATokenToKVPool and their "KV Cache is allocated" line).
//
//   cell (one token, all layers) = KV heads per GPU (floor, at least 1) x head_dim x layers x 2 x dtype bytes
//                                  MLA: (kv_lora_rank + qk_rope_head_dim) x layers x dtype bytes
//   #tokens = rest_memory // cell, capped by --max-total-tokens, floored to a multiple of page_size (1)
//   each K and V buffer holds #tokens + page_size rows (slot 0 takes padded tokens' writes)
//   the log's "GB" is 2^30 bytes (memory_pool.py: GB = 1024 * 1024 * 1024)
#include "kvlab/calc/engine.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kvlab/core/checked.hpp"
#include "kvlab/core/error.hpp"

namespace kvlab {

EngineAnswer sglang_answer(const EngineCase& c, const EngineSettings& s) {
    const ModelConfig& cfg = *c.model;
    const std::uint64_t elem = engine_value_bytes(c.dtype, {DType::fp16, DType::bf16, DType::fp8_e4m3, DType::fp8_e5m2},
                                                  "SGLang's --kv-cache-dtype takes auto (fp16/bf16), fp8_e4m3, fp8_e5m2");
    const std::uint64_t page = s.block_size ? s.block_size : 1;
    // pipeline stages (get_pp_indices, as vLLM's): each sizes its pool from its own layers and budget; the fewest tokens decide
    const auto split = pp_layer_split(Engine::sglang, static_cast<std::uint64_t>(cfg.n_layer), s.pp);
    std::size_t decide = 0;
    std::optional<std::uint64_t> stage_tokens;
    const std::uint64_t width = kv_row_values_per_rank(cfg, c.tp, false);
    for (std::size_t i = 0; i < split.size(); ++i) {
        EngineCase sc = c;
        if (!s.stage_budgets.empty()) sc.kv_budget = s.stage_budgets[i];
        const std::uint64_t r = checked_mul(checked_mul(width, split[i], "SGLang cell"), elem, "SGLang cell");
        const auto t = pool_tokens(sc, s, cfg.mla ? r : 2 * r);
        if (t && (!stage_tokens || *t < *stage_tokens)) stage_tokens = t, decide = i;
    }
    const auto layers = split[decide];
    const std::uint64_t row = checked_mul(checked_mul(width, layers, "SGLang cell"), elem, "SGLang cell");  // K (or the MLA latent) of one token
    const std::uint64_t cell = cfg.mla ? row : 2 * row;

    EngineAnswer a;
    a.settings = fmt::format("--context-length {} --kv-cache-dtype {} --page-size {}{}{}", c.context, elem == 1 ? dtype_name(c.dtype) : "auto", page,
                             c.tp > 1 ? fmt::format(" --tp {}", c.tp) : "", s.pp > 1 ? fmt::format(" --pp-size {}", s.pp) : "");
    if (s.pp > 1)
        a.notes.push_back(fmt::format("{}: --pp-size {} gives the stages {} layers (get_pp_indices); each sizes its token pool from its "
                                      "own layers; the fewest tokens, stage {}'s, are shown",
                                      cfg.name, s.pp, fmt::join(split, ", "), decide));
    if (s.draft)
        a.notes.push_back(fmt::format("draft {}: not sized: SGLang gives a speculative draft its own token pool (its draft worker), which "
                                      "kvlab does not model", s.draft->name));
    // v0.5.2 switches its hybrid sliding-window pool off for Gemma and gpt-oss (server_args.py), so every layer
    // holds #tokens; other sliding-window architectures would split the pool (set_num_token_hybrid), not modelled
    const bool swa_off = cfg.model_type.rfind("gemma", 0) == 0 || cfg.model_type == "gpt_oss";
    if (cfg.sliding_window)
        a.notes.push_back(swa_off ? fmt::format("{}: every layer holds every token: SGLang v0.5.2 turns its sliding-window pool off for "
                                                "Gemma and gpt-oss (server_args.py)",
                                                cfg.name)
                                  : fmt::format("{}: sized as full attention on every layer: SGLang's split of a sliding-window pool "
                                                "(set_num_token_hybrid, swa_full_tokens_ratio 0.8) is not modelled for model_type {}",
                                                cfg.name, cfg.model_type));
    std::optional<std::uint64_t> tokens = stage_tokens;
    if (!tokens) {
        a.notes.push_back(fmt::format("{}: {} B per token slot; give --kv-budget (the memory left for KV after mem_fraction_static) or "
                                      "--kv-tokens (--max-total-tokens) for the pool",
                                      cfg.name, cell));
        return a;
    }
    *tokens = *tokens / page * page;
    if (*tokens == 0) {  // init_memory_pool refuses an empty pool
        a.log_lines.push_back("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.");
        a.notes.push_back(fmt::format("{}: the budget holds no token slot of {} B; SGLang refuses to start", cfg.name, cell));
        return a;
    }
    const std::uint64_t buffer = checked_mul(*tokens + page, row, "SGLang pool");
    if (cfg.mla) a.log_lines.push_back(fmt::format("KV Cache is allocated. #tokens: {}, KV size: {:.2f} GB", *tokens, gib(buffer)));
    else a.log_lines.push_back(fmt::format("KV Cache is allocated. #tokens: {}, K size: {:.2f} GB, V size: {:.2f} GB", *tokens, gib(buffer), gib(buffer)));
    a.notes.push_back("SGLang's log line says GB for 2^30 bytes (GB = 1024 * 1024 * 1024 in mem_cache/memory_pool.py): its sizes are GiB, "
                      "printed here as SGLang prints them");
    a.bytes_allocated = cfg.mla ? buffer : 2 * buffer;
    a.token_capacity = *tokens;
    a.concurrency = static_cast<double>(*tokens) / static_cast<double>(c.context);
    return a;
}

}  // namespace kvlab
