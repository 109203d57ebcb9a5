// Cost model: FLOPs, transcendentals and bytes per op, one closed-form function per op formula.
// The forward pass calls them with the shapes it processed; closed_form_step_cost calls them with
// shapes derived from the config alone. Conventions and formulas: docs/cost-model.md. Activations are
// fp32; weights and KV bytes are counted at their stored width.
#pragma once
#include <array>
#include <cstdint>
#include <string_view>

#include "kvlab/kv/kv_view.hpp"
#include "kvlab/calc/model_config.hpp"

namespace kvlab {

// Every op of the forward pass, in execution order. gpt2's c_fc counts as mlp_up, c_proj as mlp_down.
enum class Op {
    embed, pos_embed, attn_norm, q_proj, k_proj, v_proj, rope, kv_store, qk, softmax, av, o_proj,
    attn_residual, mlp_norm, mlp_gate, mlp_up, activation, mlp_down, mlp_residual, final_norm, lm_head,
};
inline constexpr int n_ops = static_cast<int>(Op::lm_head) + 1;
std::string_view op_name(Op op);  // "q_proj", ...

// matmul: products against weight matrices (projections, MLP, lm_head); attention: qk, softmax, av;
// other: embeddings, norms, RoPE, KV stores, activations, residuals.
enum class OpCategory { matmul, attention, other };
OpCategory op_category(Op op);

// One op's (or a sum of ops') cost. A multiply-add is 2 FLOPs; exp/sin/cos/tanh/rsqrt are
// transcendentals, counted apart from FLOPs. Bytes are fp32 values moved, counted once per op call.
struct OpCost {
    std::uint64_t flops = 0;
    std::uint64_t transcendentals = 0;
    std::uint64_t bytes_weights_read = 0;
    std::uint64_t bytes_act_read = 0;
    std::uint64_t bytes_act_written = 0;
    std::uint64_t bytes_kv_read = 0;
    std::uint64_t bytes_kv_written = 0;

    OpCost& operator+=(const OpCost& other);
    bool operator==(const OpCost& other) const = default;
    std::uint64_t bytes_read() const { return bytes_weights_read + bytes_act_read + bytes_kv_read; }
    std::uint64_t bytes_written() const { return bytes_act_written + bytes_kv_written; }
    std::uint64_t bytes_total() const { return bytes_read() + bytes_written(); }
};

// The cost of one forward call (a step), per op, summed over layers. Fixed size: no allocation.
// wall_ns is measured, not modelled: the forward pass's wall time per op, summed over layers (0 when
// counting is off). Equality compares the costs only, so measured and closed-form costs compare.
struct StepCost {
    std::array<OpCost, n_ops> ops{};
    std::array<std::int64_t, n_ops> wall_ns{};

    void add(Op op, const OpCost& cost) { ops[static_cast<int>(op)] += cost; }
    const OpCost& at(Op op) const { return ops[static_cast<int>(op)]; }
    std::int64_t wall_ns_of(Op op) const { return wall_ns[static_cast<std::size_t>(op)]; }
    OpCost total() const;
    std::uint64_t flops(OpCategory category) const;
    bool operator==(const StepCost& other) const { return ops == other.ops; }
};


// Per-op formulas. n: token rows processed. Sizes are element counts; results are exact.
// W (d_out, d_in) @ x (n, d_in) -> (n, d_out); bias adds d_out values per row.
OpCost cost_matmul(std::int64_t n, std::int64_t d_in, std::int64_t d_out, bool bias);
// The same with the matrix's bytes as stored (narrow weights: bf16, fp16, q8_0 with its block scales).
OpCost cost_matmul(std::int64_t n, std::int64_t d_in, std::int64_t d_out, bool bias, std::uint64_t matrix_bytes);
OpCost cost_embed(std::int64_t n, std::int64_t d);         // gather n rows of the table
OpCost cost_pos_embed(std::int64_t n, std::int64_t d);     // x += P[pos] (gpt2)
OpCost cost_rmsnorm(std::int64_t n, std::int64_t d);
OpCost cost_layernorm(std::int64_t n, std::int64_t d);
// q (n, H*D) and k (n, Hkv*D) rotated in place; one sin and one cos per position per frequency.
OpCost cost_rope(std::int64_t n, std::int64_t n_head, std::int64_t n_head_kv, std::int64_t d_head);
// Copy n new K rows and n new V rows (d_kv values each) to where attention reads them. kv_row_bytes:
// the bytes one K (or V) row takes in the cache at its stored width (kv/kv_cache.hpp,
// kv_stored_row_bytes); 0 means fp32, 4 x d_kv. Activations are always fp32.
OpCost cost_kv_store(std::int64_t n, std::int64_t d_kv, KvView::Place place, std::uint64_t kv_row_bytes = 0);
// n_scores: query-key pairs per head, summed over the n query rows; n_key_rows: distinct K (or V)
// rows read, each read once per call.
OpCost cost_qk(std::int64_t n, std::int64_t n_head, std::int64_t d_kv, std::int64_t d_head,
               std::int64_t n_scores, std::int64_t n_key_rows, KvView::Place place, std::uint64_t kv_row_bytes = 0);
OpCost cost_softmax(std::int64_t n_head, std::int64_t n_scores);
OpCost cost_av(std::int64_t n, std::int64_t n_head, std::int64_t d_kv, std::int64_t d_head,
               std::int64_t n_scores, std::int64_t n_key_rows, KvView::Place place, std::uint64_t kv_row_bytes = 0);
OpCost cost_residual(std::int64_t n, std::int64_t d);      // x += y
OpCost cost_swiglu(std::int64_t n, std::int64_t d_ff);     // silu(g) * u
OpCost cost_gelu_tanh(std::int64_t n, std::int64_t d_ff);

// Which forward call: the cached mode runs n tokens at positions pos0.. against the cache (prefill:
// pos0 = 0, n = P; decode: n = 1); the uncached mode runs positions 0..n-1 with no cache.
enum class StepMode { cached, uncached };
// How MLA attention reads its latent cache (model/mla.hpp): decompressing it, or with W_UK, W_UV absorbed.
enum class MlaPath { naive, absorbed };

// Query-key pairs per head summed over query positions pos0..pos0+n-1 when each attends to the
// last min(window, pos+1) positions (window <= 0: no window). Arithmetic series, no loop.
std::int64_t sum_keys_attended(std::int64_t pos0, std::int64_t n, std::int64_t window);

// The closed form of one forward call from config arithmetic alone (logits for the last position).
// MLA configs: the attention block's costs by `mla_path` (model/mla.hpp, mla_attention_cost).
StepCost closed_form_step_cost(const ModelConfig& cfg, StepMode mode, std::int64_t pos0, std::int64_t n, std::uint64_t kv_row_bytes = 0,
                               MlaPath mla_path = MlaPath::absorbed);

}  // namespace kvlab
