// Hugging Face checkpoint directories: config.json + model.safetensors, or shards listed in
// model.safetensors.index.json. Llama-architecture names (RoPE "rotate half") and GPT-2 names (Conv1D).
// Non-goal: pytorch_model.bin pickles, biases on Llama-style attention, mixture-of-experts weights.
#pragma once
#include <filesystem>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "kvlab/formats/checkpoint.hpp"

namespace kvlab {

// Reads the config with load_model_config(dir) and every tensor it implies, F32/F16/BF16 -> fp32.
// Llama family: weights.rope_pairing = halves, wq/wk used as stored. GPT-2: Conv1D (in, out) weights
// transposed to (out, in), c_attn split into q, k, v. Throws FormatError naming the file and tensor
// (missing, wrong shape, unknown dtype), ConfigError for a bad config.json, IoError if unreadable.
// n_layers and placement: see load_checkpoint (F32 matrices in kvlab's layout are the ones placed; the
// others are converted into memory of their own).
LoadedModel load_hf_checkpoint(const std::filesystem::path& dir, std::optional<std::int64_t> n_layers = std::nullopt,
                               WeightPlacement placement = WeightPlacement::huge_pages);

// The bytes a checkpoint directory's safetensors hold, from their headers only (no tensor is read):
// the total and per stored dtype ("BF16" -> bytes). nullopt when the directory has neither
// model.safetensors nor model.safetensors.index.json. Throws FormatError for a malformed header or index.
struct StoredWeights {
    std::uint64_t bytes = 0;
    std::map<std::string, std::uint64_t> bytes_by_dtype;
    std::uint64_t vision_bytes = 0;  // the vision tower's and projector's tensors (a multimodal checkpoint), part of `bytes`
    std::string where;  // the file or index read
};
std::optional<StoredWeights> stored_weights(const std::filesystem::path& dir);

}  // namespace kvlab
