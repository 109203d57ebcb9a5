#include "kvlab/kv/kv_pool.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "kvlab/calc/kv_memory.hpp"
#include "kvlab/core/error.hpp"

namespace kvlab {

std::size_t KvAllocator::KeyHash::operator()(const Key& k) const {
    std::uint64_t h = 1469598103934665603ull ^ k.parent;  // FNV-1a over the parent id and the ids' bytes
    for (const TokenId t : k.tokens)
        for (int b = 0; b < 4; ++b) h = (h ^ ((static_cast<std::uint32_t>(t) >> (8 * b)) & 0xffu)) * 1099511628211ull;
    return static_cast<std::size_t>(h);
}

KvAllocator::KvAllocator(const KvPoolOptions& options) : o_(options) {
    if (o_.n_rows <= 0) throw UsageError(fmt::format("KV pool: {} rows; expected at least 1", o_.n_rows));
    if (o_.layout == KvLayout::contiguous) {
        free_ranges_[0] = o_.n_rows;
        return;
    }
    if (o_.block_size <= 0 || o_.n_rows % o_.block_size != 0)
        throw std::logic_error("KvAllocator: a paged pool holds a whole number of blocks");
    n_blocks_ = o_.n_rows / o_.block_size;
    blocks_.resize(static_cast<std::size_t>(n_blocks_));
    for (std::int64_t b = n_blocks_ - 1; b >= 0; --b) free_.push_back(b);  // block 0 is taken first
}

std::optional<std::int64_t> KvAllocator::take_block() {
    std::int64_t b = 0;
    if (!free_.empty()) {
        b = free_.back();
        free_.pop_back();
    } else if (!cached_.empty()) {  // evict the least recently cached block
        b = cached_.front();
        cached_.pop_front();
        uncache(b);
        ++counters_.evictions;
    } else {
        return std::nullopt;
    }
    Block& blk = blocks_[static_cast<std::size_t>(b)];
    blk.refs = 1;
    blk.fill = 0;
    blk.rekey.reset();
    rows_in_use_ += o_.block_size;
    return b;
}

void KvAllocator::uncache(std::int64_t block) {
    Block& blk = blocks_[static_cast<std::size_t>(block)];
    if (!blk.key) return;
    cache_.erase(*blk.key);
    blk.key.reset();
}

void KvAllocator::drop(std::int64_t block) {
    Block& blk = blocks_[static_cast<std::size_t>(block)];
    if (--blk.refs > 0) return;
    rows_in_use_ -= o_.block_size;
    if (blk.key) {
        blk.lru = cached_.insert(cached_.end(), block);
    } else {
        blk.fill = 0;
        free_.push_back(block);
    }
}

bool KvAllocator::reserve(SeqId seq, std::int64_t n_rows) {
    if (n_rows < 1) throw std::logic_error(fmt::format("KvAllocator: sequence {} asks {} rows", seq, n_rows));
    Seq& s = seqs_[seq];
    if (o_.layout == KvLayout::contiguous) {
        if (!s.block_rows.empty()) {
            if (n_rows > s.reserved)
                throw std::logic_error(fmt::format("KvAllocator: sequence {} asks {} rows of a {}-row reservation", seq, n_rows, s.reserved));
            return true;
        }
        const auto it = std::find_if(free_ranges_.begin(), free_ranges_.end(), [&](const auto& r) { return r.second >= n_rows; });
        if (it == free_ranges_.end()) {
            seqs_.erase(seq);
            return false;
        }
        const std::int64_t start = it->first, len = it->second;
        free_ranges_.erase(it);
        if (len > n_rows) free_ranges_[start + n_rows] = len - n_rows;
        s.block_rows = {start};
        s.reserved = n_rows;
        rows_in_use_ += n_rows;
        return true;
    }
    const auto have = static_cast<std::int64_t>(s.block_rows.size());
    const std::int64_t need = (n_rows + o_.block_size - 1) / o_.block_size - have;
    if (need <= 0) return true;
    if (need > static_cast<std::int64_t>(free_.size() + cached_.size())) {
        if (s.block_rows.empty()) seqs_.erase(seq);
        return false;
    }
    for (std::int64_t i = 0; i < need; ++i) s.block_rows.push_back(*take_block() * o_.block_size);
    return true;
}

std::int64_t KvAllocator::match_prefix(SeqId seq, std::span<const TokenId> tokens) {
    if (o_.layout != KvLayout::paged || !o_.prefix_cache) return 0;
    Seq& s = seqs_[seq];
    if (!s.block_rows.empty()) throw std::logic_error("KvAllocator::match_prefix: the sequence already holds rows");
    const auto B = static_cast<std::size_t>(o_.block_size);
    Key key;
    for (std::size_t end = B; end <= tokens.size(); end += B) {
        key.tokens.assign(tokens.begin() + static_cast<std::ptrdiff_t>(end - B), tokens.begin() + static_cast<std::ptrdiff_t>(end));
        const auto it = cache_.find(key);
        if (it == cache_.end()) break;
        Block& blk = blocks_[static_cast<std::size_t>(it->second)];
        if (blk.refs++ == 0) {  // it was idle in the cache: held again
            cached_.erase(blk.lru);
            rows_in_use_ += o_.block_size;
        }
        s.block_rows.push_back(it->second * o_.block_size);
        s.chain.push_back(blk.id);
        key.parent = blk.id;
    }
    const std::int64_t hit = static_cast<std::int64_t>(s.block_rows.size()) * o_.block_size;
    if (hit == 0) seqs_.erase(seq);  // (s is gone after this)
    else s.valid = hit;
    return hit;
}

std::optional<std::vector<RowCopy>> KvAllocator::make_writable(SeqId seq, std::int64_t row0, std::int64_t n) {
    std::vector<RowCopy> copies;
    if (o_.layout != KvLayout::paged || n <= 0) return copies;  // a contiguous pool shares nothing
    Seq& s = seqs_.at(seq);
    // (a windowed sequence writes ring rows within its blocks, never shared: positions past its table are none of them)
    const std::int64_t B = o_.block_size, first = row0 / B, last = std::min((row0 + n - 1) / B, std::ssize(s.block_rows) - 1);
    std::int64_t shared = 0;
    for (std::int64_t i = first; i <= last; ++i)
        if (blocks_[static_cast<std::size_t>(s.block_rows[static_cast<std::size_t>(i)] / B)].refs > 1) ++shared;
    if (shared > static_cast<std::int64_t>(free_.size() + cached_.size())) return std::nullopt;
    for (std::int64_t i = first; i <= last; ++i) {
        std::int64_t& row = s.block_rows[static_cast<std::size_t>(i)];
        const std::int64_t b = row / B;
        Block& blk = blocks_[static_cast<std::size_t>(b)];
        if (blk.refs == 1) {
            // held by this sequence alone: written in place, and out of the cache until it is full again; it
            // (and the blocks after it) are keyed again then. A full hit's last token, recomputed for its
            // logits, writes the same K and V: keyed the same, the block keeps its id (commit)
            if (blk.key) {
                cache_.erase(*blk.key);
                blk.rekey = std::move(blk.key);
                blk.key.reset();
            }
            s.chain.resize(std::min(s.chain.size(), static_cast<std::size_t>(i)));
            continue;
        }
        const std::int64_t copy = *take_block();
        blocks_[static_cast<std::size_t>(copy)].fill = blk.fill;
        copies.push_back({row, copy * B, blk.fill});
        drop(b);
        row = copy * B;
        ++counters_.cow_copies;
    }
    return copies;
}

void KvAllocator::commit(SeqId seq, std::span<const TokenId> tokens, std::int64_t n_valid) {
    Seq& s = seqs_.at(seq);
    const std::int64_t before = s.valid;
    s.valid = n_valid;
    if (o_.layout != KvLayout::paged) return;
    const std::int64_t B = o_.block_size;
    // only the blocks the new rows reach change their fill (a windowed ring's rows stay within its window)
    for (auto i = static_cast<std::size_t>(std::min(before, n_valid) / B); i < s.block_rows.size(); ++i) {
        Block& blk = blocks_[static_cast<std::size_t>(s.block_rows[i] / B)];
        blk.fill = static_cast<std::int32_t>(std::max<std::int64_t>(blk.fill, std::clamp<std::int64_t>(n_valid - static_cast<std::int64_t>(i) * B, 0, B)));
    }
    if (!o_.prefix_cache) return;
    // the prefix ids of the full blocks not chained yet, in order: each from the one before
    for (std::size_t i = s.chain.size(); i < s.block_rows.size(); ++i) {
        const auto end = (static_cast<std::int64_t>(i) + 1) * B;
        if (end > n_valid || end > std::ssize(tokens)) break;
        const std::int64_t b = s.block_rows[i] / B;
        Block& blk = blocks_[static_cast<std::size_t>(b)];
        if (blk.key) {  // keyed already (found in the cache)
            s.chain.push_back(blk.id);
            continue;
        }
        Key key{i == 0 ? 0 : s.chain[i - 1], std::vector<TokenId>(tokens.begin() + (end - B), tokens.begin() + end)};
        if (const auto it = cache_.find(key); it != cache_.end()) {  // computed by another sequence too: not de-duplicated
            s.chain.push_back(blocks_[static_cast<std::size_t>(it->second)].id);
            blk.rekey.reset();
            continue;
        }
        if (!(blk.rekey && *blk.rekey == key)) blk.id = next_id_++;  // the same key as before: the same prefix id
        blk.rekey.reset();
        blk.key = key;
        cache_.emplace(std::move(key), b);
        s.chain.push_back(blk.id);
    }
}

void KvAllocator::release(SeqId seq) {
    const auto it = seqs_.find(seq);
    if (it == seqs_.end()) return;
    Seq& s = it->second;
    if (o_.layout == KvLayout::contiguous) {
        std::int64_t start = s.block_rows.front(), len = s.reserved;
        rows_in_use_ -= len;
        // merge with the free ranges on either side
        auto next = free_ranges_.lower_bound(start);
        if (next != free_ranges_.end() && next->first == start + len) {
            len += next->second;
            next = free_ranges_.erase(next);
        }
        if (next != free_ranges_.begin()) {
            auto prev = std::prev(next);
            if (prev->first + prev->second == start) {
                start = prev->first;
                len += prev->second;
                free_ranges_.erase(prev);
            }
        }
        free_ranges_[start] = len;
    } else {
        // last block first: it holds the longest prefix, the least likely to be asked for again (vLLM's order)
        for (auto r = s.block_rows.rbegin(); r != s.block_rows.rend(); ++r) drop(*r / o_.block_size);
    }
    seqs_.erase(it);
}

KvView KvAllocator::rows(SeqId seq) const {
    const Seq& s = seqs_.at(seq);
    KvView kv;
    kv.block_rows = s.block_rows;
    kv.block_size = o_.layout == KvLayout::contiguous ? std::max<std::int64_t>(1, s.reserved) : o_.block_size;
    return kv;
}

std::int64_t KvAllocator::rows_reserved(SeqId seq) const {
    const auto it = seqs_.find(seq);
    if (it == seqs_.end()) return 0;
    return o_.layout == KvLayout::contiguous ? it->second.reserved
                                             : static_cast<std::int64_t>(it->second.block_rows.size()) * o_.block_size;
}

std::int64_t KvAllocator::rows_in_use() const { return rows_in_use_; }

std::int64_t KvAllocator::rows_holding_tokens() const {
    std::int64_t n = 0;
    if (o_.layout == KvLayout::contiguous) {
        for (const auto& [id, s] : seqs_) n += s.valid;
        return n;
    }
    for (const Block& b : blocks_)
        if (b.refs > 0) n += b.fill;
    return n;
}

std::vector<KvPoolCell> KvAllocator::pool_map() const {
    const std::int64_t cell = map_cell_rows(), n_cells = (o_.n_rows + cell - 1) / cell;
    std::vector<KvPoolCell> map(static_cast<std::size_t>(n_cells));
    if (o_.layout == KvLayout::contiguous) {
        // ranges are disjoint: taken in row order, the first range to reach a cell owns it
        std::vector<std::pair<std::int64_t, const std::pair<const SeqId, Seq>*>> by_start;
        for (const auto& entry : seqs_) by_start.emplace_back(entry.second.block_rows.front(), &entry);
        std::sort(by_start.begin(), by_start.end());
        for (const auto& [start, entry] : by_start) {
            const std::int64_t end = start + entry->second.reserved, valid_end = start + entry->second.valid;
            for (std::int64_t c = start / cell; c * cell < end; ++c) {
                KvPoolCell& m = map[static_cast<std::size_t>(c)];
                if (m.owner == kv_cell_free) m.owner = entry->first;
                m.fill += static_cast<std::int32_t>(std::max<std::int64_t>(0, std::min(valid_end, (c + 1) * cell) - std::max(start, c * cell)));
            }
        }
        return map;
    }
    for (std::int64_t b = 0; b < n_blocks_; ++b) {
        const Block& blk = blocks_[static_cast<std::size_t>(b)];
        KvPoolCell& m = map[static_cast<std::size_t>(b)];
        if (blk.refs == 0 && blk.key) m = {kv_cell_cached, blk.fill, false};
        m.shared = blk.refs > 1;
        if (blk.refs > 0) m.fill = blk.fill;
    }
    for (const auto& [id, s] : seqs_)  // in id order: a shared block's owner is its lowest holder
        for (const std::int64_t row : s.block_rows) {
            KvPoolCell& m = map[static_cast<std::size_t>(row / o_.block_size)];
            if (m.owner < 0) m.owner = id;
        }
    return map;
}

std::int64_t KvAllocator::rows_cached() const { return static_cast<std::int64_t>(cached_.size()) * o_.block_size; }

std::int64_t KvAllocator::largest_free_range() const {
    if (o_.layout == KvLayout::paged) return rows_free();
    std::int64_t best = 0;
    for (const auto& [start, len] : free_ranges_) best = std::max(best, len);
    return best;
}

KvPool::KvPool(const ModelConfig& cfg, std::int64_t n_rows, const KvStorage& storage) : storage_(storage) {
    const std::int64_t heads = kv_row_heads(cfg), width = kv_row_head_dim(cfg), v_rows = cfg.mla ? 0 : 1;
    values_ = !cfg.mla;
    check_kv_storage(storage, kv_row_values(cfg));
    stored_row_bytes_ = kv_stored_row_bytes(storage, heads, width);
    for (std::int64_t l = 0; l < cfg.n_layer; ++l) {
        // MLA: one latent "head" per token in the K rows, no V rows (model_config.hpp, kv_row_values)
        if (narrow()) {
            k_store_.emplace_back(storage, n_rows, heads, width);
            v_store_.emplace_back(storage, n_rows * v_rows, heads, width);
        } else {
            k_.emplace_back(large_zero_matrix(n_rows, heads * width));
            v_.emplace_back(large_zero_matrix(n_rows * v_rows, heads * width));
        }
    }
}

void KvPool::attach(std::int64_t layer, KvView& kv) {
    const auto l = static_cast<std::size_t>(layer);
    if (narrow()) {
        kv.k_store = &k_store_[l];
        kv.v_store = &v_store_[l];
        kv.row_bytes = stored_row_bytes_;
    } else {
        kv.k = &k_[l];
        kv.v = &v_[l];
    }
}

void KvPool::copy(const RowCopy& c) {
    for (std::size_t l = 0; l < k_.size(); ++l) {
        k_[l].middleRows(c.dst, c.n) = k_[l].middleRows(c.src, c.n);
        if (values_) v_[l].middleRows(c.dst, c.n) = v_[l].middleRows(c.src, c.n);  // none: MLA
    }
    for (std::size_t l = 0; l < k_store_.size(); ++l) {
        k_store_[l].copy_rows(c.src, c.dst, c.n);
        if (values_) v_store_[l].copy_rows(c.src, c.dst, c.n);
    }
}

std::uint64_t KvPool::bytes() const {
    std::uint64_t n = 0;
    for (std::size_t l = 0; l < k_.size(); ++l) n += sizeof(float) * static_cast<std::uint64_t>(k_[l].size() + v_[l].size());
    for (std::size_t l = 0; l < k_store_.size(); ++l) n += k_store_[l].bytes() + v_store_[l].bytes();
    return n;
}

void KvPool::save_rows(std::int64_t layer, int which, std::int64_t row0, std::int64_t n, std::uint8_t* out) const {
    const auto l = static_cast<std::size_t>(layer);
    if (narrow()) return (which == 0 ? k_store_[l] : v_store_[l]).save_rows(row0, n, out);
    const MatrixRM& m = which == 0 ? k_[l] : v_[l];
    std::memcpy(out, m.row(row0).data(), static_cast<std::size_t>(n) * stored_row_bytes_);  // row-major: the rows are contiguous
}

void KvPool::load_rows(std::int64_t layer, int which, std::int64_t row0, std::int64_t n, const std::uint8_t* in) {
    const auto l = static_cast<std::size_t>(layer);
    if (narrow()) return (which == 0 ? k_store_[l] : v_store_[l]).load_rows(row0, n, in);
    MatrixRM& m = which == 0 ? k_[l] : v_[l];
    std::memcpy(m.row(row0).data(), in, static_cast<std::size_t>(n) * stored_row_bytes_);
}

std::int64_t kv_seq_rows(const ModelConfig& cfg, std::int64_t n_tokens) {
    std::uint64_t rows = 0;
    for (std::int64_t l = 0; l < cfg.n_layer; ++l)
        rows = std::max(rows, kv_tokens_held(cfg, l, static_cast<std::uint64_t>(n_tokens), WindowMode::cap));
    return static_cast<std::int64_t>(rows);
}

}  // namespace kvlab
