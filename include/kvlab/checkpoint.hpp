// Loading real weights: one entry point that picks the reader from the path
// (a llama2.c .bin file, or a Hugging Face directory of safetensors). Non-goal: quantized formats.
#pragma once
#include <filesystem>

#include "kvlab/model_config.hpp"
#include "kvlab/weights.hpp"

namespace kvlab {

// A model description and its weights, read from the same checkpoint.
struct LoadedModel {
    ModelConfig config;
    Weights weights;
};

// A directory (or a *.safetensors file inside one) -> load_hf_checkpoint; any other file ->
// load_llama2c_checkpoint. Throws FormatError / ConfigError on bad contents, IoError when unreadable.
LoadedModel load_checkpoint(const std::filesystem::path& path);
// The same choice of reader, config only (no tensor is read): for checks before allocating.
ModelConfig load_checkpoint_config(const std::filesystem::path& path);

}  // namespace kvlab
