// SGLang's KV pool at release v0.5.2, read from python/sglang/srt/model_executor/model_runner.py
// (profile_max_num_token, init_memory_pool) and python/sglang/srt/mem_cache/memory_pool.py
// (MHATokenToKVPool, MLATokenToKVPool and their "KV Cache is allocated" line).
//
//   cell (one token, all layers) = KV heads per GPU (floor, at least 1) x head_dim x layers x 2 x dtype bytes
//                                  MLA: (kv_lora_rank + qk_rope_head_dim) x layers x dtype bytes
//   #tokens = rest_memory // cell, capped by --max-total-tokens, floored to a multiple of page_size (1)
//   each K and V buffer holds #tokens + page_size rows (slot 0 takes padded tokens' writes)
//   the log's "GB" is 2^30 bytes (memory_pool.py: GB = 1024 * 1024 * 1024)
//
// Pipeline stages: rest_memory comes from get_available_gpu_memory(distributed=True), an all_reduce MIN of the
// free memory over every GPU (sglang/srt/utils.py), so every stage sizes from the smallest budget and its own
// layers; the ranks then keep the fewest tokens (all_reduce MIN after the page floor, sglang PR #10214).
//
// Speculative drafts (EAGLE, EAGLE3, MTP, a STANDALONE draft model): init_memory_pool gives the target
//   #tokens = rest_memory // target cell + R x steps x topk (draft) + R x draft tokens (verify) + 100
// before the --max-total-tokens cap, and the draft worker (is_draft_worker) builds its own pool of the same
// #tokens (draft_runner_cache_size: the two share token indices) with the draft's own layers and heads. The
// draft pool is allocated on top of the budget: v0.5.2 does not count it in rest_memory (sglang PR #23862,
// April 2026, is the later change that does). R = --max-running-requests, which server_args.py sets to 48 for
// EAGLE/EAGLE3/STANDALONE; steps, topk, draft tokens from auto_choose_speculative_params: (3, 1, 4) for
// DeepSeek V2/V3 and gpt-oss, (5, 4, 8) otherwise; topk 1 makes draft tokens steps + 1. With --pp-size > 1 server_args.py refuses
// speculative decoding outright (refuse_pp_speculation).
#include "kvlab/calc/engine.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kvlab/core/checked.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/core/text.hpp"

