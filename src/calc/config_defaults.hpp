// The transformers class defaults a config.json may leave out. transformers' save_pretrained drops a
// value equal to its class's default (always so inside a nested text_config), and engines load configs
// through those classes, so an omitted key means the class default, not "unknown".
// Pinned to transformers v4.57.1; each model type cites its configuration_*.py (docs/kv-memory.md).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvlab {

inline constexpr std::string_view transformers_release = "transformers v4.57.1";

struct ClassDefaults {
    std::string_view model_type;    // "gemma3_text"
    std::string_view config_class;  // "Gemma3TextConfig"
    std::string_view file;          // "models/gemma3/configuration_gemma3.py"
    nlohmann::json values;          // key -> default, only keys kvlab reads and whose default is a value (not None)
};

// The defaults of one model_type; nullptr for a type kvlab has no table for.
const ClassDefaults* class_defaults(std::string_view model_type);
// Model types with a table, for messages and docs.
std::vector<std::string_view> class_default_types();

// Adds to `config` (one language-model object) every key its class defines and the object lacks (a key
// present as null keeps its null: the class then sees None). Returns lines naming the class, its source
// and the keys filled ("" when none was missing or the type is unknown): `sizes` for keys that change a
// KV or weight size, `numerics` for the rest (rope_theta, norm epsilon), which only the forward pass reads.
struct AppliedDefaults {
    std::string sizes;
    std::string numerics;
    std::vector<std::string> keys;  // every key filled
    std::string_view config_class;  // "Gemma3TextConfig"
    bool filled(std::string_view key) const;
};
AppliedDefaults apply_class_defaults(nlohmann::json& config, std::string_view model_type);

// Multimodal wrappers keep the language model in a sub-config; the model_type of that sub-config when
// it does not say (Gemma3Config's text_config is a Gemma3TextConfig), else "".
std::string_view text_config_type(std::string_view wrapper_type);

}  // namespace kvlab
