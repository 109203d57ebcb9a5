#include "kernels/narrow_weights.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "kvlab/core/checked.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/kv/kv_format.hpp"
#include "kernels/matmul.hpp"
#include "kernels/simd.hpp"

namespace kvlab {

void check_weight_dtype(DType dtype) {
    if (dtype != DType::fp32 && dtype != DType::bf16 && dtype != DType::fp16 && dtype != DType::q8_0)
        throw UsageError(fmt::format("--weight-dtype {}: expected fp32, bf16, fp16 or q8_0", dtype_name(dtype)));
}

void check_weight_shapes(const ModelConfig& cfg, DType dtype) {
    if (dtype != DType::q8_0) return;
    for (const auto& [name, width] : {std::pair<const char*, std::int64_t>{"hidden_size", cfg.d_model}, {"heads x head_dim", cfg.d_q()},
                                      {"intermediate_size", cfg.d_ff}})
        if (width % kv_block_values != 0)
            throw UsageError(fmt::format("--weight-dtype q8_0: {}'s {} is {}, not a multiple of 32 (q8_0 blocks hold 32 weights of a row)",
                                         cfg.name, name, width));
}

std::uint64_t NarrowMatrix::bytes(DType dtype, std::int64_t rows, std::int64_t cols) {
    return checked_mul(static_cast<std::uint64_t>(rows), row_bytes(dtype, static_cast<std::uint64_t>(cols)), "narrow weight bytes");
}

NarrowMatrix::NarrowMatrix(const WeightMatrix& w, DType dtype, const char* name, HugeArena& arena)
    : dtype_(dtype), rows_(w.rows()), cols_(w.cols()), row_bytes_(row_bytes(dtype, static_cast<std::uint64_t>(w.cols()))) {
    if (dtype != DType::bf16 && dtype != DType::fp16 && dtype != DType::q8_0)
        throw UsageError(fmt::format("--weight-dtype {}: a narrow copy is bf16, fp16 or q8_0", dtype_name(dtype)));
    if (dtype == DType::q8_0 && cols_ % kv_block_values != 0)
        throw UsageError(fmt::format("--weight-dtype q8_0: {} has rows of {} weights, which do not split into blocks of 32", name, cols_));
    n_bytes_ = bytes(dtype, rows_, cols_);
    data_ = static_cast<std::uint8_t*>(arena.take(static_cast<std::size_t>(n_bytes_)));  // every byte is written below
    // rows are independent: every thread rounds its share (a load-time cost that grows with the model)
#pragma omp parallel for schedule(static)
    for (std::int64_t r = 0; r < rows_; ++r) {
        std::uint8_t* out = data_ + static_cast<std::size_t>(r) * row_bytes_;
        const float* x = w.row(r).data();
        if (dtype == DType::q8_0) {
            for (std::int64_t b = 0; b < cols_ / kv_block_values; ++b) {
                const BlockQ8_0 q = quantize_q8_0(std::span<const float, 32>(x + b * kv_block_values, 32));
                std::memcpy(out + b * static_cast<std::int64_t>(sizeof q), &q, sizeof q);
            }
            continue;
        }
        for (std::int64_t c = 0; c < cols_; ++c) {
            const std::uint16_t code = dtype == DType::bf16 ? bf16_encode(x[c]) : fp16_encode(x[c]);
            std::memcpy(out + 2 * c, &code, 2);
        }
    }
}

void NarrowMatrix::decode(std::int64_t r, std::int64_t c0, std::int64_t n, float* out) const {
    const std::uint8_t* row = data_ + static_cast<std::size_t>(r) * row_bytes_;
    switch (dtype_) {
    case DType::bf16: bf16_decode_n(reinterpret_cast<const std::uint16_t*>(row) + c0, out, n); return;
    case DType::fp16: fp16_decode_n(reinterpret_cast<const std::uint16_t*>(row) + c0, out, n); return;
    case DType::q8_0:
        for (std::int64_t b = c0 / kv_block_values; b < (c0 + n) / kv_block_values; ++b)
            q8_0_decode_block(row + b * static_cast<std::int64_t>(sizeof(BlockQ8_0)), out + (b * kv_block_values - c0));
        return;
    default: throw std::logic_error("NarrowMatrix: unchecked dtype");
    }
}

namespace {

constexpr std::int64_t kPanelFloats = 64 * 1024;  // a gemm panel of rows: 256 KiB, in L2

#if !(defined(__AVX2__) && defined(__F16C__) && defined(__FMA__))
constexpr std::int64_t kGemvRows = 8;      // rows widened per pass
constexpr std::int64_t kGemvCols = 512;    // columns per pass: 8 x 512 floats = 16 KiB, in L1

// y[0..nr) = w rows r0.. . x, widening `kGemvCols` columns of the rows at a time into an L1 buffer and
// running the fp32 kernel on it: the portable path, where the fused one (AVX2, F16C, FMA) is not built.
void gemv_buffered(const NarrowMatrix& w, std::int64_t r0, std::int64_t nr, const float* x, float* y) {
    alignas(64) float buf[kGemvRows * kGemvCols];
    float part[kGemvRows];
    const std::int64_t cols = w.cols();
    for (std::int64_t i = 0; i < nr; i += kGemvRows) {
        const std::int64_t n = std::min(kGemvRows, nr - i);
        std::fill(y + i, y + i + n, 0.0f);
        for (std::int64_t c0 = 0; c0 < cols; c0 += kGemvCols) {
            const std::int64_t nc = std::min(kGemvCols, cols - c0);
            for (std::int64_t r = 0; r < n; ++r) w.decode(r0 + i + r, c0, nc, buf + r * nc);
            gemv_rows(buf, nc, n, nc, x + c0, part);
            for (std::int64_t r = 0; r < n; ++r) y[i + r] += part[r];
        }
    }
}
#endif

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
constexpr std::int64_t kPrefetchBytes = 512;  // how far ahead in each row the fused GEMV asks for lines (q8_0, the 256-bit pass)
// The same for the AVX-512 passes: without it each row's chain of multiply-adds waits for lines the hardware
// prefetchers have not yet brought; 16 lines ahead was the best distance measured (docs/performance-log.md).
// Past a stream's last row it asks for lines it will not read, which costs bandwidth but cannot fault.
constexpr std::int64_t kWidePrefetchBytes = 1024;

#if defined(__AVX512F__)
// A row's 16-lane accumulator folded onto the 8 lanes of its 256-bit one (lane i + lane i+8), which sum8 adds up.
__m256 fold_halves(__m512 v) {
    return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}
#endif

// gemv_fused's q8_0 pass: whole blocks of 32 from column 0 into acc; returns the columns done.
template <int R>
[[gnu::always_inline]] inline std::int64_t gemv_q8_0_blocks(const std::uint8_t* const (&row)[R], const float* x, std::int64_t cols,
                                                            __m256 (&acc)[8]) {
    std::int64_t j = 0;
#if defined(__AVX512F__)
    // AVX-512: a block per pass, its 32 codes as two 16-lane halves, each widened int8 -> int32 -> fp32
    // (exact) and multiplied by x; the halves' sum times d into the row's 16-lane accumulator: half the
    // instructions per block of the 256-bit pass below (docs/performance-log.md has the measurements).
    __m512 acc16[8];
    for (auto& a : acc16) a = _mm512_setzero_ps();
    for (; j + kv_block_values <= cols; j += kv_block_values) {
        const std::int64_t off = j / kv_block_values * static_cast<std::int64_t>(sizeof(BlockQ8_0));
        const __m512 x0 = _mm512_loadu_ps(x + j), x1 = _mm512_loadu_ps(x + j + 16);
        for (int r = 0; r < R; ++r) {
            const std::uint8_t* blk = row[r] + off;
            _mm_prefetch(reinterpret_cast<const char*>(blk + kWidePrefetchBytes), _MM_HINT_T0);
            std::uint16_t dc;
            std::memcpy(&dc, blk, 2);
            const __m512 q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2))));
            const __m512 q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18))));
            const __m512 dot = _mm512_fmadd_ps(q1, x1, _mm512_mul_ps(q0, x0));
            acc16[r] = _mm512_fmadd_ps(dot, _mm512_set1_ps(_cvtsh_ss(dc)), acc16[r]);
        }
    }
    for (int r = 0; r < R; ++r) acc[r] = fold_halves(acc16[r]);
