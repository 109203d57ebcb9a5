#include "kvlab/weights/tensor_table.hpp"

#include <fmt/format.h>

#include "kvlab/core/checked.hpp"
#include "kvlab/core/error.hpp"

namespace kvlab {

namespace {

// Shorthands for the table rows below.
TensorSpec global_matrix(std::string_view name, std::int64_t rows, std::int64_t cols, WeightMatrix Weights::*m,
                         std::string_view hf_name) {
    TensorSpec s{name, false, rows, cols, TensorInit::normal, hf_name};
    s.matrix = m;
    return s;
}
TensorSpec global_vector(std::string_view name, std::int64_t n, TensorInit init, VectorF Weights::*v,
                         std::string_view hf_name) {
    TensorSpec s{name, false, n, 0, init, hf_name};
    s.vector = v;
    return s;
}
TensorSpec layer_matrix(std::string_view name, std::int64_t rows, std::int64_t cols, WeightMatrix LayerWeights::*m,
                        std::string_view hf_name, bool hf_transposed = false, int hf_slice = -1) {
    TensorSpec s{name, true, rows, cols, TensorInit::normal, hf_name, hf_transposed, hf_slice};
    s.layer_matrix = m;
    return s;
}
TensorSpec layer_vector(std::string_view name, std::int64_t n, TensorInit init, VectorF LayerWeights::*v,
                        std::string_view hf_name, int hf_slice = -1) {
    TensorSpec s{name, true, n, 0, init, hf_name, false, hf_slice};
    s.layer_vector = v;
    return s;
}

using W = Weights;
using L = LayerWeights;
constexpr auto ones = TensorInit::ones;
constexpr auto zeros = TensorInit::zeros;

// Llama family (Hugging Face LlamaForCausalLM names; q/k/v biases for Qwen2-style configs).
std::vector<TensorSpec> llama_specs(const ModelConfig& cfg) {
    const std::int64_t d = cfg.d_model, d_q = cfg.d_q(), d_kv = cfg.d_kv(), f = cfg.d_ff, V = cfg.n_vocab;
    const bool bias = cfg.attention_bias;
    std::vector<TensorSpec> t;
    t.push_back(global_matrix("tok_embed", V, d, &W::tok_embed, "model.embed_tokens.weight"));
    t.push_back(layer_vector("attn_norm", d, ones, &L::attn_norm, "model.layers.{}.input_layernorm.weight"));
    t.push_back(layer_matrix("wq", d_q, d, &L::wq, "model.layers.{}.self_attn.q_proj.weight"));
    if (bias) t.push_back(layer_vector("bq", d_q, zeros, &L::bq, "model.layers.{}.self_attn.q_proj.bias"));
    t.push_back(layer_matrix("wk", d_kv, d, &L::wk, "model.layers.{}.self_attn.k_proj.weight"));
    if (bias) t.push_back(layer_vector("bk", d_kv, zeros, &L::bk, "model.layers.{}.self_attn.k_proj.bias"));
    t.push_back(layer_matrix("wv", d_kv, d, &L::wv, "model.layers.{}.self_attn.v_proj.weight"));
    if (bias) t.push_back(layer_vector("bv", d_kv, zeros, &L::bv, "model.layers.{}.self_attn.v_proj.bias"));
    t.push_back(layer_matrix("wo", d, d_q, &L::wo, "model.layers.{}.self_attn.o_proj.weight"));
    t.push_back(layer_vector("mlp_norm", d, ones, &L::mlp_norm, "model.layers.{}.post_attention_layernorm.weight"));
    t.push_back(layer_matrix("w1", f, d, &L::w1, "model.layers.{}.mlp.gate_proj.weight"));
    t.push_back(layer_matrix("w3", f, d, &L::w3, "model.layers.{}.mlp.up_proj.weight"));
    t.push_back(layer_matrix("w2", d, f, &L::w2, "model.layers.{}.mlp.down_proj.weight"));
    t.push_back(global_vector("final_norm", d, ones, &W::final_norm, "model.norm.weight"));
    if (!cfg.tied_embeddings) t.push_back(global_matrix("lm_head", V, d, &W::lm_head, "lm_head.weight"));
    return t;
}

// GPT-2 family (Hugging Face GPT2Model names; Conv1D weights stored (in, out); c_attn fuses q, k, v).
std::vector<TensorSpec> gpt2_specs(const ModelConfig& cfg) {
    const std::int64_t d = cfg.d_model, d_q = cfg.d_q(), d_kv = cfg.d_kv(), f = cfg.d_ff, V = cfg.n_vocab;
    std::vector<TensorSpec> t;
    t.push_back(global_matrix("tok_embed", V, d, &W::tok_embed, "wte.weight"));
    t.push_back(global_matrix("pos_embed", cfg.n_ctx_max, d, &W::pos_embed, "wpe.weight"));
    t.push_back(layer_vector("attn_norm", d, ones, &L::attn_norm, "h.{}.ln_1.weight"));
    t.push_back(layer_vector("attn_norm_bias", d, zeros, &L::attn_norm_bias, "h.{}.ln_1.bias"));
    t.push_back(layer_matrix("wq", d_q, d, &L::wq, "h.{}.attn.c_attn.weight", true, 0));
    t.push_back(layer_vector("bq", d_q, zeros, &L::bq, "h.{}.attn.c_attn.bias", 0));
    t.push_back(layer_matrix("wk", d_kv, d, &L::wk, "h.{}.attn.c_attn.weight", true, 1));
    t.push_back(layer_vector("bk", d_kv, zeros, &L::bk, "h.{}.attn.c_attn.bias", 1));
    t.push_back(layer_matrix("wv", d_kv, d, &L::wv, "h.{}.attn.c_attn.weight", true, 2));
    t.push_back(layer_vector("bv", d_kv, zeros, &L::bv, "h.{}.attn.c_attn.bias", 2));
    t.push_back(layer_matrix("wo", d, d_q, &L::wo, "h.{}.attn.c_proj.weight", true));
    t.push_back(layer_vector("bo", d, zeros, &L::bo, "h.{}.attn.c_proj.bias"));
    t.push_back(layer_vector("mlp_norm", d, ones, &L::mlp_norm, "h.{}.ln_2.weight"));
    t.push_back(layer_vector("mlp_norm_bias", d, zeros, &L::mlp_norm_bias, "h.{}.ln_2.bias"));
    t.push_back(layer_matrix("w1", f, d, &L::w1, "h.{}.mlp.c_fc.weight", true));
    t.push_back(layer_vector("b1", f, zeros, &L::b1, "h.{}.mlp.c_fc.bias"));
    t.push_back(layer_matrix("w2", d, f, &L::w2, "h.{}.mlp.c_proj.weight", true));
    t.push_back(layer_vector("b2", d, zeros, &L::b2, "h.{}.mlp.c_proj.bias"));
    t.push_back(global_vector("final_norm", d, ones, &W::final_norm, "ln_f.weight"));
    t.push_back(global_vector("final_norm_bias", d, zeros, &W::final_norm_bias, "ln_f.bias"));
    if (!cfg.tied_embeddings) t.push_back(global_matrix("lm_head", V, d, &W::lm_head, "lm_head.weight"));
    return t;
}

// Multi-head latent attention (Hugging Face DeepseekV2ForCausalLM names, dense layers, no query compression):
// the shapes weights.hpp lists for MLA under wq, wk, wv, wo and kv_norm.
std::vector<TensorSpec> mla_specs(const ModelConfig& cfg) {
    const MlaShape& m = *cfg.mla;
    const std::int64_t d = cfg.d_model, H = cfg.n_head, f = cfg.d_ff, V = cfg.n_vocab, r = m.kv_lora_rank;
    std::vector<TensorSpec> t;
    t.push_back(global_matrix("tok_embed", V, d, &W::tok_embed, "model.embed_tokens.weight"));
    t.push_back(layer_vector("attn_norm", d, ones, &L::attn_norm, "model.layers.{}.input_layernorm.weight"));
    t.push_back(layer_matrix("wq", H * (m.qk_nope_head_dim + m.qk_rope_head_dim), d, &L::wq, "model.layers.{}.self_attn.q_proj.weight"));
    t.push_back(layer_matrix("wk", r + m.qk_rope_head_dim, d, &L::wk, "model.layers.{}.self_attn.kv_a_proj_with_mqa.weight"));
    t.push_back(layer_vector("kv_norm", r, ones, &L::kv_norm, "model.layers.{}.self_attn.kv_a_layernorm.weight"));
    t.push_back(layer_matrix("wv", H * (m.qk_nope_head_dim + m.v_head_dim), r, &L::wv, "model.layers.{}.self_attn.kv_b_proj.weight"));
    t.push_back(layer_matrix("wo", d, H * m.v_head_dim, &L::wo, "model.layers.{}.self_attn.o_proj.weight"));
    t.push_back(layer_vector("mlp_norm", d, ones, &L::mlp_norm, "model.layers.{}.post_attention_layernorm.weight"));
    t.push_back(layer_matrix("w1", f, d, &L::w1, "model.layers.{}.mlp.gate_proj.weight"));
    t.push_back(layer_matrix("w3", f, d, &L::w3, "model.layers.{}.mlp.up_proj.weight"));
    t.push_back(layer_matrix("w2", d, f, &L::w2, "model.layers.{}.mlp.down_proj.weight"));
    t.push_back(global_vector("final_norm", d, ones, &W::final_norm, "model.norm.weight"));
    if (!cfg.tied_embeddings) t.push_back(global_matrix("lm_head", V, d, &W::lm_head, "lm_head.weight"));
    return t;
}

}  // namespace

std::uint64_t TensorSpec::n_values() const {
    const auto r = static_cast<std::uint64_t>(rows);
    return is_matrix() ? checked_mul(r, static_cast<std::uint64_t>(cols), "tensor size") : r;
}

std::vector<TensorSpec> tensor_specs(const ModelConfig& cfg) {
    if (cfg.family == Family::gpt2) return gpt2_specs(cfg);
    if (cfg.family == Family::llama && cfg.mla) return mla_specs(cfg);
    if (cfg.family == Family::llama) return llama_specs(cfg);
    throw ConfigError(fmt::format("{}: kvlab runs the llama and gpt2 families only", cfg.name));
}

const TensorSpec& find_spec(std::span<const TensorSpec> specs, std::string_view name) {
    for (const TensorSpec& s : specs)
        if (s.name == name) return s;
    throw Error(fmt::format("tensor table: no tensor '{}' for this config", name));
}

std::span<float> tensor_data(Weights& w, const TensorSpec& s, std::size_t layer) {
    if (s.is_matrix()) {
        MatrixRM& m = matrix_of(w, s, layer).owned();
        return {m.data(), static_cast<std::size_t>(m.size())};
    }
    VectorF& v = vector_of(w, s, layer);
    return {v.data(), static_cast<std::size_t>(v.size())};
}

std::span<const float> tensor_data(const Weights& w, const TensorSpec& s, std::size_t layer) {
    if (s.matrix) return {(w.*s.matrix).data(), static_cast<std::size_t>((w.*s.matrix).size())};
    if (s.vector) return {(w.*s.vector).data(), static_cast<std::size_t>((w.*s.vector).size())};
    const LayerWeights& l = w.layers.at(layer);
    if (s.layer_matrix) return {(l.*s.layer_matrix).data(), static_cast<std::size_t>((l.*s.layer_matrix).size())};
    return {(l.*s.layer_vector).data(), static_cast<std::size_t>((l.*s.layer_vector).size())};
}

WeightMatrix& matrix_of(Weights& w, const TensorSpec& s, std::size_t layer) {
    if (!s.is_matrix()) throw Error(fmt::format("tensor table: '{}' is not a matrix", s.name));
    return s.matrix ? w.*s.matrix : w.layers.at(layer).*s.layer_matrix;
}

const WeightMatrix& matrix_of(const Weights& w, const TensorSpec& s, std::size_t layer) {
    return matrix_of(const_cast<Weights&>(w), s, layer);  // the same member, read only
}

VectorF& vector_of(Weights& w, const TensorSpec& s, std::size_t layer) {
    if (s.is_matrix()) throw Error(fmt::format("tensor table: '{}' is not a vector", s.name));
    return s.vector ? w.*s.vector : w.layers.at(layer).*s.layer_vector;
}

void allocate_tensor(Weights& w, const TensorSpec& s, std::size_t layer) {
    if (s.matrix) (w.*s.matrix).resize(s.rows, s.cols);
    else if (s.vector) (w.*s.vector).resize(s.rows);
    else if (s.layer_matrix) (w.layers.at(layer).*s.layer_matrix).resize(s.rows, s.cols);
    else (w.layers.at(layer).*s.layer_vector).resize(s.rows);
}

std::pair<std::int64_t, std::int64_t> held_shape(const Weights& w, const TensorSpec& s, std::size_t layer) {
    if (s.matrix) return {(w.*s.matrix).rows(), (w.*s.matrix).cols()};
    if (s.vector) return {(w.*s.vector).size(), 0};
    if (s.layer_matrix) return {(w.layers.at(layer).*s.layer_matrix).rows(), (w.layers.at(layer).*s.layer_matrix).cols()};
    return {(w.layers.at(layer).*s.layer_vector).size(), 0};
}

std::uint64_t weights_bytes(const ModelConfig& cfg) {
    // every sum and product checked: the shapes come from user configs
    std::uint64_t n_values = 0;
    for (const TensorSpec& s : tensor_specs(cfg)) {
        const std::uint64_t copies = s.per_layer ? static_cast<std::uint64_t>(cfg.n_layer) : 1;
        n_values = checked_add(n_values, checked_mul(s.n_values(), copies, "weights bytes"), "weights bytes");
    }
    return checked_mul(n_values, sizeof(float), "weights bytes");
}

std::uint64_t weights_bytes_held(const Weights& w) {
    // every member of Weights and LayerWeights (whichever family filled them)
    std::uint64_t n = static_cast<std::uint64_t>(w.tok_embed.size() + w.pos_embed.size() + w.final_norm.size() +
                                                 w.final_norm_bias.size() + w.lm_head.size());
    for (const auto& lw : w.layers)
        n += static_cast<std::uint64_t>(
            lw.attn_norm.size() + lw.attn_norm_bias.size() + lw.wq.size() + lw.wk.size() + lw.wv.size() +
            lw.wo.size() + lw.bq.size() + lw.bk.size() + lw.bv.size() + lw.bo.size() + lw.mlp_norm.size() +
            lw.mlp_norm_bias.size() + lw.w1.size() + lw.w3.size() + lw.w2.size() + lw.b1.size() + lw.b2.size());
    return n * sizeof(float);
}

}  // namespace kvlab
