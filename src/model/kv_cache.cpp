#include "model/kv_cache.hpp"

#include <fmt/format.h>

#include "core/error.hpp"
#include "calc/kv_memory.hpp"

namespace kvlab {

KvCache::KvCache(const ModelConfig& cfg, std::int64_t n_tokens_max) : n_tokens_max_(n_tokens_max) {
    if (n_tokens_max <= 0)
        throw UsageError(fmt::format("KV cache: {} positions; expected at least 1", n_tokens_max));
    k_.reserve(static_cast<std::size_t>(cfg.n_layer));
    v_.reserve(static_cast<std::size_t>(cfg.n_layer));
    for (std::int64_t l = 0; l < cfg.n_layer; ++l) {
        // the row count comes from the same function kvcalc sizes the cache with
        const auto rows = static_cast<std::int64_t>(
            kv_tokens_held(cfg, l, static_cast<std::uint64_t>(n_tokens_max), WindowMode::cap));
        k_.emplace_back(MatrixRM::Zero(rows, cfg.d_kv()));
        v_.emplace_back(MatrixRM::Zero(rows, cfg.d_kv()));
    }
}

std::uint64_t KvCache::bytes() const {
    std::uint64_t sum = 0;
    for (std::size_t l = 0; l < k_.size(); ++l)
        sum += sizeof(float) * static_cast<std::uint64_t>(k_[l].size() + v_[l].size());
    return sum;
}

}  // namespace kvlab