#else
    for (; j + kv_block_values <= cols; j += kv_block_values) {
        const std::int64_t off = j / kv_block_values * static_cast<std::int64_t>(sizeof(BlockQ8_0));
        for (int r = 0; r < R; ++r) {
            const std::uint8_t* blk = row[r] + off;
            _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes), _MM_HINT_T0);
            std::uint16_t dc;
            std::memcpy(&dc, blk, 2);
            __m256 dot = _mm256_setzero_ps();
            for (int k = 0; k < 32; k += 8) {
                const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + k))));
                dot = _mm256_fmadd_ps(q, _mm256_loadu_ps(x + j + k), dot);
            }
            acc[r] = _mm256_fmadd_ps(dot, _mm256_set1_ps(_cvtsh_ss(dc)), acc[r]);
        }
    }
#endif
    return j;
}

// gemv_fused's bf16 and fp16 pass: 16 columns (32 with AVX-512) of each row at a time into acc; returns
// the columns done (the rest are added one by one).
template <int R>
[[gnu::always_inline]] inline std::int64_t gemv_half_lines(const std::uint8_t* const (&row)[R], const float* x, std::int64_t cols,
                                                           bool bf16, __m256 (&acc)[8]) {
    std::int64_t j = 0;
#if defined(__AVX512F__)
    // AVX-512: a 64-byte line of each row per pass, 32 values. bf16 needs no shuffle: the even values are
    // each 32-bit lane's low half shifted up, the odd ones its high half with the low half masked off,
    // multiplied by x's even and odd values (two permutes per pass, shared by the 8 rows); fp16: F16C on
    // each 32-byte half. Each row's line kWidePrefetchBytes ahead is asked for at every pass.
    __m512 acc16[8];
    for (auto& a : acc16) a = _mm512_setzero_ps();
    const __m512i even_idx = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd_idx = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    for (; j + 32 <= cols; j += 32) {
        const __m512 xa = _mm512_loadu_ps(x + j), xb = _mm512_loadu_ps(x + j + 16);
        const __m512 x0 = bf16 ? _mm512_permutex2var_ps(xa, even_idx, xb) : xa;
        const __m512 x1 = bf16 ? _mm512_permutex2var_ps(xa, odd_idx, xb) : xb;
        for (int r = 0; r < R; ++r) {
            // (the maskz forms: GCC 12's plain ones start from an undefined register and warn)
            const std::uint8_t* at = row[r] + 2 * j;
            _mm_prefetch(reinterpret_cast<const char*>(at + kWidePrefetchBytes), _MM_HINT_T0);
            const __m512i h = _mm512_loadu_si512(at);
            const __m512 w0 = bf16 ? _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, h, 16))
                                   : _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)));
            const __m512 w1 = bf16 ? _mm512_castsi512_ps(_mm512_and_si512(h, high_half))
                                   : _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + 32)));
            acc16[r] = _mm512_fmadd_ps(w0, x0, acc16[r]);
            acc16[r] = _mm512_fmadd_ps(w1, x1, acc16[r]);
        }
    }
    for (int r = 0; r < R; ++r) acc[r] = fold_halves(acc16[r]);
