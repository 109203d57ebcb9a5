// Input files: a whole file mapped read-only into memory, so readers index its bytes and check every
// range against size_bytes() before touching it; or a small text file read whole. Either way only a
// regular file is read (not a directory, FIFO or device such as /dev/zero), and a file that is missing or
// unreadable is an input error (exit code 2) naming the path. Non-goal: files that change while read.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvlab {

class MappedFile {
public:
    // Throws InputError when the file cannot be opened or is not a regular file, IoError when it cannot be mapped.
    explicit MappedFile(const std::filesystem::path& path, std::string_view what = "file");
    ~MappedFile();
    MappedFile(MappedFile&& other) noexcept;
    MappedFile& operator=(MappedFile&& other) noexcept;
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    std::span<const std::byte> bytes() const { return {static_cast<const std::byte*>(data_), size_bytes_}; }
    std::uint64_t size_bytes() const { return size_bytes_; }
    const std::filesystem::path& path() const { return path_; }
    // Gives back the resident pages of bytes [offset, offset + n) once they are copied out, so a loader's
    // peak memory is the weights it builds, not weights + file. The bytes stay readable (the kernel maps
    // them again from the file on the next access). Only whole pages inside the range are dropped.
    void drop_pages(std::uint64_t offset, std::uint64_t n) const noexcept;
    // f(done, chunk) over bytes [offset, offset + n) in order, 1 MiB spans at a time (`done` bytes before
    // each), dropping each span's pages once f has read it (from `offset`, so no page straddling two spans
    // stays resident). The range must lie inside the file (callers check it first).
    template <typename ChunkFn>
    void consume(std::uint64_t offset, std::uint64_t n, ChunkFn f) const {
        constexpr std::uint64_t chunk = 1 << 20;
        for (std::uint64_t done = 0; done < n; done += chunk) {
            const std::uint64_t n_chunk = std::min(chunk, n - done);
            f(done, bytes().subspan(offset + done, n_chunk));
            drop_pages(offset, done + n_chunk);
        }
    }

private:
    void release() noexcept;

    std::filesystem::path path_;
    void* data_ = nullptr;  // nullptr for an empty file (mmap cannot map 0 bytes)
    std::uint64_t size_bytes_ = 0;
};

// A span of a file to copy into memory: `bytes` bytes from `offset` to `dst`.
struct FileCopy {
    std::uint64_t offset = 0;
    std::uint64_t bytes = 0;
    std::byte* dst = nullptr;
};

// Copies each span of the file at `path` with pread: the kernel copies from its page cache, nothing of the
// file is mapped into this process (none of it counts as resident here) and no page fault is taken on the
// source. The spans must lie inside the file (callers check them against its size first). Throws
// InputError when the file cannot be opened, IoError naming it when a read fails or comes up short.
void copy_file_ranges(const std::filesystem::path& path, std::span<const FileCopy> copies, std::string_view what);

// The copies cut into `parts` lists of (nearly) equal bytes, for that many threads to copy at once: the
// bytes in order, the first list taking the first total/parts of them, a copy that straddles a cut split
// there. Fewer lists when there are fewer bytes than parts; none when there are no bytes.
std::vector<std::vector<FileCopy>> split_copies(std::span<const FileCopy> copies, int parts);

// The whole of a regular file as text. `what` names the file's role in messages ("config file", "trace
// file"); a file over `max_bytes` is refused before anything is read.
std::string read_input_file(const std::filesystem::path& path, std::string_view what, std::uint64_t max_bytes);
// Its first `n` bytes (fewer if the file is shorter): to tell what a file is before reading all of it.
std::string read_input_head(const std::filesystem::path& path, std::string_view what, std::size_t n);

}  // namespace kvlab
