// KvPool: the serving simulation's KV memory. One pool of token rows per layer, shared by many
// sequences, and its bookkeeping (KvAllocator), in one of two layouts:
//   paged       fixed blocks of `block_size` rows, taken on demand as a sequence grows and returned
//               when it finishes; a block table per sequence maps its rows to the pool's (vLLM's
//               PagedAttention). With a prefix cache, full blocks are keyed by their prefix (a chain:
//               the key of the block before and this block's tokens, as vLLM's block hashes, but exact)
//               and shared by reference count; a shared block is never written: the writer gets its own
//               copy (copy-on-write).
//   contiguous  each sequence reserves one range of rows up front, for the most tokens it may hold (a
//               static cache, TensorRT-LLM's contiguous mode), first fit in the pool.
// Both map a sequence's row r the same way (KvView's paging rule): contiguous is one block of the
// reservation's size. The rows are fp32, or encoded in one of the cache's narrow formats (KvStorage,
// kv/kv_cache.hpp: the same formats and scales as simulate --kv-dtype). Swapping to host memory is the
// scheduler's (serve/swap.hpp): the pool only saves and loads a sequence's rows as stored.
#pragma once
#include <array>
#include <cstdint>
#include <list>
#include <map>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kvlab/calc/model_config.hpp"
#include "kvlab/core/choice.hpp"
#include "kvlab/core/matrix.hpp"
#include "kvlab/kv/kv_cache.hpp"
#include "kvlab/kv/kv_view.hpp"

namespace kvlab {

using TokenId = std::int32_t;
using SeqId = std::int64_t;

enum class KvLayout { paged, contiguous };
inline constexpr std::array<Choice<KvLayout>, 2> kv_layout_choices{{{"paged", KvLayout::paged}, {"contiguous", KvLayout::contiguous}}};

struct KvPoolOptions {
    KvLayout layout = KvLayout::paged;
    std::int64_t n_rows = 0;      // token rows per layer (paged: a whole number of blocks)
    std::int64_t block_size = 16; // paged: rows per block
    bool prefix_cache = false;    // paged: share full blocks of identical prefixes
};


// Copy the pool rows src..src+n-1 to dst..dst+n-1 in every layer (a copy-on-write).
struct RowCopy {
    std::int64_t src = 0, dst = 0, n = 0;
};

// One cell of the pool's map (a paged block, or 16 rows of a contiguous pool): who holds it now. The
// picture of paged vs contiguous the vLLM paper draws by hand (Fig. 3), from a real run.
inline constexpr std::int64_t kv_cell_free = -1;       // owner: held by nobody, not cached
inline constexpr std::int64_t kv_cell_cached = -2;     // owner: held by nobody, kept for the prefix cache
inline constexpr std::int64_t kv_map_group_rows = 16;  // contiguous: rows per cell
struct KvPoolCell {
    std::int64_t owner = kv_cell_free;  // the sequence holding it (the lowest id when shared), or kv_cell_*
    std::int32_t fill = 0;              // rows holding a token's K and V
    bool shared = false;                // held by two or more sequences (a prefix block, ref count > 1)
    bool operator==(const KvPoolCell&) const = default;
};

// Counts the allocator keeps over a run.
struct KvAllocatorCounters {
    std::int64_t cow_copies = 0;           // blocks copied before a write (copy-on-write)
    std::int64_t evictions = 0;            // cached blocks reused for other content
};

class KvAllocator {
public:
    explicit KvAllocator(const KvPoolOptions& options);

    const KvPoolOptions& options() const { return o_; }
    std::int64_t n_blocks() const { return n_blocks_; }  // paged; contiguous: 0

    // Makes sure `seq` owns rows 0..n_rows-1 (n_rows >= 1): paged, blocks taken as needed (all or none);
    // contiguous, one range of n_rows reserved the first time (a later call may not ask for more). False
    // when the pool cannot; nothing is taken then.
    bool reserve(SeqId seq, std::int64_t n_rows);
    // Paged with a prefix cache, a sequence with no rows yet: takes the cached full blocks of its first
    // tokens, in order while they match. Returns the tokens they hold (a multiple of block_size); release()
    // gives them back if the sequence cannot be admitted after all.
    std::int64_t match_prefix(SeqId seq, std::span<const TokenId> tokens);
    // Before `seq` writes rows row0..row0+n-1: a block among them that is shared or cached is replaced by
    // a private copy. Returns the copies the pool must make, or nullopt when no block is free for them
    // (nothing changed then). A paged pool shares rows through its prefix cache and through fork(); a
    // contiguous pool's rows are private.
    std::optional<std::vector<RowCopy>> make_writable(SeqId seq, std::int64_t row0, std::int64_t n);
    // After `seq` holds the K and V of tokens[0..n_valid): its new full blocks enter the prefix cache,
    // keyed by their prefix (a block whose prefix is cached already stays out: not de-duplicated);
    // n_valid also sets how many rows of each of its blocks hold a token.
    void commit(SeqId seq, std::span<const TokenId> tokens, std::int64_t n_valid);
    // Returns every row of `seq` to the pool (cached blocks stay findable until reused).
    void release(SeqId seq);
    // Paged (src/kv/kv_fork.cpp): `child`, holding no rows, takes every block of `parent`, one reference
    // more each (an output forked from another: parallel sampling, beam search). Neither writes a shared
    // block in place: make_writable copies it first (copy-on-write).
    void fork(SeqId parent, SeqId child);
    // Blocks the sequences hold together, a shared block once (`held`), and the sum of their own block
    // counts (`unshared`: what each holding a private copy of its rows would take).
    struct BlocksHeld {
        std::int64_t held = 0, unshared = 0;
    };
    BlocksHeld blocks_held(std::span<const SeqId> seqs) const;

