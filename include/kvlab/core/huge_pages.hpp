// Transparent huge pages for kvlab's large arrays (weights, their narrow copies, KV caches): advice that
// the kernel may back whole 2 MiB pages of them with huge pages. Where the host's THP mode is "madvise",
// memory not advised stays in 4 KiB pages, and a decode reading its weights from them ran up to 1.4x
// slower (docs/performance.md, "Huge pages"). Advice only: nothing changes where THP is off.
#pragma once
#include <cstddef>

namespace kvlab {

inline constexpr std::size_t huge_page_bytes = std::size_t{2} << 20;  // x86-64's PMD page

// The whole huge pages inside [data, data + bytes), advised MADV_HUGEPAGE. Call it before the first write:
// a page touched before the advice stays small until the kernel's background collapse reaches it.
// Returns the bytes advised (0 when the range holds no whole huge page or the kernel refuses); never throws.
std::size_t advise_huge_pages(void* data, std::size_t bytes) noexcept;

// A mapping made one huge page longer than `bytes` (`mapping`, `mapped` long), cut down to its first
// huge-page boundary: [boundary, boundary + bytes rounded up to 4 KiB pages) stays mapped and the slack
// on both sides is given back, so no whole 2 MiB block of it lies past `bytes`. A trim the kernel refuses
// leaves that slack mapped. Returns the boundary; `mapping` and `mapped` become what stays mapped (to
// unmap at the end). HugeArena's memory and MappedFile's aligned reservation are made this way.
std::byte* keep_huge_aligned(void*& mapping, std::size_t& mapped, std::size_t bytes) noexcept;

// Memory for many arrays that one pass streams through (a model's weight matrices, or their narrow
// copies): one anonymous mapping, huge-page aligned and advised, handed out back to back in 64-byte
// aligned pieces, so matrices smaller than a huge page share huge pages instead of each lying in 4 KiB
// ones. Sized once by its owner; pieces live as long as the arena. Untouched capacity costs no memory.
class HugeArena {
public:
    explicit HugeArena(std::size_t capacity);  // throws std::bad_alloc when the mapping fails
    ~HugeArena();
    HugeArena(const HugeArena&) = delete;
    HugeArena& operator=(const HugeArena&) = delete;

    // The next `bytes` (uninitialised, 64-byte aligned). Throws Error past the capacity: the owner sized
    // the arena with footprint() for every piece it takes. Under AddressSanitizer everything but the
    // pieces taken stays poisoned, and each piece is followed by a poisoned line, so a read past a
    // matrix's end is still caught as it was when every matrix had its own heap block.
    void* take(std::size_t bytes);
    static constexpr std::size_t footprint(std::size_t bytes) { return (bytes + 63) / 64 * 64 + guard_bytes; }
    std::size_t used() const { return used_; }

private:
#if defined(__SANITIZE_ADDRESS__)
    static constexpr std::size_t guard_bytes = 64;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
    static constexpr std::size_t guard_bytes = 64;
#else
    static constexpr std::size_t guard_bytes = 0;
#endif
#else
    static constexpr std::size_t guard_bytes = 0;
#endif
    void* mapping_ = nullptr;
    std::size_t mapped_ = 0;
    std::byte* base_ = nullptr;  // the first huge-page boundary inside the mapping
    std::size_t capacity_ = 0, used_ = 0;
};

}  // namespace kvlab
