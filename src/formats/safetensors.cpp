#include "formats/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cstring>

#include <Eigen/Core>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "kvlab/core/error.hpp"
#include "kvlab/core/text.hpp"
#include "core/json_input.hpp"

static_assert(std::endian::native == std::endian::little, "safetensors is little-endian; so must the host be");

namespace kvlab {

std::uint64_t safetensors_dtype_bytes(const std::string& dtype) {
    // The dtypes of the safetensors specification (huggingface/safetensors, Dtype enum).
    static const std::map<std::string, std::uint64_t> table = {
        {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
        {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};
    const auto it = table.find(dtype);
    return it == table.end() ? 0 : it->second;
}

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path)
    : file_(std::make_shared<const MappedFile>(path, "safetensors file")) {
    const std::string where = path.string();
    const std::uint64_t size = file_->size_bytes();
    const std::byte* data = file_->bytes().data();
    if (size < 8)
        throw FormatError(fmt::format("{}: file is {} bytes; a safetensors file starts with an 8-byte header length", where, size));
    std::uint64_t header_bytes = 0;
    std::memcpy(&header_bytes, data, 8);
    if (header_bytes > size - 8)
        throw FormatError(fmt::format("{}: header length is {} bytes, but only {} bytes follow the length field", where,
                                      header_bytes, size - 8));
    const std::uint64_t buffer_begin = 8 + header_bytes;
    const std::uint64_t buffer_bytes = size - buffer_begin;

    const nlohmann::json header = parse_json(
        std::string_view(reinterpret_cast<const char*>(data + 8), static_cast<std::size_t>(header_bytes)), where + " (header)");
    if (!header.is_object()) throw FormatError(fmt::format("{}: header is JSON but not an object", where));

    for (const auto& item : header.items()) {
        const std::string& name = item.key();  // not a structured binding: clang 14's lambdas cannot capture those
        const nlohmann::json& entry = item.value();
        if (name == "__metadata__") continue;
        const auto fail = [&](const std::string& what) {
            return FormatError(fmt::format("{}: tensor {}: {}", where, quote(name), what));
        };
        if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets"))
            throw fail("expected an object with dtype, shape and data_offsets");
        SafetensorsTensor t;
        t.name = name;
        if (!entry["dtype"].is_string()) throw fail("dtype is not a string");
        t.dtype = entry["dtype"].get<std::string>();
        const std::uint64_t value_bytes = safetensors_dtype_bytes(t.dtype);
        if (value_bytes == 0) throw fail(fmt::format("unknown dtype {}", quote(t.dtype, 20)));
        if (!entry["shape"].is_array()) throw fail("shape is not an array");
        std::uint64_t n_values = 1;
        for (const auto& dim : entry["shape"]) {
            if (!dim.is_number_unsigned() || dim.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
                throw fail(fmt::format("shape {} has an entry that is not a non-negative integer", json_excerpt(entry["shape"])));
            const std::uint64_t extent = dim.get<std::uint64_t>();
            if (__builtin_mul_overflow(n_values, extent, &n_values))
                throw fail(fmt::format("shape {} has more than 2^64 values", json_excerpt(entry["shape"])));
            t.shape.push_back(static_cast<std::int64_t>(extent));
        }
        const auto& offsets = entry["data_offsets"];
        if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
            throw fail(fmt::format("data_offsets {} is not a pair of non-negative integers", json_excerpt(offsets)));
        const std::uint64_t begin = offsets[0].get<std::uint64_t>(), end = offsets[1].get<std::uint64_t>();
        if (begin > end || end > buffer_bytes)
            throw fail(fmt::format("data_offsets [{}, {}] are not an ordered range inside the {}-byte data buffer", begin, end,
                                   buffer_bytes));
        std::uint64_t want_bytes = 0;
        if (__builtin_mul_overflow(n_values, value_bytes, &want_bytes) || want_bytes != end - begin)
            throw fail(fmt::format("{} with shape {} needs {} x {} bytes, but data_offsets [{}, {}] span {} bytes", t.dtype,
                                   json_excerpt(entry["shape"]), n_values, value_bytes, begin, end, end - begin));
        t.begin_bytes = buffer_begin + begin;
        t.end_bytes = buffer_begin + end;
        tensors_.emplace(name, std::move(t));
    }

    std::vector<const SafetensorsTensor*> by_offset;
    for (const auto& [name, t] : tensors_) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(),
              [](const SafetensorsTensor* a, const SafetensorsTensor* b) { return a->begin_bytes < b->begin_bytes; });
    for (std::size_t i = 1; i < by_offset.size(); ++i)
        if (by_offset[i]->begin_bytes < by_offset[i - 1]->end_bytes)
            throw FormatError(fmt::format("{}: tensors {} and {} overlap in the data buffer", where, quote(by_offset[i - 1]->name),
                                          quote(by_offset[i]->name)));
}

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const {
    const auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
}

const SafetensorsTensor& SafetensorsFile::require(const std::string& name, const std::vector<std::int64_t>& shape) const {
    const SafetensorsTensor* t = find(name);
    if (t == nullptr)
        throw FormatError(fmt::format("{}: tensor '{}' is missing (expected shape [{}])", path().string(), name, fmt::join(shape, ", ")));
    if (t->shape != shape)
        throw FormatError(fmt::format("{}: tensor '{}' has shape [{}]; expected [{}]", path().string(), name, fmt::join(t->shape, ", "),
                                      fmt::join(shape, ", ")));
    return *t;
}

void SafetensorsFile::read_f32(const SafetensorsTensor& t, float* out) const {
    const std::uint64_t n_bytes = t.end_bytes - t.begin_bytes;
    const bool f32 = t.dtype == "F32", f16 = t.dtype == "F16";
    if (!f32 && !f16 && t.dtype != "BF16")
        throw FormatError(fmt::format("{}: tensor '{}' has dtype {}; kvlab reads F32, F16 and BF16 weights", quote(path().string()), t.name, quote(t.dtype, 20)));
    // the file's pages are given back as they are converted: peak memory is the weights, not weights + file
    file_->consume(t.begin_bytes, n_bytes, [&](std::uint64_t done, std::span<const std::byte> chunk) {
        if (f32) {
            std::memcpy(reinterpret_cast<std::byte*>(out) + done, chunk.data(), chunk.size());
            return;
        }
        for (std::uint64_t i = 0; i < chunk.size() / 2; ++i) {  // spans are 1 MiB: no value straddles two
            std::uint16_t bits = 0;
            std::memcpy(&bits, chunk.data() + 2 * i, 2);
            // Eigen 3.4's 16-bit floats widen exactly (both formats are subsets of fp32)
            out[done / 2 + i] = f16 ? static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(bits))
                                    : static_cast<float>(Eigen::numext::bit_cast<Eigen::bfloat16>(bits));
        }
    });
}

std::optional<std::uint64_t> SafetensorsFile::f32_offset(const std::string& name, std::int64_t rows, std::int64_t cols) const {
    const SafetensorsTensor& t = require(name, {rows, cols});
    if (t.dtype != "F32") return std::nullopt;
    return t.begin_bytes;
}

MatrixRM SafetensorsFile::read_matrix(const std::string& name, std::int64_t rows, std::int64_t cols) const {
    const SafetensorsTensor& t = require(name, {rows, cols});
    MatrixRM m = large_matrix(rows, cols);
    read_f32(t, m.data());
    return m;
}

VectorF SafetensorsFile::read_vector(const std::string& name, std::int64_t n) const {
    const SafetensorsTensor& t = require(name, {n});
    VectorF v(n);
    read_f32(t, v.data());
    return v;
}

}  // namespace kvlab
