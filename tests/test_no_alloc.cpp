// Holds the decode loop to no heap allocation: this test binary counts every call into glibc's malloc
// family (operator new and Eigen's aligned_malloc end there too). Built without sanitizers only, which
// replace malloc themselves.
#include <doctest/doctest.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

#include <omp.h>

#include "kvlab/kv/kv_cache.hpp"
#include "kvlab/weights/random_weights.hpp"
#include "kvlab/sim/simulator.hpp"
#include "kernels/narrow_weights.hpp"
#include "kvlab/model/transformer.hpp"
#include "sim_configs.hpp"

namespace {
std::atomic<long> g_n_allocs{0};
void counted() { g_n_allocs.fetch_add(1, std::memory_order_relaxed); }
}  // namespace

extern "C" {
void* __libc_malloc(std::size_t n);
void* __libc_calloc(std::size_t n, std::size_t size);
void* __libc_realloc(void* p, std::size_t n);
void* __libc_memalign(std::size_t alignment, std::size_t n);

void* malloc(std::size_t n) {
    counted();
    return __libc_malloc(n);
}
void* calloc(std::size_t n, std::size_t size) {
    counted();
    return __libc_calloc(n, size);
}
void* realloc(void* p, std::size_t n) {
    counted();
    return __libc_realloc(p, n);
}
void* memalign(std::size_t alignment, std::size_t n) {
    counted();
    return __libc_memalign(alignment, n);
}
void* aligned_alloc(std::size_t alignment, std::size_t n) {
    counted();
    return __libc_memalign(alignment, n);
}
int posix_memalign(void** out, std::size_t alignment, std::size_t n) {
    counted();
    *out = __libc_memalign(alignment, n);
    return *out != nullptr || n == 0 ? 0 : ENOMEM;
}
}

using namespace kvlab;
using kvlab::test::tiny_config;

TEST_CASE("The allocation counter sees a std::vector and an Eigen matrix") {
    const long before = g_n_allocs.load();
    std::vector<float> v(1000);
    const MatrixRM m(64, 64);
    CHECK(g_n_allocs.load() - before >= 2);  // proves the counting works, so the zero below means something
    CHECK(v.size() + static_cast<std::size_t>(m.size()) == 1000 + 4096);
}

TEST_CASE("Cached decode steps allocate nothing once the transformer and the cache are built") {
    const int n_threads_default = omp_get_max_threads();
    // fixed team sizes: with dynamic teams (simulate --threads 0) libgomp may pick a one-thread team on a
    // loaded machine, and it allocates every one-thread team (docs/performance.md)
    const int dynamic_default = omp_get_dynamic();
    omp_set_dynamic(0);
    // every family, GQA and MQA, a sliding window, and a single head (one attention task per step)
    for (const auto& cfg : {tiny_config(Family::llama, 4, 2), tiny_config(Family::gpt2, 3, 3),
                            tiny_config(Family::llama, 4, 1, 2, 6), tiny_config(Family::llama, 1, 1)})
    for (const int n_threads : {n_threads_default, 1, 3}) {
        omp_set_num_threads(n_threads);
        INFO(cfg.name, (cfg.sliding_window ? std::string(" windowed") : std::string()), " threads=", n_threads);
        const Weights w = random_weights(cfg, 5);
        Transformer model(cfg, w, TransformerSize{32, 8, false});
        KvCache cache(cfg, 32);
        StepCost cost;
        const std::vector<TokenId> prompt = {1, 2, 3, 4, 5, 6, 7, 8};
        model.forward_cached(prompt, 0, cache, &cost);  // prefill: Eigen's GEMM may take scratch here
        const long before = g_n_allocs.load();
        TokenId next = 9;
        for (std::int64_t pos = 8; pos < 32; ++pos) {
            const VectorF& logits = model.forward_cached(std::span<const TokenId>(&next, 1), pos, cache, &cost);
            Eigen::Index best = 0;
            logits.maxCoeff(&best);
            next = static_cast<TokenId>(best);
        }
        CHECK(g_n_allocs.load() - before == 0);
    }
    omp_set_num_threads(n_threads_default);
    omp_set_dynamic(dynamic_default);
}

TEST_CASE("Decode steps through a narrow cache and narrow weights allocate nothing either") {
    const int n_threads_default = omp_get_max_threads();
    const int dynamic_default = omp_get_dynamic();
    omp_set_dynamic(0);
    const ModelConfig cfg = tiny_config(Family::llama, 4, 2);
    const Weights w = random_weights(cfg, 5);
    const NarrowWeights nw = narrow_weights(w, DType::bf16);
    for (const DType kv : {DType::fp8_e4m3, DType::fp16})
        for (const int n_threads : {n_threads_default, 1}) {
            omp_set_num_threads(n_threads);
            INFO(dtype_name(kv), " threads=", n_threads);
            Transformer model(cfg, w, TransformerSize{32, 8, false, true}, &nw);
            KvCache cache(cfg, 32, KvStorage{kv, KvScale::token_head});
            StepCost cost;
            const std::vector<TokenId> prompt = {1, 2, 3, 4, 5, 6, 7, 8};
            model.forward_cached(prompt, 0, cache, &cost);
            const long before = g_n_allocs.load();
            TokenId next = 9;
            for (std::int64_t pos = 8; pos < 32; ++pos) model.forward_cached(std::span<const TokenId>(&next, 1), pos, cache, &cost);
            CHECK(g_n_allocs.load() - before == 0);
        }
    omp_set_num_threads(n_threads_default);
    omp_set_dynamic(dynamic_default);
}
