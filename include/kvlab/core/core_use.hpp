// How many cores a run's threads really had: process CPU time against wall time over a span. A team of
// OpenMP threads that waits for one another spins while it waits, so when other programs hold the
// cores (or there are fewer cores than threads) each wait can last a scheduler time slice, and a run
// slows many-fold (docs/performance.md, "Threads on a busy machine"). The reports say so instead of leaving the
// times unexplained.
#pragma once
#include <cstdint>
#include <string>

namespace kvlab {

struct CoreUse {
    std::int64_t wall_ns = 0;  // steady clock over the span
    std::int64_t cpu_ns = 0;   // the process's CPU time over it, all threads (user + system)
    double cores() const { return wall_ns > 0 ? static_cast<double>(cpu_ns) / static_cast<double>(wall_ns) : 0.0; }
};

// Started at construction; elapsed() is the span so far.
class CoreUseClock {
public:
    CoreUseClock();
    CoreUse elapsed() const;

private:
    std::int64_t wall0_ns_, cpu0_ns_;
};

// The note for a fixed team of `threads` whose waits spin (`waits_spin`) and that ran on well under that
// many cores (under 3/4 of them, over at least 100 ms of wall time); empty otherwise: for a team OpenMP
// sizes itself (`dynamic_team`, --threads 0), which may shrink on purpose, and for threads that sleep
// while they wait (OMP_WAIT_POLICY=passive), whose CPU time falls short by design. `cpus`: the CPUs
// this process may run on.
std::string core_use_note(const CoreUse& use, int threads, bool dynamic_team, bool waits_spin, int cpus);

}  // namespace kvlab
