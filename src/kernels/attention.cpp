#include "kvlab/kernels/attention.hpp"

#include <algorithm>
#include <cmath>

#include "kvlab/core/checked.hpp"
#include "kvlab/kv/kv_cache.hpp"
#include "kvlab/kv/kv_view.hpp"
#include "kernels/simd.hpp"
#include "kvlab/core/matrix.hpp"

namespace kvlab {

namespace {

// Rows per chunk: 8 KiB of fp32 at D = 32 (or 64 and more), so a chunk (decoded from a narrow cache, or
// fp32 rows read in place) stays in L1 while every query head of the group reads it.
std::int64_t chunk_rows(std::int64_t d_head) { return std::max<std::int64_t>(8, 2048 / d_head); }
std::int64_t padded(std::int64_t n) { return (n + 15) / 16 * 16; }

// The two products of one query head over a block of rows (row t at x + t * stride, D values), one
// call per head so a head's numbers do not depend on how many heads share the call:
//   dot_rows:  s[t] = x_t . q            (the scores)
//   axpy_rows: out += sum_t p[t] x_t     (the weighted values)
// With AVX2 and D a multiple of 8, hand-vectorized: dot_rows takes 8 rows at a time and sums their 8
// partial-sum vectors in one tree, axpy_rows keeps 32 output values in registers across the rows.
// Elsewhere, Eigen's matrix-vector products.

void dot_rows(const float* x, std::int64_t stride, std::int64_t n, std::int64_t D, const float* q, float* s) {
    std::int64_t t = 0;
#if defined(__AVX2__) && defined(__FMA__)
    if (D % 8 == 0)
        for (; t + 8 <= n; t += 8) {
            __m256 acc[8];
            for (int r = 0; r < 8; ++r) acc[r] = _mm256_setzero_ps();
            for (std::int64_t i = 0; i < D; i += 8) {
                const __m256 qi = _mm256_loadu_ps(q + i);
                for (int r = 0; r < 8; ++r) acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + (t + r) * stride + i), qi, acc[r]);
            }
            _mm256_storeu_ps(s + t, sum8(acc));
        }
#endif
    if (t < n) {
        const Eigen::Map<const MatrixRM, 0, Eigen::OuterStride<>> rest(x + t * stride, n - t, D, Eigen::OuterStride<>(stride));
        Eigen::Map<VectorF>(s + t, n - t).noalias() = rest * Eigen::Map<const VectorF>(q, D);
    }
}

void axpy_rows(const float* x, std::int64_t stride, std::int64_t n, std::int64_t D, const float* p, float* out) {
#if defined(__AVX2__) && defined(__FMA__)
    if (D % 8 == 0) {
        std::int64_t i = 0;
        for (; i + 32 <= D; i += 32) {
            // 32 outputs in registers over every row; even and odd rows in separate registers, so 8
            // chains of fused multiply-adds run at once instead of waiting on each other
            __m256 acc[2][4];
            for (int b = 0; b < 4; ++b) {
                acc[0][b] = _mm256_loadu_ps(out + i + 8 * b);
                acc[1][b] = _mm256_setzero_ps();
            }
            std::int64_t t = 0;
            for (; t + 2 <= n; t += 2)
                for (int u = 0; u < 2; ++u) {
                    const __m256 pt = _mm256_set1_ps(p[t + u]);
                    for (int b = 0; b < 4; ++b) acc[u][b] = _mm256_fmadd_ps(pt, _mm256_loadu_ps(x + (t + u) * stride + i + 8 * b), acc[u][b]);
                }
            if (t < n)
                for (int b = 0; b < 4; ++b) acc[0][b] = _mm256_fmadd_ps(_mm256_set1_ps(p[t]), _mm256_loadu_ps(x + t * stride + i + 8 * b), acc[0][b]);
            for (int b = 0; b < 4; ++b) _mm256_storeu_ps(out + i + 8 * b, _mm256_add_ps(acc[0][b], acc[1][b]));
        }
        for (; i < D; i += 8) {
            __m256 acc = _mm256_loadu_ps(out + i);
            for (std::int64_t t = 0; t < n; ++t) acc = _mm256_fmadd_ps(_mm256_set1_ps(p[t]), _mm256_loadu_ps(x + t * stride + i), acc);
            _mm256_storeu_ps(out + i, acc);
        }
        return;
    }
#endif
    const Eigen::Map<const MatrixRM, 0, Eigen::OuterStride<>> rows(x, n, D, Eigen::OuterStride<>(stride));
    Eigen::Map<VectorF>(out, D).noalias() += rows.transpose() * Eigen::Map<const VectorF>(p, n);
}

}  // namespace

