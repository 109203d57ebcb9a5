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
//   -pp > 1 with a speculative draft: no pool, the engine's refusal (refuse_vllm_pp_draft)
//   a separate draft model (not an EAGLE head, not MTP) in v0.10.x: no pool, the engine's refusal (refuse_vllm_draft_model)
#include "kvlab/calc/engine.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kvlab/core/checked.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/core/text.hpp"

namespace kvlab {
namespace {

std::uint64_t cdiv(std::uint64_t a, std::uint64_t b) { return (a + b - 1) / b; }

struct Layout {
    std::uint64_t full_layers = 0, sliding_layers = 0;
    std::uint64_t group_size = 0, full_groups = 0, sliding_groups = 0;  // hybrid only
    bool hybrid() const { return full_layers > 0 && sliding_layers > 0; }
};

// What vLLM sizes one case by: its settings, the page, the layers by kind and the blocks one request needs.
struct VllmPlan {
    std::uint64_t elem = 0, bs = 0, batched = 0, page = 0, len = 0;
    Layout lay;
    std::uint64_t window = 0, full_pages = 0, sliding_pages = 0, needed = 0;
    std::uint64_t blocks_per_request = 0, layers_per_block = 0, groups = 1;
    std::uint64_t first_layer = 0, last_layer = 0;  // the stage's layers [first, last) of the target model
    std::uint64_t draft_layers = 0;                 // a draft's layers in this stage's pool (the last stage's)
    std::uint64_t budget = 0;                       // this stage's KV budget, if known
};

// The cache dtype's bytes, the block size, the step's batched tokens, the page and max_model_len.
void read_vllm_settings(const EngineCase& c, const EngineSettings& s, VllmPlan& p) {
    const ModelConfig& cfg = *c.model;
    // "auto" is the model's fp16/bf16; fp8, fp8_e4m3 and fp8_e5m2 are stored as uint8
    p.elem = engine_value_bytes(c.dtype, {DType::fp16, DType::bf16, DType::fp8_e4m3, DType::fp8_e5m2},
                                "vLLM's --kv-cache-dtype takes auto (fp16/bf16), fp8, fp8_e4m3, fp8_e5m2");
    p.bs = s.block_size ? s.block_size : 16;
    // vllm/engine/arg_utils.py (_set_default_args): the API server's default is 8192 on GPUs of 70 GiB or
    // more whose name does not contain "a100" (PR #17885), 2048 on the rest
    const bool small_default = c.gpu_memory != 0 && (c.gpu_memory < (std::uint64_t{70} << 30) || c.gpu_is_a100);
    p.batched = s.max_num_batched_tokens.value_or(small_default ? 2048 : 8192);
    p.page = checked_mul(checked_mul((cfg.mla ? 1 : 2) * p.bs, kv_row_values_per_rank(cfg, c.tp, false), "vLLM page"), p.elem, "vLLM page");
    p.len = c.context;  // max_model_len
}

// Counts full and sliding layers, the pages a request needs of each, and groups a hybrid model's layers.
void group_vllm_layers(const ModelConfig& cfg, VllmPlan& p) {
    Layout& lay = p.lay;
    for (auto l = p.first_layer; l < p.last_layer; ++l) (cfg.layer_window(static_cast<std::int64_t>(l)) > 0 ? lay.sliding_layers : lay.full_layers) += 1;
    lay.full_layers += p.draft_layers;  // a draft's layers (EAGLE head, draft model, MTP) as full-attention layers of the same pool
    p.window = cfg.sliding_window ? static_cast<std::uint64_t>(*cfg.sliding_window) : 0;
    p.full_pages = cdiv(p.len, p.bs);
    p.sliding_pages = p.window ? cdiv(std::min(p.window - 1 + p.batched, p.len), p.bs) + 1 : 0;
    // blocks one request needs, counted per layer (what check_enough_kv_cache_memory sums) and per group
    p.needed = checked_mul(p.page, lay.full_layers * p.full_pages + lay.sliding_layers * p.sliding_pages, "vLLM KV needed");
    if (lay.hybrid()) {
        lay.group_size = std::min(lay.full_layers, lay.sliding_layers);
        lay.full_groups = cdiv(lay.full_layers, lay.group_size);
        lay.sliding_groups = cdiv(lay.sliding_layers, lay.group_size);
        p.groups = lay.full_groups + lay.sliding_groups;
        p.blocks_per_request = lay.full_groups * p.full_pages + lay.sliding_groups * p.sliding_pages;
        p.layers_per_block = lay.group_size;
    } else {
        p.blocks_per_request = lay.sliding_layers ? p.sliding_pages : p.full_pages;
        p.layers_per_block = lay.full_layers + lay.sliding_layers;
    }
}

// The vLLM flags an answer stands for (the engine-flags column).
std::string vllm_flags(const EngineCase& c, const VllmPlan& p, std::uint64_t pp) {
    return fmt::format("--max-model-len {} --block-size {} --kv-cache-dtype {}{}{}{}", p.len, p.bs, p.elem == 1 ? "fp8" : "auto",
                       c.tp > 1 ? fmt::format(" -tp {}", c.tp) : "", p.window ? fmt::format(" --max-num-batched-tokens {}", p.batched) : "",
                       pp > 1 ? fmt::format(" -pp {}", pp) : "");
}

// The flags, the MLA block-size note and the hybrid grouping note; returns the padding line to log, if any.
std::string add_vllm_settings(const ModelConfig& cfg, const EngineCase& c, const VllmPlan& p, std::uint64_t pp, EngineAnswer& a) {
    const Layout& lay = p.lay;
    a.settings = vllm_flags(c, p, pp);
    // vllm/platforms/cuda.py (check_and_update_config) raises an MLA model's block size on its own: to 64 when
    // the FlashMLA backend runs it (Hopper), to 128 for CUTLASS MLA (Blackwell)
    if (cfg.mla && p.bs % 64 != 0)
        a.notes.push_back(fmt::format("{}: MLA with --block-size {}; vLLM on CUDA forces 64 with FlashMLA (Hopper) and 128 with "
                                      "CUTLASS MLA (Blackwell), logging \"Forcing kv cache block size to 64 for FlashMLA backend.\": give "
                                      "--block-size 64 for a Hopper GPU, 128 for a Blackwell one",
                                      cfg.name, p.bs));
    std::string padding_line;  // logged when the engine core groups the layers, after the worker's budget line
    if (lay.hybrid()) {
        const std::uint64_t padding = p.groups * lay.group_size - lay.full_layers - lay.sliding_layers;
        if (padding > 0) {
            const std::uint64_t padded_kind = lay.full_layers % lay.group_size ? lay.full_layers : lay.sliding_layers;
            padding_line = fmt::format("Add {} padding layers, may waste at most {:.2f}% KV cache memory", padding,
                                       static_cast<double>(padding) / static_cast<double>(padded_kind) * 100.0);
        }
        a.notes.push_back(fmt::format("{}: {} full-attention and {} sliding-window layers share blocks in {} groups of {} (hybrid KV cache manager)",
                                      cfg.name, lay.full_layers, lay.sliding_layers, p.groups, lay.group_size));
    }
    return padding_line;
}

// The largest max_model_len whose request fits the budget, by the same sum (a binary search in vLLM).
std::uint64_t vllm_max_model_len(const VllmPlan& p, std::uint64_t budget) {
    auto need_at = [&](std::uint64_t l) {
        const auto sp = p.window ? cdiv(std::min(p.window - 1 + p.batched, l), p.bs) + 1 : 0;
        return p.page * (p.lay.full_layers * cdiv(l, p.bs) + p.lay.sliding_layers * sp);
    };
    std::uint64_t lo = 0, hi = p.len;
    while (lo < hi) {
        const std::uint64_t mid = lo + (hi - lo + 1) / 2;
        if (need_at(mid) <= budget) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// GiB as the release prints them: "%.2f" up to v0.10.2; format_gib's round(x, 2) as Python shows a float
// ("4.5", "24.0") in the releases kvlab knows from v0.15.2 on.
std::string vllm_gib(std::uint64_t bytes, std::uint64_t version) {
    if (version < 15002) return fmt::format("{:.2f}", gib(bytes));
    std::string t = fmt::format("{}", std::round(gib(bytes) * 100.0) / 100.0);
    if (t.find_first_of(".e") == std::string::npos) t += ".0";
    return t;
}

// vLLM's "not enough memory" error and the note that it refuses to start.
void refuse_vllm_start(const ModelConfig& cfg, const VllmPlan& p, std::uint64_t budget, std::uint64_t version, EngineAnswer& a) {
    const std::uint64_t lo = vllm_max_model_len(p, budget);
    a.log_lines.push_back(fmt::format(
        "ValueError: To serve at least one request with the models's max seq len ({}), ({} GiB KV cache is needed, which is larger than "
        "the available KV cache memory ({} GiB).{} Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
        "initializing the engine.",
        p.len, vllm_gib(p.needed, version), vllm_gib(budget, version),
        lo > 0 ? fmt::format(" Based on the available memory, the estimated maximum model length is {}.", lo) : ""));
    a.notes.push_back(fmt::format("{}: vLLM refuses to start: one request of {} tokens needs {} B of KV, more than the {} B available", cfg.name,
                                  p.len, p.needed, budget));
}

// The pool's tokens, concurrency and bytes from its blocks, with vLLM's two log lines as the release prints them
// (before v0.8.0, PR #13596: "# GPU blocks: N" and the concurrency as tokens / max_model_len, no separators).
void fill_vllm_pool(const VllmPlan& p, std::uint64_t blocks, std::uint64_t version, EngineAnswer& a) {
    const std::uint64_t tokens = checked_mul(blocks / p.groups, p.bs, "vLLM tokens");
    double concurrency = static_cast<double>(blocks) / static_cast<double>(p.blocks_per_request);
    if (version < 8000) {
        concurrency = static_cast<double>(blocks * p.bs) / static_cast<double>(p.len);
        a.log_lines.push_back(fmt::format("# GPU blocks: {}", blocks));
        a.log_lines.push_back(fmt::format("Maximum concurrency for {} tokens per request: {:.2f}x", p.len, concurrency));
    } else {
        a.log_lines.push_back(fmt::format("GPU KV cache size: {} tokens", with_thousands(tokens)));
        a.log_lines.push_back(fmt::format("Maximum concurrency for {} tokens per request: {:.2f}x", with_thousands(p.len), concurrency));
    }
    a.bytes_allocated = checked_mul(checked_mul(blocks, p.page, "vLLM pool"), p.layers_per_block, "vLLM pool");
    a.token_capacity = tokens;
    a.concurrency = concurrency;
}

// One plan per pipeline stage (get_pp_indices), each with its layers, budget and, on the last, the draft's layers.
std::vector<VllmPlan> vllm_stage_plans(const EngineCase& c, const EngineSettings& s, EngineAnswer& a) {
    const ModelConfig& cfg = *c.model;
    const auto split = pp_layer_split(Engine::vllm, static_cast<std::uint64_t>(cfg.n_layer), s.pp);
    std::vector<VllmPlan> plans;
    std::uint64_t first = 0;
    for (std::size_t i = 0; i < split.size(); ++i) {
        VllmPlan p;
        read_vllm_settings(c, s, p);
        p.first_layer = first;
        p.last_layer = first += split[i];
        if (i + 1 == split.size() && s.draft) {
            p.draft_layers = static_cast<std::uint64_t>(s.draft->n_layer);
            VllmPlan d;
            EngineCase dc = c;
            dc.model = s.draft;
            read_vllm_settings(dc, s, d);
            if (d.page != p.page)
                a.notes.push_back(fmt::format("draft {}: its page ({} B) differs from {}'s ({} B); vLLM makes every layer's page the largest "
                                              "(unify_kv_cache_spec_page_size): sized with {} B for every layer",
                                              s.draft->name, d.page, cfg.name, p.page, std::max(d.page, p.page)));
            p.page = std::max(p.page, d.page);
        }
        if (!s.stage_budgets.empty()) p.budget = s.stage_budgets.at(i);
        else if (c.kv_budget) p.budget = *c.kv_budget;
        group_vllm_layers(cfg, p);
        plans.push_back(p);
    }
    return plans;
}

// With -pp > 1 and a speculative draft, the releases kvlab knows (v0.7.3 to v0.15.2) stop before any pool exists: the
// speculative config checks the draft against a parallel config that copies the target's pipeline_parallel_size
// (SpeculativeConfig.create_draft_parallel_config, _verify_args -> ModelConfig.verify_with_parallel_config), and an EAGLE head
// cannot run pipeline parallel: the V0 class EAGLE has no SupportsPP, V1's EagleLlamaForCausalLM inherits Llama's flag but its
// forward takes no intermediate_tensors, which supports_pp also demands (model_executor/models/interfaces.py). vLLM's own docs
// (spec_decode "Known Feature Incompatibility"): "Pipeline parallelism is not composable with speculative decoding as of vllm<=0.15.0".
EngineAnswer refuse_vllm_pp_draft(const EngineCase& c, const EngineSettings& s, std::uint64_t version) {
    const ModelConfig& cfg = *c.model;
    VllmPlan p;
    read_vllm_settings(c, s, p);
    EngineAnswer a;
    a.settings = vllm_flags(c, p, s.pp);
    a.log_lines.push_back("NotImplementedError: Pipeline parallelism is not supported for this model. Supported models implement the `SupportsPP` "
                          "interface.");
    a.notes.push_back(fmt::format("{}: {} refuses -pp {} with the draft {}, before any pool is allocated: SpeculativeConfig._verify_args checks "
                                  "the draft against the target's pipeline_parallel_size, and an EAGLE head cannot run pipeline parallel "
                                  "(vLLM's docs: \"Pipeline parallelism is not composable with speculative decoding as of vllm<=0.15.0\")",
                                  cfg.name, engine_release_name(Engine::vllm, version), s.pp, s.draft->name));
    a.notes.push_back("the line is ModelConfig.verify_with_parallel_config's, as an EAGLE head meets it (vllm sources read near v0.8.5 and "
                      "v0.10.2, not the release files). A separate draft model fails elsewhere: V0 (v0.7.3, v0.8.0) raises "
                      "\"NotImplementedError: Speculative decoding is currently incompatible with pipeline parallelism\" "
                      "(spec_decode_worker.py), v0.10 refuses draft models even without -pp; MTP heads were not checked. vllm PR #50514 "
                      "(Aug 2026, v0.29.1rc0) runs EAGLE3 with -pp, the drafter on the last stage: a release kvcalc does not know");
    return a;
}

// v0.10.0 and v0.10.2 run the V1 engine only, and V1 had no proposer for a separate draft model: SpeculativeConfig.__post_init__
// ends its method detection with `self.method = "draft_model"` and raises (so does EngineArgs._is_v1_supported_oracle when the
// JSON says "method": "draft_model"). v0.7.3 and v0.8.0 run draft models on V0 (0.8.0's V1 oracle falls back to V0 for them);
// PR #24322 (merged Jan 2026) brought draft models to V1, their layers bound into the same KV cache as the target's.
EngineAnswer refuse_vllm_draft_model(const EngineCase& c, const EngineSettings& s, std::uint64_t version) {
    VllmPlan p;
    read_vllm_settings(c, s, p);
    EngineAnswer a;
    a.settings = vllm_flags(c, p, s.pp);
    a.log_lines.push_back("NotImplementedError: Speculative decoding with draft model is not supported yet. Please consider using other "
                          "speculative decoding methods such as ngram, medusa, eagle, or deepseek_mtp.");
    a.notes.push_back(fmt::format("{}: {} refuses the separate draft model {} before any pool is allocated: its V1 engine has no "
                                  "draft-model proposer (SpeculativeConfig.__post_init__ sets method \"draft_model\" and raises); an EAGLE "
                                  "head (\"method\": \"eagle\"/\"eagle3\", or \"eagle-\"/\"eagle3\" in its name) or MTP runs",
                                  c.model->name, engine_release_name(Engine::vllm, version), s.draft->name));
    a.notes.push_back("v0.7.3 and v0.8.0 (V0) and v0.15.2 (after vllm PR #24322, Jan 2026) size a draft model; kvcalc calls a draft "
                      "a draft model when --speculative-config says \"method\": \"draft_model\", or names a model without \"eagle-\"/"
                      "\"eagle3\" and gives no method, or when --draft has more than 2 layers and no such name; medusa, "
                      "mlp_speculator and MTP model types that vLLM reads from the draft's config are not detected from a name");
    return a;
}

// A draft kind from vLLM's method, else from the draft's name (see engine.hpp).
bool vllm_eagle_name(std::string_view model) {
    std::string low(model);
    std::transform(low.begin(), low.end(), low.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    return low.find("eagle-") != std::string::npos || low.find("eagle3") != std::string::npos;
}

}  // namespace

DraftKind vllm_draft_kind(std::string_view method, std::string_view model) {
    if (method == "eagle" || method == "eagle3") return DraftKind::eagle;
    if (method == "draft_model") return DraftKind::draft_model;
    if (method.find("mtp") != std::string_view::npos) return DraftKind::mtp;
    if (!method.empty() || model.empty()) return DraftKind::unset;
    return vllm_eagle_name(model) ? DraftKind::eagle : DraftKind::draft_model;
}

DraftKind draft_kind_of(const ModelConfig& draft) {
    return vllm_eagle_name(draft.name) || draft.n_layer <= 2 ? DraftKind::eagle : DraftKind::draft_model;
}

EngineAnswer vllm_answer(const EngineCase& c, const EngineSettings& s) {
    const ModelConfig& cfg = *c.model;
    const std::uint64_t version = s.version ? s.version : 10002;
    // __post_init__'s method detection runs before _verify_args' pipeline check
    if (s.draft && s.draft_kind == DraftKind::draft_model && version >= 10000 && version < 15000) return refuse_vllm_draft_model(c, s, version);
    if (s.pp > 1 && s.draft) return refuse_vllm_pp_draft(c, s, version);
    EngineAnswer a;
    const std::vector<VllmPlan> plans = vllm_stage_plans(c, s, a);
    const bool has_budget = c.kv_budget || !s.stage_budgets.empty();
    // the stage that decides: the fewest blocks (vLLM unifies the workers on the minimum), else the most layers
    std::size_t decide = 0;
    for (std::size_t i = 1; i < plans.size(); ++i) {
        const auto blocks_i = has_budget ? plans[i].budget / plans[i].page / plans[i].layers_per_block : 0;
        const auto blocks_d = has_budget ? plans[decide].budget / plans[decide].page / plans[decide].layers_per_block : 0;
        if (has_budget ? blocks_i < blocks_d : plans[i].needed > plans[decide].needed) decide = i;
    }
    VllmPlan p = plans[decide];
    if (version >= 15002 && plans.size() > 1 && has_budget && !s.kv_tokens) {
        // v0.15.2's get_kv_cache_configs checks one request against every stage's layers together and the smallest budget
        // (issue #34076: 24.0 GiB for all 48 layers against one stage's 3.18 GiB), before each stage sizes its own pool
        VllmPlan all = p;
        for (std::size_t i = 0; i < plans.size(); ++i)
            if (i != decide) {
                all.lay.full_layers += plans[i].lay.full_layers;
                all.lay.sliding_layers += plans[i].lay.sliding_layers;
                all.needed += plans[i].needed;
                all.budget = std::min(all.budget, plans[i].budget);
            }
        if (all.needed > all.budget) p = all;
    }
    const std::string padding_line = add_vllm_settings(cfg, c, p, s.pp, a);
    if (s.pp > 1) {
        std::vector<std::string> parts;
        for (const auto& q : plans) parts.push_back(fmt::format("{}", q.last_layer - q.first_layer + q.draft_layers));
        a.notes.push_back(fmt::format("{}: -pp {} gives the stages {} layers (get_pp_indices); each sizes blocks from its own budget and "
                                      "vLLM keeps the fewest, stage {}'s; engine allocates: that stage's pool per GPU",
                                      cfg.name, s.pp, fmt::join(parts, ", "), decide));
    }
    if (s.draft)
        a.notes.push_back(fmt::format("draft {}: its {} take blocks from the same pool as {}'s (the drafter's attention layers join "
                                      "the KV cache spec)", s.draft->name, counted(s.draft->n_layer, "layer"), cfg.name));

    // the order vLLM logs them in: the worker's budget (gpu_worker.py; from v0.10.0 in the releases kvlab knows), then the
    // engine core's grouping (the padding line), the override and the check that one request fits (kv_cache_utils.py)
    // (check_enough_kv_cache_memory runs before the grouping: a refused start prints no padding line)
    if (has_budget && version >= 10000) {
        std::vector<std::uint64_t> shown;
        for (const auto& q : plans)
            if (std::find(shown.begin(), shown.end(), q.budget) == shown.end()) shown.push_back(q.budget);
        for (const auto b : shown) a.log_lines.push_back(fmt::format("Available KV cache memory: {} GiB", vllm_gib(b, version)));
    }
    const bool refused = !s.kv_tokens && has_budget && p.needed > p.budget;
    if (!padding_line.empty() && !refused) a.log_lines.push_back(padding_line);
    std::optional<std::uint64_t> blocks;
    if (s.kv_tokens) {
        blocks = *s.kv_tokens / p.bs;  // --num-gpu-blocks-override: the pool's blocks, whatever the memory says
        if (has_budget)
            a.log_lines.push_back(fmt::format("Overriding num_gpu_blocks={} with num_gpu_blocks_override={}", p.budget / p.page / p.layers_per_block, *blocks));
    } else if (has_budget) {
        if (p.needed > p.budget) {
            refuse_vllm_start(cfg, p, p.budget, version, a);
            return a;
        }
        blocks = p.budget / p.page / p.layers_per_block;
    }
    if (!blocks) {
        a.notes.push_back(fmt::format("{}: one request of {} tokens needs {} blocks ({} B); give --kv-budget (vLLM's \"Available KV cache memory\") "
                                      "or --gpu for the pool",
                                      cfg.name, p.len, p.blocks_per_request, p.needed));
        return a;
    }
    fill_vllm_pool(p, *blocks, version, a);
    return a;
}

}  // namespace kvlab
