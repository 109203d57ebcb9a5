#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "kvlab/gemv.hpp"
#include "kvlab/weights.hpp"

using namespace kvlab;

namespace {

// y = W x through gemv_rows over rows [0, rows) of a (rows + 2, ld) buffer whose first `cols` columns
// are W; checked against a double-precision dot per row, within fp32 rounding of the row's sum of
// |w_j x_j|. The two rows after `rows` and y's sentinels after `rows` must stay untouched.
void check_gemv(std::int64_t rows, std::int64_t cols, std::int64_t ld) {
    CAPTURE(rows);
    CAPTURE(cols);
    CAPTURE(ld);
    std::srand(static_cast<unsigned>(rows * 1000 + cols));
    const MatrixRM w = MatrixRM::Random(rows + 2, ld);  // (rows + 2, ld)
    const VectorF x = VectorF::Random(cols);             // (cols)
    const float sentinel = 12345.0f;
    std::vector<float> y(static_cast<std::size_t>(rows + 3), sentinel);  // (rows) + 3 sentinels
    gemv_rows(w.data(), ld, rows, cols, x.data(), y.data());
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
    // rows below, at and above kGemvStreams (= 8) and its multiples; cols 1, a packet (16 floats on
    // AVX-512, 8 on AVX), a packet plus a tail, and the model widths of stories15M (288, 768)
    for (const std::int64_t rows : {1, 7, 8, 9, 16, 23, 100})
        for (const std::int64_t cols : {1, 5, 8, 16, 17, 33, 288, 768}) {
            check_gemv(rows, cols, cols);
            check_gemv(rows, cols, cols + 3);  // a row stride wider than the row (a block of a wider matrix)
        }
}

TEST_CASE("gemv_rows: with zero rows writes nothing") {
    check_gemv(0, 16, 16);
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
