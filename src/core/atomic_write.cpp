#include "core/atomic_write.hpp"

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <system_error>
#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/interrupt.hpp"
#include "core/text.hpp"

namespace kvlab {

namespace fs = std::filesystem;

namespace {

// .NAME.tmp-PID-RANDOM plus suffix: a name no earlier run left behind (a run killed with SIGKILL keeps its
// temporary, and PIDs come round again, in containers every run is PID 1)
fs::path temp_path(const fs::path& target, std::string_view suffix) {
    static std::uint64_t counter = 0;
    const auto now = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    std::uint64_t x = now ^ (++counter * 0x9E3779B97F4A7C15ull);  // splitmix64 finaliser
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    return target.parent_path() / fmt::format(".{}.tmp-{}-{:08x}{}", target.filename().string(), ::getpid(),
                                              static_cast<std::uint32_t>(x), suffix);
}

// Why `path` may not be replaced, or empty if it may (absent or a regular file).
std::string not_replaceable(const fs::path& path) {
    std::error_code ec;
    const fs::file_status st = fs::symlink_status(path, ec);
    if (ec || st.type() == fs::file_type::not_found || st.type() == fs::file_type::regular) return {};
    switch (st.type()) {
        case fs::file_type::directory: return "is a directory; expected a file name";
        case fs::file_type::symlink:
            return "is a symbolic link; kvlab replaces files by renaming and would replace the link itself: give the "
                   "link's target instead";
        case fs::file_type::fifo: return "is a FIFO; expected a regular file";
        default: return "is a device or special file; expected a regular file";
    }
}

}  // namespace

void check_output_path(const fs::path& path, std::string_view flag) {
    if (path.empty() || !path.has_filename())
        throw UsageError(fmt::format("{}: {} is not a file name", flag, quote(path.string())));
    if (const std::string why = not_replaceable(path); !why.empty())
        throw UsageError(fmt::format("{}: {} {}", flag, quote(path.string()), why));
    const fs::path dir = path.parent_path().empty() ? fs::path(".") : path.parent_path();
    std::error_code ec;
    if (!fs::is_directory(dir, ec))
        throw UsageError(fmt::format("{}: cannot write {}: directory {} does not exist", flag, quote(path.string()),
                                     quote(dir.string())));
    try {
        const TempFile probe(path, flag, ".probe");  // created and removed: the directory takes a new file
    } catch (const IoError& e) {
        throw UsageError(e.what());
    }
}

TempFile::TempFile(const fs::path& target, std::string_view flag, std::string_view suffix) : target_(target), flag_(flag) {
    for (int attempt = 0;; ++attempt) {
        path_ = temp_path(target, suffix);
        slot_ = register_temp_file(path_);  // before it exists: a signal between open and register leaves nothing
        const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0) {
            ::close(fd);
            return;
        }
        const int err = errno;
        unregister_temp_file(slot_);
        if (err != EEXIST || attempt == 16)
            throw IoError(fmt::format("{}: cannot write {}: {}", flag_, quote(target_.string()), std::strerror(err)));
    }
}

TempFile::~TempFile() {
    if (!committed_) ::unlink(path_.c_str());
    unregister_temp_file(slot_);
}

void TempFile::commit() {
    if (const std::string why = not_replaceable(target_); !why.empty())
        throw IoError(fmt::format("{}: {} {}", flag_, quote(target_.string()), why));
    if (::rename(path_.c_str(), target_.c_str()) != 0) {
        const int err = errno;
        throw IoError(fmt::format("{}: cannot replace {}: {}", flag_, quote(target_.string()), std::strerror(err)));
    }
    committed_ = true;
}

void write_atomically(const fs::path& path, std::string_view flag, const std::function<void(std::ostream&)>& write) {
    TempFile temp(path, flag);
    {
        std::ofstream out(temp.path(), std::ios::binary | std::ios::trunc);
        if (!out) {
            const int err = errno;
            throw IoError(fmt::format("{}: cannot write {}: {}", flag, quote(path.string()), std::strerror(err)));
        }
        write(out);
        out.flush();
        int err = out ? 0 : errno;
        out.close();  // a full disk may show only now
        if (!out) {
            if (err == 0) err = errno;
            throw IoError(fmt::format("{}: writing {} failed: {}", flag, quote(path.string()),
                                      err ? std::strerror(err) : "the stream reported an error"));
        }
    }
    temp.commit();
}

}  // namespace kvlab
