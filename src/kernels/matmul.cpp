#include "kernels/matmul.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

#include <Eigen/Core>
#include <fmt/format.h>

#include "kvlab/core/error.hpp"

namespace kvlab {

namespace {

namespace ei = Eigen::internal;
using Packet = ei::packet_traits<float>::type;  // the widest SIMD register of the build
constexpr std::int64_t kPacket = ei::packet_traits<float>::size;
constexpr int kRegisters = EIGEN_ARCH_DEFAULT_NUMBER_OF_REGISTERS;
constexpr int kTileVectors = 4;  // registers of tokens per tile (gemm_rows dispatches on 1..4)
constexpr std::int64_t kTileTokens = kTileVectors * kPacket;
constexpr std::int64_t kGroupTokens = 4 * kTileTokens;  // tokens packed at once: several tiles share one weight pass
constexpr std::int64_t kPanelBytes = 256 * 1024;       // weight rows kept in L2 while a group's tiles pass over them

// The kernels are templates on their register blocking (rows, token registers) so that the
// accumulators are fixed-size arrays the compiler keeps in registers.

// out[s][t * ldo] = row[s] . x_t for S rows read side by side and N tokens (x_t at x + t * ldx): S x N
// independent accumulators, so S streams of weights are in flight, the FMA chains do not wait on each
// other, and each weight packet is loaded once for all N tokens. A (row, token) sum runs in the same
// order whatever N and S are, so a token's outputs in a small batch are bitwise those of a one-token call
// (rows off a SIMD boundary take gemv_rows_shifted for one token, below, and differ by rounding).
// One token reads gemv_streams() rows side by side; 2..4 tokens as many as the registers hold, up to 8.
constexpr int streams_for(int N) { return std::clamp((kRegisters - N - 1) / N, 1, 8); }
// Tokens gemm_rows runs this way. Up to 4, each token's weights come once from memory for all of them;
// at 5..8 on AVX-512 (2 rows in flight) the packed tiles measured as fast or faster (docs/serving.md)
constexpr std::int64_t kGemvMaxTokens = 4;

template <int S, int N>
void dot_rows_n(const float* const (&row)[S], std::int64_t cols, const float* x, std::int64_t ldx, float* const (&out)[S], std::int64_t ldo) {
    Packet acc[S][N];
    for (int s = 0; s < S; ++s)
        for (int t = 0; t < N; ++t) acc[s][t] = ei::pset1<Packet>(0.0f);
    std::int64_t j = 0;
    if constexpr (N == 1) {
        // one token: 4 packets of each row per visit (the same multiply-adds in the same order as the loop
        // below, so the sums do not change), no software prefetch: with the accumulators in registers
        // (below) it made decodes slower (docs/performance-log.md)
        for (; j + 4 * kPacket <= cols; j += 4 * kPacket) {
            Packet xj[4];
            for (int u = 0; u < 4; ++u) xj[u] = ei::ploadu<Packet>(x + j + u * kPacket);
            for (int s = 0; s < S; ++s)
                for (int u = 0; u < 4; ++u) acc[s][0] = ei::pmadd(ei::ploadu<Packet>(row[s] + j + u * kPacket), xj[u], acc[s][0]);
        }
    }
    for (; j + kPacket <= cols; j += kPacket) {
        Packet xj[N];
        for (int t = 0; t < N; ++t) xj[t] = ei::ploadu<Packet>(x + t * ldx + j);
        for (int s = 0; s < S; ++s) {
            const Packet w = ei::ploadu<Packet>(row[s] + j);
            for (int t = 0; t < N; ++t) acc[s][t] = ei::pmadd(w, xj[t], acc[s][t]);
        }
    }
    // Unrolled (as the compiler unrolls the loops above) so that no accumulator is indexed at run time:
    // otherwise GCC 12 keeps the array in memory and, for one token on 4 streams, stored and reloaded
    // three of the four accumulators at every visit, a store-to-load round trip in each FMA chain that
    // slowed the GEMV's read; the sums are the same (docs/performance-log.md).
#pragma GCC unroll 8
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 4
        for (int t = 0; t < N; ++t) {
            float sum = ei::predux(acc[s][t]);
            for (std::int64_t k = j; k < cols; ++k) sum += row[s][k] * x[t * ldx + k];
            out[s][t * ldo] = sum;
        }
}

// gemv_rows for N tokens: rows in S sequential sub-blocks read side by side, then the rest one by one.
template <int N, int S = streams_for(N)>
void gemv_rows_n(const float* w, std::int64_t ldw, std::int64_t rows, std::int64_t cols, const float* x, std::int64_t ldx, float* y,
                 std::int64_t ldo) {
    const std::int64_t per = rows / S;
    for (std::int64_t i = 0; i < per; ++i) {
        const float* row[S];
        float* out[S];
        for (int s = 0; s < S; ++s) {
            row[s] = w + (s * per + i) * ldw;
            out[s] = y + s * per + i;
        }
        dot_rows_n<S, N>(row, cols, x, ldx, out, ldo);
    }
    for (std::int64_t i = S * per; i < rows; ++i) {
        const float* row[1] = {w + i * ldw};
        float* out[1] = {y + i};
        dot_rows_n<1, N>(row, cols, x, ldx, out, ldo);
    }
}

// One token over rows that start m floats past a SIMD boundary, 0 < m < kPacket, the same m for every row
// (the row stride and the row a whole number of packets): a llama2.c checkpoint read in place, whose
// 28-byte header puts every row 7 floats past a 64-byte line. A load of such a row at its own start
// spans two lines, which slows the decode's GEMV (docs/performance.md). Instead each row
// is read in aligned packets from m floats before its start to m floats before its end, against
// x_rot = x shifted m lanes on (zeros around it): the first packet keeps lanes m.. (`head`), the last
// lanes ..m-1 (`tail`), so the other row's bytes in them, whatever their bits, count as +0. The lanes
// hold the columns in another order than the aligned kernel's, so the sums differ from it by rounding.
template <int S>
void dot_rows_shifted(const float* const (&row)[S], std::int64_t cols, std::int64_t m, const float* x_rot, const Packet& head,
                      const Packet& tail, float* const (&out)[S]) {
    const float* base[S];
    Packet acc[S];
    Packet xj = ei::pload<Packet>(x_rot);
    for (int s = 0; s < S; ++s) {
        base[s] = row[s] - m;
        acc[s] = ei::pmul(ei::pand(ei::pload<Packet>(base[s]), head), xj);
    }
    std::int64_t j = kPacket;
    for (; j + 4 * kPacket <= cols; j += 4 * kPacket) {
        Packet xs[4];
        for (int u = 0; u < 4; ++u) xs[u] = ei::pload<Packet>(x_rot + j + u * kPacket);
        for (int s = 0; s < S; ++s)
            for (int u = 0; u < 4; ++u) acc[s] = ei::pmadd(ei::pload<Packet>(base[s] + j + u * kPacket), xs[u], acc[s]);
    }
    for (; j < cols; j += kPacket) {
        xj = ei::pload<Packet>(x_rot + j);
        for (int s = 0; s < S; ++s) acc[s] = ei::pmadd(ei::pload<Packet>(base[s] + j), xj, acc[s]);
    }
    xj = ei::pload<Packet>(x_rot + cols);  // j == cols: each row's last m floats, in lanes 0..m-1
#pragma GCC unroll 8
    for (int s = 0; s < S; ++s) out[s][0] = ei::predux(ei::pmadd(ei::pand(ei::pload<Packet>(base[s] + cols), tail), xj, acc[s]));
}

// gemv_rows_n<1, S> for rows m floats past a boundary (dot_rows_shifted): x_rot built once per call,
// in this thread's buffer (grown once, then reused). The row loop is gemv_rows_n's, written out again:
// shared through a generic lambda, it made the aligned decode slower (docs/performance-log.md).
template <int S>
void gemv_rows_shifted(const float* w, std::int64_t ldw, std::int64_t rows, std::int64_t cols, const float* x, float* y, std::int64_t m) {
    thread_local std::vector<float, Eigen::aligned_allocator<float>> x_rot;
    x_rot.resize(static_cast<std::size_t>(std::max<std::int64_t>(static_cast<std::int64_t>(x_rot.size()), cols + kPacket)));
    std::fill(x_rot.begin(), x_rot.begin() + m, 0.0f);
    std::copy(x, x + cols, x_rot.begin() + m);
    std::fill(x_rot.begin() + m + cols, x_rot.begin() + cols + kPacket, 0.0f);
    alignas(64) std::uint32_t bits[2][kPacket];
    for (std::int64_t l = 0; l < kPacket; ++l) {
        bits[0][l] = l >= m ? ~0u : 0u;
        bits[1][l] = l < m ? ~0u : 0u;
    }
    const Packet head = ei::pload<Packet>(reinterpret_cast<const float*>(bits[0]));
    const Packet tail = ei::pload<Packet>(reinterpret_cast<const float*>(bits[1]));
    const std::int64_t per = rows / S;
    for (std::int64_t i = 0; i < per; ++i) {
        const float* row[S];
        float* out[S];
        for (int s = 0; s < S; ++s) {
            row[s] = w + (s * per + i) * ldw;
            out[s] = y + s * per + i;
        }
        dot_rows_shifted<S>(row, cols, m, x_rot.data(), head, tail, out);
    }
    for (std::int64_t i = S * per; i < rows; ++i) {
        const float* row[1] = {w + i * ldw};
        float* out[1] = {y + i};
        dot_rows_shifted<1>(row, cols, m, x_rot.data(), head, tail, out);
    }
}

// Rows per gemm micro-kernel with C registers of tokens: R*C accumulators + C token registers + one
// broadcast weight must fit the register file (AVX-512, 32 registers: C = 4 -> 6 rows; AVX: C = 4 -> 2).
constexpr int rows_for(int C) { return std::clamp((kRegisters - C - 1) / C, 1, 8); }

// tile (R, kTileTokens) = W rows (R, cols) @ xt (cols, C*kPacket), the first C*kPacket tokens: for
// each input feature j, R weights w[r][j] are broadcast against the C token registers xt[j].
// Meanwhile the next R rows (`next`, nullable) are prefetched, a line of each per 16 features, so
// they arrive while this block computes.
template <int R, int C>
void gemm_tile(const float* w, std::int64_t ldw, std::int64_t cols, const float* xt, float* tile, const float* next) {
    Packet acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = ei::pset1<Packet>(0.0f);
    for (std::int64_t j = 0; j < cols; ++j) {
        if (next && j % 16 == 0)
            for (int r = 0; r < R; ++r) ei::prefetch(next + r * ldw + j);
        Packet xj[C];
        for (int c = 0; c < C; ++c) xj[c] = ei::ploadu<Packet>(xt + (j * C + c) * kPacket);
        for (int r = 0; r < R; ++r) {
            const Packet wr = ei::pset1<Packet>(w[r * ldw + j]);
            for (int c = 0; c < C; ++c) acc[r][c] = ei::pmadd(wr, xj[c], acc[r][c]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) ei::pstore(tile + r * kTileTokens + c * kPacket, acc[r][c]);
}

// out (n_tok, rows) for one tile of n_tok <= kTileTokens packed tokens: R rows at a time, then one by one.
template <int C>
void gemm_tokens(const float* w, std::int64_t ldw, std::int64_t rows, std::int64_t cols, const float* xt,
                 std::int64_t n_tok, float* out, std::int64_t ldo) {
    constexpr int R = rows_for(C);
    alignas(64) float tile[R * kTileTokens];  // (R, tile tokens) one block of out^T
    auto scatter = [&](std::int64_t i0, int n_rows) {  // tile^T into out rows
        for (std::int64_t t = 0; t < n_tok; ++t)
            for (int r = 0; r < n_rows; ++r) out[t * ldo + i0 + r] = tile[r * kTileTokens + t];
    };
    std::int64_t i = 0;
    for (; i + R <= rows; i += R) {
        gemm_tile<R, C>(w + i * ldw, ldw, cols, xt, tile, i + 2 * R <= rows ? w + (i + R) * ldw : nullptr);
        scatter(i, R);
    }
    for (; i < rows; ++i) {
        gemm_tile<1, C>(w + i * ldw, ldw, cols, xt, tile, nullptr);
        scatter(i, 1);
    }
}

// xt (cols, n_vec registers) = x rows 0..n_tok-1 transposed, zero past n_tok up to a whole register.
void pack_tile(const float* x, std::int64_t ldx, std::int64_t n_tok, std::int64_t cols, float* xt) {
    const std::int64_t width = (n_tok + kPacket - 1) / kPacket * kPacket;
    for (std::int64_t j = 0; j < cols; ++j) {
        float* xt_j = xt + j * width;
        for (std::int64_t t = 0; t < n_tok; ++t) xt_j[t] = x[t * ldx + j];
        std::fill(xt_j + n_tok, xt_j + width, 0.0f);
    }
}

}  // namespace

int gemv_streams() {
#if defined(__x86_64__) || defined(__i386__)
    static const int streams = [] {
        __builtin_cpu_init();
        return __builtin_cpu_is("amd") ? 4 : 8;
    }();
    return streams;
#else
    return 8;
#endif
}

void gemv_rows(const float* w, std::int64_t ldw, std::int64_t rows, std::int64_t cols, const float* x, float* y, int streams) {
    static_assert(kRegisters >= 10, "8 streams of one token hold 8 accumulators, x and a weight in registers");
    const auto m = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(w) % (kPacket * sizeof(float)) / sizeof(float));
    if (m != 0 && reinterpret_cast<std::uintptr_t>(w) % sizeof(float) == 0 && ldw % kPacket == 0 && cols % kPacket == 0 && cols > 0)
        switch (streams) {
            case 4: gemv_rows_shifted<4>(w, ldw, rows, cols, x, y, m); return;
            case 8: gemv_rows_shifted<8>(w, ldw, rows, cols, x, y, m); return;
            default: break;  // refused below
        }
    switch (streams) {
        case 4: gemv_rows_n<1, 4>(w, ldw, rows, cols, x, 0, y, 0); return;
        case 8: gemv_rows_n<1, 8>(w, ldw, rows, cols, x, 0, y, 0); return;
        default: throw Error(fmt::format("gemv_rows: {} streams; expected 4 or 8", streams));
    }
}

std::int64_t gemm_tile_tokens() { return kTileTokens; }

std::int64_t gemm_scratch_floats(std::int64_t cols, std::int64_t n_max) {
    std::int64_t out = 0;
    if (__builtin_mul_overflow(cols, std::min(kGroupTokens, (n_max + kPacket - 1) / kPacket * kPacket), &out))
        throw OverflowError(fmt::format("GEMM scratch for {} input features overflows 64 bits; expected a real model's shape", cols));
    return out;
}

void gemm_rows(const float* w, std::int64_t ldw, std::int64_t rows, std::int64_t cols, const float* x, std::int64_t ldx,
               std::int64_t n, float* out, std::int64_t ldo, float* scratch) {
    static_assert(kTileVectors == 4, "gemm_rows dispatches on 1..4 token registers");
    // a few tokens: GEMV-style streams, each weight loaded once for all of them (no packing, no padding
    // to a whole register of tokens)
    if (n <= kGemvMaxTokens) switch (n) {
            case 1: gemv_rows(w, ldw, rows, cols, x, out); return;
            case 2: gemv_rows_n<2>(w, ldw, rows, cols, x, ldx, out, ldo); return;
            case 3: gemv_rows_n<3>(w, ldw, rows, cols, x, ldx, out, ldo); return;
            case 4: gemv_rows_n<4>(w, ldw, rows, cols, x, ldx, out, ldo); return;
            default: break;
        }
    const std::int64_t row_bytes = std::max<std::int64_t>(1, cols) * static_cast<std::int64_t>(sizeof(float));
    for (std::int64_t g0 = 0; g0 < n; g0 += kGroupTokens) {
        // pack every tile of this group of tokens once: tile k at scratch + k * cols * kTileTokens
        const std::int64_t n_group = std::min(kGroupTokens, n - g0);
        for (std::int64_t t0 = 0; t0 < n_group; t0 += kTileTokens)
            pack_tile(x + (g0 + t0) * ldx, ldx, std::min(kTileTokens, n_group - t0), cols, scratch + t0 * cols);
        // one tile: every row once; several: panels of rows small enough to stay in L2 while every
        // tile passes over them, so the weights come from memory once per group
        const std::int64_t panel = n_group <= kTileTokens ? rows : std::max<std::int64_t>(16, kPanelBytes / row_bytes);
        for (std::int64_t i0 = 0; i0 < rows; i0 += panel) {
            const std::int64_t n_rows = std::min(panel, rows - i0);
            const float* w_i0 = w + i0 * ldw;
            for (std::int64_t t0 = 0; t0 < n_group; t0 += kTileTokens) {
                const std::int64_t n_tok = std::min(kTileTokens, n_group - t0);
                const float* xt = scratch + t0 * cols;
                float* out_t0 = out + (g0 + t0) * ldo + i0;
                switch ((n_tok + kPacket - 1) / kPacket) {  // only the registers that hold tokens
                    case 1: gemm_tokens<1>(w_i0, ldw, n_rows, cols, xt, n_tok, out_t0, ldo); break;
                    case 2: gemm_tokens<2>(w_i0, ldw, n_rows, cols, xt, n_tok, out_t0, ldo); break;
                    case 3: gemm_tokens<3>(w_i0, ldw, n_rows, cols, xt, n_tok, out_t0, ldo); break;
                    default: gemm_tokens<4>(w_i0, ldw, n_rows, cols, xt, n_tok, out_t0, ldo); break;
                }
            }
        }
    }
}

}  // namespace kvlab
