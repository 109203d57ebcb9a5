// KvAllocator's forks: one output's blocks shared with another by reference count, for parallel
// sampling and beam search (vLLM's fork of a sequence: no row is copied until one of them writes a
// shared block, then make_writable gives the writer its own copy).
#include <fmt/format.h>

#include <set>
#include <stdexcept>

#include "kvlab/kv/kv_pool.hpp"

namespace kvlab {

void KvAllocator::fork(SeqId parent, SeqId child) {
    if (o_.layout != KvLayout::paged) throw std::logic_error("KvAllocator::fork: a contiguous pool shares no rows");
    if (seqs_.contains(child)) throw std::logic_error(fmt::format("KvAllocator::fork: sequence {} already holds rows", child));
    const Seq s = seqs_.at(parent);  // a copy: the map may move on insertion
    for (const std::int64_t row : s.block_rows) ++blocks_[static_cast<std::size_t>(row / o_.block_size)].refs;
    seqs_[child] = s;
}

KvAllocator::BlocksHeld KvAllocator::blocks_held(std::span<const SeqId> seqs) const {
    BlocksHeld b;
    std::set<std::int64_t> distinct;
    for (const SeqId seq : seqs) {
        const auto it = seqs_.find(seq);
        if (it == seqs_.end()) continue;
        b.unshared += std::ssize(it->second.block_rows);
        distinct.insert(it->second.block_rows.begin(), it->second.block_rows.end());
    }
    b.held = std::ssize(distinct);
    return b;
}

}  // namespace kvlab
