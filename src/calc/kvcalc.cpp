// kvcalc's tables from a request (~640 lines, over the house's ~350: run_kvcalc's steps each fill one table
// for the model, variant and dtype they share, and read best together; the headline they feed is kvcalc_headline.cpp).
#include "calc/kvcalc.hpp"

#include "calc/encoder_decoder.hpp"

#include "calc/kvcalc_headline.hpp"
#include "calc/kvcalc_pp.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "kvlab/core/checked.hpp"
#include "kvlab/calc/param_count.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/core/text.hpp"
#include "kvlab/core/units.hpp"

namespace kvlab {
namespace {

std::uint64_t u(std::int64_t x) { return static_cast<std::uint64_t>(x); }

}  // namespace

ModelConfig apply_variant(const ModelConfig& cfg, const AttentionVariant& v) {
    if (v.n_head_kv == 0) return cfg;
    if (cfg.mla)
        throw UsageError(fmt::format("--attention {}: {} uses MLA, whose cache is one shared latent; what-if head counts do not apply (the 'vs MHA' column compares with the equivalent MHA)",
                                     v.label, cfg.name));
    return with_kv_heads(cfg, v.n_head_kv < 0 ? cfg.n_head : v.n_head_kv);
}

std::uint64_t sequence_bytes(const ModelConfig& cfg, DType dtype, std::uint64_t n_tokens, const KvcalcRequest& r) {
    return kv_bytes_sequence_paged(cfg, dtype, n_tokens, r.window_mode, r.block_size).total();
}

// floor(memory x util) in exact integer arithmetic: util is taken to 6 decimals (0.9 -> 900000 / 10^6).
std::uint64_t usable_bytes(std::uint64_t memory, double util) {
    __extension__ using u128 = unsigned __int128;  // memory x 10^6 can exceed 64 bits
    const auto ppm = static_cast<u128>(std::llround(util * 1e6));
    return static_cast<std::uint64_t>(static_cast<u128>(memory) * ppm / 1000000u);
}

std::uint64_t max_context(const ModelConfig& cfg, DType dtype, std::uint64_t batch, std::uint64_t budget, std::uint64_t limit,
                          const KvcalcRequest& r) {
    auto fits = [&](std::uint64_t t) {
        const auto per_seq = sequence_bytes(cfg, dtype, t, r);
        return per_seq == 0 || per_seq <= budget / batch;
    };
    if (!fits(1)) return 0;
    std::uint64_t lo = 1, hi = limit;
    if (fits(hi)) return hi;
    while (hi - lo > 1) {
        const auto mid = lo + (hi - lo) / 2;
        (fits(mid) ? lo : hi) = mid;
    }
    return lo;
}

namespace {

std::string dtype_formula(DType dtype, std::uint64_t n_values) {
    const auto& info = dtype_info(dtype);
    if (info.block_values == 1) return fmt::format("{} x {} B ({})", n_values, info.block_bytes, info.name);
    return fmt::format("ceil({}/{}) blocks x {} B ({})", n_values, info.block_values, info.block_bytes, info.name);
}

std::vector<std::uint64_t> contexts_for(const ModelConfig& cfg, const KvcalcRequest& r) {
    if (!r.contexts.empty()) return r.contexts;
    std::vector<std::uint64_t> out{4096};
    if (cfg.n_ctx_max > 0 && u(cfg.n_ctx_max) != 4096) out.push_back(u(cfg.n_ctx_max));
    std::sort(out.begin(), out.end());
    return out;
}

// MLA has no MHA twin in its config; the equivalent MHA caches K of H x (nope + rope) and V of H x v_head_dim.
std::uint64_t mha_equivalent_bytes_per_token(const ModelConfig& cfg, DType dtype) {
    if (!cfg.mla) return kv_bytes_per_token(with_kv_heads(cfg, cfg.n_head), dtype).total();
    const auto h = u(cfg.n_head);
    const auto k = row_bytes(dtype, h * u(cfg.mla->qk_nope_head_dim + cfg.mla->qk_rope_head_dim));
    const auto v = row_bytes(dtype, h * u(cfg.mla->v_head_dim));
    return checked_mul(checked_add(k, v, "KV bytes"), u(cfg.n_layer), "KV bytes per token");
}

std::string window_formula(const ModelConfig& cfg, std::uint64_t n_tokens, const KvcalcRequest& r, std::uint64_t layer_bytes, std::uint64_t token_bytes) {
    const auto t = allocated_tokens(n_tokens, r.block_size);
    const std::string paged = r.block_size ? fmt::format(" (T = ceil({} / {}) x {} = {} paged tokens)", n_tokens, r.block_size, r.block_size, t) : "";
    const auto n_win = static_cast<std::uint64_t>(std::count(cfg.layer_windowed.begin(), cfg.layer_windowed.end(), true));
    if (!cfg.sliding_window || r.window_mode == WindowMode::ignore || n_win == 0)
        return fmt::format("{} tokens x {} B/token{}", t, token_bytes, paged);
    const auto W = static_cast<std::uint64_t>(*cfg.sliding_window);
    const auto held = std::min<std::uint64_t>(n_tokens, W);
    if (r.block_size)  // a windowed layer's tokens in whole blocks too, a ring of them
        return fmt::format("({} windowed layers x ceil(min(W={}, T={}) / {}) x {} = {} + {} global layers x {}) tokens x {} B/token/layer{}", n_win, W,
                           n_tokens, r.block_size, r.block_size, allocated_tokens(held, r.block_size), u(cfg.n_layer) - n_win, t, layer_bytes, paged);
    return fmt::format("({} windowed layers x min(W={}, T={}) = {} + {} global layers x {}) tokens x {} B/token/layer", n_win, W, n_tokens, held,
                       u(cfg.n_layer) - n_win, n_tokens, layer_bytes);
}

}  // namespace

ModelConfig per_gpu_config(const ModelConfig& cfg, std::uint64_t tp) {
    if (tp <= 1 || cfg.mla) return cfg;  // MLA's latent is not split across heads: every GPU holds it whole
    const auto kv = u(cfg.n_head_kv);
    if (u(cfg.n_head) % tp != 0)
        throw UsageError(fmt::format("--tp: {} does not divide {}'s {} query heads; expected a divisor", tp, cfg.name, cfg.n_head));
    if (kv >= tp ? kv % tp != 0 : tp % kv != 0)
        throw UsageError(fmt::format("--tp: {} and {}'s {} KV heads do not divide one another; expected TP dividing the KV heads or a multiple of them", tp,
                                     cfg.name, kv));
    ModelConfig out = cfg;
    out.n_head = static_cast<std::int64_t>(u(cfg.n_head) / tp);
    out.n_head_kv = static_cast<std::int64_t>(std::max<std::uint64_t>(kv / tp, 1));
    return out;
}

BudgetFit fit_budget(std::uint64_t budget_bytes, std::uint64_t bytes_per_token, std::uint64_t block_size) {
    const auto bytes_per_block = checked_mul(bytes_per_token, block_size, "bytes per block");
    BudgetFit f;
    f.n_blocks = budget_bytes / bytes_per_block;
    f.n_tokens = checked_mul(f.n_blocks, block_size, "tokens in budget");
    return f;
}

std::uint64_t model_weight_bytes(const ModelConfig& cfg, bool native_layout, const KvcalcRequest& r, bool active) {
    const bool moe_active = active && cfg.n_expert > 1;
    if (cfg.stored_weight_bytes && native_layout && !moe_active) return *cfg.stored_weight_bytes;
    const ParamCount params = count_params(cfg);
    const auto& w = dtype_info(r.weights_dtype);
    return checked_mul(active ? params.active_per_token : params.total(), w.block_bytes, "weights bytes") / w.block_values;
}

std::uint64_t decode_weight_bytes(const ModelConfig& cfg, bool native_layout, const KvcalcRequest& r, std::uint64_t batch) {
    const bool stored = cfg.stored_weight_bytes && native_layout;
    // dense: every weight, less the stored vision tower's tensors (named in the checkpoint), which decoding never reads;
    // a vision tower counted from the config but not found by name is taken out in proportion below
    if (cfg.n_expert <= 1 && stored && cfg.stored_vision_bytes > 0 && cfg.stored_vision_bytes <= *cfg.stored_weight_bytes)
        return *cfg.stored_weight_bytes - cfg.stored_vision_bytes;
    if (cfg.n_expert <= 1 && !(stored && cfg.vision_params > 0)) return model_weight_bytes(cfg, native_layout, r, true);
    if (batch <= 1 && !stored) return model_weight_bytes(cfg, native_layout, r, true);  // exact: one token's parameters
    // weights as stored (a checkpoint's own dtypes): the step's share of the parameters, in proportion, so
    // that the read never exceeds the weights held; else parameters x --weights-dtype
    const auto& w = dtype_info(r.weights_dtype);
    const double params = decode_params_read(cfg, batch);
    const double bytes = stored ? static_cast<double>(*cfg.stored_weight_bytes) * params / static_cast<double>(count_params(cfg).total())
                                : params * static_cast<double>(w.block_bytes) / static_cast<double>(w.block_values);
    if (!(bytes < 0x1p63)) throw OverflowError(fmt::format("{}: weights read per decode step overflow 63-bit bytes", cfg.name));
    return static_cast<std::uint64_t>(std::llround(bytes));
}

namespace {

// The smallest tensor-parallel degree that per_gpu_config accepts (TP divides the query heads, and TP
// and the KV heads divide one another) at which a share of `total` weight bytes fits in `usable`; 0 if none.
std::uint64_t min_tp_to_fit(const ModelConfig& cfg, std::uint64_t total, std::uint64_t usable) {
    const auto heads = u(cfg.n_head), kv = u(cfg.n_head_kv);
    for (std::uint64_t tp = 1; tp <= heads; ++tp) {
        const bool valid = heads % tp == 0 && (cfg.mla || (kv >= tp ? kv % tp == 0 : tp % kv == 0));
        if (valid && ceil_div(total, tp) < usable) return tp;
    }
    return 0;
}

// Every table kvcalc fills, in the order it prints them.
struct KvcalcTables {
    Table per_token, per_seq, gpu_fit, gpu_batch, gpu_context, roofline, budget;
    bool no_window_column = false;  // per_seq also shows the batch's KV without windows
    std::vector<CaseFacts> cases;   // the headline's figures, one per model, layout and dtype (the last: being filled)
};

// One model, attention variant and KV dtype being sized, and what every row of it names.
struct KvCase {
    const ModelConfig& base;     // the model as configured
    const ModelConfig& cfg;      // with the variant's KV heads
    const ModelConfig& gpu_cfg;  // one GPU's share of it under TP: with --pp, the fullest stage's layers (kvcalc_pp.hpp)
    const ModelConfig& tp_cfg;   // one TP rank's heads over every layer (what a decode step reads, stage after stage)
    std::uint64_t stage_weights; // the fullest stage's weights, all TP ranks together (every weight without --pp)
    bool native;                 // the model's own attention layout
    DType dtype;
    std::string dn, att;
    KvBytes layer;               // bytes per token per layer
    std::uint64_t token;         // bytes per token
    const std::vector<std::uint64_t>& contexts;
};

// Records the request's inputs (the models are added as they are sized).
void record_inputs(nlohmann::json& in, const KvcalcRequest& r) {
    in["dtypes"] = nlohmann::json::array();
    for (auto d : r.dtypes) in["dtypes"].push_back(std::string(dtype_name(d)));
    in["attention"] = nlohmann::json::array();
    for (const auto& v : r.variants) in["attention"].push_back(v.label);
    in["contexts"] = r.contexts;
    in["batches"] = r.batches;
    in["window_mode"] = choice_name(window_mode_choices, r.window_mode);
    in["block_size"] = r.block_size;
    in["tp"] = r.tp;
    in["pp"] = r.pp;
    in["units"] = choice_name(unit_system_choices, r.units);
    in["models"] = nlohmann::json::array();
}

// The per-token and per-sequence tables, the latter with columns for windows, paging and TP as asked.
void make_kv_tables(const KvcalcRequest& r, KvcalcTables& t) {
    t.per_token = Table{"KV cache per token", {
        {"model", "model", false}, {"attention", "attention", false}, {"n_layer", "layers"}, {"n_head", "heads"},
        {"n_head_kv", "kv heads"}, {"d_head", "head dim"}, {"dtype", "dtype", false},
        {"bytes_k_per_token_layer", "K/token/layer"}, {"bytes_v_per_token_layer", "V/token/layer"},
        {"bytes_per_token", "KV/token"}, {"reduction_vs_mha", "vs MHA"}}, {}, {}};
    t.per_seq = Table{"KV cache per sequence and batch", {
        {"model", "model", false}, {"attention", "attention", false}, {"dtype", "dtype", false}, {"context", "context"},
        {"batch", "batch"}, {"tokens_held", "tokens held"}, {"bytes_per_sequence", "KV/sequence"}, {"bytes_per_batch", "KV/batch"}}, {}, {}};
    const bool any_window = std::any_of(r.models.begin(), r.models.end(), [](const ModelConfig& m) { return m.sliding_window.has_value(); });
    t.no_window_column = any_window && r.window_mode == WindowMode::cap;
    if (t.no_window_column) t.per_seq.columns.push_back({"bytes_per_batch_no_window", "no window"});
    if (r.block_size) {
        t.per_seq.columns.push_back({"blocks_per_sequence", "blocks/seq"});
        t.per_seq.columns.push_back({"bytes_paging_waste_per_batch", "paging waste"});
    }
    if (r.tp > 1 || r.pp > 1) {
        t.per_seq.columns.push_back({"n_head_kv_per_gpu", "kv heads/GPU"});
        t.per_seq.columns.push_back({"bytes_per_batch_per_gpu", "KV/batch/GPU"});
    }
}

// The GPU tables: does it fit, largest batch, longest context and the decode roofline.
void make_gpu_tables(const KvcalcRequest& r, KvcalcTables& t) {
    const auto U = r.units;
    const std::string on = fmt::format("{} ({} of {}{}, {})", r.gpu->display_name, fmt::format("{:.0f}%", r.mem_util * 100),
                                       format_bytes(usable_gpu_bytes(*r.gpu), U), r.gpu->driver_bytes ? " driver-reported" : "",
                                       r.pp > 1 ? fmt::format("{} = {} GPUs, the fullest stage", parallel_label(r.tp, r.pp), r.tp * r.pp)
                                                : parallel_label(r.tp, r.pp));
    t.gpu_fit = Table{"Does it fit on " + on + "?",
                      {{"model", "model", false}, {"attention", "attention", false}, {"dtype", "KV dtype", false}, {"parameters", "params"},
                       {"bytes_weights_per_gpu", "weights/GPU"}, {"bytes_kv_budget_per_gpu", "KV budget/GPU"}, {"max_tokens", "max KV tokens"},
                       {"context", "context"}, {"batch", "batch"}, {"bytes_kv_per_gpu", "KV/GPU"}, {"fits", "fits", false}}, {}, {}};
    t.gpu_batch = Table{"Largest batch at each context on " + on,
                        {{"model", "model", false}, {"attention", "attention", false}, {"dtype", "KV dtype", false}, {"context", "context"},
                         {"max_batch", "max batch"}}, {}, {}};
    t.gpu_context = Table{"Longest context at each batch on " + on,
                          {{"model", "model", false}, {"attention", "attention", false}, {"dtype", "KV dtype", false}, {"batch", "batch"},
                           {"max_context", "max context"}}, {}, {}};
    t.roofline = Table{fmt::format("Decode roofline on {} ({} per GPU{})", r.gpu->display_name, format_rate(r.gpu->bandwidth_bytes_per_s),
                                   r.pp > 1 ? ", " + parallel_label(r.tp, r.pp) + ": a step passes through every stage in turn" : ""),
                       {{"model", "model", false}, {"attention", "attention", false}, {"dtype", "KV dtype", false}, {"context", "context"},
                        {"batch", "batch"}, {"bytes_weights_read", "weights read"}, {"bytes_kv_read", "KV read"},
                        {"min_ms_per_step", "min ms/step"}, {"max_tokens_per_s", "max tok/s"}, {"kv_fits", "KV fits", false}}, {}, {}};
}

// The --kv-budget table: GPU blocks, tokens and concurrency per model.
Table make_budget_table(const KvcalcRequest& r) {
    const auto bs = r.block_size ? r.block_size : 16;
    return Table{fmt::format("KV budget {} ({} B) per GPU, block size {}", format_bytes(*r.kv_budget, r.units), *r.kv_budget, bs),
                 {{"model", "model", false}, {"attention", "attention", false}, {"dtype", "dtype", false}, {"bytes_per_token_per_gpu", "KV/token/GPU"},
                  {"gpu_blocks", "# GPU blocks"}, {"tokens", "tokens"}, {"context", "tokens/request"}, {"max_concurrency", "max concurrency"}}, {}, {}};
}

// Records a model's inputs and notes the rules its config was read by, and contexts past its maximum.
void describe_model(Report& report, const KvcalcRequest& r, const ModelConfig& base, const std::vector<std::uint64_t>& contexts) {
    nlohmann::json mj = {{"name", base.name}, {"display_name", base.display_name}, {"source", base.source},
                         {"n_layer", base.n_layer}, {"hidden_size", base.d_model}, {"n_head", base.n_head}, {"n_head_kv", base.n_head_kv},
                         {"d_head", base.d_head}, {"max_position_embeddings", base.n_ctx_max}, {"attention", base.attention_kind()},
                         {"head_dim_rule", base.head_dim_rule}, {"kv_heads_rule", base.kv_heads_rule}, {"window_rule", base.window_rule},
                         {"ffn_rule", base.ffn_rule}, {"ctx_rule", base.ctx_rule}, {"defaults_applied", base.defaults},
                         {"numeric_defaults_applied", base.numeric_defaults}};
    if (base.stored_weight_bytes) mj["stored_weight_bytes"] = *base.stored_weight_bytes;
    if (base.sliding_window) mj["sliding_window"] = *base.sliding_window;
    mj["contexts"] = contexts;
    report.inputs["models"].push_back(mj);
    // the context's source is named when it is not plainly max_position_embeddings
    const bool plain_ctx = base.ctx_rule.empty() || base.ctx_rule == fmt::format("max context {} from max_position_embeddings", base.n_ctx_max);
    report.notes.push_back(fmt::format("{}: {}; {}; {}{}{}", base.name, base.head_dim_rule, base.kv_heads_rule, base.window_rule,
                                       plain_ctx ? "" : "; " + base.ctx_rule,
                                       base.defaults.empty() ? "" : fmt::format("; defaults applied: {}", fmt::join(base.defaults, "; "))));
    if (!base.type_rule.empty()) report.notes.push_back(fmt::format("{}: {}", base.name, base.type_rule));
    if (base.cross) {
        report.notes.push_back(fmt::format("{}: {}", base.name, encoder_decoder_rule(base.model_type, base)));
        mj["encoder_layers"] = base.cross->n_layer_encoder;
        mj["encoder_len"] = base.cross->encoder_len;
        report.inputs["models"].back() = mj;
    }
    if (r.explain && !base.numeric_defaults.empty())
        report.notes.push_back(fmt::format("{}: defaults that change no size: {}", base.name, fmt::join(base.numeric_defaults, "; ")));
    if (r.gpu && base.stored_weight_bytes) report.notes.push_back(fmt::format("{}: {}", base.name, base.stored_weights_rule));
    if (r.gpu && !base.vision_rule.empty()) report.notes.push_back(fmt::format("{}: {}", base.name, base.vision_rule));
    if (r.gpu && !base.stored_weight_bytes && !base.quant_method.empty())
        report.notes.push_back(fmt::format("{}: its quantization_config says quant_method {}, so the checkpoint stores most weights narrower "
                                           "than the {} the fit prices every parameter at: give --weights-dtype (e.g. fp8), or --config the "
                                           "checkpoint's folder so its safetensors headers give the bytes",
                                           base.name, quote(base.quant_method, 40), dtype_name(r.weights_dtype)));
    for (auto t : contexts)
        if (base.n_ctx_max > 0 && t > u(base.n_ctx_max))
            report.notes.push_back(fmt::format("warning: context {} exceeds {}'s {}", t, base.name,
                                               plain_ctx ? fmt::format("max_position_embeddings {}", base.n_ctx_max) : base.ctx_rule));
}

// Notes how TP spreads a variant's KV heads (or the MLA latent) over the GPUs.
void note_tp_split(Report& report, const KvcalcRequest& r, const ModelConfig& cfg, const std::string& att) {
    if (r.tp > u(cfg.n_head_kv) && !cfg.mla)
        report.notes.push_back(fmt::format("{} {}: TP {} exceeds {} KV heads, so each GPU holds 1 KV head and every head is replicated on {} GPUs",
                                           cfg.name, att, r.tp, cfg.n_head_kv, r.tp / u(cfg.n_head_kv)));
    if (r.tp > 1 && cfg.mla)
        report.notes.push_back(fmt::format("{} {}: the MLA latent is shared by all heads, so every one of the {} GPUs holds it whole", cfg.name, att, r.tp));
}

// Notes how --pp splits a variant over its stages and which stage the GPU columns size (kvcalc_pp.hpp).
void note_pipeline(Report& report, const KvcalcRequest& r, const ModelConfig& cfg, const std::string& att, const PipelineStage& s) {
    if (r.pp <= 1) return;
    report.notes.push_back(fmt::format(
        "{} {}: --pp {} splits its {} layers {} (the first L mod {} stages one more; --engine tables use that engine's split); the "
        "per-GPU columns{} size stage {}, the fullest (most layers): layers {}-{}{}",
        cfg.name, att, r.pp, cfg.n_layer, fmt::join(s.split, ", "), r.pp, r.gpu ? ", the fit, largest batch and longest context" : "", s.index,
        s.first_layer, s.first_layer + u(s.cfg.n_layer) - 1,
        r.gpu ? fmt::format(", {} B of weights (embeddings on the first stage, the output matrix on the last, a copy when tied; the final "
                            "norm with the layers), / TP {} per GPU", s.weights, r.tp) : ""));
    if (r.gpu && r.gpu->bandwidth_bytes_per_s)
        report.notes.push_back(fmt::format(
            "{} {}: decode roofline under --pp {}: each token passes through the {} stages one after another, so one step reads every "
            "stage's weights and KV in turn: min time/step = (all weights / TP + all layers' KV per TP rank) / bandwidth, as at PP 1 (each "
            "GPU reads only its stage's share, but the stages wait for one another); max tok/s is one batch in flight: an engine that keeps "
            "{} micro-batches in flight can reach up to {}x that, each micro-batch holding its own KV",
            cfg.name, att, r.pp, r.pp, r.pp, r.pp));
}

// An encoder-decoder model: its cross-attention cache, a constant part of every KV/sequence figure.
void note_cross_attention(Report& report, const KvcalcRequest& r, const KvCase& c) {
    const ModelConfig& cfg = c.cfg;
    const std::uint64_t cross = kv_bytes_cross(cfg, c.dtype, r.block_size).total();
    const std::uint64_t rows = allocated_tokens(u(cfg.cross->encoder_len), r.block_size);
    report.notes.push_back(fmt::format("{} {} {}: cross-attention cache = 2 (K and V) x {} decoder layers x {} encoder rows{} x ({} KV heads x "
                                       "{} head dim =) {} = {} B = {} per sequence, written once at prefill; every KV/sequence figure is "
                                       "this plus the self-attention cache, KV/token x T generated tokens",
                                       cfg.name, c.att, c.dn, cfg.n_layer, rows,
                                       rows == u(cfg.cross->encoder_len) ? "" : fmt::format(" ({} in blocks of {})", cfg.cross->encoder_len, r.block_size),
                                       cfg.n_head_kv, cfg.d_head, dtype_formula(c.dtype, u(cfg.d_kv())), cross, format_bytes(cross, r.units)));
}

// The KV/token row, with its formula under --explain.
void add_per_token_row(Report& report, Table& per_token, const KvcalcRequest& r, const KvCase& c) {
    const auto U = r.units;
    const ModelConfig& cfg = c.cfg;
    const DType dtype = c.dtype;
    const std::string &att = c.att, &dn = c.dn;
    const KvBytes& layer = c.layer;
    const auto token = c.token;
    const auto token_mha = mha_equivalent_bytes_per_token(c.base, dtype);
    per_token.rows.push_back({text_cell(cfg.name), text_cell(att), int_cell(cfg.n_layer), int_cell(cfg.n_head),
                              int_cell(cfg.mla ? 1 : cfg.n_head_kv), int_cell(cfg.mla ? cfg.mla->kv_lora_rank + cfg.mla->qk_rope_head_dim : cfg.d_head), text_cell(dn),
                              bytes_cell(layer.k, U), bytes_cell(layer.v, U), bytes_cell(token, U),
                              ratio_cell(static_cast<double>(token_mha) / static_cast<double>(token))});
    if (cfg.cross) note_cross_attention(report, r, c);
    if (!r.explain) return;
    if (cfg.mla)
        report.notes.push_back(fmt::format("{} {} {}: KV/token = {} layers x {} (latent {} + rope {}) = {} B = {}", cfg.name, att, dn,
                                           cfg.n_layer, dtype_formula(dtype, u(cfg.mla->kv_lora_rank + cfg.mla->qk_rope_head_dim)),
                                           cfg.mla->kv_lora_rank, cfg.mla->qk_rope_head_dim, token, format_bytes(token, U)));
    else
        report.notes.push_back(fmt::format("{} {} {}: KV/token = 2 (K and V) x {} layers x ({} KV head{} x {} head dim =) {} = {} B = {}", cfg.name, att,
                                           dn, cfg.n_layer, cfg.n_head_kv, cfg.n_head_kv == 1 ? "" : "s", cfg.d_head, dtype_formula(dtype, u(cfg.d_kv())), token,
                                           format_bytes(token, U)));
}

// One per-sequence row: a batch of b sequences of t tokens, with the optional no-window, paging and TP columns.
std::vector<Cell> sequence_row(const KvcalcRequest& r, const KvCase& c, bool no_window_column, std::uint64_t t, std::uint64_t b,
                               std::uint64_t held, std::uint64_t seq, std::uint64_t exact_seq, std::uint64_t batch) {
    const auto U = r.units;
    const ModelConfig &cfg = c.cfg, &gpu_cfg = c.gpu_cfg;
    const DType dtype = c.dtype;
    std::vector<Cell> row{text_cell(cfg.name), text_cell(c.att), text_cell(c.dn), uint_cell(t), uint_cell(b), uint_cell(held),
                          bytes_cell(seq, U), bytes_cell(batch, U)};
    if (no_window_column)
        row.push_back(bytes_cell(checked_mul(kv_bytes_sequence_paged(cfg, dtype, t, WindowMode::ignore, r.block_size).total(), b,
                                             "KV bytes per batch"), U));
    if (r.block_size) {
        // the blocks of the layer that holds the most (a full layer's ceil(T / N), unless every layer is windowed)
        std::uint64_t blocks = 0;
        for (std::int64_t l = 0; l < cfg.n_layer; ++l)
            blocks = std::max(blocks, kv_slots_held(cfg, l, t, r.window_mode, r.block_size) / r.block_size);
        row.push_back(uint_cell(blocks));
        row.push_back(bytes_cell(checked_mul(seq - exact_seq, b, "paging waste"), U));
    }
    if (r.tp > 1 || r.pp > 1) {
        row.push_back(int_cell(gpu_cfg.mla ? 1 : gpu_cfg.n_head_kv));
        row.push_back(bytes_cell(checked_mul(sequence_bytes(gpu_cfg, dtype, t, r), b, "KV bytes per GPU"), U));
    }
    return row;
}

// The per-sequence rows at each context and batch, with their formulas under --explain.
void add_sequence_rows(Report& report, KvcalcTables& tables, const KvcalcRequest& r, const KvCase& c) {
    const auto U = r.units;
    const ModelConfig& cfg = c.cfg;
    const DType dtype = c.dtype;
    const std::string &att = c.att, &dn = c.dn;
    for (const auto t : c.contexts) {
        const auto seq = sequence_bytes(cfg, dtype, t, r);
        const auto exact_seq = kv_bytes_sequence(cfg, dtype, t, r.window_mode).total();
        std::uint64_t held = 0;
        for (std::int64_t l = 0; l < cfg.n_layer; ++l) held = std::max(held, kv_tokens_held(cfg, l, t, r.window_mode));
        if (r.explain) {
            report.notes.push_back(fmt::format("{} {} {}: KV/sequence at T={} = {} = {} B = {}", cfg.name, att, dn, t,
                                               window_formula(cfg, t, r, c.layer.total(), c.token),
                                               seq, format_bytes(seq, U)));
        }
        for (const auto b : r.batches) {
            const auto batch = checked_mul(seq, b, "KV bytes per batch");
            const auto batch_gpu = r.tp > 1 || r.pp > 1 ? checked_mul(sequence_bytes(c.gpu_cfg, dtype, t, r), b, "KV bytes per GPU") : batch;
            tables.cases.back().sizes.push_back({t, b, batch, batch_gpu});
            tables.per_seq.rows.push_back(sequence_row(r, c, tables.no_window_column, t, b, held, seq, exact_seq, batch));
            if (r.explain)
                report.notes.push_back(fmt::format("{} {} {}: KV/batch at T={}, B={} = {} B x {} = {} B = {}", cfg.name, att, dn, t, b, seq, b,
                                                   batch, format_bytes(batch, U)));
        }
    }
}

// What one GPU holds for a case: its share of the weights, the memory usable and the KV budget left.
struct GpuFit {
    ParamCount params;
    std::uint64_t weights_total = 0, weights = 0, usable = 0, kv_budget = 0, per_token_gpu = 0, max_tokens = 0;
};

// Sizes the weights and KV budget on one GPU, with the budget's formula under --explain.
GpuFit fit_on_gpu(Report& report, const KvcalcRequest& r, const KvCase& c) {
    const ModelConfig& cfg = c.cfg;
    GpuFit g;
    g.params = count_params(cfg);
    g.weights_total = model_weight_bytes(cfg, c.native, r);
    g.weights = ceil_div(c.stage_weights, r.tp);  // without --pp the stage is the whole model
    g.usable = usable_bytes(usable_gpu_bytes(*r.gpu), r.mem_util);
    g.kv_budget = g.usable > g.weights ? g.usable - g.weights : 0;
    g.per_token_gpu = kv_bytes_per_token(c.gpu_cfg, c.dtype).total();
    g.max_tokens = g.kv_budget / g.per_token_gpu;
    if (r.explain) {
        const auto& w = dtype_info(r.weights_dtype);
        const std::string weights_expr =
            cfg.stored_weight_bytes && c.native
                ? fmt::format("{} B as stored", *cfg.stored_weight_bytes)
                : fmt::format("{} params x {} B ({})", g.params.total(),
                              static_cast<double>(w.block_bytes) / static_cast<double>(w.block_values), dtype_name(r.weights_dtype));
        const std::string stage = r.pp > 1 ? fmt::format(" x the fullest stage's share {} / {} B", c.stage_weights, g.weights_total) : "";
        report.notes.push_back(fmt::format("{} {} {} on {}: KV budget/GPU = floor({} B x {}) - weights {}{} / TP {} = {} B; max tokens = "
                                           "floor({} / {} B/token) = {}",
                                           cfg.name, c.att, c.dn, r.gpu->name, usable_gpu_bytes(*r.gpu), r.mem_util, weights_expr, stage, r.tp,
                                           g.kv_budget, g.kv_budget, g.per_token_gpu, g.max_tokens));
    }
    return g;
}

// The fit table's verdict for one context and batch: "yes", or what does not fit ("fits" column).
const char* fit_verdict(bool weights_fit, bool kv_fits) { return !weights_fit ? "no: weights" : kv_fits ? "yes" : "no: KV"; }

// One fit row per context and batch: the GPU's share of the weights, the KV budget left, the batch's KV per
// GPU (as held: whole blocks with --block-size) and the verdict, which the headline's figures copy.
void add_fit_table_rows(KvcalcTables& tables, const KvcalcRequest& r, const KvCase& c, const GpuFit& g, bool weights_fit) {
    const auto U = r.units;
    CaseFacts& facts = tables.cases.back();
    const auto limit = c.cfg.n_ctx_max > 0 ? u(c.cfg.n_ctx_max) : (std::uint64_t{1} << 40);
    for (const auto t : c.contexts)
        for (const auto b : r.batches) {
            const auto kv_gpu = checked_mul(sequence_bytes(c.gpu_cfg, c.dtype, t, r), b, "KV bytes per batch");
            const bool kv_fits = weights_fit && kv_gpu <= g.kv_budget;
            tables.gpu_fit.rows.push_back({text_cell(c.cfg.name), text_cell(c.att), text_cell(c.dn), params_cell(g.params.total()),
                                           bytes_cell(g.weights, U), weights_fit ? bytes_cell(g.kv_budget, U) : Cell{"-", nullptr},
                                           weights_fit ? uint_cell(g.max_tokens) : Cell{"-", nullptr}, uint_cell(t), uint_cell(b),
                                           bytes_cell(kv_gpu, U), text_cell(fit_verdict(weights_fit, kv_fits))});
            if (!weights_fit) continue;
            CaseFacts::Fit f{t, b, kv_gpu, kv_fits, std::nullopt, max_context(c.gpu_cfg, c.dtype, b, g.kv_budget, limit, r), false, {}, {}};
            if (t <= limit) f.max_batch = g.kv_budget / sequence_bytes(c.gpu_cfg, c.dtype, t, r);
            f.max_context_is_model_max = f.max_context == limit;
            facts.fits.push_back(f);
        }
}

// Notes that a model's weights do not fit (and the TP that would fit them) and adds its "no: weights" fit rows.
void add_no_fit_rows(Report& report, KvcalcTables& tables, const KvcalcRequest& r, const KvCase& c, const GpuFit& g) {
    const auto U = r.units;
    const ModelConfig& cfg = c.cfg;
    const std::uint64_t tp_needed = min_tp_to_fit(cfg, c.stage_weights, g.usable);
    tables.cases.back().tp_needed = tp_needed;
    report.notes.push_back(fmt::format(
        "{} does not fit on {}: its {} weights need {} per GPU at {}, more than the {} usable ({:.0f}% of {}); {}", cfg.name,
        r.gpu->name, cfg.stored_weight_bytes && c.native ? "stored" : dtype_name(r.weights_dtype), format_bytes(g.weights, U), parallel_label(r.tp, r.pp), format_bytes(g.usable, U), r.mem_util * 100,
        format_bytes(usable_gpu_bytes(*r.gpu), U),
        tp_needed ? fmt::format("needs TP >= {} (--tp {}) for the weights alone", tp_needed, tp_needed)
                  : std::string("no tensor-parallel degree that divides its heads makes the weights fit")));
    add_fit_table_rows(tables, r, c, g, false);
}

// The fit rows, then the largest batch at each context and the longest context at each batch.
void add_fit_rows(KvcalcTables& tables, const KvcalcRequest& r, const KvCase& c, const GpuFit& g) {
    const ModelConfig &cfg = c.cfg, &gpu_cfg = c.gpu_cfg;
    const std::string &att = c.att, &dn = c.dn;
    add_fit_table_rows(tables, r, c, g, true);
    const auto limit = cfg.n_ctx_max > 0 ? u(cfg.n_ctx_max) : (std::uint64_t{1} << 40);
    for (const auto t : c.contexts)  // past the model's max context there is no batch to size: "-" (null)
        tables.gpu_batch.rows.push_back({text_cell(cfg.name), text_cell(att), text_cell(dn), uint_cell(t),
                                         t > limit ? Cell{"-", nullptr} : uint_cell(g.kv_budget / sequence_bytes(gpu_cfg, c.dtype, t, r))});
    for (const auto b : r.batches) {
        const auto ctx = max_context(gpu_cfg, c.dtype, b, g.kv_budget, limit, r);
        tables.gpu_context.rows.push_back({text_cell(cfg.name), text_cell(att), text_cell(dn), uint_cell(b),
                                           {fmt::format("{}{}", ctx, ctx == limit ? " (model max)" : ""), ctx}});
    }
}

// Notes how many routed experts a MoE decode step reads at each batch (when some batch is over 1).
void note_moe_decode_reads(Report& report, const KvcalcRequest& r, const ModelConfig& cfg) {
    if (!(cfg.n_expert > 1 && std::any_of(r.batches.begin(), r.batches.end(), [](std::uint64_t b) { return b > 1; }))) return;
    std::string per_batch;
    for (const auto b : r.batches)
        per_batch += fmt::format("{}B={}: {:.2f}", per_batch.empty() ? "" : ", ", b, expected_experts_read(cfg.n_expert, cfg.n_expert_active, b));
    report.notes.push_back(fmt::format("{}: a MoE decode step at batch B reads every routed expert some token of the batch uses: "
                                       "{} x (1 - (1 - {}/{})^B) of the {} per MoE layer in expectation when each token picks its "
                                       "{} uniformly ({}); skewed routing reads fewer, down to {}",
                                       cfg.name, cfg.n_expert, cfg.n_expert_active, cfg.n_expert, cfg.n_expert,
                                       cfg.n_expert_active, per_batch, cfg.n_expert_active));
}

// The decode roofline rows: the weights and KV one step reads at each context and batch, and its time.
void add_roofline_rows(Report& report, KvcalcTables& tables, const KvcalcRequest& r, const KvCase& c, std::uint64_t kv_budget) {
    const auto U = r.units;
    Table& roofline = tables.roofline;
    auto fit = tables.cases.back().fits.begin();  // the fit rows' facts, in the same context x batch order
    const ModelConfig &cfg = c.cfg, &gpu_cfg = c.gpu_cfg;
    const DType dtype = c.dtype;
    const std::string &att = c.att, &dn = c.dn;
    for (const auto t : c.contexts)
        for (const auto b : r.batches) {
            const auto active_weights = ceil_div(decode_weight_bytes(cfg, c.native, r, b), r.tp);
            // one step reads every stage's weights and KV in turn (per TP rank: all layers), so a pipeline adds no bandwidth to it
            const auto kv_read = checked_mul(kv_bytes_sequence(c.tp_cfg, dtype, t, r.window_mode).total(), b, "KV bytes read");
            const auto total = checked_add(active_weights, kv_read, "bytes per step");
            // fits: the batch's KV as the budget holds it (whole blocks with --block-size), as "Largest batch" counts
            const auto kv_held = checked_mul(sequence_bytes(gpu_cfg, dtype, t, r), b, "KV bytes per batch");
            const bool kv_fits = kv_held <= kv_budget;
            if (!kv_fits)
                report.notes.push_back(fmt::format("warning: {} {} {}: batch {} at context {} needs {} of KV per GPU, more than the {} budget; its roofline row is hypothetical",
                                                   cfg.name, att, dn, b, t, format_bytes(kv_held, U), format_bytes(kv_budget, U)));
            const double s = static_cast<double>(total) / static_cast<double>(r.gpu->bandwidth_bytes_per_s);
            fit->ms_per_step = s * 1e3;
            fit->tokens_per_s = static_cast<double>(b) / s;
            ++fit;
            roofline.rows.push_back({text_cell(cfg.name), text_cell(att), text_cell(dn), uint_cell(t), uint_cell(b),
                                     bytes_cell(active_weights, U), bytes_cell(kv_read, U), real_cell(s * 1e3, 3),
                                     real_cell(static_cast<double>(b) / s, 1), text_cell(kv_fits ? "yes" : "no")});  // as the fit table's "fits"
            if (r.explain)
                report.notes.push_back(fmt::format("{} {} {}: min time/step at T={}, B={} = ({} B weights + {} B KV) / {} B/s = {:.3f} ms", cfg.name,
                                                   att, dn, t, b, active_weights, kv_read, r.gpu->bandwidth_bytes_per_s, s * 1e3));
        }
}

// The GPU tables' rows for a case; false when nothing more is sized for it (weights that do not fit, or no bandwidth).
bool add_gpu_rows(Report& report, KvcalcTables& tables, const KvcalcRequest& r, const KvCase& c) {
    const GpuFit g = fit_on_gpu(report, r, c);
    CaseFacts& facts = tables.cases.back();
    facts.on_gpu = true;
    facts.weights_fit = g.usable > g.weights;
    facts.weights_gpu = g.weights;
    facts.usable = g.usable;
    facts.kv_budget = g.kv_budget;
    if (!facts.weights_fit) {
        add_no_fit_rows(report, tables, r, c, g);
        return false;  // no batch, context or roofline for a model that cannot load
    }
    add_fit_rows(tables, r, c, g);
    if (r.gpu->bandwidth_bytes_per_s == 0) return false;  // --gpu-mem without --gpu-bandwidth: no roofline
    // Decode roofline: every step reads the weights its batch uses once (a MoE's routed experts:
    // those some token of the batch is routed to) and every resident KV byte once.
    note_moe_decode_reads(report, r, c.cfg);
    add_roofline_rows(report, tables, r, c, g.kv_budget);
    return true;
}

// The --kv-budget rows: the GPU blocks the budget holds and the requests they serve at each context.
void add_budget_rows(Report& report, KvcalcTables& tables, const KvcalcRequest& r, const KvCase& c) {
    Table& budget = tables.budget;
    CaseFacts& facts = tables.cases.back();
    const ModelConfig& gpu_cfg = c.gpu_cfg;
    const std::string& name = c.cfg.name;
    const auto bs = r.block_size ? r.block_size : 16;
    const auto per_token_gpu = kv_bytes_per_token(gpu_cfg, c.dtype).total();
    const auto fit = fit_budget(*r.kv_budget, per_token_gpu, bs);
    facts.n_blocks = fit.n_blocks;
    facts.n_tokens = fit.n_tokens;
    facts.block_size = bs;
    if (gpu_cfg.sliding_window && r.window_mode == WindowMode::cap)
        report.notes.push_back(fmt::format("{} {} {}: max concurrency holds each sliding layer's min(W, T) tokens (exact math); vLLM "
                                           "reserves W - 1 + one step's tokens + a block there, fewer requests: --engine vllm gives its figure",
                                           name, c.att, c.dn));
    for (const auto t : c.contexts) {
        // a request holds whole blocks of its tokens (a windowed layer: of min(W, T), --window-mode cap);
        // without windows blocks / ceil(T / bs), vLLM v0.10.2's division (--engine vllm adds what it
        // reserves beyond a window)
        const auto pool = checked_mul(checked_mul(fit.n_blocks, bs, "KV pool"), per_token_gpu, "KV pool");
        const auto request = kv_bytes_sequence_paged(gpu_cfg, c.dtype, t, r.window_mode, bs).total();
        const double conc = static_cast<double>(pool) / static_cast<double>(request);
        facts.concurrency.emplace_back(t, conc);
        budget.rows.push_back({text_cell(name), text_cell(c.att), text_cell(c.dn), bytes_cell(per_token_gpu, r.units), uint_cell(fit.n_blocks),
                               uint_cell(fit.n_tokens), uint_cell(t), {fmt::format("{:.2f}x", conc), conc}});
        if (r.explain)
            report.notes.push_back(fmt::format("{} {} {}: # GPU blocks = floor({} B / ({} tokens x {} B)) = {}; concurrency at {} tokens = "
                                               "{} x {} x {} B / {} B (a request's whole blocks, windows capped) = {:.2f}x",
                                               name, c.att, c.dn, *r.kv_budget, bs, per_token_gpu, fit.n_blocks, t, fit.n_blocks, bs,
                                               per_token_gpu, request, conc));
    }
}

// Every table's rows for one model, variant and dtype, in the order their notes read.
void add_case_rows(Report& report, KvcalcTables& tables, const KvcalcRequest& r, const KvCase& c) {
    CaseFacts facts;
    facts.model = c.cfg.name;
    facts.attention = c.att;
    facts.attention_kind = c.cfg.attention_kind();
    facts.dtype = c.dn;
    facts.bytes_per_token = c.token;
    tables.cases.push_back(std::move(facts));
    add_per_token_row(report, tables.per_token, r, c);
    add_sequence_rows(report, tables, r, c);
    if (r.gpu && !add_gpu_rows(report, tables, r, c)) return;  // nothing more for it: no budget rows either
    if (r.kv_budget) add_budget_rows(report, tables, r, c);
}

// Sizes one model: its notes, then each attention variant at each KV dtype.
void add_model_rows(Report& report, KvcalcTables& tables, const KvcalcRequest& r, const ModelConfig& base) {
    const auto contexts = contexts_for(base, r);
    describe_model(report, r, base, contexts);
    for (const auto& variant : r.variants) {
        const ModelConfig cfg = apply_variant(base, variant);
        const std::string att = variant.label == "native" ? cfg.attention_kind() + " (native)" : cfg.attention_kind();
        const auto tp_cfg = per_gpu_config(cfg, r.tp);
        const bool native = variant.n_head_kv == 0;
        const PipelineStage stage = fullest_stage(tp_cfg, cfg, r.gpu ? model_weight_bytes(cfg, native, r) : 0, r.pp);  // weights: the fit's only
        const ModelConfig& gpu_cfg = stage.cfg;
        note_tp_split(report, r, cfg, att);
        note_pipeline(report, r, cfg, att, stage);
        for (const auto dtype : r.dtypes) {
            auto dn = std::string(dtype_name(dtype));
            const auto layer = kv_bytes_per_token_layer(cfg, dtype);
            const auto token = kv_bytes_per_token(cfg, dtype).total();
            const KvCase c{base, cfg, gpu_cfg, tp_cfg, stage.weights, native, dtype, std::move(dn), att, layer, token, contexts};
            add_case_rows(report, tables, r, c);
        }
    }
}

// Puts the filled tables in the report with the GPU and budget inputs, then any engine's own tables.
void finish_report(Report& report, KvcalcTables& tables, const KvcalcRequest& r) {
    auto& in = report.inputs;
    report.tables.push_back(std::move(tables.per_token));
    report.tables.push_back(std::move(tables.per_seq));
    if (r.gpu) {
        in["gpu"] = {{"name", r.gpu->name}, {"memory_bytes", r.gpu->memory_bytes}, {"usable_memory_bytes", usable_gpu_bytes(*r.gpu)}, {"bandwidth_bytes_per_s", r.gpu->bandwidth_bytes_per_s}};
        in["weights_dtype"] = std::string(dtype_name(r.weights_dtype));
        in["mem_util"] = r.mem_util;
        tables.gpu_fit.notes.push_back("fits: the answer for that context and batch: yes when the weights load and the batch's KV (KV/GPU) "
                                       "fits the KV budget left after them; no: KV when only the weights fit; no: weights when the "
                                       "weights alone do not.");
        tables.gpu_fit.notes.push_back("The fit counts weights and KV only: activations, CUDA graphs and framework buffers also take memory, so engines report a smaller KV budget (use --kv-budget with the engine's figure).");
        report.tables.push_back(std::move(tables.gpu_fit));
        if (!tables.gpu_batch.rows.empty()) report.tables.push_back(std::move(tables.gpu_batch));
        if (!tables.gpu_context.rows.empty()) report.tables.push_back(std::move(tables.gpu_context));
        if (r.gpu->bandwidth_bytes_per_s && !tables.roofline.rows.empty()) report.tables.push_back(std::move(tables.roofline));
        else report.notes.push_back("no decode roofline: give --gpu-bandwidth (bytes per second) with --gpu-mem");
    }
    if (r.kv_budget) {
        in["kv_budget_bytes"] = *r.kv_budget;
        if (r.engine == Engine::exact) report.tables.push_back(std::move(tables.budget));  // an engine's own table replaces it
    }
    if (r.engine != Engine::exact) append_engine_tables(report, r);
}

}  // namespace

Report run_kvcalc(const KvcalcRequest& r) {
    Report report;
    record_inputs(report.inputs, r);
    KvcalcTables tables;
    make_kv_tables(r, tables);
    if (r.gpu) make_gpu_tables(r, tables);
    if (r.kv_budget) tables.budget = make_budget_table(r);
    if (!r.tp_rule.empty()) report.notes.push_back(r.tp_rule);
    for (const auto& base : r.models) add_model_rows(report, tables, r, base);
    report.headline = kvcalc_headline(tables.cases, r);
    finish_report(report, tables, r);
    return report;
}

}  // namespace kvlab
