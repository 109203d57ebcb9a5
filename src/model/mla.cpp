// Multi-head latent attention in the fast path (kvlab/model/mla.hpp): Eigen products over the call's
// rows, one task per (query, head) for attention, and the counted cost of each op from the shapes it ran.
#include "kvlab/model/mla.hpp"

#include <cmath>

#include <omp.h>

#include "kernels/threads.hpp"
#include "kvlab/kv/kv_cache.hpp"
#include "kvlab/model/ops.hpp"

namespace kvlab {

namespace {

constexpr std::uint64_t b = 4;  // bytes per fp32 value
std::uint64_t u(std::int64_t x) { return static_cast<std::uint64_t>(x); }

struct Dims {
    std::int64_t d, H, r, R, dn, dv;
};
Dims dims(const ModelConfig& cfg) {
    const MlaShape& m = *cfg.mla;
    return {cfg.d_model, cfg.n_head, m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim};
}

// RoPE on one R-wide part at position pos (pairs as the checkpoint stores them)
void rope_part(float* v, std::int64_t R, std::int64_t pos, float theta, RopePairing pairing) {
    for (std::int64_t i = 0; i < R / 2; ++i) {
        const float freq = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(R));
        const float c = std::cos(static_cast<float>(pos) * freq), s = std::sin(static_cast<float>(pos) * freq);
        float& a = pairing == RopePairing::halves ? v[i] : v[2 * i];
        float& bb = pairing == RopePairing::halves ? v[i + R / 2] : v[2 * i + 1];
        const float a0 = a, b0 = bb;
        a = a0 * c - b0 * s;
        bb = a0 * s + b0 * c;
    }
}

}  // namespace

MlaCost mla_attention_cost(const ModelConfig& cfg, MlaPath path, std::int64_t n, std::int64_t S, std::int64_t m,
                           KvView::Place place, std::uint64_t kv_row_bytes) {
    const Dims k = dims(cfg);
    const bool cache = place == KvView::Place::cache;
    const std::uint64_t row = cache && kv_row_bytes ? kv_row_bytes : b * u(k.r + k.R);  // one stored latent row
    MlaCost c;
    c.q_proj = cost_matmul(n, k.d, k.H * (k.dn + k.R), false);
    c.k_proj = cost_matmul(n, k.d, k.r + k.R, false);
    c.latent_norm = cost_rmsnorm(n, k.r);
    c.rope = cost_rope(n, k.H, 1, k.R);
    c.kv_store.bytes_act_read = b * u(n) * u(k.r + k.R);
    (cache ? c.kv_store.bytes_kv_written : c.kv_store.bytes_act_written) = u(n) * row;
    c.softmax = cost_softmax(k.H, S);
    const std::uint64_t up_w = b * u(k.r) * u(k.H) * u(k.dn + k.dv);  // kv_b_proj, read once per call
    c.up.bytes_weights_read = up_w;
    c.qk.bytes_act_written = b * u(k.H) * u(S);
    c.av.bytes_act_read = b * u(k.H) * u(S);  // probabilities
    if (path == MlaPath::naive) {
        // decompress the m attended latent rows (read once, here) into every head's k_C and v_C
        c.up.flops = 2 * u(m) * u(k.r) * u(k.H) * u(k.dn + k.dv);
        (cache ? c.up.bytes_kv_read : c.up.bytes_act_read) = u(m) * row;
        c.up.bytes_act_written = b * u(m) * u(k.H) * u(k.dn + k.dv);
        c.qk.flops = 2 * u(k.H) * u(k.dn + k.R) * u(S);
        c.qk.bytes_act_read = b * (u(n) * u(k.H) * u(k.dn + k.R) + u(m) * (u(k.H) * u(k.dn) + u(k.R)));  // q; k_C, k_R
        c.av.flops = 2 * u(k.H) * u(k.dv) * u(S);
        c.av.bytes_act_read += b * u(m) * u(k.H) * u(k.dv);  // v_C
        c.av.bytes_act_written = b * u(n) * u(k.H) * u(k.dv);
    } else {
        // fold W_UK into each query head (dn -> r) and W_UV into its latent output (r -> dv)
        c.up.flops = 2 * u(n) * u(k.H) * u(k.r) * u(k.dn + k.dv);
        c.up.bytes_act_read = b * u(n) * u(k.H) * (u(k.dn) + u(k.r));
        c.up.bytes_act_written = b * u(n) * u(k.H) * (u(k.r) + u(k.dv));
        c.qk.flops = 2 * u(k.H) * u(k.r + k.R) * u(S);
        c.qk.bytes_act_read = b * u(n) * u(k.H) * u(k.r + k.R);  // absorbed q_C and q_R
        (cache ? c.qk.bytes_kv_read : c.qk.bytes_act_read) += u(m) * row;  // the latent rows, read once
        c.av.flops = 2 * u(k.H) * u(k.r) * u(S);
        c.av.bytes_act_read += b * u(m) * u(k.r);  // the latents again, as qk read them
        c.av.bytes_act_written = b * u(n) * u(k.H) * u(k.r);
    }
    return c;
}

