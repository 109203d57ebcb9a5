// GGUF headers (llama.cpp's file format, docs/gguf.md in ggml-org/ggml): the magic "GGUF", a version
// (2 or 3), the tensor and metadata counts, typed key/value pairs, then one info per tensor (name, shape,
// type, offset) before the aligned tensor data. kvcalc --gguf reads the metadata (a model's shape is in it)
// and the tensor infos, for where the data starts; no tensor data is touched. Every length and count is checked
// against the bytes left in the file before anything is allocated or skipped. Non-goal: tensors, writing.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "kvlab/calc/model_config.hpp"

namespace kvlab {

// One metadata value: scalars as integer / real / bool / string; arrays keep their element type, their
// length, and their integer elements when they are numbers (strings in arrays are skipped: a vocabulary
// is ~10^5 of them).
struct GgufValue {
    enum class Kind { integer, real, boolean, string, array } kind = Kind::integer;
    std::int64_t integer = 0;  // unsigned 64-bit values above 2^63 - 1 are refused
    double real = 0;
    bool boolean = false;
    std::string text;
    std::uint64_t array_length = 0;
    std::vector<std::int64_t> array_integers;  // numeric arrays only (e.g. per-layer head counts)
    std::vector<bool> array_booleans;          // bool arrays only (e.g. a per-layer sliding-window pattern)
};

struct GgufHeader {
    std::uint32_t version = 0;
    std::uint64_t n_tensors = 0;
    std::map<std::string, GgufValue> metadata;
    // With tensors: where their data starts (after the tensor infos, aligned to general.alignment, 32 by
    // default) and how many bytes of the file it takes from there: the weights as the file stores them.
    std::uint64_t tensor_data_start = 0;
    std::uint64_t tensor_data_bytes = 0;
};

// Throws FormatError naming the file and the byte offset for anything malformed or truncated.
GgufHeader read_gguf_header(const std::filesystem::path& path);

// The model shape llama.cpp reads from the metadata ("{arch}.block_count", ".embedding_length",
// ".attention.head_count[_kv]", ".attention.key_length", ".context_length", ...), as a ModelConfig
// named after the file. Throws ConfigError for missing or inconsistent fields.
ModelConfig gguf_model_config(const GgufHeader& header, const std::filesystem::path& path);
ModelConfig load_gguf_config(const std::filesystem::path& path);

}  // namespace kvlab
