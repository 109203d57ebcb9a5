#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "kvlab/core/error.hpp"
#include "kernels/matmul.hpp"
#include "kvlab/weights/weights.hpp"

#include <Eigen/Core>

using namespace kvlab;

namespace {

// y = W x through gemv_rows over a (rows, ld) buffer whose first `cols` columns are W (exactly sized,
// so an ASan build catches a read past it); checked against a double-precision dot per row, within
// fp32 rounding of the row's sum of |w_j x_j|. y's three sentinels after `rows` must stay untouched.
void check_gemv(std::int64_t rows, std::int64_t cols, std::int64_t ld, int streams) {
    CAPTURE(rows);
    CAPTURE(cols);
    CAPTURE(ld);
    CAPTURE(streams);
    std::srand(static_cast<unsigned>(rows * 1000 + cols));
    const MatrixRM w = MatrixRM::Random(rows, ld);  // (rows, ld)
    const VectorF x = VectorF::Random(cols);             // (cols)
    const float sentinel = 12345.0f;
    std::vector<float> y(static_cast<std::size_t>(rows + 3), sentinel);  // (rows) + 3 sentinels
    gemv_rows(w.data(), ld, rows, cols, x.data(), y.data(), streams);
    for (std::int64_t i = 0; i < rows; ++i) {
        double exact = 0.0, magnitude = 0.0;
        for (std::int64_t j = 0; j < cols; ++j) {
            exact += static_cast<double>(w(i, j)) * x[j];
            magnitude += std::abs(static_cast<double>(w(i, j)) * x[j]);
        }
        // fp32 accumulation: each of the <= cols additions rounds by at most 2^-24 of the running magnitude
        CHECK(std::abs(y[static_cast<std::size_t>(i)] - exact) <= magnitude * static_cast<double>(cols) * 0x1p-24 + 1e-30);
    }
    for (std::int64_t i = rows; i < rows + 3; ++i) CHECK(y[static_cast<std::size_t>(i)] == sentinel);
}

}  // namespace

TEST_CASE("gemv_rows: every row's dot product, for row counts around the stream count and tails of the SIMD width") {
    // rows below, at and above either stream count (4, 8) and their multiples; cols 1, a packet (16
    // floats on AVX-512, 8 on AVX), a packet plus a tail, and the model widths of stories15M (288, 768)
    for (const int streams : gemv_stream_choices)
        for (const std::int64_t rows : {1, 3, 4, 5, 7, 8, 9, 16, 23, 100})
            for (const std::int64_t cols : {1, 5, 8, 16, 17, 33, 288, 768}) {
                check_gemv(rows, cols, cols, streams);
                check_gemv(rows, cols, cols + 3, streams);  // a row stride wider than the row (a block of a wider matrix)
            }
}

TEST_CASE("gemv_rows: rows that start off a SIMD boundary (a checkpoint read in place) give every row's dot product") {
    // the matrix inside a larger buffer, `shift` floats past an aligned start, with NaN in the floats
    // before and after it: the aligned chunks that read them must count them as nothing
    const std::int64_t packet = gemm_tile_tokens() / 4;  // floats per SIMD register
    for (const int streams : gemv_stream_choices)
        for (std::int64_t shift = 1; shift < packet; shift += (packet > 4 ? 3 : 1))
            for (const std::int64_t rows : {1, 5, 9, 23})
                for (const std::int64_t cols : {packet, 2 * packet, std::int64_t{288}, std::int64_t{768}}) {
                    CAPTURE(streams);
                    CAPTURE(shift);
                    CAPTURE(rows);
                    CAPTURE(cols);
                    std::srand(static_cast<unsigned>(rows * 7 + cols + shift));
                    VectorF buf = VectorF::Constant(rows * cols + 2 * packet, std::nanf(""));  // Eigen aligns it to the SIMD width
                    const VectorF values = VectorF::Random(rows * cols);
                    buf.segment(shift, rows * cols) = values;
                    const VectorF x = VectorF::Random(cols);
                    std::vector<float> y(static_cast<std::size_t>(rows));
                    gemv_rows(buf.data() + shift, cols, rows, cols, x.data(), y.data(), streams);
                    for (std::int64_t i = 0; i < rows; ++i) {
                        double exact = 0.0, magnitude = 0.0;
                        for (std::int64_t j = 0; j < cols; ++j) {
                            exact += static_cast<double>(values[i * cols + j]) * x[j];
                            magnitude += std::abs(static_cast<double>(values[i * cols + j]) * x[j]);
                        }
                        CHECK(std::abs(y[static_cast<std::size_t>(i)] - exact) <= magnitude * static_cast<double>(cols) * 0x1p-24 + 1e-30);
                    }
                }
}

TEST_CASE("gemv_rows: with zero rows writes nothing") {
    for (const int streams : gemv_stream_choices) check_gemv(0, 16, 16, streams);
}

TEST_CASE("gemv_rows: the stream count changes the speed only, never a bit of the result") {
    // each row is summed in the same order whichever rows run beside it, so the CPU's choice
    // (gemv_streams) cannot make two hosts' runs differ
    std::srand(11);
    const MatrixRM w = MatrixRM::Random(203, 288);  // 203 = 25 * 8 + 3 = 50 * 4 + 3: tails for both
    const VectorF x = VectorF::Random(288);
    VectorF y4(203), y8(203);
    gemv_rows(w.data(), w.cols(), w.rows(), w.cols(), x.data(), y4.data(), 4);
    gemv_rows(w.data(), w.cols(), w.rows(), w.cols(), x.data(), y8.data(), 8);
    CHECK(y4 == y8);
    CHECK((gemv_streams() == 4 || gemv_streams() == 8));
    CHECK_THROWS_AS(gemv_rows(w.data(), w.cols(), w.rows(), w.cols(), x.data(), y4.data(), 6), Error);
}

