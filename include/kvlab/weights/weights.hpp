// Model weights in memory, fp32, row-major, PyTorch (out, in) orientation: y = W x.
// Filled by a random initialiser (simulate --seed) or a loader (llama2.c .bin, safetensors).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "kvlab/calc/model_config.hpp"
#include "kvlab/core/matrix.hpp"

namespace kvlab {

class MappedFile;  // core/mapped_file.hpp

// A weight matrix (rows, cols), row-major fp32: its own values, or a read-only view of values another
// owner holds (a checkpoint's mapped pages used in place, kept alive by Weights::mapped; an arena, by Weights::backing). The
// kernels read data() either way; filling one (loaders, random init) goes through owned().
class WeightMatrix {
public:
    using Index = Eigen::Index;
    WeightMatrix() = default;
    WeightMatrix(MatrixRM m) : own_(std::move(m)) {}  // implicit, as the MatrixRM it holds
    static WeightMatrix view(const float* data, Index rows, Index cols) {
        WeightMatrix w;
        w.view_ = data;
        w.rows_ = rows;
        w.cols_ = cols;
        return w;
    }
    bool is_view() const { return view_ != nullptr; }
    Index rows() const { return view_ ? rows_ : own_.rows(); }
    Index cols() const { return view_ ? cols_ : own_.cols(); }
    Index size() const { return rows() * cols(); }
    const float* data() const { return view_ ? view_ : own_.data(); }
    Eigen::Map<const MatrixRM> map() const { return {data(), rows(), cols()}; }
    Eigen::Map<const Eigen::RowVectorXf> row(Index i) const { return {data() + i * cols(), cols()}; }
    float operator()(Index r, Index c) const { return data()[r * cols() + c]; }
    float& operator()(Index r, Index c) { return owned()(r, c); }
    bool operator==(const WeightMatrix& o) const { return rows() == o.rows() && cols() == o.cols() && map() == o.map(); }
    // Its own values, to fill or change: a view is copied first (and no longer a view).
    MatrixRM& owned() {
        if (view_) {
            MatrixRM copy = large_matrix(rows_, cols_);
            copy = map();
            own_ = std::move(copy);
            view_ = nullptr;
        }
        return own_;
    }
    template <typename Derived>
    WeightMatrix& operator=(const Eigen::MatrixBase<Derived>& values) {  // its own values from any expression
        MatrixRM m = large_matrix(values.rows(), values.cols());  // a fresh buffer: `values` may read own_
        m = values;
        own_ = std::move(m);
        view_ = nullptr;
        return *this;
    }
    void resize(Index rows, Index cols) {  // uninitialised (large_matrix)
        view_ = nullptr;
        if (own_.rows() != rows || own_.cols() != cols) own_ = large_matrix(rows, cols);
    }

private:
    MatrixRM own_;
    const float* view_ = nullptr;
    Index rows_ = 0, cols_ = 0;
};

// How RoPE pairs dimensions within a head: llama2.c rotates neighbours (x[2i], x[2i+1]);
// Hugging Face Llama rotates halves (x[i], x[i+D/2]). The source format decides.
enum class RopePairing { neighbours, halves };

// Legend: d model dim, H heads, Hkv KV heads, D head dim, f FFN hidden, V vocab, C max context.
struct LayerWeights {
    VectorF attn_norm;       // (d)  RMSNorm / LayerNorm weight before attention
    VectorF attn_norm_bias;  // (d)  gpt2 only, else empty
    WeightMatrix wq;             // (H*D, d)
    WeightMatrix wk;             // (Hkv*D, d)
    WeightMatrix wv;             // (Hkv*D, d)
    WeightMatrix wo;             // (d, H*D)
    VectorF bq, bk, bv, bo;  // (H*D), (Hkv*D), (Hkv*D), (d): gpt2 only, else empty
    // MLA (cfg.mla; DeepSeek-V2 section 2.1, names as Hugging Face's deepseek_v2), with r kv_lora_rank, R
    // qk_rope_head_dim, dn qk_nope_head_dim, dv v_head_dim: wq (H*(dn+R), d) q_proj, each head's [W_UQ; W_QR]
    // rows; wk (r+R, d) kv_a_proj_with_mqa, [W_DKV; W_KR]; wv (H*(dn+dv), r) kv_b_proj, each head's [W_UK;
    // W_UV] rows; wo (d, H*dv); kv_norm (r) the latent's RMSNorm (kv_a_layernorm). Empty otherwise.
    VectorF kv_norm;
    VectorF mlp_norm;        // (d)
    VectorF mlp_norm_bias;   // (d)  gpt2 only
    WeightMatrix w1;             // (f, d) llama: gate_proj; gpt2: c_fc (transposed from Conv1D)
    WeightMatrix w3;             // (f, d) llama: up_proj; gpt2: empty
    WeightMatrix w2;             // (d, f) llama: down_proj; gpt2: c_proj (transposed)
    VectorF b1, b2;          // (f), (d): gpt2 only
};

struct Weights {
    WeightMatrix tok_embed;   // (V, d)
    WeightMatrix pos_embed;   // (C, d) gpt2 only, else empty
    std::vector<LayerWeights> layers;  // L of them
    VectorF final_norm;       // (d)
    VectorF final_norm_bias;  // (d) gpt2 only
    WeightMatrix lm_head;     // (V, d); empty when tied: the classifier is tok_embed
    RopePairing rope_pairing = RopePairing::neighbours;
    std::shared_ptr<const void> backing;  // the arena views among the matrices point into, or null
    // WeightPlacement::mapped_file (formats/checkpoint.hpp): the checkpoint files the views read in place
    // (a llama2.c file, or the safetensors shards holding F32 matrices); empty when none is
    std::vector<std::shared_ptr<const MappedFile>> mapped;

    const WeightMatrix& classifier() const { return lm_head.size() ? lm_head : tok_embed; }
};

// What a forward pass (model/transformer.hpp, model/reference.hpp) runs, checked once before it reads raw
// rows: ConfigError for MLA, mixture-of-experts, an odd RoPE head size, or a matrix whose shape is not
// the config's.
void check_forward_shapes(const ModelConfig& cfg, const Weights& weights);

}  // namespace kvlab
