#include "kvlab/formats/npy.hpp"

#include <bit>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "core/atomic_write.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/core/text.hpp"

namespace kvlab {

static_assert(std::endian::native == std::endian::little, "'<f4' rows are written as the CPU holds them");

std::string npy_preamble(std::uint64_t n_rows, std::uint64_t n_cols, std::size_t min_bytes) {
    // version 1.0: 6 bytes of magic, 2 of version, 2 of header length, then the header (its '\n' included)
    constexpr std::size_t fixed = 10;
    std::string dict = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}", n_rows, n_cols);
    std::size_t total = fixed + dict.size() + 1;
    total = std::max(total, min_bytes);
    total = (total + 63) / 64 * 64;
    if (total - fixed > 65535) throw UsageError("npy: the header does not fit version 1.0's 2-byte length");
    dict.append(total - fixed - dict.size() - 1, ' ');
    dict += '\n';
    const auto header_len = static_cast<std::uint16_t>(dict.size());
    std::string out = "\x93NUMPY";
    out += '\x01';
    out += '\x00';
    out += static_cast<char>(header_len & 0xFF);
    out += static_cast<char>(header_len >> 8);
    return out + dict;
}

struct NpyRowWriter::Temp {
    TempFile file;
};

NpyRowWriter::NpyRowWriter(const std::filesystem::path& path, std::string_view flag, std::uint64_t max_rows, std::uint64_t n_cols)
    : temp_(new Temp{TempFile(path, flag)}), path_(path), flag_(flag), max_rows_(max_rows), n_cols_(n_cols) {
    out_.open(temp_->file.path(), std::ios::binary | std::ios::trunc);
    const std::string preamble = npy_preamble(max_rows, n_cols);
    preamble_bytes_ = preamble.size();
    out_.write(preamble.data(), static_cast<std::streamsize>(preamble.size()));
    if (!out_) throw IoError(fmt::format("{}: cannot write {}: {}", flag_, quote(path_.string()), std::strerror(errno)));
}

NpyRowWriter::~NpyRowWriter() = default;

void NpyRowWriter::add_row(std::span<const float> row) {
    if (row.size() != n_cols_ || n_rows_ >= max_rows_)
        throw UsageError(fmt::format("{}: row {} of {} values; expected at most {} rows of {}", flag_, n_rows_, row.size(), max_rows_, n_cols_));
    out_.write(reinterpret_cast<const char*>(row.data()), static_cast<std::streamsize>(row.size_bytes()));
    ++n_rows_;
}

void NpyRowWriter::finish() {
    // the shape says the rows written; padded to the first preamble's length, so the data stays put
    const std::string preamble = npy_preamble(n_rows_, n_cols_, preamble_bytes_);
    out_.seekp(0);
    out_.write(preamble.data(), static_cast<std::streamsize>(preamble.size()));
    out_.close();
    if (!out_ || preamble.size() != preamble_bytes_)
        throw IoError(fmt::format("{}: writing {} failed: {}", flag_, quote(path_.string()), std::strerror(errno)));
    temp_->file.commit();
}

}  // namespace kvlab
