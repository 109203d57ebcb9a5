#include "session/model_source.hpp"

#include <cstdlib>
#include <strings.h>  // strcasecmp
#include <unistd.h>

#include <Eigen/Core>
#include <fmt/format.h>
#include <omp.h>

#include "kvlab/calc/presets.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/core/text.hpp"
#include "kvlab/core/units.hpp"
#include "kvlab/formats/checkpoint.hpp"
#include "kvlab/weights/random_weights.hpp"

namespace kvlab {

ModelConfig resolve_model(ModelSource& src) {
    if (!src.checkpoint.empty()) return load_checkpoint_config(src.checkpoint);
    if (!src.config.empty()) return load_model_config(src.config);
    const ModelConfig preset = load_model(src.model);
    if (preset.checkpoint.empty()) return preset;
    src.checkpoint = preset.checkpoint.string();
    if (src.tokenizer.empty()) src.tokenizer = preset.tokenizer.string();
    ModelConfig real = load_checkpoint_config(src.checkpoint);
    real.name = preset.name;
    real.display_name = preset.display_name;
    return real;
}

Weights load_model_weights(const ModelSource& src, const ModelConfig& cfg, std::uint64_t seed, WeightPlacement placement) {
    if (src.checkpoint.empty()) return random_weights(cfg, seed);
    return load_checkpoint(src.checkpoint, cfg.n_layer, placement).weights;  // --layers: only the first N are read
}

namespace {

std::uint64_t physical_memory() {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) : 0;
}

}  // namespace

std::uint64_t default_max_memory() { return physical_memory() / 4 * 3; }

std::uint64_t max_memory_allowed(const std::string& text, bool force) {
    if (text.empty()) return default_max_memory();
    const std::uint64_t limit = parse_size(text, "--max-memory");
    if (const std::uint64_t physical = physical_memory(); !force && physical > 0 && limit > physical)
        throw UsageError(fmt::format("--max-memory: {} ({}) is more than this machine's {} of physical memory; a run that needs "
                                     "it would swap or be killed part-way: give at most that, or add --force-memory",
                                     quote(text), format_bytes(limit, UnitSystem::iec), format_bytes(physical, UnitSystem::iec)));
    return limit;
}

void set_thread_count(int threads, bool deterministic) {
    if (threads < 0) throw UsageError(fmt::format("--threads: {}; expected 0 (all cores) or more", threads));
    if (threads > 0) {
        omp_set_num_threads(threads);
        Eigen::setNbThreads(threads);
    }
    // --threads 0: all cores, but fewer when the machine is busy: libgomp then sizes teams by the load
    // average, which avoids the many-fold slowdown of spinning threads on an oversubscribed machine.
    // --deterministic too: no output depends on the team's size (every row and head is summed the same way
    // whatever thread takes it, kernels/threads.hpp), so a fixed team bought nothing but that slowdown
    // (6.5x on a 2-core machine at load 10, docs/cli-simulate.md). Set either way, so that a process
    // running several sessions (the benches) does not keep an earlier one's dynamic teams.
    (void)deterministic;
    omp_set_dynamic(threads == 0 ? 1 : 0);
}

std::string thread_use_note(const CoreUse& use) {
    // libgomp spins unless told to sleep (OMP_WAIT_POLICY=passive) or given a short spin count (a waiting
    // thread then sleeps after a few µs, and its CPU time falls short of the wall time by design)
    const char* policy = std::getenv("OMP_WAIT_POLICY");
    const char* spin = std::getenv("GOMP_SPINCOUNT");
    char* end = nullptr;
    const unsigned long long count = spin ? std::strtoull(spin, &end, 10) : 0;
    const bool short_spin = spin && end != spin && *end == '\0' && count < 100000;
    const bool waits_spin = !(policy && strcasecmp(policy, "passive") == 0) && !short_spin;
    return core_use_note(use, omp_get_max_threads(), omp_get_dynamic() != 0, waits_spin, omp_get_num_procs());
}

}  // namespace kvlab
