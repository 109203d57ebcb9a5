// Loading real weights: one entry point that picks the reader from the path
// (a llama2.c .bin file, or a Hugging Face directory of safetensors). Non-goal: quantized formats.
#pragma once
#include <filesystem>
#include <optional>
#include <span>
#include <string_view>

#include "kvlab/calc/model_config.hpp"
#include "kvlab/core/mapped_file.hpp"
#include "kvlab/weights/weights.hpp"

namespace kvlab {

// A model description and its weights, read from the same checkpoint.
struct LoadedModel {
    ModelConfig config;
    Weights weights;
};

// Where a checkpoint's matrices live when they are stored as kvlab holds them (every matrix of a llama2.c
// file; a safetensors file's F32 matrices except GPT-2's transposed Conv1D ones):
// - huge_pages (the default: serve, the benchmark's reference replay): copied into one arena of huge
//   pages in forward order, each matrix on a 64-byte line (copy_mapped_matrices).
// - mapped_file: used in place, views into the mapped file, as llama2.c's run.c reads them: simulate reads
//   checkpoints so, the GEMV reading rows that start off a 64-byte line (28 bytes into one in a llama2.c
//   file) at the aligned rate (docs/performance.md, "Checkpoints are read in place"); Weights::mapped
//   keeps the mappings.
// The other matrices (BF16/F16 widened, GPT-2's transposed) are converted into memory of their own either way.
enum class WeightPlacement { huge_pages, mapped_file };

// A directory (or a *.safetensors file inside one) -> load_hf_checkpoint; any other file ->
// load_llama2c_checkpoint. Throws FormatError / ConfigError on bad contents, IoError when unreadable.
// With n_layers, only the first n_layers layers' tensors are read into weights.layers (simulate
// --layers: the rest are never allocated); the config still describes the whole model.
// Throws UsageError for n_layers outside 1..L.
LoadedModel load_checkpoint(const std::filesystem::path& path, std::optional<std::int64_t> n_layers = std::nullopt,
                            WeightPlacement placement = WeightPlacement::huge_pages);

// How many layers a loader reads: n_layers, or all of them. Throws UsageError naming --layers.
std::int64_t layers_to_read(const ModelConfig& cfg, std::optional<std::int64_t> n_layers, const std::filesystem::path& path);
// The same choice of reader, config only (no tensor is read): for checks before allocating.
ModelConfig load_checkpoint_config(const std::filesystem::path& path);

// The bytes of the weights' matrices (weights/tensor_table.hpp; a tied classifier counted once) and how many
// of them are views into a mapped checkpoint file (Weights::mapped): read in place, from the page cache.
struct MatrixBytes {
    std::uint64_t total = 0;
    std::uint64_t in_place = 0;
};
MatrixBytes matrix_bytes(const ModelConfig& cfg, const Weights& w);

// Weights loaded with WeightPlacement::mapped_file moved to where huge_pages puts them: every matrix that
// reads a mapped checkpoint file in place (Weights::mapped) copied with pread into one arena of huge pages,
// back to back in forward order (weights/tensor_table.hpp), the views pointed there and the mapping released.
// The mapping's resident pages are given back before the arena is touched, so the process never holds
// the weights twice. Nothing happens when no matrix is mapped. Throws what copy_checkpoint_ranges throws.
void copy_mapped_matrices(const ModelConfig& cfg, Weights& w);

// Copies spans of a checkpoint file into memory (copy_file_ranges: pread, nothing of the file mapped),
// every thread of the team its share of the bytes (split_copies). Most of a copy's time is the kernel
// faulting fresh huge pages in (and, in a virtual machine, the host backing them), which two threads do
// faster than one (docs/performance.md, "Where a checkpoint's matrices live"). Throws what
// copy_file_ranges throws (the first part's error when several fail).
void copy_checkpoint_ranges(const std::filesystem::path& path, std::span<const FileCopy> copies, std::string_view what);

}  // namespace kvlab
