#include "model/attention.hpp"

#include <algorithm>
#include <cmath>

#include "model/weights.hpp"

namespace kvlab {

void attention_head(const AttentionShape& shape, std::int64_t h, const float* q, const float* k, const float* v,
                    std::int64_t n_tokens, float* out, float* scores) {
    using StridedRows = Eigen::Map<const MatrixRM, 0, Eigen::OuterStride<>>;
    const std::int64_t D = shape.d_head, d_kv = shape.n_head_kv * D, n_group = shape.n_head / shape.n_head_kv;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    const std::int64_t kv_off = (h / n_group) * D;  // column of this head's KV head in a (Hkv*D) row
    const StridedRows k_h(k + kv_off, n_tokens, D, Eigen::OuterStride<>(d_kv));  // (T, D)
    const StridedRows v_h(v + kv_off, n_tokens, D, Eigen::OuterStride<>(d_kv));  // (T, D)
    Eigen::Map<const VectorF> q_h(q + h * D, D);
    Eigen::Map<VectorF> out_h(out + h * D, D);
    Eigen::Map<VectorF> s(scores, n_tokens);  // (T)
    // scores = K_h q_h / sqrt(D), then softmax, max-subtracted
    s.noalias() = k_h * q_h;
    s *= scale;
    s = (s.array() - s.maxCoeff()).exp();
    const float sum = s.sum();
    // out_h = V_h^T p
    out_h.noalias() = v_h.transpose() * s;
    out_h /= sum;
}

void attention_decode_ref(const AttentionShape& shape, const float* q, const float* k, const float* v,
                          std::int64_t n_tokens, float* out, float* scores) {
    const std::int64_t d_kv = shape.n_head_kv * shape.d_head;
    const std::int64_t n_group = shape.n_head / shape.n_head_kv;
    const float scale = 1.0f / std::sqrt(static_cast<float>(shape.d_head));
    for (std::int64_t h = 0; h < shape.n_head; ++h) {
        const float* q_h = q + h * shape.d_head;                     // (D)
        const std::int64_t kv_off = (h / n_group) * shape.d_head;    // column of KV head in a (Hkv*D) row
        // scores = q_h . k_t / sqrt(D)
        float max_score = -INFINITY;
        for (std::int64_t t = 0; t < n_tokens; ++t) {
            const float* k_t = k + t * d_kv + kv_off;
            float s = 0.0f;
            for (std::int64_t i = 0; i < shape.d_head; ++i) s += q_h[i] * k_t[i];
            scores[t] = s * scale;
            max_score = std::max(max_score, scores[t]);
        }
        // softmax, max-subtracted for stability
        float sum = 0.0f;
        for (std::int64_t t = 0; t < n_tokens; ++t) {
            scores[t] = std::exp(scores[t] - max_score);
            sum += scores[t];
        }
        // out_h = sum_t p_t v_t
        float* out_h = out + h * shape.d_head;
        std::fill(out_h, out_h + shape.d_head, 0.0f);
        for (std::int64_t t = 0; t < n_tokens; ++t) {
            const float p = scores[t] / sum;
            const float* v_t = v + t * d_kv + kv_off;
            for (std::int64_t i = 0; i < shape.d_head; ++i) out_h[i] += p * v_t[i];
        }
    }
}

}  // namespace kvlab