TEST_CASE("gemv_rows: agrees with Eigen's matrix-vector product on a classifier-shaped block") {
    // 1000 rows of a 288-wide tied embedding: a thread's block of the stories15M classifier, scaled down
    std::srand(7);
    const MatrixRM w = MatrixRM::Random(1000, 288);
    const VectorF x = VectorF::Random(288);
    VectorF y(1000);
    gemv_rows(w.data(), w.cols(), w.rows(), w.cols(), x.data(), y.data());
    const VectorF ref = w * x;
    CHECK((y - ref).cwiseAbs().maxCoeff() <= 1e-4f * ref.cwiseAbs().maxCoeff());
    CHECK((y - ref).cwiseAbs().maxCoeff() < 1e-3f);
}

namespace {

// out = x W^T through gemm_rows, x (n, cols) inside a wider (n, cols + 2) buffer, W (rows, cols) inside
// a (rows, cols + 1) buffer (both exactly that size, for ASan), out (n, rows) inside an (n, rows + 4)
// buffer starting at column 1: checked against double-precision dots; the columns of out around the
// block must stay untouched.
void check_gemm(std::int64_t n, std::int64_t rows, std::int64_t cols) {
    CAPTURE(n);
    CAPTURE(rows);
    CAPTURE(cols);
    std::srand(static_cast<unsigned>(n * 10000 + rows * 100 + cols));
    const MatrixRM x = MatrixRM::Random(n, cols + 2);     // (n, cols + 2)
    const MatrixRM w = MatrixRM::Random(rows, cols + 1);  // (rows, cols + 1)
    const float sentinel = -777.0f;
    MatrixRM out = MatrixRM::Constant(n, rows + 4, sentinel);  // (n, rows + 4), block at columns 1..rows
    Eigen::Matrix<float, Eigen::Dynamic, 1> scratch(gemm_scratch_floats(cols, n));
    gemm_rows(w.data(), w.cols(), rows, cols, x.data(), x.cols(), n, out.data() + 1, out.cols(), scratch.data());
    for (std::int64_t t = 0; t < n; ++t) {
        CHECK(out(t, 0) == sentinel);
        for (std::int64_t c = rows + 1; c < rows + 4; ++c) CHECK(out(t, c) == sentinel);
        for (std::int64_t i = 0; i < rows; ++i) {
            double exact = 0.0, magnitude = 0.0;
            for (std::int64_t j = 0; j < cols; ++j) {
                exact += static_cast<double>(x(t, j)) * w(i, j);
                magnitude += std::abs(static_cast<double>(x(t, j)) * w(i, j));
            }
            CHECK(std::abs(out(t, 1 + i) - exact) <= magnitude * static_cast<double>(cols) * 0x1p-24 + 1e-30);
        }
    }
}

}  // namespace

TEST_CASE("gemm_rows: every token's outputs, for token counts around the SIMD width and the tile") {
    // the tile is 4 SIMD registers of tokens (64 on AVX-512): token counts that fill 1, 2, 3 and 4
    // registers of a tile, at and around its edges, and several tiles; row counts around the
    // micro-kernel's block of rows (6 on AVX-512, 2 on AVX); input widths 1, odd, and stories15M's 288
    const std::int64_t tile = gemm_tile_tokens(), reg = tile / 4;
    for (const std::int64_t n : {std::int64_t{2}, reg - 1, reg + 1, 2 * reg + 1, 3 * reg, tile - 1, tile, tile + 1, 2 * tile + 3})
        for (const std::int64_t rows : {1, 2, 5, 6, 7, 13, 40})
            for (const std::int64_t cols : {1, 17, 288}) check_gemm(n, rows, cols);
}

TEST_CASE("gemm_rows: several tiles and groups over more weight rows than one L2 panel holds") {
    // 288 floats a row: a 256 KiB panel is 227 rows, so 500 rows are three panels, each passed over by
    // the three tiles of 2 * tile + 3 tokens; 4 * tile + 5 tokens are two groups (four tiles at most
    // are packed at once), the second with one partial tile
    check_gemm(2 * gemm_tile_tokens() + 3, 500, 288);
    check_gemm(4 * gemm_tile_tokens() + 5, 500, 288);
}

TEST_CASE("gemm_rows: agrees with Eigen's product on a prefill-shaped block") {
    // 48 tokens through a (768, 288) weight: stories15M's gate projection
    std::srand(11);
    const MatrixRM x = MatrixRM::Random(48, 288), w = MatrixRM::Random(768, 288);
    MatrixRM out(48, 768);
    Eigen::Matrix<float, Eigen::Dynamic, 1> scratch(gemm_scratch_floats(288, 48));
    gemm_rows(w.data(), w.cols(), w.rows(), w.cols(), x.data(), x.cols(), x.rows(), out.data(), out.cols(), scratch.data());
    const MatrixRM ref = x * w.transpose();
    CHECK((out - ref).cwiseAbs().maxCoeff() <= 1e-5f * ref.cwiseAbs().maxCoeff());
}
