#include "calc/presets.hpp"

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.hpp"

namespace kvlab {
namespace {

std::size_t edit_distance(std::string_view a, std::string_view b) {
    std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
        cur[0] = i;
        for (std::size_t j = 1; j <= b.size(); ++j)
            cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
        std::swap(prev, cur);
    }
    return prev[b.size()];
}

}  // namespace

std::filesystem::path presets_dir() {
    std::error_code ec;
    if (const char* env = std::getenv("KVLAB_PRESETS_DIR"); env && *env) {
        if (!std::filesystem::is_directory(env, ec))
            throw UsageError(fmt::format("KVLAB_PRESETS_DIR: '{}' is not a directory; expected the folder holding the preset .json files", env));
        return env;
    }
    if (std::filesystem::is_directory(KVLAB_INSTALL_PRESETS_DIR, ec)) return KVLAB_INSTALL_PRESETS_DIR;
    if (std::filesystem::is_directory(KVLAB_SOURCE_PRESETS_DIR, ec)) return KVLAB_SOURCE_PRESETS_DIR;
    throw IoError(fmt::format("no presets directory found (looked at {} and {}); set KVLAB_PRESETS_DIR", KVLAB_INSTALL_PRESETS_DIR, KVLAB_SOURCE_PRESETS_DIR));
}

std::vector<std::string> preset_names() {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(presets_dir())) {
        if (entry.path().extension() != ".json" || entry.path().stem() == "gpus") continue;
        names.push_back(entry.path().stem().string());
    }
    std::sort(names.begin(), names.end());
    return names;
}

std::vector<std::string> closest_names(std::string_view name, const std::vector<std::string>& names, std::size_t n_max) {
    std::vector<std::pair<std::size_t, std::string>> scored;
    for (const auto& n : names) {
        std::size_t d = edit_distance(name, n);
        if (n.find(name) != std::string::npos) d = std::min<std::size_t>(d, 2);  // "70b" → llama-2-70b
        scored.emplace_back(d, n);
    }
    std::sort(scored.begin(), scored.end());
    std::vector<std::string> out;
    for (const auto& [d, n] : scored)
        if (out.size() < n_max) out.push_back(n);
    return out;
}

ModelConfig load_preset(std::string_view name) {
    const auto names = preset_names();
    if (std::find(names.begin(), names.end(), name) == names.end())
        throw UsageError(fmt::format("--model: unknown preset '{}'; did you mean: {}? (`kvlab presets` lists all)", name,
                                     fmt::join(closest_names(name, names, 3), ", ")));
    auto cfg = load_model_config(presets_dir() / (std::string(name) + ".json"));
    cfg.name = std::string(name);
    return cfg;
}

ModelConfig load_model(std::string_view name_or_path) {
    std::error_code ec;
    const std::filesystem::path p(name_or_path);
    if (name_or_path.find('/') != std::string_view::npos || p.extension() == ".json" || std::filesystem::exists(p, ec))
        return load_model_config(p);
    return load_preset(name_or_path);
}

}  // namespace kvlab
