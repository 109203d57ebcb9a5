// The few AVX2 helpers more than one kernel uses (attention, narrow weights). Only where the build
// targets AVX2; every caller keeps a portable path for other CPUs.
#pragma once
#ifdef __AVX2__
#include <immintrin.h>

namespace kvlab {

// One vector of the 8 horizontal sums of a[0..7]: lane r = a[r][0] + ... + a[r][7].
inline __m256 sum8(const __m256 (&a)[8]) {
    const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));  // a0..a3: lanes 0-3 | 4-7
    const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));  // a4..a7
    return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

}  // namespace kvlab
#endif
