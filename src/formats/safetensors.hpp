// Reader for one safetensors file: an 8-byte little-endian header length, a JSON header of
// {name: {dtype, shape, data_offsets}}, then the tensor bytes. Non-goal: writing; dtypes other than F32/F16/BF16 as data.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/mapped_file.hpp"
#include "model/weights.hpp"

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

    const std::filesystem::path& path() const { return file_.path(); }
    const std::map<std::string, SafetensorsTensor>& tensors() const { return tensors_; }
    const SafetensorsTensor* find(const std::string& name) const;  // nullptr when absent

    // Reads an F32, F16 or BF16 tensor as fp32 after checking its shape is exactly `shape`.
    // Throws FormatError for a missing tensor, another shape or another dtype.
    MatrixRM read_matrix(const std::string& name, std::int64_t rows, std::int64_t cols) const;  // (rows, cols)
    // An F32 matrix of exactly (rows, cols) where it lies in the mapping, to be used in place; nullptr for
    // another dtype or a start that is not 4-byte aligned (read_matrix then). The file must outlive it.
    const float* f32_view(const std::string& name, std::int64_t rows, std::int64_t cols) const;
    VectorF read_vector(const std::string& name, std::int64_t n) const;                       // (n)

private:
    const SafetensorsTensor& require(const std::string& name, const std::vector<std::int64_t>& shape) const;
    void read_f32(const SafetensorsTensor& tensor, float* out) const;

    MappedFile file_;
    std::map<std::string, SafetensorsTensor> tensors_;
};

// Bytes per value of a safetensors dtype name; 0 when the name is not a safetensors dtype.
std::uint64_t safetensors_dtype_bytes(const std::string& dtype);

}  // namespace kvlab
