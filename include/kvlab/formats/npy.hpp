// NumPy .npy files of float32 rows (format version 1.0, numpy/lib/format.py and NEP 1): simulate --logits
// writes one row per step as the run produces them. Non-goals: reading, other dtypes, Fortran order.
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace kvlab {

// The .npy preamble for a C-order little-endian float32 array of (n_rows, n_cols): the magic "\x93NUMPY",
// version 1.0, the header length (uint16, little-endian), and the header dict
// "{'descr': '<f4', 'fortran_order': False, 'shape': (n_rows, n_cols), }" padded with spaces and ended
// by '\n' so that the data starts on a multiple of 64 bytes. `min_bytes` pads it further to at least
// that many bytes in all (so that a header rewritten with fewer rows keeps the data where it was).
std::string npy_preamble(std::uint64_t n_rows, std::uint64_t n_cols, std::size_t min_bytes = 0);

// Rows of n_cols float32 into `path`, atomically: a temporary file beside it gets a preamble for
// `max_rows`, then each row; finish() rewrites the preamble with the rows written (Ctrl-C may stop a run
// early) and renames the file over `path`. Without finish() the temporary is removed. IoError names `flag`.
class NpyRowWriter {
public:
    NpyRowWriter(const std::filesystem::path& path, std::string_view flag, std::uint64_t max_rows, std::uint64_t n_cols);
    ~NpyRowWriter();
    NpyRowWriter(const NpyRowWriter&) = delete;
    NpyRowWriter& operator=(const NpyRowWriter&) = delete;

    void add_row(std::span<const float> row);  // throws UsageError for a row of another width or past max_rows
    void finish();
    std::uint64_t n_rows() const { return n_rows_; }

private:
    struct Temp;
    std::unique_ptr<Temp> temp_;
    std::filesystem::path path_;
    std::string flag_;
    std::ofstream out_;
    std::uint64_t max_rows_, n_cols_, n_rows_ = 0;
    std::size_t preamble_bytes_ = 0;
};

}  // namespace kvlab
