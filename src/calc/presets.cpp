#include "kvlab/calc/presets.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kvlab/core/error.hpp"
#include "kvlab/core/text.hpp"

namespace kvlab {
namespace {

// The folder the running executable is in (Linux: /proc/self/exe), empty when unknown.
std::filesystem::path executable_dir() {
    std::error_code ec;
    const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    return ec ? std::filesystem::path() : exe.parent_path();
}

}  // namespace

std::filesystem::path presets_dir() {
    std::error_code ec;
    if (const char* env = std::getenv("KVLAB_PRESETS_DIR"); env && *env) {
        if (!std::filesystem::is_directory(env, ec))
            throw ConfigError(fmt::format("KVLAB_PRESETS_DIR: {} is not a directory; expected the folder holding the preset .json files",
                                          quote(env)));
        return env;
    }
    // an installed kvlab (<prefix>/bin/kvlab) reads <prefix>/share/kvlab/presets, whatever prefix it was
    // installed to; a build-tree kvlab reads the source tree's presets
    std::vector<std::string> tried;
    if (const auto exe = executable_dir(); !exe.empty()) tried.push_back((exe.parent_path() / "share" / "kvlab" / "presets").string());
    tried.emplace_back(KVLAB_SOURCE_PRESETS_DIR);
    for (const auto& dir : tried)
        if (std::filesystem::is_directory(dir, ec)) return dir;
    throw ConfigError(fmt::format("no presets folder found (looked at {}); set KVLAB_PRESETS_DIR to the folder holding the preset .json files",
                                  fmt::join(tried, " and ")));
}

std::vector<std::string> preset_names() {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(presets_dir())) {
        if (entry.path().extension() != ".json" || entry.path().stem() == "gpus") continue;
        names.push_back(entry.path().stem().string());
    }
    std::sort(names.begin(), names.end());
    if (names.empty())
        throw ConfigError(fmt::format("{}: no model presets (.json files) in the presets folder; set KVLAB_PRESETS_DIR to the folder "
                                      "holding them", quote(presets_dir().string())));
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
    if (name.find('/') != std::string_view::npos) {
        // a Hugging Face id ("meta-llama/Meta-Llama-3-8B"): the preset read from that id's config.json
        const auto lower = [](std::string_view s) {
            std::string out(s);
            for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
            return out;
        };
        std::vector<std::string> ids;
        for (const auto& n : names) {
            ModelConfig cfg = load_model_config(presets_dir() / (n + ".json"));
            if (cfg.hf_id.empty()) continue;
            if (lower(cfg.hf_id) == lower(name)) {
                cfg.name = n;
                return cfg;
            }
            ids.push_back(cfg.hf_id);
        }
        throw UsageError(fmt::format("--model: no preset has the Hugging Face id {}, and kvlab does not download (no network "
                                     "access): download its config.json and give it with --config FILE; ids with presets: {}",
                                     quote(name), fmt::join(ids, ", ")));
    }
    if (std::find(names.begin(), names.end(), name) == names.end())
        throw UsageError(fmt::format("--model: unknown preset {}; did you mean: {}? (`kvlab presets` lists all)", quote(name),
                                     fmt::join(closest_names(name, names, 3), ", ")));
    auto cfg = load_model_config(presets_dir() / (std::string(name) + ".json"));
    cfg.name = std::string(name);
    return cfg;
}

ModelConfig load_model(std::string_view name_or_path) {
    std::error_code ec;
    const std::filesystem::path p(name_or_path);
    // a file or folder that exists, or anything that looks like a file: a config; "org/name": a Hugging Face id
    if (std::filesystem::exists(p, ec) || p.extension() == ".json") return load_model_config(p);
    const bool hf_id_shape = std::count(name_or_path.begin(), name_or_path.end(), '/') == 1 && name_or_path.front() != '/' &&
                             name_or_path.front() != '.' && name_or_path.back() != '/';
    if (name_or_path.find('/') != std::string_view::npos && !hf_id_shape) return load_model_config(p);  // a path: says it is missing
    return load_preset(name_or_path);
}

}  // namespace kvlab
