// Ctrl-C and kill: what kvlab leaves behind. Temporary files registered here are removed before the
// process dies of SIGINT, SIGTERM or SIGHUP, so an interrupted write leaves the old file as it was and no
// .tmp file beside it. A command that can stop cleanly (simulate: finish the step, report, write the
// partial trace) holds a StopOnInterrupt: the first SIGINT then sets its flag, a second one kills.
// Only async-signal-safe calls (unlink, signal, raise) run in the handler.
#pragma once
#include <atomic>
#include <filesystem>

namespace kvlab {

// Installs the handlers; main() calls it once before running a command. Signals the process was
// started with ignored (nohup: SIGHUP; background jobs of a script: SIGINT) stay ignored.
void install_interrupt_handlers();

// Registers `path` for removal on a fatal signal; returns a slot for unregister_temp_file. Throws
// IoError if the path is too long to register or all slots are taken.
int register_temp_file(const std::filesystem::path& path);
void unregister_temp_file(int slot) noexcept;

// While one exists, the first SIGINT sets `flag` (and prints nothing); the next SIGINT, or SIGTERM,
// removes the temporary files and kills the process.
class StopOnInterrupt {
public:
    explicit StopOnInterrupt(std::atomic<bool>& flag);
    ~StopOnInterrupt();
    StopOnInterrupt(const StopOnInterrupt&) = delete;
    StopOnInterrupt& operator=(const StopOnInterrupt&) = delete;
};

}  // namespace kvlab
