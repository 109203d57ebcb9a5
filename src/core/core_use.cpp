#include "kvlab/core/core_use.hpp"

#include <ctime>

#include <fmt/format.h>

namespace kvlab {

namespace {

std::int64_t clock_ns(clockid_t id) {
    timespec ts{};
    clock_gettime(id, &ts);
    return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace

CoreUseClock::CoreUseClock() : wall0_ns_(clock_ns(CLOCK_MONOTONIC)), cpu0_ns_(clock_ns(CLOCK_PROCESS_CPUTIME_ID)) {}

CoreUse CoreUseClock::elapsed() const {
    return {clock_ns(CLOCK_MONOTONIC) - wall0_ns_, clock_ns(CLOCK_PROCESS_CPUTIME_ID) - cpu0_ns_};
}

std::string core_use_note(const CoreUse& use, int threads, bool dynamic_team, bool waits_spin, int cpus) {
    constexpr std::int64_t shortest_ns = 100'000'000;  // shorter runs: thread start-up weighs too much
    if (dynamic_team || !waits_spin || threads < 2 || use.wall_ns < shortest_ns || use.cores() >= 0.75 * threads) return "";
    const std::string why = threads > cpus ? fmt::format("this process may run on {} CPUs, fewer than the threads", cpus)
                                           : "other programs were using the cores";
    return fmt::format("{} threads ran on {:.2f} cores on average (CPU time / wall time over the steps): {}, and a thread that "
                       "waits for another spins, so the times above can be many times slower than this machine runs; "
                       "--threads 0 sizes the team by the load, or set OMP_WAIT_POLICY=passive",
                       threads, use.cores(), why);
}

}  // namespace kvlab
