// Multi-head latent attention (MLA, DeepSeek-V2: arXiv 2405.04434 section 2.1) in the fast path: the
// cache holds per token one latent row, c_KV (kv_lora_rank values, RMS-normed) and the decoupled RoPE key
// k_R (qk_rope_head_dim values), and nothing else. Two ways to decode from it, same logits:
//   naive     decompress every attended latent into per-head keys k_C = W_UK c and values v_C = W_UV c,
//             then attend as MHA with heads of qk_nope + qk_rope (keys) and v_head_dim (values);
//   absorbed  fold W_UK into the query (q_C^T W_UK c = (W_UK^T q_C)^T c) and W_UV into the output
//             (sum_t p_t W_UV c_t = W_UV sum_t p_t c_t): attention reads the latent rows directly.
// Readable reference: model/reference_mla.hpp. Costs: docs/cost-model.md ("MLA").
#pragma once
#include <array>
#include <cstdint>
#include <span>

#include "kvlab/calc/model_config.hpp"
#include "kvlab/core/choice.hpp"
#include "kvlab/core/matrix.hpp"
#include "kvlab/model/cost.hpp"
#include "kvlab/weights/weights.hpp"

namespace kvlab {

inline constexpr std::array<Choice<MlaPath>, 2> mla_path_choices{{{"naive", MlaPath::naive}, {"absorbed", MlaPath::absorbed}}};

// The costs of one MLA attention block over n query rows of one sequence whose queries attend n_scores
// (query, key) pairs in all and read n_key_rows distinct latent rows (row_bytes each where they are kept:
// the cache's stored width, or fp32 activations). How the ops of the table carry them:
//   q_proj  x W_Q^T (H*(dn+R) outputs)       k_proj  x [W_DKV; W_KR]^T (r+R outputs: the latent row)
//   attn_norm (part)  the latent's RMSNorm    rope    q's R-wide parts (H heads) and the one k_R
//   kv_store  one latent row per token (no V row)
//   v_proj  the up-projection W_UK, W_UV: naive, applied to every attended latent row (the decompression);
//           absorbed, folded into each query (W_UK) and its attention output (W_UV)
//   qk, softmax, av  naive: per head over dn+R wide keys and dv wide values; absorbed: over r+R wide
//           latent rows and their r-wide part.
struct MlaCost {
    OpCost q_proj, k_proj, latent_norm, rope, kv_store, up, qk, softmax, av;
};
MlaCost mla_attention_cost(const ModelConfig& cfg, MlaPath path, std::int64_t n, std::int64_t n_scores,
                           std::int64_t n_key_rows, KvView::Place place, std::uint64_t kv_row_bytes);
void add_mla_cost(StepCost& s, const MlaCost& c);

// Activations the MLA block needs beside the transformer's (N tokens per call, T positions, H heads).
struct MlaBuffers {
    MatrixRM q;       // (N, H*(dn+R))  queries: each head's [q_C; q_R]
    MatrixRM latent;  // (N, r+R)       the call's new latent rows [c_KV; k_R]
    MatrixRM rows;    // (T, r+R)       the attended latent rows, as read (decoded) from where they are kept
    MatrixRM up;      // naive: (T, H*(dn+dv)) decompressed [k_C; v_C] of each attended row; absorbed: (threads, H*r)
    MatrixRM act;     // uncached mode: (T, r+R) every position's latent row (the "cache" of the layer); else empty
    MatrixRM scratch; // (threads, T + 2r): one query head's scores, absorbed query and latent output
    static std::uint64_t floats(const ModelConfig& cfg, std::int64_t N, std::int64_t T, bool uncached, MlaPath path, int threads);
    void allocate(const ModelConfig& cfg, std::int64_t N, std::int64_t T, bool uncached, MlaPath path, int threads);
};

struct TokenRun;
class OpRecorder;
// MLA's attention block on x (n rows, normed): out (n, H*dv) = per-head attention over each run's latent
// rows (stored here first), before o_proj. Causal, no window. Records q_proj, k_proj, attn_norm, rope,
// kv_store, v_proj, qk, softmax, av.
void mla_attention(MatrixRM& out, const MatrixRM& x, std::int64_t n, std::span<const TokenRun> runs, const LayerWeights& lw,
                   const ModelConfig& cfg, RopePairing pairing, MlaPath path, MlaBuffers& buf, OpRecorder& rec);

}  // namespace kvlab
