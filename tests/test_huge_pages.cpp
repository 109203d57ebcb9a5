#include <doctest/doctest.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include <sys/mman.h>

#include "kvlab/calc/presets.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/core/huge_pages.hpp"
#include "kvlab/core/mapped_file.hpp"
#include "kvlab/weights/random_weights.hpp"
#include "kvlab/sim/simulator.hpp"
#include "test_files.hpp"

using namespace kvlab;

namespace {

std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

}  // namespace

TEST_CASE("MappedFile maps a file of a huge page or more from a huge-page boundary, every byte as written") {
    kvlab::test::TempDir dir("kvlab-mapped");
    for (const std::size_t n : {huge_page_bytes + 100, std::size_t{5000}}) {
        CAPTURE(n);
        std::string bytes(n, '\0');
        for (std::size_t i = 0; i < n; ++i) bytes[i] = static_cast<char>((i * 7 + i / 4096) % 251);
        const auto path = dir / "f.bin";
        std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(n));
        const MappedFile file(path);
        REQUIRE(file.size_bytes() == n);
        // (Linux 6.7 and later align a plain mapping this long to 2 MiB too; this checks kvlab's own
        // placement on any kernel. Mapping the file 4 KiB past the boundary on purpose fails here.)
        if (n >= huge_page_bytes) CHECK(address(file.bytes().data()) % huge_page_bytes == 0);
        CHECK(std::memcmp(file.bytes().data(), bytes.data(), n) == 0);
    }
}

TEST_CASE("HugeArena hands out 64-byte aligned pieces back to back, the first on a huge-page boundary") {
    // footprints: 100 B -> 128 (+ a 64-byte guard under ASan), 1000 -> 1024, 64 -> 64
    HugeArena arena(HugeArena::footprint(100) + HugeArena::footprint(1000) + HugeArena::footprint(64));
    void* a = arena.take(100);
    void* b = arena.take(1000);
    void* c = arena.take(64);
    CHECK(address(a) % huge_page_bytes == 0);
    CHECK(address(b) == address(a) + HugeArena::footprint(100));
    CHECK(address(c) == address(b) + HugeArena::footprint(1000));
    CHECK(address(b) % 64 == 0);
    CHECK(address(c) % 64 == 0);
    CHECK(arena.used() == HugeArena::footprint(100) + HugeArena::footprint(1000) + HugeArena::footprint(64));
    std::memset(a, 1, 100);  // writable, each piece whole
    std::memset(b, 2, 1000);
    std::memset(c, 3, 64);
    CHECK(static_cast<unsigned char*>(a)[99] == 1);
    CHECK(static_cast<unsigned char*>(b)[0] == 2);
    // full: one more byte is the owner's sizing error, not a silent overflow into other memory
    CHECK_THROWS_AS(arena.take(1), Error);
    CHECK_THROWS_AS(HugeArena(1024).take(SIZE_MAX - 10), Error);  // the footprint wraps: refused, not rounded to a few bytes
    // 5 MiB + 100 B: the arena keeps whole 4 KiB pages up to the capacity and no more, so no 2 MiB block
    // past the last whole huge page can be given a huge page (THP mode "always" included)
    const std::size_t capacity = (5u << 20) + 100, kept = (5u << 20) + 4096;
    HugeArena odd(capacity);
    auto* first = static_cast<std::byte*>(odd.take(64));
    unsigned char resident = 0;
    CHECK(::mincore(first + kept - 4096, 4096, &resident) == 0);  // the arena's last page is mapped
    errno = 0;
    CHECK(::mincore(first + kept, 4096, &resident) == -1);  // the page after it is not (given back)
    CHECK(errno == ENOMEM);
}

TEST_CASE("advise_huge_pages advises exactly the whole 2 MiB pages inside the range") {
    HugeArena arena(8u << 20);
    auto* base = static_cast<std::byte*>(arena.take(6u << 20));  // starts on a huge-page boundary
    CHECK(advise_huge_pages(nullptr, 4u << 20) == 0);
    CHECK(advise_huge_pages(base, huge_page_bytes - 1) == 0);            // shorter than one page
    CHECK(advise_huge_pages(base + 4096, huge_page_bytes) == 0);         // 2 MiB long, but straddles a boundary
    // [base + 4 KiB, base + 4 MiB + 4 KiB) holds one whole page, [base + 2 MiB, base + 4 MiB)
    // a kernel with THP takes the advice (whatever its mode); one without (or a sandbox refusing madvise)
    // refuses it, and the memory works the same
    const std::size_t advised = advise_huge_pages(base + 4096, 4u << 20);
    CHECK((advised == huge_page_bytes || advised == 0));
    CHECK(advise_huge_pages(base, 6u << 20) == (advised ? std::size_t{6} << 20 : 0));  // three whole pages
}

TEST_CASE("Random weights: every matrix is a view into one arena, in forward order, kept by Weights::backing") {
    const ModelConfig cfg = simulation_config(load_model("stories15m"), std::nullopt);
    const Weights w = random_weights(cfg, 42);
    REQUIRE(w.backing != nullptr);
    const LayerWeights& l0 = w.layers[0];
    const LayerWeights& l1 = w.layers[1];
    for (const WeightMatrix* m : {&w.tok_embed, &l0.wq, &l0.w2, &l1.wq}) CHECK(m->is_view());
    // tok_embed, then layer 0's wq wk wv wo w1 w3 w2, then layer 1's: each after the last one's footprint
    // (288 x 288 floats = 331776 B, a multiple of 64; 768 x 288 floats = 884736 B)
    auto after = [](const WeightMatrix& prev) { return address(prev.data()) + HugeArena::footprint(prev.size() * sizeof(float)); };
    CHECK(address(l0.wq.data()) == after(w.tok_embed));
    CHECK(address(l0.wk.data()) == after(l0.wq));
    CHECK(address(l0.wv.data()) == after(l0.wk));
    CHECK(address(l0.wo.data()) == after(l0.wv));
    CHECK(address(l0.w1.data()) == after(l0.wo));
    CHECK(address(l0.w3.data()) == after(l0.w1));
    CHECK(address(l0.w2.data()) == after(l0.w3));
    CHECK(address(l1.wq.data()) == after(l0.w2));
    CHECK(address(w.tok_embed.data()) % huge_page_bytes == 0);
    // a copy shares the arena; changing one copies that matrix out of it, the other keeps its values
    Weights changed = w;
    const float before = w.layers[0].wq(0, 0);
    changed.layers[0].wq(0, 0) = before + 1.0f;
    CHECK_FALSE(changed.layers[0].wq.is_view());
    CHECK(w.layers[0].wq(0, 0) == before);
}