#endif
    auto widen = [bf16](__m128i h) { return bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)) : _mm256_cvtph_ps(h); };
    for (; j + 16 <= cols; j += 16) {  // 32 bytes of each row per pass, the next lines prefetched
        const __m256 x0 = _mm256_loadu_ps(x + j), x1 = _mm256_loadu_ps(x + j + 8);
        for (int r = 0; r < R; ++r) {
            _mm_prefetch(reinterpret_cast<const char*>(row[r] + 2 * j + kPrefetchBytes), _MM_HINT_T0);
            const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row[r] + 2 * j));
            acc[r] = _mm256_fmadd_ps(widen(_mm256_castsi256_si128(h)), x0, acc[r]);
            acc[r] = _mm256_fmadd_ps(widen(_mm256_extracti128_si256(h, 1)), x1, acc[r]);
        }
    }
    return j;
}

// R rows side by side (R streams in flight: narrow_gemv_streams, or one for the rows left over), each
// 8 weights (16 with AVX-512) widened in a register and multiplied into the row's accumulator; one tree
// sums the accumulators at the end (sum8, the rows past R zero: a row's sum is the same whatever R).
// bf16: a 16-bit shift into the top of an fp32; fp16: F16C; q8_0: per block of 32, the codes' dot
// product with x, times the block's scale d. Writes y[0..7]. The AVX-512 passes add in another order
// than the 256-bit ones, so the last bits of y depend on which one the build has.
template <int R>
void gemv_fused(const NarrowMatrix& w, const std::uint8_t* const (&row)[R], const float* x, float* y) {
    static_assert(R == 1 || R == 4 || R == 8, "1, 4 or 8 rows side by side");
    const std::int64_t cols = w.cols();
    __m256 acc[8];
    for (auto& a : acc) a = _mm256_setzero_ps();
    std::int64_t j = 0;
    if (w.dtype() == DType::q8_0) j = gemv_q8_0_blocks<R>(row, x, cols, acc);
    else j = gemv_half_lines<R>(row, x, cols, w.dtype() == DType::bf16, acc);
    _mm256_storeu_ps(y, sum8(acc));
    for (; j < cols; ++j)  // columns past the last 16 (bf16, fp16): one by one
        for (int r = 0; r < R; ++r) {
            std::uint16_t c;
            std::memcpy(&c, row[r] + 2 * j, 2);
            y[r] += (w.dtype() == DType::bf16 ? bf16_decode(c) : fp16_decode(c)) * x[j];
        }
}

