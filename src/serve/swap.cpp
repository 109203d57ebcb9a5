#include "serve/swap.hpp"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "kvlab/calc/kv_memory.hpp"
#include "kvlab/core/checked.hpp"

namespace kvlab {

std::uint64_t swap_bytes(const ModelConfig& cfg, std::uint64_t row_bytes, std::int64_t n_tokens) {
    std::uint64_t sum = 0;
    for (std::int64_t l = 0; l < cfg.n_layer; ++l)
        sum = checked_add(sum, checked_mul(static_cast<std::uint64_t>(kv_rows_per_token(cfg)) * row_bytes, kv_tokens_held(cfg, l, static_cast<std::uint64_t>(n_tokens), WindowMode::cap), "swap bytes"),
                          "swap bytes");
    return sum;
}

bool HostKvTier::fits(const KvPool& pool, std::int64_t n_tokens) const {
    return swap_bytes(cfg_, pool.stored_row_bytes(), n_tokens) <= budget_ - used_;
}

template <typename F>
void HostKvTier::each_run(const KvView& rows, std::int64_t n, F f) const {
    for (std::int64_t r = 0, len = 0; r < n; r += len) {
        len = rows.block_rows.empty() ? n - r : std::min(n - r, rows.block_size - r % rows.block_size);
        f(rows.pool_row(r), len);
    }
}

std::uint64_t HostKvTier::swap_out(SeqId seq, const KvPool& pool, const KvView& rows, std::int64_t n_tokens) {
    if (held_.count(seq)) throw std::logic_error(fmt::format("HostKvTier: sequence {} is swapped out already", seq));
    const std::uint64_t row_bytes = pool.stored_row_bytes();
    Held h;
    h.n_tokens = n_tokens;
    h.bytes.resize(swap_bytes(cfg_, row_bytes, n_tokens));
    std::uint8_t* out = h.bytes.data();
    for (std::int64_t l = 0; l < cfg_.n_layer; ++l) {
        const auto held = static_cast<std::int64_t>(kv_tokens_held(cfg_, l, static_cast<std::uint64_t>(n_tokens), WindowMode::cap));
        for (int which = 0; which < kv_rows_per_token(cfg_); ++which)  // K then V (MLA: the latent only)
            each_run(rows, held, [&](std::int64_t row0, std::int64_t len) {
                pool.save_rows(l, which, row0, len, out);
                out += static_cast<std::size_t>(len) * row_bytes;
            });
    }
    const std::uint64_t moved = h.bytes.size();
    used_ += moved;
    peak_ = std::max(peak_, used_);
    held_.emplace(seq, std::move(h));
    return moved;
}

std::uint64_t HostKvTier::swap_in(SeqId seq, KvPool& pool, const KvView& rows) {
    const auto it = held_.find(seq);
    if (it == held_.end()) throw std::logic_error(fmt::format("HostKvTier: sequence {} is not swapped out", seq));
    const std::uint64_t row_bytes = pool.stored_row_bytes();
    const std::uint8_t* in = it->second.bytes.data();
    for (std::int64_t l = 0; l < cfg_.n_layer; ++l) {
        const auto held = static_cast<std::int64_t>(kv_tokens_held(cfg_, l, static_cast<std::uint64_t>(it->second.n_tokens), WindowMode::cap));
        for (int which = 0; which < kv_rows_per_token(cfg_); ++which)  // K then V (MLA: the latent only)
            each_run(rows, held, [&](std::int64_t row0, std::int64_t len) {
                pool.load_rows(l, which, row0, len, in);
                in += static_cast<std::size_t>(len) * row_bytes;
            });
    }
    const std::uint64_t moved = it->second.bytes.size();
    used_ -= moved;
    held_.erase(it);
    return moved;
}

StepCost recompute_cost(const ModelConfig& cfg, std::int64_t n_tokens, std::uint64_t kv_row_bytes) {
    StepCost c = closed_form_step_cost(cfg, StepMode::cached, 0, n_tokens, kv_row_bytes);
    c.ops[static_cast<std::size_t>(Op::final_norm)] = {};
    c.ops[static_cast<std::size_t>(Op::lm_head)] = {};
    return c;
}

SwapOrRecompute swap_or_recompute(const ModelConfig& cfg, std::uint64_t kv_row_bytes, const GpuSpec& gpu, double host_bytes_per_s,
                                  std::int64_t n_tokens) {
    const OpCost c = recompute_cost(cfg, n_tokens, kv_row_bytes).total();
    const RooflineTime t = roofline_time(gpu, static_cast<double>(c.flops), static_cast<double>(c.bytes_total() - c.bytes_weights_read));
    const std::uint64_t row = kv_row_bytes ? kv_row_bytes : sizeof(float) * static_cast<std::uint64_t>(cfg.d_kv());
    return {t.seconds(), 2.0 * static_cast<double>(swap_bytes(cfg, row, n_tokens)) / host_bytes_per_s};
}

SwapCrossover swap_crossover(const ModelConfig& cfg, std::uint64_t kv_row_bytes, const GpuSpec& gpu, double host_bytes_per_s, std::int64_t max_len) {
    auto faster = [&](std::int64_t n) { return swap_or_recompute(cfg, kv_row_bytes, gpu, host_bytes_per_s, n).recompute_faster(); };
    SwapCrossover x;
    x.recompute_faster_at_1 = faster(1);
    bool prev = x.recompute_faster_at_1;
    for (std::int64_t lo = 1; lo < max_len;) {
        const std::int64_t hi = std::min(max_len, lo * 2);
        if (faster(hi) != prev) {  // the first length in (lo, hi] where it changes: bisection
            std::int64_t a = lo, b = hi;
            while (b - a > 1) {
                const std::int64_t mid = a + (b - a) / 2;
                (faster(mid) == prev ? a : b) = mid;
            }
            x.flips.push_back(b);
            prev = !prev;
        }
        lo = hi;
    }
    return x;
}

}  // namespace kvlab
