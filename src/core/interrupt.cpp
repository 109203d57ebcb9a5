#include "core/interrupt.hpp"

#include <array>
#include <climits>
#include <csignal>
#include <cstring>
#include <unistd.h>

#include <fmt/format.h>

#include "kvlab/core/error.hpp"
#include "kvlab/core/text.hpp"

namespace kvlab {

namespace {

// Fixed storage the handler can read without allocating: a slot's path is written before `used` is set.
struct Slot {
    std::atomic<bool> used{false};
    char path[PATH_MAX + 1] = {};
};
constexpr int n_slots = 16;  // a command holds at most a handful of temporaries at once (trace plot: 4)
std::array<Slot, n_slots> g_slots;
std::atomic<std::atomic<bool>*> g_stop_flag{nullptr};
static_assert(std::atomic<std::atomic<bool>*>::is_always_lock_free && std::atomic<bool>::is_always_lock_free,
              "the signal handler needs lock-free atomics");

extern "C" void on_fatal_signal(int sig) {
    if (sig == SIGINT) {
        if (std::atomic<bool>* flag = g_stop_flag.exchange(nullptr)) {  // first Ctrl-C of a stoppable command
            flag->store(true);
            return;
        }
    }
    for (auto& slot : g_slots)
        if (slot.used.load()) ::unlink(slot.path);
    std::signal(sig, SIG_DFL);
    std::raise(sig);  // die of the signal, so the shell sees it (exit status 128 + sig)
}

}  // namespace

void install_interrupt_handlers() {
    for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
        // a signal the parent ignores stays ignored (nohup ignores SIGHUP; a shell's background jobs, SIGINT)
        struct sigaction old {};
        if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
        struct sigaction action {};
        action.sa_handler = on_fatal_signal;
        sigemptyset(&action.sa_mask);
        for (const int other : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&action.sa_mask, other);  // one handler at a time
        action.sa_flags = SA_RESTART;
        ::sigaction(sig, &action, nullptr);
    }
}

int register_temp_file(const std::filesystem::path& path) {
    const std::string& text = path.native();
    if (text.size() > PATH_MAX)
        throw IoError(fmt::format("{}: path too long ({} bytes; the limit is {})", quote(text), text.size(), PATH_MAX));
    for (int i = 0; i < n_slots; ++i) {
        Slot& slot = g_slots[static_cast<std::size_t>(i)];
        if (slot.used.load()) continue;
        std::memcpy(slot.path, text.c_str(), text.size() + 1);
        slot.used.store(true);
        return i;
    }
    throw IoError(fmt::format("{}: too many temporary files open at once ({})", quote(text), n_slots));
}

void unregister_temp_file(int slot) noexcept {
    if (slot >= 0 && slot < n_slots) g_slots[static_cast<std::size_t>(slot)].used.store(false);
}

StopOnInterrupt::StopOnInterrupt(std::atomic<bool>& flag) { g_stop_flag.store(&flag); }
StopOnInterrupt::~StopOnInterrupt() { g_stop_flag.store(nullptr); }

}  // namespace kvlab
