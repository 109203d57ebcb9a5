// Model weights in memory, fp32, row-major, PyTorch (out, in) orientation: y = W x.
// Filled by a random initialiser (simulate --seed) or a loader (llama2.c .bin, safetensors).
#pragma once
#include <cstdint>
#include <vector>

#include <Eigen/Core>

#include "calc/model_config.hpp"

namespace kvlab {

using MatrixRM = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using VectorF = Eigen::VectorXf;

// How RoPE pairs dimensions within a head: llama2.c rotates neighbours (x[2i], x[2i+1]);
// Hugging Face Llama rotates halves (x[i], x[i+D/2]). The source format decides.
enum class RopePairing { neighbours, halves };

// Legend: d model dim, H heads, Hkv KV heads, D head dim, f FFN hidden, V vocab, C max context.
struct LayerWeights {
    VectorF attn_norm;       // (d)  RMSNorm / LayerNorm weight before attention
    VectorF attn_norm_bias;  // (d)  gpt2 only, else empty
    MatrixRM wq;             // (H*D, d)
    MatrixRM wk;             // (Hkv*D, d)
    MatrixRM wv;             // (Hkv*D, d)
    MatrixRM wo;             // (d, H*D)
    VectorF bq, bk, bv, bo;  // (H*D), (Hkv*D), (Hkv*D), (d): gpt2 only, else empty
    VectorF mlp_norm;        // (d)
    VectorF mlp_norm_bias;   // (d)  gpt2 only
    MatrixRM w1;             // (f, d) llama: gate_proj; gpt2: c_fc (transposed from Conv1D)
    MatrixRM w3;             // (f, d) llama: up_proj; gpt2: empty
    MatrixRM w2;             // (d, f) llama: down_proj; gpt2: c_proj (transposed)
    VectorF b1, b2;          // (f), (d): gpt2 only
};

struct Weights {
    MatrixRM tok_embed;       // (V, d)
    MatrixRM pos_embed;       // (C, d) gpt2 only, else empty
    std::vector<LayerWeights> layers;  // L of them
    VectorF final_norm;       // (d)
    VectorF final_norm_bias;  // (d) gpt2 only
    MatrixRM lm_head;         // (V, d); empty when tied: the classifier is tok_embed
    RopePairing rope_pairing = RopePairing::neighbours;

    const MatrixRM& classifier() const { return lm_head.size() ? lm_head : tok_embed; }
};

}  // namespace kvlab