std::int64_t attention_scratch_floats(const AttentionShape& shape, std::int64_t n_keys) {
    const std::uint64_t scores = checked_mul(static_cast<std::uint64_t>(shape.n_head), static_cast<std::uint64_t>(padded(n_keys)), "attention scratch");
    const auto chunk = static_cast<std::uint64_t>(chunk_rows(shape.d_head) * shape.d_head);
    const auto q_sink = checked_mul(static_cast<std::uint64_t>(shape.n_head), static_cast<std::uint64_t>(shape.d_head), "attention scratch");
    return static_cast<std::int64_t>(checked_add(checked_add(scores, chunk, "attention scratch"), q_sink, "attention scratch"));
}

void attention_heads(const AttentionShape& shape, std::int64_t h0, std::int64_t nh, const float* q, const KvView& kv,
                     std::int64_t r0, std::int64_t n_tokens, float* out, float* scratch, const float* q_sink, std::int64_t n_sink_rows) {
    const std::int64_t D = shape.d_head, n_group = shape.n_head / shape.n_head_kv, T = n_tokens;
    const std::int64_t kv0 = h0 / n_group, kv1 = (h0 + nh - 1) / n_group + 1;  // the KV heads the query heads read
    const std::int64_t chunk = chunk_rows(D);  // fp32 rows are read in place; the chunk stays in L1 for the group
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    const std::int64_t s_stride = padded(T);
    float* s = scratch;                    // (nh, T) scores, one padded row per query head
    float* buf = scratch + nh * s_stride;  // one KV head's decoded chunk
    // the query heads of KV head g in this call: [first, last)
    auto first = [&](std::int64_t g) { return std::max(h0, g * n_group); };
    auto last = [&](std::int64_t g) { return std::min(h0 + nh, (g + 1) * n_group); };
    // rows c0..c0+n-1 of KV head g: fp32 rows in place, or a narrow cache's decoded into buf
    auto rows = [&](const MatrixRM* m, const KvRowStore* store, std::int64_t g, std::int64_t c0, std::int64_t n,
                    std::int64_t& stride) -> const float* {
        const std::int64_t row = kv.pool_row(r0 + c0);
        if (!store) {
            stride = m->cols();
            return m->data() + row * stride + g * D;
        }
        store->read_head(row, n, g, buf);
        stride = D;
        return buf;
    };
    // rows in the chunk starting at c0: up to `chunk`, and paged, up to the end of c0's block (K and V
    // share one block table)
    auto chunk_at = [&](std::int64_t c0) {
        const std::int64_t n = std::min(chunk, (q_sink && c0 < n_sink_rows ? n_sink_rows : T) - c0);  // sinks: a chunk of their own
        return kv.block_rows.empty() ? n : std::min(n, kv.block_size - (r0 + c0) % kv.block_size);
    };
    // scores = K q / sqrt(D) for every query head, a chunk of keys at a time: within a chunk the KV heads
    // in order, so the call reads each row's slice of KV heads kv0..kv1-1 in one run of memory
    for (std::int64_t c0 = 0, n = 0; c0 < T; c0 += n) {
        n = chunk_at(c0);
        for (std::int64_t g = kv0; g < kv1; ++g) {
            std::int64_t stride = 0;
            const float* k_c = rows(kv.k, kv.k_store, g, c0, n, stride);
            const float* qc = q_sink && c0 < n_sink_rows ? q_sink : q;
            for (std::int64_t h = first(g); h < last(g); ++h) dot_rows(k_c, stride, n, D, qc + h * D, s + (h - h0) * s_stride + c0);
        }
    }
    // softmax per head, max-subtracted
    for (std::int64_t j = 0; j < nh; ++j) {
        Eigen::Map<Eigen::ArrayXf> p(s + j * s_stride, T);
        p *= scale;
        p = (p - p.maxCoeff()).exp();
        p /= p.sum();
    }
    // out = V^T p, a chunk of values at a time
    std::fill(out + h0 * D, out + (h0 + nh) * D, 0.0f);
    for (std::int64_t c0 = 0, n = 0; c0 < T; c0 += n) {
        n = chunk_at(c0);
        for (std::int64_t g = kv0; g < kv1; ++g) {
            std::int64_t stride = 0;
            const float* v_c = rows(kv.v, kv.v_store, g, c0, n, stride);
            for (std::int64_t h = first(g); h < last(g); ++h) axpy_rows(v_c, stride, n, D, s + (h - h0) * s_stride + c0, out + h * D);
        }
    }
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
