#include "calc/param_count.hpp"

#include <cmath>

#include <fmt/format.h>

#include "core/checked.hpp"
#include "core/error.hpp"

namespace kvlab {
namespace {

std::uint64_t u(std::int64_t x) { return static_cast<std::uint64_t>(x); }
std::uint64_t mul(std::uint64_t a, std::uint64_t b) { return checked_mul(a, b, "parameter count"); }
std::uint64_t add(std::uint64_t a, std::uint64_t b) { return checked_add(a, b, "parameter count"); }

// One layer's attention projections. Llama: q (d, H*D), k and v (d, Hkv*D), o (H*D, d).
std::uint64_t attention_params(const ModelConfig& c) {
    const auto d = u(c.d_model);
    if (c.family == Family::gpt2) return add(mul(mul(4, d), d), mul(4, d));  // c_attn 3d^2+3d, c_proj d^2+d
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
    return n;
}

}  // namespace

std::uint64_t ParamCount::total() const { return add(add(add(add(embedding, attention), mlp), norms), lm_head); }

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
    } else if (c.falcon) {
        // Falcon: dense_h_to_4h (f, d) and dense_4h_to_h (d, f), GELU, no biases ("bias": false); LayerNorms
        // with weight and bias: norms_per_layer per layer and ln_f (transformers models/falcon/modeling_falcon.py)
        const auto f = u(c.d_ff);
        p.mlp = mul(L, mul(mul(2, d), f));
        active_mlp = p.mlp;
        p.norms = add(mul(L, mul(mul(2, d), u(c.norms_per_layer))), mul(2, d));
    } else {
        // SwiGLU expert: gate and up (d, f), down (f, d).
        const auto dense_expert = mul(mul(3, d), u(c.d_ff));
        const auto moe_f = c.d_ff_expert ? u(c.d_ff_expert) : u(c.d_ff);
        const auto moe_expert = mul(mul(3, d), moe_f);
        const auto n_moe_layer = c.n_expert > 1 ? L - u(c.n_layer_dense) : 0;
        const auto n_dense_layer = L - n_moe_layer;
        const auto moe_layer = add(add(mul(u(c.n_expert + c.n_expert_shared), moe_expert), mul(d, u(c.n_expert))), 0);  // experts + router
        const auto moe_layer_active = add(mul(u(c.n_expert_active + c.n_expert_shared), moe_expert), mul(d, u(c.n_expert)));
        p.mlp = add(mul(n_dense_layer, dense_expert), mul(n_moe_layer, moe_layer));
        active_mlp = add(mul(n_dense_layer, dense_expert), mul(n_moe_layer, moe_layer_active));
        p.norms = add(mul(L, mul(2, d)), d);  // two RMSNorms per layer + final
        if (n_moe_layer > 0) p.routed_expert = moe_expert, p.n_moe_layer = n_moe_layer;
    }
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
    if (count >= 1000) return {fmt::format("{:.2f} K", n / 1e3), count};
    return {fmt::format("{}", count), count};
}

}  // namespace kvlab
