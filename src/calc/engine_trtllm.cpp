// TensorRT-LLM's paged KV cache at 1.2.0rc2 (PyTorch backend), read from
// tensorrt_llm/_torch/pyexecutor/resource_manager.py (calculate_max_num_blocks, per-token bytes) and
// cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp (allocatePools and its log lines).
//
//   bytes per token = kv_factor (2; 1 for MLA) x layers x ceil(KV heads / TP) x head_dim x dtype bytes
//   max_tokens = free memory x free_gpu_memory_fraction (0.9) / bytes per token, capped by max_tokens
//   blocks = ceil(max_tokens / tokens_per_block (32)): whole blocks, so a little past the budget
#include "kvlab/calc/engine.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kvlab/core/checked.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/core/text.hpp"

namespace kvlab {

EngineAnswer trtllm_answer(const EngineCase& c, const EngineSettings& s) {
    const ModelConfig& cfg = *c.model;
    const std::uint64_t elem = engine_value_bytes(c.dtype, {DType::fp16, DType::bf16, DType::fp8_e4m3, DType::int8},
                                                  "TensorRT-LLM's KV cache is fp16/bf16, fp8 (e4m3) or int8 (kvlab does not size nvfp4)");
    const std::uint64_t tpb = s.block_size ? s.block_size : 32;
    const std::uint64_t version = s.version ? s.version : 1002000;
    EngineAnswer a;
    // pipeline stages (mapping.py pp_layers, the first ranks one more: pp_layer_split): each rank's bytes per token from its own
    // layers (and, on the last, a draft's: resource_manager.py get_pp_layers appends the spec layers on the last PP rank;
    // PR #3497 adds the draft's KV bytes per token); max_tokens is the minimum over the ranks
    const auto split = pp_layer_split(Engine::trtllm, static_cast<std::uint64_t>(cfg.n_layer), s.pp);
    auto token_bytes = [&](const ModelConfig& m, std::uint64_t layers) {
        return checked_mul(checked_mul(m.mla ? 1 : 2, layers, "TensorRT-LLM bytes per token"), checked_mul(kv_row_values_per_rank(m, c.tp, true), elem, "row"),
                           "TensorRT-LLM bytes per token");
    };
    std::size_t decide = 0;
    std::optional<std::uint64_t> max_tokens;
    std::uint64_t per_token = 0;
    for (std::size_t i = 0; i < split.size(); ++i) {
        std::uint64_t bytes = token_bytes(cfg, split[i]);
        if (s.draft && i + 1 == split.size()) bytes += token_bytes(*s.draft, static_cast<std::uint64_t>(s.draft->n_layer));
        EngineCase sc = c;
        if (!s.stage_budgets.empty()) sc.kv_budget = s.stage_budgets[i];
        const auto t = pool_tokens(sc, s, bytes);
        if (i == 0 || (t && (!max_tokens || *t < *max_tokens))) max_tokens = t, decide = i, per_token = bytes;
    }
    a.settings = fmt::format("tokens_per_block={} kv_cache_dtype={}{}{}", tpb, elem == 1 ? dtype_name(c.dtype) : "auto",
                             c.tp > 1 ? fmt::format(" tp_size={}", c.tp) : "", s.pp > 1 ? fmt::format(" pp_size={}", s.pp) : "");
    if (s.pp > 1)
        a.notes.push_back(fmt::format("{}: pp_size {} gives the ranks {} layers (mapping.py pp_layers, the first ranks one more); max_tokens is "
                                      "the minimum over the ranks, rank {}'s", cfg.name, s.pp, fmt::join(split, ", "), decide));
    if (s.draft)
        a.notes.push_back(fmt::format("draft {}: the KV bytes per token of its {} join {}'s in one pool (PR #3497)", s.draft->name,
                                      counted(s.draft->n_layer, "layer"), cfg.name));
    if (s.draft && s.pp > 1)  // py_executor.py; NVIDIA/TensorRT-LLM issue #9009 meets it with an n-gram drafter on 1.2.0rc2
        a.notes.push_back("--pp with a draft: TensorRT-LLM 1.2.0rc2 refuses a separate drafter (a draft model, n-gram) under pipeline parallel "
                          "(\"Drafting is not supported for selected executor loop\", py_executor.py); sized here as a one-model draft "
                          "(EAGLE3, MTP) on the last rank, which was not checked against that refusal");
    if (cfg.sliding_window)
        a.notes.push_back(fmt::format("{}: every layer holds every token, as TensorRT-LLM does unless kv_cache_config.max_attention_window "
                                      "lists several windows (per-window pools with an equal share of memory each: not modelled)",
                                      cfg.name));
    if (!max_tokens) {
        a.notes.push_back(fmt::format("{}: {} B per token; give --kv-budget (free memory x free_gpu_memory_fraction) or --kv-tokens (max_tokens) "
                                      "for the pool",
                                      cfg.name, per_token));
        return a;
    }
    const std::uint64_t blocks = (*max_tokens + tpb - 1) / tpb;
    const std::uint64_t tokens = checked_mul(blocks, tpb, "TensorRT-LLM tokens");
    const std::uint64_t bytes = checked_mul(tokens, per_token, "TensorRT-LLM pool");
    // BlockManager's constructor (kvCacheManager.cpp at 1.2.0rc2), one line per attention window: here the
    // one window max_seq_len, whose blocks are ceil(max_seq_len / tokens_per_block); then allocatePools'
    // two lines. The KV cache's max_seq_len is the requested one + 1 under the overlap scheduler, which is on
    // by default (py_executor_creator.py: `if not disable_overlap_scheduler: max_seq_len = ... + 1`).
    // Releases before 1.0 printed "Number of blocks in KV cache primary pool: N" instead of the first line;
    // 1.2 prints that one per window at DEBUG.
    const std::uint64_t seq = checked_add(c.context, 1, "TensorRT-LLM max_seq_len");
    if (version < 1000000)  // 0.13 (issue #2268's log): the pool's block count alone
        a.log_lines.push_back(fmt::format("[TensorRT-LLM][INFO] Number of blocks in KV cache primary pool: {}", blocks));
    else
        a.log_lines.push_back(fmt::format("[TensorRT-LLM][INFO] Max KV cache blocks per sequence: {} [window size={}], tokens per block={}, "
                                          "primary blocks={}, secondary blocks=0, max sequence length={}",
                                          (seq + tpb - 1) / tpb, seq, tpb, blocks, seq));
    a.log_lines.push_back(fmt::format("[TensorRT-LLM][INFO] Number of tokens per block: {}.", tpb));
    a.log_lines.push_back(fmt::format("[TensorRT-LLM][INFO] [MemUsageChange] Allocated {:.2f} GiB for max tokens in paged KV cache ({}).", gib(bytes), tokens));
    a.bytes_allocated = bytes;
    a.token_capacity = tokens;
    a.concurrency = static_cast<double>(tokens) / static_cast<double>(c.context);
    return a;
}

}  // namespace kvlab
