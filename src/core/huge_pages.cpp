#include "kvlab/core/huge_pages.hpp"

#include <cstdint>
#include <new>

#include <fmt/format.h>
#include <sys/mman.h>
#if defined(__SANITIZE_ADDRESS__)
#define KVLAB_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVLAB_ASAN 1
#endif
#endif
#ifdef KVLAB_ASAN
#include <sanitizer/asan_interface.h>
#endif

#include "kvlab/core/error.hpp"

namespace kvlab {

std::size_t advise_huge_pages(void* data, std::size_t bytes) noexcept {
    constexpr std::uintptr_t huge = huge_page_bytes;
    const auto begin = reinterpret_cast<std::uintptr_t>(data);
    if (data == nullptr || bytes < huge || begin > UINTPTR_MAX - bytes) return 0;
    const std::uintptr_t first = (begin + huge - 1) & ~(huge - 1), last = (begin + bytes) & ~(huge - 1);
    if (last <= first) return 0;
#ifdef MADV_HUGEPAGE
    // EINVAL where the kernel has no THP: the advice is dropped, the memory works the same
    if (::madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE) != 0) return 0;
    return last - first;
#else
    return 0;  // a system without transparent huge pages
#endif
}

std::byte* keep_huge_aligned(void*& mapping, std::size_t& mapped, std::size_t bytes) noexcept {
    const auto at = reinterpret_cast<std::uintptr_t>(mapping);
    auto* base = reinterpret_cast<std::byte*>((at + huge_page_bytes - 1) & ~(std::uintptr_t{huge_page_bytes} - 1));
    const std::size_t page = 4096, kept = (bytes + page - 1) / page * page;
    std::byte* begin = static_cast<std::byte*>(mapping);
    std::byte* end = begin + mapped;
    if (base > begin && ::munmap(begin, static_cast<std::size_t>(base - begin)) == 0) begin = base;
    if (end > base + kept && ::munmap(base + kept, static_cast<std::size_t>(end - (base + kept))) == 0) end = base + kept;
    mapping = begin;
    mapped = static_cast<std::size_t>(end - begin);
    return base;
}

HugeArena::HugeArena(std::size_t capacity) : capacity_(capacity) {
    if (capacity == 0) return;
    if (capacity > SIZE_MAX - huge_page_bytes) throw std::bad_alloc();
    mapped_ = capacity + huge_page_bytes;  // room to start on a huge-page boundary
    mapping_ = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapping_ == MAP_FAILED) {
        mapping_ = nullptr;
        throw std::bad_alloc();
    }
    // no whole 2 MiB block of the mapping lies past the capacity, so in THP mode "always" too the last
    // partial huge page stays in 4 KiB pages and touching the end of the last piece makes nothing
    // resident that it does not use
    base_ = keep_huge_aligned(mapping_, mapped_, capacity);
    advise_huge_pages(base_, capacity);
#ifdef KVLAB_ASAN
    ASAN_POISON_MEMORY_REGION(mapping_, mapped_);
#endif
}

HugeArena::~HugeArena() {
    if (mapping_ == nullptr) return;
#ifdef KVLAB_ASAN
    ASAN_UNPOISON_MEMORY_REGION(mapping_, mapped_);  // the addresses may be mapped again for anything
#endif
    ::munmap(mapping_, mapped_);
}

void* HugeArena::take(std::size_t bytes) {
    const std::size_t n = footprint(bytes);
    if (n < bytes || n > capacity_ - used_)
        throw Error(fmt::format("huge-page arena: {} bytes asked with {} of {} left; its owner sized it too small", bytes,
                                capacity_ - used_, capacity_));
    void* out = base_ + used_;
    used_ += n;
#ifdef KVLAB_ASAN
    ASAN_UNPOISON_MEMORY_REGION(out, bytes);
#endif
    return out;
}

}  // namespace kvlab