namespace kvlab {
namespace {

// The speculative headroom init_memory_pool adds to the target's (and so the draft's) token count.
struct SpecHeadroom {
    std::uint64_t reqs = 0, steps = 0, topk = 0, draft_tokens = 0, tokens = 0;
};
SpecHeadroom spec_headroom(const ModelConfig& cfg, const EngineSettings& s) {
    // auto_choose_speculative_params: (3, 1, 4) for DeepseekV2/V3 and GptOss, in server_args.py before and after v0.5.2
    const bool short_tree = cfg.model_type == "deepseek_v2" || cfg.model_type == "deepseek_v3" || cfg.model_type == "gpt_oss";
    SpecHeadroom h;
    h.reqs = s.max_running_requests.value_or(48);
    h.steps = s.spec_steps.value_or(short_tree ? 3 : 5);
    h.topk = s.spec_topk.value_or(short_tree ? 1 : 4);
    h.draft_tokens = h.topk == 1 ? h.steps + 1 : s.spec_draft_tokens.value_or(short_tree ? 4 : 8);
    h.tokens = checked_add(checked_mul(h.reqs, checked_add(checked_mul(h.steps, h.topk, "SGLang headroom"), h.draft_tokens, "SGLang headroom"),
                                       "SGLang headroom"),
                           100, "SGLang headroom");
    return h;
}

// One pool's "KV Cache is allocated" line (MHATokenToKVPool / MLATokenToKVPool); returns its bytes.
std::uint64_t push_pool_line(bool mla, std::uint64_t tokens, std::uint64_t page, std::uint64_t row, EngineAnswer& a) {
    const std::uint64_t buffer = checked_mul(tokens + page, row, "SGLang pool");  // K (or the MLA latent) of #tokens + page rows
    if (mla) a.log_lines.push_back(fmt::format("KV Cache is allocated. #tokens: {}, KV size: {:.2f} GB", tokens, gib(buffer)));
    else a.log_lines.push_back(fmt::format("KV Cache is allocated. #tokens: {}, K size: {:.2f} GB, V size: {:.2f} GB", tokens, gib(buffer), gib(buffer)));
    return mla ? buffer : 2 * buffer;
}

// The draft worker's pool: the target's #tokens, the draft's own layers and KV heads.
std::uint64_t add_sglang_draft(const ModelConfig& draft, const EngineCase& c, std::uint64_t elem, std::uint64_t page, std::uint64_t tokens,
                               const SpecHeadroom& h, bool from_budget, EngineAnswer& a) {
    const std::uint64_t row = checked_mul(checked_mul(kv_row_values_per_rank(draft, c.tp, false), static_cast<std::uint64_t>(draft.n_layer), "SGLang draft"),
                                          elem, "SGLang draft");
    const std::uint64_t bytes = push_pool_line(draft.mla.has_value(), tokens, page, row, a);
    a.notes.push_back(fmt::format("draft {}: the draft worker's own pool of the same #tokens ({} x {} B for its {}), allocated on top of the budget: "
                                  "SGLang v0.5.2 sizes #tokens from the target's layers alone (its default mem_fraction_static keeps 2048 MB more "
                                  "for an EAGLE draft, 6144 MB for a STANDALONE draft model)",
                                  draft.name, tokens + page, draft.mla ? row : 2 * row, counted(draft.n_layer, "layer")));
    if (from_budget)
        a.notes.push_back(fmt::format("speculative headroom: SGLang adds {} = {} requests x ({} steps x {} topk + {} draft tokens) + 100 to the "
                                      "budget's count, before the --max-total-tokens cap (init_memory_pool; --max-running-requests and "
                                      "--speculative-* of --engine-cmd set them)",
                                      h.tokens, h.reqs, h.steps, h.topk, h.draft_tokens));
    return bytes;
}

// v0.5.2 refuses pipeline parallel with speculative decoding: when pp_size > 1, check_server_args (server_args.py)
// asserts that the overlap schedule is off, no speculative algorithm runs and mixed chunked prefill is off.
// __post_init__ has by then turned overlap off for pp_size > 1 and mixed chunking off for EAGLE, so the speculative
// algorithm is what fails, before any pool exists. The message as stored before v0.5.2 (the reflectionai/sglang fork at
// 444f5d21, Aug 2025) and after it (a file with DeepSeek-V3.2's NSA backends); sglang PR #30775 (July 2026) lifts it
// behind SGLANG_ENABLE_PP_SPEC=1 with the draft worker on the last stage only.
void refuse_pp_speculation(const ModelConfig& cfg, std::uint64_t pp, EngineAnswer& a) {
    a.log_lines.push_back("AssertionError: Pipeline parallelism is not compatible with overlap schedule, speculative decoding, mixed chunked prefill.");
    a.notes.push_back(fmt::format("{}: SGLang v0.5.2 refuses --pp-size {} with speculative decoding, before any pool is allocated: check_server_args "
                                  "(server_args.py) asserts that pipeline parallel runs without overlap schedule, speculative decoding and mixed "
                                  "chunked prefill, and --pp-size has already turned the overlap schedule off",
                                  cfg.name, pp));
    a.notes.push_back("the line is that assert's message in server_args.py snapshots from before v0.5.2 (Aug 2025) and after it (one with "
                      "DeepSeek-V3.2's NSA backends), which agree; v0.5.2's own file was not read. Later releases run the draft worker on the "
                      "last stage only (sglang PR #30775, July 2026, behind SGLANG_ENABLE_PP_SPEC=1), which kvcalc does not model");
}

void add_sglang_notes(const ModelConfig& cfg, const EngineSettings& s, const std::vector<std::uint64_t>& split, std::size_t decide, EngineAnswer& a) {
    if (s.pp > 1)
        a.notes.push_back(fmt::format("{}: --pp-size {} gives the stages {} layers (get_pp_indices); every stage sizes its pool from the smallest "
                                      "GPU budget (an all_reduce MIN of free memory) and its own layers, and all keep the fewest tokens, stage "
                                      "{}'s (all_reduce MIN, sglang PR #10214)",
                                      cfg.name, s.pp, fmt::join(split, ", "), decide));
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
}

}  // namespace

EngineAnswer sglang_answer(const EngineCase& c, const EngineSettings& s) {
    const ModelConfig& cfg = *c.model;
    const std::uint64_t elem = engine_value_bytes(c.dtype, {DType::fp16, DType::bf16, DType::fp8_e4m3, DType::fp8_e5m2},
                                                  "SGLang's --kv-cache-dtype takes auto (fp16/bf16), fp8_e4m3, fp8_e5m2");
    const std::uint64_t page = s.block_size ? s.block_size : 1;
    const auto split = pp_layer_split(Engine::sglang, static_cast<std::uint64_t>(cfg.n_layer), s.pp);
    const std::uint64_t width = kv_row_values_per_rank(cfg, c.tp, false);
    std::optional<std::uint64_t> budget = c.kv_budget;  // every rank's: the smallest (all_reduce MIN of free memory)
    if (!s.stage_budgets.empty()) budget = *std::min_element(s.stage_budgets.begin(), s.stage_budgets.end());
    const SpecHeadroom spec = s.draft ? spec_headroom(cfg, s) : SpecHeadroom{};
    std::size_t decide = 0;
    std::optional<std::uint64_t> tokens;  // each stage: budget // its cell (+ the headroom), capped, floored; the fewest decide
    for (std::size_t i = 0; i < split.size(); ++i) {
        const std::uint64_t r = checked_mul(checked_mul(width, split[i], "SGLang cell"), elem, "SGLang cell");
        std::optional<std::uint64_t> t;
        if (budget) t = checked_add(*budget / (cfg.mla ? r : 2 * r), spec.tokens, "SGLang #tokens");
        if (s.kv_tokens) t = t ? std::min(*t, *s.kv_tokens) : *s.kv_tokens;
        if (t) *t = *t / page * page;
        if (t && (!tokens || *t < *tokens)) tokens = t, decide = i;
    }
    const std::uint64_t row = checked_mul(checked_mul(width, split[decide], "SGLang cell"), elem, "SGLang cell");  // K (or the MLA latent) of one token
    const std::uint64_t cell = cfg.mla ? row : 2 * row;

    EngineAnswer a;
    a.settings = fmt::format("--context-length {} --kv-cache-dtype {} --page-size {}{}{}", c.context, elem == 1 ? dtype_name(c.dtype) : "auto", page,
                             c.tp > 1 ? fmt::format(" --tp {}", c.tp) : "", s.pp > 1 ? fmt::format(" --pp-size {}", s.pp) : "");
    if (s.pp > 1 && (s.draft || s.speculative)) {
        refuse_pp_speculation(cfg, s.pp, a);
        return a;
    }
    add_sglang_notes(cfg, s, split, decide, a);
    if (!tokens) {
        a.notes.push_back(fmt::format("{}: {} B per token slot; give --kv-budget (the memory left for KV after mem_fraction_static) or "
                                      "--kv-tokens (--max-total-tokens) for the pool",
                                      cfg.name, cell));
        return a;
    }
    if (*tokens == 0) {  // init_memory_pool refuses an empty pool
        a.log_lines.push_back("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.");
        a.notes.push_back(fmt::format("{}: the budget holds no token slot of {} B; SGLang refuses to start", cfg.name, cell));
        return a;
    }
    a.bytes_allocated = push_pool_line(cfg.mla.has_value(), *tokens, page, row, a);
    if (s.draft) {
        a.bytes_allocated = checked_add(*a.bytes_allocated, add_sglang_draft(*s.draft, c, elem, page, *tokens, spec, budget.has_value(), a), "SGLang pools");
    }
    a.notes.push_back("SGLang's log line says GB for 2^30 bytes (GB = 1024 * 1024 * 1024 in mem_cache/memory_pool.py): its sizes are GiB, "
                      "printed here as SGLang prints them");
    a.token_capacity = *tokens;
    a.concurrency = static_cast<double>(*tokens) / static_cast<double>(c.context);
    return a;
}

}  // namespace kvlab
