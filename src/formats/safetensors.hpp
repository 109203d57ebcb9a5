// Reader for one safetensors file: an 8-byte little-endian header length, a JSON header of
// {name: {dtype, shape, data_offsets}}, then the tensor bytes. Non-goal: writing; dtypes other than F32/F16/BF16 as data.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kvlab/core/mapped_file.hpp"
#include "kvlab/weights/weights.hpp"

namespace kvlab {

struct SafetensorsTensor {
    std::string name;
    std::string dtype;                // as written: "F32", "F16", "BF16", "I64", ...
    std::vector<std::int64_t> shape;  // row-major; [] is a scalar
    std::uint64_t begin_bytes = 0;    // absolute offsets in the file (data_offsets + 8 + header length)
    std::uint64_t end_bytes = 0;
};

class SafetensorsFile {
public:
    // Maps the file and validates the whole header before any tensor is read: JSON well formed,
    // every dtype known, byte span == product(shape) x dtype size, spans inside the file and not
    // overlapping. Throws FormatError naming the file (and tensor); IoError if unreadable.
    explicit SafetensorsFile(const std::filesystem::path& path);

    const std::filesystem::path& path() const { return file_->path(); }
    // The mapping, for views into it that outlive this reader (Weights::mapped).
    const std::shared_ptr<const MappedFile>& mapping() const { return file_; }
    const std::map<std::string, SafetensorsTensor>& tensors() const { return tensors_; }
    const SafetensorsTensor* find(const std::string& name) const;  // nullptr when absent

    // Reads an F32, F16 or BF16 tensor as fp32 after checking its shape is exactly `shape`.
    // Throws FormatError for a missing tensor, another shape or another dtype.
    MatrixRM read_matrix(const std::string& name, std::int64_t rows, std::int64_t cols) const;  // (rows, cols)
    // Where an F32 matrix of exactly (rows, cols) starts in the file (its first byte's offset), for a
    // loader to copy its bytes as they are (copy_file_ranges); nullopt for another dtype (read_matrix then).
    // Throws FormatError for a missing tensor or another shape.
    std::optional<std::uint64_t> f32_offset(const std::string& name, std::int64_t rows, std::int64_t cols) const;
    VectorF read_vector(const std::string& name, std::int64_t n) const;                       // (n)

private:
    const SafetensorsTensor& require(const std::string& name, const std::vector<std::int64_t>& shape) const;
    void read_f32(const SafetensorsTensor& tensor, float* out) const;

    std::shared_ptr<const MappedFile> file_;
    std::map<std::string, SafetensorsTensor> tensors_;
};

// Bytes per value of a safetensors dtype name; 0 when the name is not a safetensors dtype.
std::uint64_t safetensors_dtype_bytes(const std::string& dtype);

}  // namespace kvlab