    // Where the sequence's rows are in the pool: a KvView of its block table (the layer's matrices, the
    // window and sinks are the forward pass's to fill in).
    KvView rows(SeqId seq) const;
    std::int64_t rows_reserved(SeqId seq) const;  // rows `seq` may write

    // The pool now. Rows in use: held by a live sequence; holding tokens: those rows with a token's K and
    // V written (a shared block counts once); cached: paged blocks nobody holds, kept for the prefix
    // cache; free: the rest (cached blocks included, since they are taken when needed).
    std::int64_t rows_in_use() const;
    std::int64_t rows_holding_tokens() const;
    std::int64_t rows_cached() const;
    std::int64_t rows_free() const { return o_.n_rows - rows_in_use(); }
    std::int64_t largest_free_range() const;  // contiguous: the longest reservation that fits now
    std::int64_t n_live() const { return static_cast<std::int64_t>(seqs_.size()); }
    // The pool's map, cell by cell from row 0: paged, one cell per block; contiguous, one per 16 rows (the
    // last may be shorter), owned by the sequence holding the cell's first held row.
    std::int64_t map_cell_rows() const { return o_.layout == KvLayout::paged ? o_.block_size : kv_map_group_rows; }
    std::vector<KvPoolCell> pool_map() const;
    const KvAllocatorCounters& counters() const { return counters_; }

private:
    // A cached block's key: the id of the prefix before it (0: none) and its own tokens. Ids are never
    // reused, so a key whose parent was evicted can no longer be reached, never matched wrongly.
    struct Key {
        std::uint64_t parent = 0;
        std::vector<TokenId> tokens;
        bool operator==(const Key&) const = default;
    };
    struct KeyHash {
        std::size_t operator()(const Key& k) const;
    };
    struct Block {
        std::int32_t refs = 0;
        std::int32_t fill = 0;                 // rows holding a token's K and V
        std::optional<Key> key;                // in the prefix cache
        std::optional<Key> rekey;              // out of the cache while written in place: its key before, so that
                                               // keyed again the same it keeps its id (and its children stay reachable)
        std::uint64_t id = 0;                  // keyed: the id of the prefix up to this block's end
        std::list<std::int64_t>::iterator lru; // position in cached_ while refs == 0 and keyed
    };
    struct Seq {
        std::vector<std::int64_t> block_rows;  // paged: first pool row of each block; contiguous: {start}
        std::int64_t reserved = 0;             // contiguous: rows reserved
        std::int64_t valid = 0;                // rows holding tokens
        std::vector<std::uint64_t> chain;      // prefix cache: the prefix id through each full block so far
    };
    std::optional<std::int64_t> take_block();  // a free block, else the least recently cached one
    void drop(std::int64_t block);             // one reference fewer
    void uncache(std::int64_t block);

    KvPoolOptions o_;
    std::int64_t n_blocks_ = 0;
    std::vector<Block> blocks_;
    std::vector<std::int64_t> free_;           // paged: blocks neither held nor cached
    std::list<std::int64_t> cached_;           // paged: held by nobody, in the prefix cache; front = least recent
    std::unordered_map<Key, std::int64_t, KeyHash> cache_;
    std::uint64_t next_id_ = 1;
    std::map<std::int64_t, std::int64_t> free_ranges_;  // contiguous: start -> length
    std::map<SeqId, Seq> seqs_;
    std::int64_t rows_in_use_ = 0;
    KvAllocatorCounters counters_;
};

// The pool's K and V rows for every layer: fp32 matrices (n_rows, Hkv*D), or a narrow format's encoded
// rows (KvRowStore), each row then kv_stored_row_bytes wide.
class KvPool {
public:
    KvPool(const ModelConfig& cfg, std::int64_t n_rows, const KvStorage& storage = {});
    bool narrow() const { return storage_.dtype != DType::fp32; }
    const KvStorage& storage() const { return storage_; }
    // Points a sequence's view (its block table, from KvAllocator::rows) at layer `layer`'s rows.
    void attach(std::int64_t layer, KvView& kv);
    void copy(const RowCopy& c);  // every layer
    std::uint64_t bytes() const;
    // One K (or V) row as stored: fp32 Hkv*D floats, or the narrow format's bytes and per-row scales.
    std::uint64_t stored_row_bytes() const { return stored_row_bytes_; }
    // Pool rows row0..row0+n-1 of one layer's K (which = 0) or V (1), as stored, bit for bit.
    void save_rows(std::int64_t layer, int which, std::int64_t row0, std::int64_t n, std::uint8_t* out) const;
    void load_rows(std::int64_t layer, int which, std::int64_t row0, std::int64_t n, const std::uint8_t* in);

private:
    KvStorage storage_;
    std::uint64_t stored_row_bytes_ = 0;
    bool values_ = true;  // false for MLA: the K rows hold the latent, there are no V rows
    std::vector<MatrixRM> k_, v_;
    std::vector<KvRowStore> k_store_, v_store_;
};

// Rows a sequence of n_tokens positions needs in the pool: its most held by any layer (a windowed
// layer keeps a ring of its window, within the same rows).
std::int64_t kv_seq_rows(const ModelConfig& cfg, std::int64_t n_tokens);

}  // namespace kvlab
