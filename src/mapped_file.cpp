#include "kvlab/mapped_file.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "kvlab/error.hpp"

namespace kvlab {

MappedFile::MappedFile(const std::filesystem::path& path) : path_(path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw IoError(fmt::format("{}: cannot open: {}", path.string(), std::strerror(errno)));
    struct stat info {};
    if (::fstat(fd, &info) != 0) {
        const int err = errno;
        ::close(fd);
        throw IoError(fmt::format("{}: cannot stat: {}", path.string(), std::strerror(err)));
    }
    if (!S_ISREG(info.st_mode)) {
        ::close(fd);
        throw IoError(fmt::format("{}: not a regular file", path.string()));
    }
    size_bytes_ = static_cast<std::uint64_t>(info.st_size);
    if (size_bytes_ > 0) {
        void* data = ::mmap(nullptr, size_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (data == MAP_FAILED) {
            const int err = errno;
            ::close(fd);
            throw IoError(fmt::format("{}: cannot map {} bytes: {}", path.string(), size_bytes_, std::strerror(err)));
        }
        data_ = data;
    }
    ::close(fd);  // the mapping keeps the file alive
}

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
