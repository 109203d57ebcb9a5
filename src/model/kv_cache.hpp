// KvCache: the simulator's preallocated K and V buffers, per layer, keys stored after RoPE.
// Sliding-window layers keep only the last W positions in a ring buffer. Non-goal: batching, paging.
#pragma once
#include <cstdint>
#include <vector>

#include "calc/model_config.hpp"
#include "model/weights.hpp"

namespace kvlab {

class KvCache {
public:
    // Room for positions 0..n_tokens_max-1; layer l holds kv_tokens_held(cfg, l, n_tokens_max, cap)
    // rows, so bytes() == kv_bytes_sequence(cfg, fp32, n_tokens_max, cap).total().
    KvCache(const ModelConfig& cfg, std::int64_t n_tokens_max);

    std::int64_t n_tokens_max() const { return n_tokens_max_; }
    std::int64_t n_rows(std::int64_t layer) const { return k_[static_cast<std::size_t>(layer)].rows(); }
    // Row holding position `pos` in `layer`: pos itself, or pos mod W in a ring buffer.
    std::int64_t row_of(std::int64_t layer, std::int64_t pos) const { return pos % n_rows(layer); }
    MatrixRM& k(std::int64_t layer) { return k_[static_cast<std::size_t>(layer)]; }
    MatrixRM& v(std::int64_t layer) { return v_[static_cast<std::size_t>(layer)]; }
    const MatrixRM& k(std::int64_t layer) const { return k_[static_cast<std::size_t>(layer)]; }
    const MatrixRM& v(std::int64_t layer) const { return v_[static_cast<std::size_t>(layer)]; }
    // Bytes allocated for K and V over all layers (fp32).
    std::uint64_t bytes() const;

private:
    std::int64_t n_tokens_max_ = 0;
    std::vector<MatrixRM> k_;  // L of (rows_l, Hkv*D), rows_l = T_max or min(W, T_max)
    std::vector<MatrixRM> v_;  // L of (rows_l, Hkv*D)
};

}  // namespace kvlab
