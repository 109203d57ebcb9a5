// Writing a file so that a reader never sees it half-written: a temporary file in the same directory
// (.NAME.tmp-PID-RANDOM), renamed over the target once complete and checked. Only a regular file (or a new
// name) is ever replaced: renaming over a symbolic link or a device node would replace the link or node
// itself, so those are refused. Temporaries are removed on any error and on SIGINT/SIGTERM/SIGHUP
// (interrupt.hpp). Messages name the user's path and flag, never the temporary. Non-goal: fsync durability.
#pragma once
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <string_view>

namespace kvlab {

// Checks, before any work, that `path` can be written later: it is absent or a regular file (not a
// directory, symbolic link, device or FIFO), and its directory exists and takes a new file. Throws
// UsageError naming `flag` and `path`.
void check_output_path(const std::filesystem::path& path, std::string_view flag);

// A temporary file beside `target` (.NAME.tmp-PID-RANDOM plus `suffix`), created empty and exclusively,
// removed when destroyed unless committed, and on a fatal signal.
class TempFile {
public:
    TempFile(const std::filesystem::path& target, std::string_view flag, std::string_view suffix = {});
    ~TempFile();
    TempFile(const TempFile&) = delete;
    TempFile& operator=(const TempFile&) = delete;

    const std::filesystem::path& path() const { return path_; }
    // Renames the temporary over the target, checking first that the target is still absent or a
    // regular file. Throws IoError naming the flag and target.
    void commit();

private:
    std::filesystem::path target_, path_;
    std::string flag_;
    int slot_ = -1;
    bool committed_ = false;
};

// Lets `write` fill a temporary file, then renames it over `path`. Throws IoError naming `flag` and
// `path` when the file cannot be written (a full disk included); on any error no file is left behind
// and the old `path` is untouched.
void write_atomically(const std::filesystem::path& path, std::string_view flag,
                      const std::function<void(std::ostream&)>& write);

}  // namespace kvlab