// As gemv_rows: rows = S * per + rest, stream s walks rows s*per .. (s+1)*per-1, so each of the S
// streams is one long sequential run of memory the prefetchers follow; then the rest one by one. Every
// row is summed by the same arithmetic, so y does not depend on S or on where the rows start.
template <int S>
void gemv_streams_fused(const NarrowMatrix& w, std::int64_t r0, std::int64_t rows, const float* x, float* y) {
    const std::int64_t per = rows / S;
    float out[8];
    for (std::int64_t i = 0; i < per; ++i) {
        const std::uint8_t* row[S];
        for (int s = 0; s < S; ++s) row[s] = w.row_data(r0 + s * per + i);
        gemv_fused<S>(w, row, x, out);
        for (int s = 0; s < S; ++s) y[s * per + i] = out[s];
    }
    for (std::int64_t i = S * per; i < rows; ++i) {
        const std::uint8_t* row[1] = {w.row_data(r0 + i)};
        gemv_fused<1>(w, row, x, out);
        y[i] = out[0];
    }
}
#endif

}  // namespace

int narrow_gemv_streams(DType dtype) { return dtype == DType::q8_0 ? 8 : gemv_streams(); }

void gemv_narrow(const NarrowMatrix& w, std::int64_t r0, std::int64_t rows, const float* x, float* y) {
    gemv_narrow(w, r0, rows, x, y, narrow_gemv_streams(w.dtype()));
}

void gemv_narrow(const NarrowMatrix& w, std::int64_t r0, std::int64_t rows, const float* x, float* y, int streams) {
    if (streams != 4 && streams != 8) throw std::logic_error(fmt::format("gemv_narrow: {} streams; expected 4 or 8", streams));
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
    if (streams == 4) gemv_streams_fused<4>(w, r0, rows, x, y);
    else gemv_streams_fused<8>(w, r0, rows, x, y);
#else
    gemv_buffered(w, r0, rows, x, y);
#endif
}

std::int64_t narrow_panel_floats(std::int64_t cols) {
    return std::max<std::int64_t>(kPanelFloats, static_cast<std::int64_t>(checked_mul(16, static_cast<std::uint64_t>(cols), "narrow weight panel")));
}

