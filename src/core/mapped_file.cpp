#include "kvlab/core/mapped_file.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "kvlab/core/error.hpp"
#include "core/file_roles.hpp"
#include "kvlab/core/huge_pages.hpp"
#include "kvlab/core/text.hpp"

namespace kvlab {

namespace {

// An open descriptor of a regular file, with its size; closes itself.
struct InputFd {
    int fd = -1;
    std::uint64_t size = 0;
    InputFd(const std::filesystem::path& path, std::string_view what) {
        fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // O_NONBLOCK: a FIFO must not hang the open
        if (fd < 0)
            throw InputError(fmt::format("{}: cannot open the {}: {}", quote(path.string()), what, std::strerror(errno)));
        struct stat info {};
        if (::fstat(fd, &info) != 0) {
            const int err = errno;
            ::close(fd);
            throw InputError(fmt::format("{}: cannot stat the {}: {}", quote(path.string()), what, std::strerror(err)));
        }
        if (!S_ISREG(info.st_mode)) {
            ::close(fd);
            const char* kind = S_ISDIR(info.st_mode) ? "a directory" : S_ISFIFO(info.st_mode) ? "a pipe" : "a device or special file";
            throw InputError(fmt::format("{}: is {}; expected a regular {}", quote(path.string()), kind, what));
        }
        size = static_cast<std::uint64_t>(info.st_size);
        note_input(path, what, static_cast<unsigned long long>(info.st_dev), static_cast<unsigned long long>(info.st_ino));
    }
    ~InputFd() { ::close(fd); }
    InputFd(const InputFd&) = delete;
    InputFd& operator=(const InputFd&) = delete;
};

}  // namespace

std::string read_input_file(const std::filesystem::path& path, std::string_view what, std::uint64_t max_bytes) {
    const InputFd in(path, what);
    if (in.size > max_bytes)
        throw InputError(fmt::format("{}: the {} is {} bytes; kvlab reads at most {} bytes of it", quote(path.string()), what,
                                     in.size, max_bytes));
    std::string text(static_cast<std::size_t>(in.size), '\0');
    std::size_t done = 0;
    while (done < text.size()) {
        const ssize_t n = ::read(in.fd, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw IoError(fmt::format("{}: reading the {} failed: {}", quote(path.string()), what, std::strerror(errno)));
        if (n == 0) break;  // the file shrank while read
        done += static_cast<std::size_t>(n);
    }
    text.resize(done);
    return text;
}

std::string read_input_head(const std::filesystem::path& path, std::string_view what, std::size_t n) {
    const InputFd in(path, what);
    std::string head(static_cast<std::size_t>(std::min<std::uint64_t>(n, in.size)), '\0');
    std::size_t done = 0;
    while (done < head.size()) {
        const ssize_t got = ::read(in.fd, head.data() + done, head.size() - done);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) throw IoError(fmt::format("{}: reading the {} failed: {}", quote(path.string()), what, std::strerror(errno)));
        if (got == 0) break;
        done += static_cast<std::size_t>(got);
    }
    head.resize(done);
    return head;
}

void copy_file_ranges(const std::filesystem::path& path, std::span<const FileCopy> copies, std::string_view what) {
    const InputFd in(path, what);
    for (const FileCopy& c : copies) {
        std::uint64_t done = 0;
        while (done < c.bytes) {
            const std::uint64_t want = std::min<std::uint64_t>(c.bytes - done, std::uint64_t{1} << 30);  // pread's limit is below 2 GiB
            const ssize_t got = ::pread(in.fd, c.dst + done, static_cast<std::size_t>(want), static_cast<off_t>(c.offset + done));
            if (got < 0 && errno == EINTR) continue;
            if (got < 0)
                throw IoError(fmt::format("{}: reading {} bytes of the {} at offset {} failed: {}", quote(path.string()), c.bytes, what,
                                          c.offset, std::strerror(errno)));
            if (got == 0)
                throw IoError(fmt::format("{}: the {} ended at offset {} while {} bytes from offset {} were read; expected a file "
                                          "that does not change while kvlab reads it", quote(path.string()), what, c.offset + done,
                                          c.bytes, c.offset));
            done += static_cast<std::uint64_t>(got);
        }
    }
}

std::vector<std::vector<FileCopy>> split_copies(std::span<const FileCopy> copies, int parts) {
    std::uint64_t total = 0;
    for (const FileCopy& c : copies) total += c.bytes;  // the spans lie in one file: no overflow
    const auto n = std::min<std::uint64_t>(static_cast<std::uint64_t>(std::max(parts, 1)), total);
    std::vector<std::vector<FileCopy>> out(static_cast<std::size_t>(n));
    std::uint64_t at = 0;  // bytes given out so far
    std::size_t part = 0;
    for (FileCopy c : copies)
        while (c.bytes > 0) {
            const std::uint64_t end = total / n * (part + 1) + (part + 1 == n ? total % n : 0);  // this part's last byte + 1
            const std::uint64_t take = std::min(c.bytes, end - at);
            out[part].push_back({c.offset, take, c.dst});
            c.offset += take, c.bytes -= take, c.dst += take, at += take;
            if (at == end) ++part;
        }
    return out;
}

MappedFile::MappedFile(const std::filesystem::path& path, std::string_view what) : path_(path) {
    const InputFd in(path, what);
    const int fd = in.fd;
    size_bytes_ = in.size;
    if (size_bytes_ == 0) return;
    // A file of a huge page or more starts on a huge-page boundary, with MADV_HUGEPAGE: where the page cache
    // holds it in 2 MiB folios the kernel then maps each with one entry (FilePmdMapped), as fast to read as
    // memory of huge pages (docs/performance.md, "Checkpoints are read in place"). A reservation
    // one huge page longer is cut down to the aligned span (keep_huge_aligned), which the file is then mapped over.
    if (size_bytes_ >= huge_page_bytes && size_bytes_ <= SIZE_MAX - huge_page_bytes) {
        std::size_t reserved = static_cast<std::size_t>(size_bytes_) + huge_page_bytes;
        void* r = ::mmap(nullptr, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (r != MAP_FAILED) {
            std::byte* at = keep_huge_aligned(r, reserved, static_cast<std::size_t>(size_bytes_));
            void* data = ::mmap(at, size_bytes_, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
            if (data == MAP_FAILED) {
                const int err = errno;
                ::munmap(r, reserved);
                throw IoError(fmt::format("{}: cannot map {} bytes: {}", quote(path.string()), size_bytes_, std::strerror(err)));
            }
            advise_huge_pages(data, static_cast<std::size_t>(size_bytes_));
            data_ = data;
            return;
        }
    }
    void* data = ::mmap(nullptr, size_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (data == MAP_FAILED)
        throw IoError(fmt::format("{}: cannot map {} bytes: {}", quote(path.string()), size_bytes_, std::strerror(errno)));
    data_ = data;
}  // the mapping keeps the file alive once the descriptor closes

MappedFile::~MappedFile() { release(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_bytes_(std::exchange(other.size_bytes_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
    if (this != &other) {
        release();
        path_ = std::move(other.path_);
        data_ = std::exchange(other.data_, nullptr);
        size_bytes_ = std::exchange(other.size_bytes_, 0);
    }
    return *this;
}

void MappedFile::drop_pages(std::uint64_t offset, std::uint64_t n) const noexcept {
    if (data_ == nullptr || offset >= size_bytes_) return;
    const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
    const std::uint64_t end = std::min(size_bytes_, offset + std::min(n, size_bytes_ - offset));
    const std::uint64_t first = (offset + page - 1) / page * page, last = end / page * page;  // whole pages inside
    if (last > first) ::madvise(static_cast<std::byte*>(data_) + first, last - first, MADV_DONTNEED);
}

void MappedFile::release() noexcept {
    if (data_ != nullptr) ::munmap(data_, size_bytes_);
    data_ = nullptr;
    size_bytes_ = 0;
}

}  // namespace kvlab
