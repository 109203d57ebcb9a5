#include "kvlab/gemv.hpp"

#include <Eigen/Core>

namespace kvlab {

namespace {

using Packet = Eigen::internal::packet_traits<float>::type;  // the widest SIMD register of the build
constexpr std::int64_t kPacket = Eigen::internal::unpacket_traits<Packet>::size;

// out[s] = row[s] . x for S rows read side by side: S independent accumulators, so S streams of
// weights are in flight and the FMA chains do not wait on each other.
template <int S>
void dot_rows(const float* const (&row)[S], std::int64_t cols, const float* x, float* const (&out)[S]) {
    namespace ei = Eigen::internal;
    Packet acc[S];
    for (int s = 0; s < S; ++s) acc[s] = ei::pset1<Packet>(0.0f);
    std::int64_t j = 0;
    for (; j + kPacket <= cols; j += kPacket) {
        const Packet xj = ei::ploadu<Packet>(x + j);
        for (int s = 0; s < S; ++s) acc[s] = ei::pmadd(ei::ploadu<Packet>(row[s] + j), xj, acc[s]);
    }
    for (int s = 0; s < S; ++s) {
        float sum = ei::predux(acc[s]);
        for (std::int64_t t = j; t < cols; ++t) sum += row[s][t] * x[t];
        *out[s] = sum;
    }
}

}  // namespace

void gemv_rows(const float* w, std::int64_t ld, std::int64_t rows, std::int64_t cols, const float* x, float* y) {
    constexpr int S = kGemvStreams;
    // rows = S * per + rest: sub-block s is rows [s*per, (s+1)*per); the rest run one at a time
    const std::int64_t per = rows / S;
    for (std::int64_t i = 0; i < per; ++i) {
        const float* row[S];
        float* out[S];
        for (int s = 0; s < S; ++s) {
            row[s] = w + (s * per + i) * ld;
            out[s] = y + s * per + i;
        }
        dot_rows<S>(row, cols, x, out);
    }
    for (std::int64_t i = S * per; i < rows; ++i) {
        const float* row[1] = {w + i * ld};
        float* out[1] = {y + i};
        dot_rows<1>(row, cols, x, out);
    }
}

}  // namespace kvlab
