// The dense fp32 matrix and vector every numeric layer shares (Eigen, row-major: one token or one
// weight row per row), and the large buffers the forward pass streams through, advised huge pages.
#pragma once
#include <Eigen/Core>

#include "kvlab/core/huge_pages.hpp"

namespace kvlab {

using MatrixRM = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using VectorF = Eigen::VectorXf;

// A matrix the forward pass streams through (weights, KV caches), uninitialised: its storage's whole
// 2 MiB pages advised huge before anything touches them (core/huge_pages.hpp says why).
inline MatrixRM large_matrix(Eigen::Index rows, Eigen::Index cols) {
    MatrixRM m(rows, cols);
    advise_huge_pages(m.data(), static_cast<std::size_t>(m.size()) * sizeof(float));
    return m;
}
inline MatrixRM large_zero_matrix(Eigen::Index rows, Eigen::Index cols) {
    MatrixRM m = large_matrix(rows, cols);
    m.setZero();
    return m;
}

}  // namespace kvlab
