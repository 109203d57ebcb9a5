// Helpers shared by the unit tests: test data paths and preset loading.
#pragma once
#include <string>

#include "kvlab/calc/model_config.hpp"
#include "kvlab/calc/presets.hpp"
#include "test_paths.hpp"

namespace kvlab::test {

inline std::string data_path(const std::string& name) { return std::string(test_data_dir) + "/" + name; }
inline ModelConfig data_config(const std::string& name) { return load_model_config(data_path(name)); }

}  // namespace kvlab::test
