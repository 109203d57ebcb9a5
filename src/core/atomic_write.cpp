#include "core/atomic_write.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <streambuf>
#include <vector>
#include <system_error>
#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include "kvlab/core/error.hpp"
#include "core/file_roles.hpp"
#include "core/interrupt.hpp"
#include "kvlab/core/text.hpp"

namespace kvlab {

namespace fs = std::filesystem;

namespace {

// .NAME.tmp-PID-RANDOM plus suffix: a name no earlier run left behind (a run killed with SIGKILL keeps its
// temporary, and PIDs come round again, in containers every run is PID 1). NAME is the target's name
// cut to its first 40 bytes, so the temporary's name is at most 1 + 40 + 5 + 10 + 1 + 8 + 6 = 71 bytes
// and any legal target name (up to NAME_MAX, 255 bytes) has a temporary that fits beside it.
fs::path temp_path(const fs::path& target, std::string_view suffix) {
    constexpr std::size_t name_bytes = 40;
    static std::uint64_t counter = 0;
    const auto now = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    std::uint64_t x = now ^ (++counter * 0x9E3779B97F4A7C15ull);  // splitmix64 finaliser
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    return target.parent_path() / fmt::format(".{}.tmp-{}-{:08x}{}", target.filename().string().substr(0, name_bytes), ::getpid(),
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
    refuse_if_input(path, flag);
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
    refuse_if_input(target_, flag_);  // a file read since the path was checked (a model's shipped weights)
    if (::rename(path_.c_str(), target_.c_str()) != 0) {
        const int err = errno;
        throw IoError(fmt::format("{}: cannot replace {}: {}", flag_, quote(target_.string()), std::strerror(err)));
    }
    committed_ = true;
}

namespace {

// Hands a file its bytes in whole, aligned pieces of 2 MiB (the last one shorter), one write() each. The
// page cache then holds the file in 2 MiB folios, which a reader that maps it (kvlab reading a checkpoint
// in place, llama2.c's run.c) maps with one fault per 2 MiB instead of one per 64 KiB (docs/performance.md,
// "Checkpoints are read in place", has what that saves).
// The stream it writes to must be unbuffered, so each piece reaches the file as one write().
class AlignedPieces : public std::streambuf {
public:
    static constexpr std::size_t piece = std::size_t{2} << 20;
    explicit AlignedPieces(std::ostream& file) : file_(file), buf_(piece) { setp(buf_.data(), buf_.data() + buf_.size()); }
    // Writes what is held; false when the file refused it.
    bool drain() {
        const std::ptrdiff_t n = pptr() - pbase();
        if (n > 0) file_.write(pbase(), n);
        setp(buf_.data(), buf_.data() + buf_.size());
        return static_cast<bool>(file_);
    }

protected:
    int_type overflow(int_type c) override {
        if (!drain()) return traits_type::eof();
        if (!traits_type::eq_int_type(c, traits_type::eof())) {
            *pptr() = traits_type::to_char_type(c);
            pbump(1);
        }
        return traits_type::not_eof(c);
    }
    std::streamsize xsputn(const char* s, std::streamsize n) override {
        std::streamsize done = 0;
        while (done < n) {
            if (pptr() == epptr() && !drain()) break;
            const std::streamsize k = std::min<std::streamsize>(n - done, epptr() - pptr());
            std::memcpy(pptr(), s + done, static_cast<std::size_t>(k));
            pbump(static_cast<int>(k));  // k <= 2 MiB
            done += k;
        }
        return done;
    }
    int sync() override { return drain() ? 0 : -1; }

private:
    std::ostream& file_;
    std::vector<char> buf_;
};

}  // namespace

void write_atomically(const fs::path& path, std::string_view flag, const std::function<void(std::ostream&)>& write) {
    TempFile temp(path, flag);
    {
        std::ofstream out;
        out.rdbuf()->pubsetbuf(nullptr, 0);  // unbuffered: AlignedPieces hands it whole pieces
        out.open(temp.path(), std::ios::binary | std::ios::trunc);
        if (!out) {
            const int err = errno;
            throw IoError(fmt::format("{}: cannot write {}: {}", flag, quote(path.string()), std::strerror(err)));
        }
        AlignedPieces pieces(out);
        std::ostream staged(&pieces);
        write(staged);
        staged.flush();
        if (!staged) out.setstate(std::ios::badbit);
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