void gemm_narrow(const NarrowMatrix& w, std::int64_t r0, std::int64_t rows, const float* x, std::int64_t ldx, std::int64_t n,
                 float* out, std::int64_t ldo, float* panel, float* scratch) {
    const std::int64_t cols = w.cols(), per_panel = std::max<std::int64_t>(1, narrow_panel_floats(cols) / std::max<std::int64_t>(1, cols));
    for (std::int64_t i = 0; i < rows; i += per_panel) {
        const std::int64_t nr = std::min(per_panel, rows - i);
        for (std::int64_t r = 0; r < nr; ++r) w.decode(r0 + i + r, 0, cols, panel + r * cols);
        gemm_rows(panel, cols, nr, cols, x, ldx, n, out + i, ldo, scratch);
    }
}

std::uint64_t NarrowWeights::bytes() const {
    std::uint64_t sum = classifier.bytes();
    for (const NarrowLayer& l : layers)
        for (const NarrowMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w1, &l.w3, &l.w2}) sum += m->bytes();
    return sum;
}

namespace {

// A layer's matmul weights, in forward order, and where each one's narrow copy goes.
struct LayerMatrix {
    WeightMatrix LayerWeights::*fp32;
    NarrowMatrix NarrowLayer::*narrow;
    const char* name;
};
constexpr LayerMatrix layer_matrices[] = {{&LayerWeights::wq, &NarrowLayer::wq, "wq"}, {&LayerWeights::wk, &NarrowLayer::wk, "wk"},
                                          {&LayerWeights::wv, &NarrowLayer::wv, "wv"}, {&LayerWeights::wo, &NarrowLayer::wo, "wo"},
                                          {&LayerWeights::w1, &NarrowLayer::w1, "w1"}, {&LayerWeights::w3, &NarrowLayer::w3, "w3"},
                                          {&LayerWeights::w2, &NarrowLayer::w2, "w2"}};

}  // namespace

NarrowWeights narrow_weights(const Weights& w, DType dtype) {
    check_weight_dtype(dtype);
    NarrowWeights nw;
    nw.dtype = dtype;
    // one arena holds every narrow matrix, back to back in forward order (w3 is empty for gpt2)
    std::uint64_t arena_bytes = HugeArena::footprint(NarrowMatrix::bytes(dtype, w.classifier().rows(), w.classifier().cols()));
    for (const LayerWeights& lw : w.layers)
        for (const LayerMatrix& m : layer_matrices)
            arena_bytes = checked_add(arena_bytes, HugeArena::footprint(NarrowMatrix::bytes(dtype, (lw.*m.fp32).rows(), (lw.*m.fp32).cols())),
                                      "narrow weight bytes");
    nw.arena = std::make_shared<HugeArena>(static_cast<std::size_t>(arena_bytes));
    for (const LayerWeights& lw : w.layers) {
        NarrowLayer& l = nw.layers.emplace_back();
        for (const LayerMatrix& m : layer_matrices)
            if ((lw.*m.fp32).size()) l.*m.narrow = NarrowMatrix(lw.*m.fp32, dtype, m.name, *nw.arena);
    }
    nw.classifier = NarrowMatrix(w.classifier(), dtype, "the classifier", *nw.arena);
    return nw;
}

std::uint64_t narrow_weights_bytes(const ModelConfig& cfg, DType dtype) {
    // one matrix: rows x row_bytes(cols)
    const auto matrix = [&](std::int64_t rows, std::int64_t cols) { return NarrowMatrix::bytes(dtype, rows, cols); };
    const std::int64_t d = cfg.d_model, f = cfg.d_ff;
    std::uint64_t layer = 0;
    for (const std::uint64_t m : {matrix(cfg.d_q(), d), matrix(cfg.d_kv(), d), matrix(cfg.d_kv(), d), matrix(d, cfg.d_q()), matrix(f, d),
                                  cfg.family == Family::llama ? matrix(f, d) : 0, matrix(d, f)})
        layer = checked_add(layer, m, "narrow weight bytes");
    return checked_add(checked_mul(layer, static_cast<std::uint64_t>(cfg.n_layer), "narrow weight bytes"), matrix(cfg.n_vocab, d),
                       "narrow weight bytes");
}

}  // namespace kvlab