void add_mla_cost(StepCost& s, const MlaCost& c) {
    s.add(Op::attn_norm, c.latent_norm);
    s.add(Op::q_proj, c.q_proj);
    s.add(Op::k_proj, c.k_proj);
    s.add(Op::v_proj, c.up);
    s.add(Op::rope, c.rope);
    s.add(Op::kv_store, c.kv_store);
    s.add(Op::qk, c.qk);
    s.add(Op::softmax, c.softmax);
    s.add(Op::av, c.av);
}

std::uint64_t MlaBuffers::floats(const ModelConfig& cfg, std::int64_t N, std::int64_t T, bool uncached, MlaPath path, int threads) {
    const Dims k = dims(cfg);
    const std::uint64_t up = path == MlaPath::naive ? u(T) * u(k.H) * u(k.dn + k.dv) : 0;
    return u(N) * u(k.H) * u(k.dn + k.R) + u(N) * u(k.r + k.R) + u(T) * u(k.r + k.R) + up +
           (uncached ? u(T) * u(k.r + k.R) : 0) + u(threads) * u(T + 2 * k.r);
}

void MlaBuffers::allocate(const ModelConfig& cfg, std::int64_t N, std::int64_t T, bool uncached, MlaPath path, int threads) {
    const Dims k = dims(cfg);
    q.resize(N, k.H * (k.dn + k.R));
    latent.resize(N, k.r + k.R);
    rows.resize(T, k.r + k.R);
    if (path == MlaPath::naive) up.resize(T, k.H * (k.dn + k.dv));
    if (uncached) act.resize(T, k.r + k.R);
    scratch.resize(threads, T + 2 * k.r);
}

namespace {

// Query row i of a run, head h: out (dv) = attention over the run's gathered latent rows 0..pos.
void mla_head(const Dims& k, MlaPath path, const MlaBuffers& buf, const WeightMatrix& kv_b, std::int64_t i, std::int64_t pos,
              std::int64_t h, float* out, float* work) {
    using Vec = Eigen::Map<VectorF>;
    using CVec = Eigen::Map<const VectorF>;
    const std::int64_t m = pos + 1, uk = h * (k.dn + k.dv);
    const float scale = 1.0f / std::sqrt(static_cast<float>(k.dn + k.R));  // DeepSeek-V2 eq. 19: the q.k width
    const CVec q_c(buf.q.row(i).data() + h * (k.dn + k.R), k.dn), q_r(buf.q.row(i).data() + h * (k.dn + k.R) + k.dn, k.R);
    Vec scores(work, m);
    const auto lat = buf.rows.topRows(m);
    scores.noalias() = lat.rightCols(k.R) * q_r;  // the decoupled RoPE part
    if (path == MlaPath::naive) {
        scores.noalias() += buf.up.block(0, uk, m, k.dn) * q_c;  // k_C of every row, decompressed
    } else {
        Vec q_lat(work + m, k.r);  // W_UK_h^T q_C
        q_lat.noalias() = kv_b.map().block(uk, 0, k.dn, k.r).transpose() * q_c;
        scores.noalias() += lat.leftCols(k.r) * q_lat;
    }
    scores *= scale;
    scores = (scores.array() - scores.maxCoeff()).exp().matrix();
    scores /= scores.sum();
    Vec o(out, k.dv);
    if (path == MlaPath::naive) {
        o.noalias() = buf.up.block(0, uk + k.dn, m, k.dv).transpose() * scores;
    } else {
        Vec o_lat(work + m + k.r, k.r);
        o_lat.noalias() = lat.leftCols(k.r).transpose() * scores;
        o.noalias() = kv_b.map().block(uk + k.dn, 0, k.dv, k.r) * o_lat;
    }
}

// The run's new latent rows into its KV rows (encoded if narrow), then all its rows 0..last gathered.
void store_and_gather(const TokenRun& run, MlaBuffers& buf) {
    const KvView& kv = run.kv;
    if (kv.k_store && !kv.k_store->calibrated()) kv.k_store->calibrate(buf.latent.middleRows(run.row0, run.n), run.n);
    for (std::int64_t i = 0; i < run.n; ++i) {
        const std::int64_t row = kv.row_of(run.pos0 + i);
        if (kv.k_store) kv.k_store->write(row, buf.latent.row(run.row0 + i).data());
        else kv.k->row(row) = buf.latent.row(run.row0 + i);
    }
    for (std::int64_t t = 0; t < run.pos0 + run.n; ++t) {
        if (kv.k_store) kv.k_store->read(kv.row_of(t), buf.rows.row(t).data());
        else buf.rows.row(t) = kv.k->row(kv.row_of(t));
    }
}

}  // namespace

