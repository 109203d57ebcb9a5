// Preset lookup: model presets (HF config.json + "_kvlab" block) and the GPU table, from one directory.
#pragma once
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "calc/model_config.hpp"

namespace kvlab {

// $KVLAB_PRESETS_DIR, else the installed share/kvlab/presets, else the source tree's presets/.
std::filesystem::path presets_dir();
// Sorted model preset names (file stems, gpus.json excluded).
std::vector<std::string> preset_names();
// Throws UsageError with a "did you mean" list for an unknown name.
ModelConfig load_preset(std::string_view name);
// A preset name, or a path to a config.json / a directory holding one.
ModelConfig load_model(std::string_view name_or_path);
// Up to `n_max` names closest to `name` by edit distance.
std::vector<std::string> closest_names(std::string_view name, const std::vector<std::string>& names, std::size_t n_max);

}  // namespace kvlab
