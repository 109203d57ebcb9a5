// vLLM V1's KV cache at release v0.10.2, read from vllm/v1/kv_cache_interface.py (page sizes, the memory
// one request may need), vllm/v1/core/kv_cache_utils.py (blocks from a budget, layer groups, the two
// log lines and the "not enough memory" error) and vllm/v1/worker/gpu_worker.py (the budget line).
//
//   page (one block of one layer) = 2 (1 for MLA) x block_size x KV heads per GPU x head size x dtype bytes
//   one kind of layer:  blocks = budget // page // layers;        tokens = blocks x block_size
//   full + sliding:     layers are grouped by kind in groups of g = the smaller count; blocks = budget // page // g;
//                       tokens = blocks // groups x block_size
//   blocks a request needs = per group: cdiv(max_model_len, bs) (full) or cdiv(min(W - 1 + batched, len), bs) + 1 (sliding)
//   concurrency = blocks / blocks a request needs
#include "calc/engine.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "core/checked.hpp"
#include "core/error.hpp"

namespace kvlab {
namespace {

std::uint64_t cdiv(std::uint64_t a, std::uint64_t b) { return (a + b - 1) / b; }

struct Layout {
    std::uint64_t full_layers = 0, sliding_layers = 0;
    std::uint64_t group_size = 0, full_groups = 0, sliding_groups = 0;  // hybrid only
    bool hybrid() const { return full_layers > 0 && sliding_layers > 0; }
};

}  // namespace

EngineAnswer vllm_answer(const EngineCase& c, const EngineSettings& s) {
    const ModelConfig& cfg = *c.model;
    // "auto" is the model's fp16/bf16; fp8, fp8_e4m3 and fp8_e5m2 are stored as uint8
    const std::uint64_t elem = engine_value_bytes(c.dtype, {DType::fp16, DType::bf16, DType::fp8_e4m3, DType::fp8_e5m2},
                                                  "vLLM's --kv-cache-dtype takes auto (fp16/bf16), fp8, fp8_e4m3, fp8_e5m2");
    const std::uint64_t bs = s.block_size ? s.block_size : 16;
    // vllm/engine/arg_utils.py (_set_default_args): the API server's default is 8192 on GPUs of 70 GiB or
    // more whose name does not contain "a100" (PR #17885), 2048 on the rest
    const bool small_default = c.gpu_memory != 0 && (c.gpu_memory < (std::uint64_t{70} << 30) || c.gpu_is_a100);
    const std::uint64_t batched = s.max_num_batched_tokens.value_or(small_default ? 2048 : 8192);
    const std::uint64_t page = checked_mul(checked_mul((cfg.mla ? 1 : 2) * bs, kv_row_values_per_rank(cfg, c.tp, false), "vLLM page"), elem, "vLLM page");
    const std::uint64_t len = c.context;  // max_model_len

    Layout lay;
    for (std::int64_t l = 0; l < cfg.n_layer; ++l) (cfg.layer_window(l) > 0 ? lay.sliding_layers : lay.full_layers) += 1;
    const std::uint64_t window = cfg.sliding_window ? static_cast<std::uint64_t>(*cfg.sliding_window) : 0;
    const std::uint64_t full_pages = cdiv(len, bs);
    const std::uint64_t sliding_pages = window ? cdiv(std::min(window - 1 + batched, len), bs) + 1 : 0;
    // blocks one request needs, counted per layer (what check_enough_kv_cache_memory sums) and per group
    const std::uint64_t needed = checked_mul(page, lay.full_layers * full_pages + lay.sliding_layers * sliding_pages, "vLLM KV needed");
    std::uint64_t blocks_per_request = 0, layers_per_block = 0, groups = 1;
    if (lay.hybrid()) {
        lay.group_size = std::min(lay.full_layers, lay.sliding_layers);
        lay.full_groups = cdiv(lay.full_layers, lay.group_size);
        lay.sliding_groups = cdiv(lay.sliding_layers, lay.group_size);
        groups = lay.full_groups + lay.sliding_groups;
        blocks_per_request = lay.full_groups * full_pages + lay.sliding_groups * sliding_pages;
        layers_per_block = lay.group_size;
    } else {
        blocks_per_request = lay.sliding_layers ? sliding_pages : full_pages;
        layers_per_block = static_cast<std::uint64_t>(cfg.n_layer);
    }

    EngineAnswer a;
    a.settings = fmt::format("--max-model-len {} --block-size {} --kv-cache-dtype {}{}{}", len, bs, elem == 1 ? "fp8" : "auto",
                             c.tp > 1 ? fmt::format(" -tp {}", c.tp) : "", window ? fmt::format(" --max-num-batched-tokens {}", batched) : "");
    // vllm/platforms/cuda.py (check_and_update_config) raises an MLA model's block size on its own: to 64 when
    // the FlashMLA backend runs it (Hopper), to 128 for CUTLASS MLA (Blackwell)
    if (cfg.mla && bs % 64 != 0)
        a.notes.push_back(fmt::format("{}: MLA with --block-size {}; vLLM on CUDA forces 64 with FlashMLA (Hopper) and 128 with "
                                      "CUTLASS MLA (Blackwell), logging \"Forcing kv cache block size to 64 for FlashMLA backend.\": give "
                                      "--block-size 64 for a Hopper GPU, 128 for a Blackwell one",
                                      cfg.name, bs));
    std::string padding_line;  // logged when the engine core groups the layers, after the worker's budget line
    if (lay.hybrid()) {
        const std::uint64_t padding = groups * lay.group_size - lay.full_layers - lay.sliding_layers;
        if (padding > 0) {
            const std::uint64_t padded_kind = lay.full_layers % lay.group_size ? lay.full_layers : lay.sliding_layers;
            padding_line = fmt::format("Add {} padding layers, may waste at most {:.2f}% KV cache memory", padding,
                                       static_cast<double>(padding) / static_cast<double>(padded_kind) * 100.0);
        }
        a.notes.push_back(fmt::format("{}: {} full-attention and {} sliding-window layers share blocks in {} groups of {} (hybrid KV cache manager)",
                                      cfg.name, lay.full_layers, lay.sliding_layers, groups, lay.group_size));
    }

    // the order vLLM logs them in: the worker's budget (gpu_worker.py), then the engine core's grouping
    // (the padding line), the override and the check that one request fits (kv_cache_utils.py)
    // (check_enough_kv_cache_memory runs before the grouping: a refused start prints no padding line)
    if (c.kv_budget) a.log_lines.push_back(fmt::format("Available KV cache memory: {:.2f} GiB", gib(*c.kv_budget)));
    const bool refused = !s.kv_tokens && c.kv_budget && needed > *c.kv_budget;
    if (!padding_line.empty() && !refused) a.log_lines.push_back(padding_line);
    std::optional<std::uint64_t> blocks;
    if (s.kv_tokens) {
        blocks = *s.kv_tokens / bs;  // --num-gpu-blocks-override: the pool's blocks, whatever the memory says
        if (c.kv_budget)
            a.log_lines.push_back(fmt::format("Overriding num_gpu_blocks={} with num_gpu_blocks_override={}", *c.kv_budget / page / layers_per_block, *blocks));
    } else if (c.kv_budget) {
        if (needed > *c.kv_budget) {
            // the largest max_model_len whose request fits, by the same sum (a binary search in vLLM)
            auto need_at = [&](std::uint64_t l) {
                const auto sp = window ? cdiv(std::min(window - 1 + batched, l), bs) + 1 : 0;
                return page * (lay.full_layers * cdiv(l, bs) + lay.sliding_layers * sp);
            };
            std::uint64_t lo = 0, hi = len;
            while (lo < hi) {
                const std::uint64_t mid = lo + (hi - lo + 1) / 2;
                if (need_at(mid) <= *c.kv_budget) lo = mid;
                else hi = mid - 1;
            }
            a.log_lines.push_back(fmt::format(
                "ValueError: To serve at least one request with the models's max seq len ({}), ({:.2f} GiB KV cache is needed, which is larger than "
                "the available KV cache memory ({:.2f} GiB).{} Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
                "initializing the engine.",
                len, gib(needed), gib(*c.kv_budget), lo > 0 ? fmt::format(" Based on the available memory, the estimated maximum model length is {}.", lo) : ""));
            a.notes.push_back(fmt::format("{}: vLLM refuses to start: one request of {} tokens needs {} B of KV, more than the {} B available", cfg.name,
                                          len, needed, *c.kv_budget));
            return a;
        }
        blocks = *c.kv_budget / page / layers_per_block;
    }
    if (!blocks) {
        a.notes.push_back(fmt::format("{}: one request of {} tokens needs {} blocks ({} B); give --kv-budget (vLLM's \"Available KV cache memory\") "
                                      "or --gpu for the pool",
                                      cfg.name, len, blocks_per_request, needed));
        return a;
    }
    const std::uint64_t tokens = checked_mul(*blocks / groups, bs, "vLLM tokens");
    const double concurrency = static_cast<double>(*blocks) / static_cast<double>(blocks_per_request);
    a.log_lines.push_back(fmt::format("GPU KV cache size: {} tokens", with_thousands(tokens)));
    a.log_lines.push_back(fmt::format("Maximum concurrency for {} tokens per request: {:.2f}x", with_thousands(len), concurrency));
    a.bytes_allocated = checked_mul(checked_mul(*blocks, page, "vLLM pool"), layers_per_block, "vLLM pool");
    a.token_capacity = tokens;
    a.concurrency = concurrency;
    return a;
}

}  // namespace kvlab
