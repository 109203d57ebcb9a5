// Per-op cost formulas (docs/cost-model.md). Inputs are validated model sizes and positions within
// the context, so every product stays far below 2^64 (the largest, 2*n*d_in*d_out, is ~1e17 for a
// 405B layer at 1M tokens).
#include "kvlab/model/cost.hpp"

#include <algorithm>

#include "kvlab/core/error.hpp"
#include "kvlab/model/mla.hpp"

namespace kvlab {

namespace {
constexpr std::uint64_t b = 4;  // bytes per fp32 value
std::uint64_t u(std::int64_t x) { return static_cast<std::uint64_t>(x); }
}  // namespace

std::string_view op_name(Op op) {
    static constexpr std::array<std::string_view, n_ops> names = {
        "embed", "pos_embed", "attn_norm", "q_proj", "k_proj", "v_proj", "rope", "kv_store", "qk",
        "softmax", "av", "o_proj", "attn_residual", "mlp_norm", "mlp_gate", "mlp_up", "activation",
        "mlp_down", "mlp_residual", "final_norm", "lm_head"};
    return names[static_cast<std::size_t>(op)];
}

OpCategory op_category(Op op) {
    switch (op) {
        case Op::q_proj: case Op::k_proj: case Op::v_proj: case Op::o_proj:
        case Op::mlp_gate: case Op::mlp_up: case Op::mlp_down: case Op::lm_head:
            return OpCategory::matmul;
        case Op::qk: case Op::softmax: case Op::av:
            return OpCategory::attention;
        default:
            return OpCategory::other;
    }
}

OpCost& OpCost::operator+=(const OpCost& o) {
    flops += o.flops;
    transcendentals += o.transcendentals;
    bytes_weights_read += o.bytes_weights_read;
    bytes_act_read += o.bytes_act_read;
    bytes_act_written += o.bytes_act_written;
    bytes_kv_read += o.bytes_kv_read;
    bytes_kv_written += o.bytes_kv_written;
    return *this;
}

OpCost StepCost::total() const {
    OpCost sum;
    for (const auto& c : ops) sum += c;
    return sum;
}

std::uint64_t StepCost::flops(OpCategory category) const {
    std::uint64_t sum = 0;
    for (int i = 0; i < n_ops; ++i)
        if (op_category(static_cast<Op>(i)) == category) sum += ops[static_cast<std::size_t>(i)].flops;
    return sum;
}

OpCost cost_matmul(std::int64_t n, std::int64_t d_in, std::int64_t d_out, bool bias) {
    return cost_matmul(n, d_in, d_out, bias, b * u(d_in) * u(d_out));
}

OpCost cost_matmul(std::int64_t n, std::int64_t d_in, std::int64_t d_out, bool bias, std::uint64_t matrix_bytes) {
    OpCost c;
    c.flops = 2 * u(n) * u(d_in) * u(d_out) + (bias ? u(n) * u(d_out) : 0);
    c.bytes_weights_read = matrix_bytes + (bias ? b * u(d_out) : 0);
    c.bytes_act_read = b * u(n) * u(d_in);
    c.bytes_act_written = b * u(n) * u(d_out);
    return c;
}

OpCost cost_embed(std::int64_t n, std::int64_t d) {
    OpCost c;
    c.bytes_weights_read = b * u(n) * u(d);
    c.bytes_act_written = b * u(n) * u(d);
    return c;
}

OpCost cost_pos_embed(std::int64_t n, std::int64_t d) {
    OpCost c;
    c.flops = u(n) * u(d);
    c.bytes_weights_read = b * u(n) * u(d);
    c.bytes_act_read = b * u(n) * u(d);
    c.bytes_act_written = b * u(n) * u(d);
    return c;
}

OpCost cost_rmsnorm(std::int64_t n, std::int64_t d) {
    // per row: sum of squares 2d, mean and +eps 2, rsqrt (transcendental), x * inv * w 2d
    OpCost c;
    c.flops = u(n) * (4 * u(d) + 2);
    c.transcendentals = u(n);
    c.bytes_weights_read = b * u(d);
    c.bytes_act_read = b * u(n) * u(d);
    c.bytes_act_written = b * u(n) * u(d);
    return c;
}

OpCost cost_layernorm(std::int64_t n, std::int64_t d) {
    // per row: mean d+1, centre d, variance 2d+1, +eps 1, rsqrt (transcendental), (x-m)*inv*w+b 3d
    OpCost c;
    c.flops = u(n) * (7 * u(d) + 3);
    c.transcendentals = u(n);
    c.bytes_weights_read = b * 2 * u(d);
    c.bytes_act_read = b * u(n) * u(d);
    c.bytes_act_written = b * u(n) * u(d);
    return c;
}

OpCost cost_rope(std::int64_t n, std::int64_t n_head, std::int64_t n_head_kv, std::int64_t d_head) {
    // per rotated pair: 4 mul + 2 add; pairs = n*(H+Hkv)*D/2; sin+cos per position per frequency = D
    const std::uint64_t n_values = u(n) * u(n_head + n_head_kv) * u(d_head);
    OpCost c;
    c.flops = 3 * n_values;
    c.transcendentals = u(n) * u(d_head);
    c.bytes_act_read = b * n_values;
    c.bytes_act_written = b * n_values;
    return c;
}

namespace {
// bytes of one K (or V) row where attention keeps it: the cache's stored width, or fp32 activations
std::uint64_t kv_row(std::int64_t d_kv, KvView::Place place, std::uint64_t kv_row_bytes) {
    return place == KvView::Place::cache && kv_row_bytes ? kv_row_bytes : b * u(d_kv);
}
}  // namespace

OpCost cost_kv_store(std::int64_t n, std::int64_t d_kv, KvView::Place place, std::uint64_t kv_row_bytes) {
    OpCost c;
    c.bytes_act_read = b * 2 * u(n) * u(d_kv);  // the new fp32 K row and V row of each token
    (place == KvView::Place::cache ? c.bytes_kv_written : c.bytes_act_written) = 2 * u(n) * kv_row(d_kv, place, kv_row_bytes);
    return c;
}

OpCost cost_qk(std::int64_t n, std::int64_t n_head, std::int64_t d_kv, std::int64_t d_head,
               std::int64_t n_scores, std::int64_t n_key_rows, KvView::Place place, std::uint64_t kv_row_bytes) {
    OpCost c;
    c.flops = 2 * u(n_head) * u(d_head) * u(n_scores);
    c.bytes_act_read = b * u(n) * u(n_head) * u(d_head);  // q
    (place == KvView::Place::cache ? c.bytes_kv_read : c.bytes_act_read) += u(n_key_rows) * kv_row(d_kv, place, kv_row_bytes);
    c.bytes_act_written = b * u(n_head) * u(n_scores);
    return c;
}

OpCost cost_softmax(std::int64_t n_head, std::int64_t n_scores) {
    // per score: scale, running max, subtract, sum, normalise = 5; one exp
    OpCost c;
    c.flops = 5 * u(n_head) * u(n_scores);
    c.transcendentals = u(n_head) * u(n_scores);
    c.bytes_act_read = b * u(n_head) * u(n_scores);
    c.bytes_act_written = b * u(n_head) * u(n_scores);
    return c;
}

OpCost cost_av(std::int64_t n, std::int64_t n_head, std::int64_t d_kv, std::int64_t d_head,
               std::int64_t n_scores, std::int64_t n_key_rows, KvView::Place place, std::uint64_t kv_row_bytes) {
    OpCost c;
    c.flops = 2 * u(n_head) * u(d_head) * u(n_scores);
    c.bytes_act_read = b * u(n_head) * u(n_scores);  // probabilities
    (place == KvView::Place::cache ? c.bytes_kv_read : c.bytes_act_read) += u(n_key_rows) * kv_row(d_kv, place, kv_row_bytes);
    c.bytes_act_written = b * u(n) * u(n_head) * u(d_head);
    return c;
}

OpCost cost_residual(std::int64_t n, std::int64_t d) {
    OpCost c;
    c.flops = u(n) * u(d);
    c.bytes_act_read = b * 2 * u(n) * u(d);
    c.bytes_act_written = b * u(n) * u(d);
    return c;
}

OpCost cost_swiglu(std::int64_t n, std::int64_t d_ff) {
    // per value: g / (1 + exp(-g)) is negate, add, divide (3) + exp; times u (1)
    OpCost c;
    c.flops = 4 * u(n) * u(d_ff);
    c.transcendentals = u(n) * u(d_ff);
    c.bytes_act_read = b * 2 * u(n) * u(d_ff);
    c.bytes_act_written = b * u(n) * u(d_ff);
    return c;
}

OpCost cost_gelu_tanh(std::int64_t n, std::int64_t d_ff) {
    // per value: 0.5*x*(1 + tanh(c*(x + 0.044715*x^3))): x^3 2, *0.044715 1, +x 1, *c 1, 1+ 1,
    // *x 1, *0.5 1 = 8; one tanh
    OpCost c;
    c.flops = 8 * u(n) * u(d_ff);
    c.transcendentals = u(n) * u(d_ff);
    c.bytes_act_read = b * u(n) * u(d_ff);
    c.bytes_act_written = b * u(n) * u(d_ff);
    return c;
}

std::int64_t sum_keys_attended(std::int64_t pos0, std::int64_t n, std::int64_t window) {
    const std::int64_t end = pos0 + n;  // positions pos0..end-1 attend to pos+1 keys, capped at window
    if (window <= 0 || end <= window) return (pos0 + 1 + end) * n / 2;
    const std::int64_t growing_end = std::max(pos0, window);  // positions below window: pos+1 keys
    const std::int64_t n_growing = growing_end - pos0;
    return (pos0 + 1 + growing_end) * n_growing / 2 + (end - growing_end) * window;
}

StepCost closed_form_step_cost(const ModelConfig& cfg, StepMode mode, std::int64_t pos0, std::int64_t n, std::uint64_t kv_row_bytes,
                               MlaPath mla_path) {
    if (n <= 0 || pos0 < 0 || (mode == StepMode::uncached && pos0 != 0))
        throw UsageError("closed_form_step_cost: expected n > 0, pos0 >= 0, and pos0 = 0 for the uncached mode");
    const bool gpt2 = cfg.family == Family::gpt2;
    const bool qkv_bias = gpt2 || cfg.attention_bias;  // Qwen2-style llama configs bias q, k, v only
    const std::int64_t d = cfg.d_model, d_q = cfg.d_q(), d_kv = cfg.d_kv(), f = cfg.d_ff;
    const KvView::Place place = mode == StepMode::cached ? KvView::Place::cache : KvView::Place::activations;
    StepCost s;
    s.add(Op::embed, cost_embed(n, d));
    if (gpt2) s.add(Op::pos_embed, cost_pos_embed(n, d));
    for (std::int64_t l = 0; l < cfg.n_layer; ++l) {
        const std::int64_t n_scores = sum_keys_attended(pos0, n, cfg.layer_window(l));
        // distinct key positions read: from the first query's oldest key to the newest position
        const std::int64_t n_key_rows = n - 1 + cfg.keys_attended(l, pos0);
        s.add(Op::attn_norm, gpt2 ? cost_layernorm(n, d) : cost_rmsnorm(n, d));
        if (cfg.mla) {  // the latent cache's attention block, then the output projection from H*dv
            add_mla_cost(s, mla_attention_cost(cfg, mla_path, n, n_scores, n_key_rows, place, kv_row_bytes));
            s.add(Op::o_proj, cost_matmul(n, cfg.n_head * cfg.mla->v_head_dim, d, false));
        } else {
            s.add(Op::q_proj, cost_matmul(n, d, d_q, qkv_bias));
            s.add(Op::k_proj, cost_matmul(n, d, d_kv, qkv_bias));
            s.add(Op::v_proj, cost_matmul(n, d, d_kv, qkv_bias));
            if (!gpt2) s.add(Op::rope, cost_rope(n, cfg.n_head, cfg.n_head_kv, cfg.d_head));
            s.add(Op::kv_store, cost_kv_store(n, d_kv, place, kv_row_bytes));
            s.add(Op::qk, cost_qk(n, cfg.n_head, d_kv, cfg.d_head, n_scores, n_key_rows, place, kv_row_bytes));
            s.add(Op::softmax, cost_softmax(cfg.n_head, n_scores));
            s.add(Op::av, cost_av(n, cfg.n_head, d_kv, cfg.d_head, n_scores, n_key_rows, place, kv_row_bytes));
            s.add(Op::o_proj, cost_matmul(n, d_q, d, gpt2));
        }
        s.add(Op::attn_residual, cost_residual(n, d));
        s.add(Op::mlp_norm, gpt2 ? cost_layernorm(n, d) : cost_rmsnorm(n, d));
        if (!gpt2) s.add(Op::mlp_gate, cost_matmul(n, d, f, false));
        s.add(Op::mlp_up, cost_matmul(n, d, f, gpt2));
        s.add(Op::activation, gpt2 ? cost_gelu_tanh(n, f) : cost_swiglu(n, f));
        s.add(Op::mlp_down, cost_matmul(n, f, d, gpt2));
        s.add(Op::mlp_residual, cost_residual(n, d));
    }
    // only the last position's logits are needed to pick the next token
    s.add(Op::final_norm, gpt2 ? cost_layernorm(1, d) : cost_rmsnorm(1, d));
    s.add(Op::lm_head, cost_matmul(1, d, cfg.n_vocab, false));
    return s;
}

}  // namespace kvlab