void mla_attention(MatrixRM& out, const MatrixRM& x, std::int64_t n, std::span<const TokenRun> runs, const LayerWeights& lw,
                   const ModelConfig& cfg, RopePairing pairing, MlaPath path, MlaBuffers& buf, OpRecorder& rec) {
    const Dims k = dims(cfg);
    const float eps = static_cast<float>(cfg.norm_eps), theta = static_cast<float>(cfg.rope_theta);
    buf.q.topRows(n).noalias() = x.topRows(n) * lw.wq.map().transpose();
    buf.latent.topRows(n).noalias() = x.topRows(n) * lw.wk.map().transpose();
    for (std::int64_t i = 0; i < n; ++i) {  // RMSNorm of c_KV (the first r values of the latent row)
        auto c = buf.latent.row(i).head(k.r);
        const float inv = 1.0f / std::sqrt(c.squaredNorm() / static_cast<float>(k.r) + eps);
        c = (c * inv).cwiseProduct(lw.kv_norm.transpose());
    }
    for (const TokenRun& run : runs)  // RoPE on q_R of every head and on k_R, never on c_KV
        for (std::int64_t i = run.row0; i < run.row0 + run.n; ++i) {
            const std::int64_t pos = run.pos0 + i - run.row0;
            for (std::int64_t h = 0; h < k.H; ++h) rope_part(buf.q.row(i).data() + h * (k.dn + k.R) + k.dn, k.R, pos, theta, pairing);
            rope_part(buf.latent.row(i).data() + k.r, k.R, pos, theta, pairing);
        }
    // the projections ran once over all n rows: their costs once, for all the runs
    const MlaCost all = mla_attention_cost(cfg, path, n, 0, 0, runs[0].kv.place, runs[0].kv.row_bytes);
    rec.record({{Op::q_proj, all.q_proj}, {Op::k_proj, all.k_proj}, {Op::attn_norm, all.latent_norm}, {Op::rope, all.rope}});
    for (const TokenRun& run : runs) {
        store_and_gather(run, buf);
        const std::int64_t m = run.pos0 + run.n;
        if (path == MlaPath::naive)  // decompress every attended latent: [k_C; v_C] of each head
            buf.up.topRows(m).noalias() = buf.rows.topRows(m).leftCols(k.r) * lw.wv.map().transpose();
        for_each_task(run.n * k.H, [&](std::int64_t task) {
            const std::int64_t i = run.row0 + task / k.H, h = task % k.H;
            mla_head(k, path, buf, lw.wv, i, run.pos0 + i - run.row0, h, out.row(i).data() + h * k.dv,
                     buf.scratch.row(omp_get_thread_num()).data());
        });
        const std::int64_t S = sum_keys_attended(run.pos0, run.n, 0);
        const MlaCost c = mla_attention_cost(cfg, path, run.n, S, m, run.kv.place, run.kv.row_bytes);
        rec.record({{Op::kv_store, c.kv_store}, {Op::v_proj, c.up}, {Op::qk, c.qk}, {Op::softmax, c.softmax}, {Op::av, c.av}});
    }
}

}  // namespace kvlab
