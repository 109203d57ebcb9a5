// Preset lookup: model presets (HF config.json + "_kvlab" block) and the GPU table, from one directory.
#pragma once
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "kvlab/calc/model_config.hpp"

namespace kvlab {

// $KVLAB_PRESETS_DIR, else <the executable's folder>/../share/kvlab/presets (an installed kvlab, any
// prefix), else the source tree's presets/. Throws ConfigError when none exists.
std::filesystem::path presets_dir();
// Sorted model preset names (file stems, gpus.json excluded). Throws ConfigError when there are none.
std::vector<std::string> preset_names();
// A preset by name, or by the Hugging Face id it was read from ("meta-llama/Meta-Llama-3-8B", any case).
// Throws UsageError with a "did you mean" list for an unknown name, or, for an id no preset has, the
// advice to download its config.json (kvlab has no network access).
ModelConfig load_preset(std::string_view name);
// A path to a config.json or a directory holding one (if it exists, or ends in .json), else a preset
// name or Hugging Face id ("org/name").
ModelConfig load_model(std::string_view name_or_path);
// Up to `n_max` names closest to `name` by edit distance.
std::vector<std::string> closest_names(std::string_view name, const std::vector<std::string>& names, std::size_t n_max);

}  // namespace kvlab
