#include "kvlab/calc/param_count.hpp"

#include <cmath>

#include <fmt/format.h>

#include "kvlab/core/checked.hpp"
#include "kvlab/core/error.hpp"

namespace kvlab {
namespace {

std::uint64_t u(std::int64_t x) { return static_cast<std::uint64_t>(x); }
std::uint64_t mul(std::uint64_t a, std::uint64_t b) { return checked_mul(a, b, "parameter count"); }
std::uint64_t add(std::uint64_t a, std::uint64_t b) { return checked_add(a, b, "parameter count"); }

// One layer's attention projections. Llama: q (d, H*D), k and v (d, Hkv*D), o (H*D, d).
std::uint64_t attention_params(const ModelConfig& c) {
    const auto d = u(c.d_model);
    if (c.family == Family::gpt2) {
        // c_attn (d, q + 2 kv) + bias, c_proj (q, d) + bias: 4d^2 + 4d for MHA; GPT-BigCode's multi_query keeps one
        // K and V head (transformers models/gpt_bigcode/modeling_gpt_bigcode.py, kv_dim)
        const auto qkv = add(u(c.d_q()), mul(2, u(c.n_head_kv * c.d_head)));
        return add(add(mul(d, qkv), qkv), add(mul(u(c.d_q()), d), d));
    }
    if (c.mla || c.lora_attention) {
        // DeepSeek-V2/V3 MLA (and MiniCPM3's same projections): q (optionally via a q LoRA), kv_a_proj_with_mqa,
        // kv_b_proj, o_proj, two LoRA norms.
        const auto& m = c.mla ? *c.mla : *c.lora_attention;
        const auto h = u(c.n_head);
        const auto q_out = mul(h, u(m.qk_nope_head_dim + m.qk_rope_head_dim));
        std::uint64_t n = m.q_lora_rank ? add(add(mul(d, u(m.q_lora_rank)), u(m.q_lora_rank)), mul(u(m.q_lora_rank), q_out)) : mul(d, q_out);
        n = add(n, mul(d, u(m.kv_lora_rank + m.qk_rope_head_dim)));
        n = add(n, u(m.kv_lora_rank));
        n = add(n, mul(u(m.kv_lora_rank), mul(h, u(m.qk_nope_head_dim + m.v_head_dim))));
        return add(n, mul(mul(h, u(m.v_head_dim)), d));
    }
    const auto q = u(c.d_q()), kv = u(c.n_head_kv * c.d_head);
    std::uint64_t n = add(add(mul(d, q), mul(mul(2, d), kv)), mul(q, d));
    if (c.attention_bias) n = add(n, add(q, mul(2, kv)));
    if (c.out_bias) n = add(n, d);
    if (c.qk_norm) n = add(n, mul(2, u(c.d_head)));
    if (c.attention_sinks) n = add(n, u(c.n_head));
    return n;
}

// One MLP (or expert) f wide: gated (gate, up, down) or GELU (up, down), with biases where the family has them.
std::uint64_t mlp_params(const ModelConfig& c, std::uint64_t f) {
    const auto d = u(c.d_model), m = u(c.mlp_matrices);
    std::uint64_t n = mul(mul(m, d), f);
    if (c.mlp_bias) n = add(n, add(mul(m - 1, f), d));
    return n;
}

}  // namespace

std::uint64_t ParamCount::total() const { return add(add(add(add(add(embedding, attention), mlp), norms), lm_head), vision); }

ParamCount count_params(const ModelConfig& c) {
    if (c.d_ff == 0)
        throw ConfigError(fmt::format("{}: the config has no intermediate_size, so its weights (parameter count) are unknown; "
                                      "KV sizes do not need it, a GPU fit does: add the field to the config", c.name));
    ParamCount p;
    const auto d = u(c.d_model), L = u(c.n_layer), V = u(c.n_vocab);
    p.embedding = mul(V, d);
    if (c.family == Family::gpt2) p.embedding = add(p.embedding, mul(u(c.n_ctx_max), d));  // learned positions
    p.lm_head = c.tied_embeddings ? 0 : mul(V, d);
    p.attention = mul(L, attention_params(c));

    std::uint64_t active_mlp = 0;
    if (c.family == Family::gpt2) {
        const auto f = u(c.d_ff);
        p.mlp = mul(L, add(add(mul(mul(2, d), f), f), d));  // c_fc d*f + f, c_proj f*d + d
        active_mlp = p.mlp;
        p.norms = add(mul(L, mul(4, d)), mul(2, d));  // ln_1, ln_2 weight+bias; ln_f
    } else {
        // dense layers f wide; MoE layers (after the first n_layer_dense, every moe_layer_step-th) hold the routed
        // experts, the shared ones and a router (+ a bias: gpt-oss; + a shared-expert gate: Qwen2-MoE)
        const auto dense_f = u(c.d_ff_dense ? c.d_ff_dense : c.d_ff);
        const auto moe_f = u(c.d_ff_expert ? c.d_ff_expert : c.d_ff);
        const auto shared_f = c.d_ff_shared ? u(c.d_ff_shared) : moe_f;
        const auto dense_mlp = mlp_params(c, dense_f), moe_expert = mlp_params(c, moe_f);
        std::uint64_t n_moe_layer = 0;
        if (c.n_expert > 1)
            for (std::int64_t i = c.n_layer_dense; i < c.n_layer; ++i) n_moe_layer += (i + 1) % c.moe_layer_step == 0;
        const auto n_dense_layer = L - n_moe_layer;
        std::uint64_t fixed = add(mul(u(c.n_expert_shared), mlp_params(c, shared_f)), mul(d, u(c.n_expert)));  // shared experts, router
        if (c.router_bias) fixed = add(fixed, u(c.n_expert));
        if (c.shared_expert_gate) fixed = add(fixed, d);
        const auto moe_layer = add(mul(u(c.n_expert), moe_expert), fixed);
        const auto moe_layer_active = add(mul(u(c.n_expert_active), moe_expert), fixed);
        p.mlp = add(mul(n_dense_layer, dense_mlp), mul(n_moe_layer, moe_layer));
        active_mlp = add(mul(n_dense_layer, dense_mlp), mul(n_moe_layer, moe_layer_active));
        // norms_per_layer d-wide norms a layer and a final one, weight (+ bias for LayerNorms)
        const auto per_norm = c.norm_bias ? mul(2, d) : d;
        p.norms = add(mul(mul(L, u(c.norms_per_layer)), per_norm), per_norm);
        if (n_moe_layer > 0) p.routed_expert = moe_expert, p.n_moe_layer = n_moe_layer;
    }
    if (c.lm_head_bias && !c.tied_embeddings) p.lm_head = add(p.lm_head, V);
    p.vision = c.vision_params;
    p.active_per_token = add(add(add(add(p.embedding, p.attention), active_mlp), p.norms), p.lm_head);
    return p;
}

double expected_experts_read(std::int64_t n_expert, std::int64_t n_active, std::uint64_t batch) {
    const double e = static_cast<double>(n_expert), k = static_cast<double>(n_active);
    return e * (1.0 - std::pow(1.0 - k / e, static_cast<double>(batch)));
}

double decode_params_read(const ModelConfig& cfg, std::uint64_t batch) {
    const ParamCount p = count_params(cfg);
    const double active = static_cast<double>(p.active_per_token);
    if (p.n_moe_layer == 0 || batch <= 1) return active;
    const double extra = expected_experts_read(cfg.n_expert, cfg.n_expert_active, batch) - static_cast<double>(cfg.n_expert_active);
    return active + static_cast<double>(p.n_moe_layer) * extra * static_cast<double>(p.routed_expert);
}

Cell params_cell(std::uint64_t count) {
    const double n = static_cast<double>(count);
    if (count >= 1000000000) return {fmt::format("{:.2f} B", n / 1e9), count};
    if (count >= 1000000) return {fmt::format("{:.2f} M", n / 1e6), count};
    if (count >= 1000) return {fmt::format("{:.2f} k", n / 1e3), count};
    return {fmt::format("{}", count), count};
}

}  // namespace kvlab
