#include "kvlab/calc/model_config.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "calc/config_defaults.hpp"
#include "calc/encoder_decoder.hpp"
#include "kvlab/core/checked.hpp"
#include "kvlab/core/error.hpp"
#include "core/json_input.hpp"
#include "kvlab/core/mapped_file.hpp"
#include "kvlab/core/text.hpp"

namespace kvlab {
namespace {

using nlohmann::json;

// Reads HF configs the way serving engines do; every field error names file, field and value.
class FieldReader {
public:
    FieldReader(const json& j, std::string where) : j_(j), where_(std::move(where)) {}

    const json* find(std::initializer_list<const char*> names, std::string* found_name = nullptr) const {
        for (const char* n : names) {
            auto it = j_.find(n);
            if (it != j_.end() && !it->is_null()) {
                if (found_name) *found_name = n;
                return &*it;
            }
        }
        return nullptr;
    }

    std::int64_t positive_int(const json& v, const std::string& field) const {
        if (v.is_number_integer() || v.is_number_unsigned()) {
            if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max() / 4))
                throw ConfigError(fmt::format("{}: {} = {} is too large; expected a positive integer below 2^61", where_, field, json_excerpt(v)));
            const auto x = v.get<std::int64_t>();
            if (x <= 0) throw ConfigError(fmt::format("{}: {} = {}; expected a positive integer", where_, field, x));
            if (x > (std::int64_t{1} << 40))
                throw ConfigError(fmt::format("{}: {} = {} is implausibly large; expected a positive integer below 2^40", where_, field, x));
            return x;
        }
        if (v.is_number_float()) {
            const double d = v.get<double>();
            // 4096.0 is tolerated by engines only if integral; kvlab refuses any float to avoid silent fix-ups.
            throw ConfigError(fmt::format("{}: {} = {} is not an integer; expected a positive integer", where_, field, d));
        }
        throw ConfigError(fmt::format("{}: {} = {} has the wrong type ({}); expected a positive integer", where_, field, json_excerpt(v), v.type_name()));
    }

    std::int64_t required(std::initializer_list<const char*> names) const {
        std::string name;
        const json* v = find(names, &name);
        if (!v) throw ConfigError(fmt::format("{}: missing required field {}; expected a positive integer", where_, *names.begin()));
        return positive_int(*v, name);
    }

    std::optional<std::int64_t> optional(std::initializer_list<const char*> names) const {
        std::string name;
        const json* v = find(names, &name);
        if (!v) return std::nullopt;
        return positive_int(*v, name);
    }

    double positive_real(std::initializer_list<const char*> names, double fallback) const {
        std::string name;
        const json* v = find(names, &name);
        if (!v) return fallback;
        if (!v->is_number() || !(v->get<double>() > 0.0) || !std::isfinite(v->get<double>()))
            throw ConfigError(fmt::format("{}: {} = {}; expected a positive number", where_, name, json_excerpt(*v)));
        return v->get<double>();
    }

    bool boolean(const char* name, bool fallback) const {
        auto it = j_.find(name);
        if (it == j_.end() || it->is_null()) return fallback;
        if (!it->is_boolean()) throw ConfigError(fmt::format("{}: {} = {}; expected true or false", where_, name, json_excerpt(*it)));
        return it->get<bool>();
    }

    std::string string(const char* name) const {
        auto it = j_.find(name);
        if (it == j_.end() || it->is_null()) return {};
        if (!it->is_string()) throw ConfigError(fmt::format("{}: {} = {}; expected a string", where_, name, json_excerpt(*it)));
        return it->get<std::string>();
    }

private:
    const json& j_;
    std::string where_;
};

// What the parameter count needs beyond the shapes: biases, norms and MLP form per family, from the
// transformers modeling files named.
void read_weight_layout(const FieldReader& f, ModelConfig& cfg) {
    const std::string& t = cfg.model_type;
    // q/k/v biases: Qwen2 and Qwen2-MoE always (Qwen2Attention); Llama-style attention_bias adds o_proj's too
    const bool bias = f.boolean("attention_bias", false);
    // (Qwen2-VL and Qwen2.5-VL's text models are Qwen2's)
    cfg.attention_bias = bias || t == "qwen2" || t == "qwen2_moe" || t == "qwen2_vl" || t == "qwen2_5_vl" || t == "qwen2_vl_text" ||
                         t == "qwen2_5_vl_text";
    cfg.out_bias = bias;
    if (t == "gpt_neox" || t == "phi") {
        // GPTNeoXMLP / PhiMLP: dense_h_to_4h (fc1) and dense_4h_to_h (fc2) with biases, GELU; LayerNorms with
        // bias; q/k/v and the output projection with biases; Phi: one LayerNorm per layer, lm_head with a bias
        cfg.mlp_matrices = 2;
        cfg.mlp_bias = true;
        cfg.norm_bias = true;
        cfg.attention_bias = cfg.out_bias = true;
        if (t == "phi") {
            cfg.norms_per_layer = 1;
            cfg.lm_head_bias = true;
        }
    }
    if (t == "gemma2" || t == "gemma3" || t == "gemma3_text") cfg.norms_per_layer = 4;  // pre/post attention and feed-forward
    if (t == "cohere" || t == "cohere2") cfg.norms_per_layer = 1;  // one input LayerNorm feeds attention and MLP in parallel
    cfg.qk_norm = t == "qwen3" || t == "qwen3_moe" || t == "gemma3" || t == "gemma3_text";
    if (t == "gpt_oss") {  // q/k/v/o biases; GptOssExperts: gate_up and down with biases; router with a bias; sinks per head
        cfg.attention_bias = cfg.out_bias = true;
        cfg.mlp_bias = true;
        cfg.router_bias = true;
        cfg.attention_sinks = true;
    }
}

// A multimodal config's vision side (the top level's vision_config). Gemma 3 (transformers
// models/siglip/modeling_siglip.py and models/gemma3/modeling_gemma3.py, SigLIP without its pooling head):
//   patch embedding Conv2d(C, h, P, P) + bias: C P^2 h + h; positions (image_size / P)^2 x h
//   per layer: q, k, v, out Linear(h, h) + bias 4(h^2 + h); two LayerNorms 4h; fc1, fc2 2 h I + I + h
//   post LayerNorm 2h; projector: mm_input_projection_weight h x text hidden + its RMSNorm h.
// With google/gemma-3-{4b,12b,27b}-it's configs this makes their published totals exact (test_config.cpp).
// Qwen2.5-VL (transformers models/qwen2_5_vl/modeling_qwen2_5_vl.py, Qwen2_5_VisionTransformerPretrainedModel):
//   patch embedding Conv3d(C, h, (T, P, P)) without bias: C T P^2 h
//   per block: two RMSNorms 2h; qkv Linear(h, 3h) + bias; proj Linear(h, h) + bias; gated MLP gate, up Linear(h, I) + bias,
//   down Linear(I, h) + bias: 4h^2 + 3hI + 7h + 2I
//   merger: RMSNorm h; Linear(h m^2, h m^2) + bias; Linear(h m^2, out) + bias, m = spatial_merge_size
// With Qwen/Qwen2.5-VL-7B-Instruct's config: 676,550,144, and 8,292,166,656 in all, the published total.
std::uint64_t qwen25_vl_vision_params(const FieldReader& v, const ModelConfig& cfg, std::string& missing) {
    const auto depth = v.optional({"depth"}), hidden = v.optional({"hidden_size"}), inner = v.optional({"intermediate_size"});
    if (!depth || !hidden || !inner) {
        missing = !depth ? "depth" : (!hidden ? "hidden_size" : "intermediate_size");
        return 0;
    }
    const char* what = "vision tower parameters";
    const auto h = static_cast<std::uint64_t>(*hidden), i = static_cast<std::uint64_t>(*inner);
    const auto c = static_cast<std::uint64_t>(v.optional({"in_channels", "in_chans"}).value_or(3));
    const auto t = static_cast<std::uint64_t>(v.optional({"temporal_patch_size"}).value_or(2));
    const auto p = static_cast<std::uint64_t>(v.optional({"patch_size"}).value_or(14));
    const auto m = static_cast<std::uint64_t>(v.optional({"spatial_merge_size"}).value_or(2));
    const auto out = static_cast<std::uint64_t>(v.optional({"out_hidden_size"}).value_or(cfg.d_model));
    const std::uint64_t patch = checked_mul(checked_mul(checked_mul(c, t, what), checked_mul(p, p, what), what), h, what);
    const std::uint64_t block = checked_add(checked_add(checked_mul(4 * h, h, what), checked_mul(3 * h, i, what), what), 7 * h + 2 * i, what);
    const std::uint64_t wide = checked_mul(h, checked_mul(m, m, what), what);
    const std::uint64_t merger = checked_add(checked_add(h, checked_add(checked_mul(wide, wide, what), wide, what), what),
                                             checked_add(checked_mul(wide, out, what), out, what), what);
    return checked_add(checked_add(patch, checked_mul(static_cast<std::uint64_t>(*depth), block, what), what), merger, what);
}

void read_vision_tower(const json& root, const std::string& where, ModelConfig& cfg) {
    const auto vc = root.find("vision_config");
    if (vc == root.end() || !vc->is_object()) return;
    const FieldReader v(*vc, where + ": vision_config");
    const std::string type = v.string("model_type");
    const std::string outer = FieldReader(root, where).string("model_type");  // cfg's model_type may be the text model's
    if (outer == "qwen2_5_vl") {
        std::string missing;
        cfg.vision_params = qwen25_vl_vision_params(v, cfg, missing);
        cfg.vision_rule = cfg.vision_params > 0
                              ? fmt::format("weights include Qwen2.5-VL's vision transformer and patch merger: {:.2f} M ({}) "
                                            "parameters, loaded as vLLM loads them; decode reads only the text model's",
                                            static_cast<double>(cfg.vision_params) / 1e6, cfg.vision_params)
                              : fmt::format("its vision_config has no {}, so the vision transformer is not counted: the weights "
                                            "are the text model's only", missing);
        return;
    }
    const bool siglip = type == "siglip_vision_model" && outer == "gemma3" && !v.boolean("vision_use_head", true);
    if (!siglip) {
        cfg.vision_rule = fmt::format("its vision_config (model_type {}) is not counted: the weights are the text model's only, "
                                      "and an engine that loads the vision tower too has less memory left for KV",
                                      type.empty() ? std::string("unnamed") : quote(type, 40));
        return;
    }
    // SiglipVisionConfig's defaults where Gemma 3's config leaves a field out (num_channels)
    const auto h = static_cast<std::uint64_t>(v.optional({"hidden_size"}).value_or(768));
    const auto inner = static_cast<std::uint64_t>(v.optional({"intermediate_size"}).value_or(3072));
    const auto layers = static_cast<std::uint64_t>(v.optional({"num_hidden_layers"}).value_or(12));
    const auto channels = static_cast<std::uint64_t>(v.optional({"num_channels"}).value_or(3));
    const auto image = static_cast<std::uint64_t>(v.optional({"image_size"}).value_or(224));
    const auto patch = static_cast<std::uint64_t>(v.optional({"patch_size"}).value_or(16));
    if (image % patch != 0)
        throw ConfigError(fmt::format("{}: vision_config image_size {} is not a multiple of patch_size {}", where, image, patch));
    const char* what = "vision tower parameters";
    const auto grid = image / patch;
    const std::uint64_t embed = checked_add(checked_add(checked_mul(checked_mul(channels, checked_mul(patch, patch, what), what), h, what), h, what),
                                            checked_mul(checked_mul(grid, grid, what), h, what), what);
    const std::uint64_t layer = checked_add(checked_add(checked_mul(4, checked_add(checked_mul(h, h, what), h, what), what), 4 * h, what),
                                            checked_add(checked_mul(2 * h, inner, what), inner + h, what), what);
    const std::uint64_t tower = checked_add(checked_add(embed, checked_mul(layers, layer, what), what), 2 * h, what);
    const std::uint64_t projector = checked_add(checked_mul(h, static_cast<std::uint64_t>(cfg.d_model), what), h, what);
    cfg.vision_params = checked_add(tower, projector, what);
    cfg.vision_rule = fmt::format("weights include the SigLIP vision tower ({} layers, {} wide, {}x{} patches of {} px) and its "
                                  "projector: {:.2f} M ({}) parameters, loaded as vLLM loads them; decode reads only the text model's",
                                  layers, h, grid, grid, patch, static_cast<double>(cfg.vision_params) / 1e6, cfg.vision_params);
}

// The longest context, as vLLM v0.10.2 derives max_model_len (_get_and_verify_max_len in vllm/config):
// the smallest of the length keys; model_max_length over it when set (Command-R, Cohere2); then
// rope_scaling's factor where the scaling stretches the trained length (yarn: original_max_position_embeddings
// x factor; linear, dynamic: x factor). su, longrope and llama3 configs already give the long length in
// max_position_embeddings, and Gemma 3's is already scaled, so those are left as they are.
void read_max_context(const FieldReader& f, const std::string& where, ModelConfig& cfg) {
    // model_max_length may be a tokenizer's "no limit" sentinel (1e30, as tokenizer_config.json writes it): a number
    // past 2^40 is no length, and is left out with a note rather than refused
    const json* mml = f.find({"model_max_length"});
    const bool sentinel = mml && mml->is_number() && mml->get<double>() > static_cast<double>(std::int64_t{1} << 40);
    if (sentinel) cfg.defaults.push_back(fmt::format("model_max_length {} ignored: a no-limit sentinel, not a length", json_excerpt(*mml)));
    // a length written as an integral float (131072.0) is that integer, as vLLM's min() takes it; 4096.5 is refused
    auto length = [&](const char* k) -> std::optional<std::int64_t> {
        const json* v = f.find({k});
        if (!v) return std::nullopt;
        if (v->is_number_float() && std::isfinite(v->get<double>()) && v->get<double>() == std::floor(v->get<double>()) && v->get<double>() >= 1.0 &&
            v->get<double>() <= static_cast<double>(std::int64_t{1} << 40))
            return static_cast<std::int64_t>(v->get<double>());
        return f.positive_int(*v, k);
    };
    std::string key;
    for (const char* k : {"max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length", "model_max_length",
                          "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len"}) {
        if (sentinel && std::string_view(k) == "model_max_length") continue;
        if (const auto v = length(k); v && (key.empty() || *v < cfg.n_ctx_max)) {
            cfg.n_ctx_max = *v;
            key = k;
        }
    }
    if (const auto v = sentinel ? std::nullopt : length("model_max_length")) {
        cfg.n_ctx_max = *v;
        key = "model_max_length";
    }
    if (key.empty()) return;
    cfg.ctx_rule = fmt::format("max context {} from {}", cfg.n_ctx_max, key);
    const json* rs = f.find({"rope_scaling"});
    if (!rs || !rs->is_object() || cfg.model_type.find("gemma3") != std::string::npos) return;
    const FieldReader r(*rs, where + ": rope_scaling");
    if (rs->empty()) return;
    // type is the old name of rope_type (vLLM's patch_rope_scaling_dict); the new name wins, and a config that
    // gives two different ones is told so; one with neither is refused, as no engine could tell what it scales
    const std::string rope_type = r.string("rope_type"), old_type = r.string("type");
    if (!rope_type.empty() && !old_type.empty() && rope_type != old_type)
        cfg.defaults.push_back(fmt::format("rope_scaling's rope_type {} read, its type {} left out", quote(rope_type, 40), quote(old_type, 40)));
    const std::string type = rope_type.empty() ? old_type : rope_type;
    if (type.empty()) throw ConfigError(fmt::format("{}: rope_scaling has no rope_type (or type); expected the scaling type, e.g. \"yarn\"", where));
    if (type == "su" || type == "longrope" || type == "llama3") return;
    const double factor = r.positive_real({"factor"}, 1.0);
    std::int64_t base = cfg.n_ctx_max;
    if (type == "yarn") {
        base = r.optional({"original_max_position_embeddings"}).value_or(0);
        if (base == 0) throw ConfigError(fmt::format("{}: rope_scaling of type yarn has no original_max_position_embeddings; expected a positive integer", where));
    }
    if (factor == 1.0 && base == cfg.n_ctx_max) return;
    const double scaled = std::floor(static_cast<double>(base) * factor);
    if (!(scaled >= 1.0 && scaled <= static_cast<double>(std::int64_t{1} << 40)))
        throw ConfigError(fmt::format("{}: rope_scaling factor {} gives a context of {} tokens; expected 1 to 2^40", where, factor, scaled));
    cfg.n_ctx_max = static_cast<std::int64_t>(scaled);
    cfg.ctx_rule = type == "yarn" ? fmt::format("max context {} = original_max_position_embeddings {} x rope_scaling factor {} (yarn)", cfg.n_ctx_max, base, factor)
                                  : fmt::format("max context {} = {} {} x rope_scaling factor {} ({})", cfg.n_ctx_max, key, base, factor, type);
}

void read_sliding_window(const FieldReader& f, const json& j, const std::string& where, ModelConfig& cfg) {
    cfg.layer_windowed.assign(static_cast<std::size_t>(cfg.n_layer), false);
    // layer_types names each layer's attention, window or not. kvlab sizes two kinds; any other
    // (linear_attention, chunked_attention, ...) caches differently, and counting it as full attention
    // would be a silent guess
    if (const auto types = j.find("layer_types"); types != j.end() && types->is_array())
        for (std::size_t i = 0; i < types->size(); ++i)
            if (const auto& t = (*types)[i]; t.is_string() && t.get<std::string>() != "sliding_attention" && t.get<std::string>() != "full_attention")
                throw ConfigError(fmt::format("{}: layer_types[{}] = {}; kvlab sizes full_attention and sliding_attention layers only",
                                              where, i, quote(t.get<std::string>())));
    const auto window = f.optional({"sliding_window"});
    if (!window) {
        cfg.window_rule = "no sliding window";
        return;
    }
    if (!f.boolean("use_sliding_window", true)) {
        cfg.window_rule = fmt::format("sliding_window {} ignored: use_sliding_window is false", *window);
        return;
    }
    cfg.sliding_window = window;
    if (cfg.model_type == "gemma3_text" && f.boolean("use_bidirectional_attention", false)) {
        // Gemma3TextConfig: bidirectional attention (EmbeddingGemma) looks sliding_window // 2 + 1 positions each way
        cfg.sliding_window = *window / 2 + 1;
        cfg.defaults.push_back(fmt::format("sliding window {} = {} / 2 + 1: use_bidirectional_attention is true", *cfg.sliding_window, *window));
    }
    auto types = j.find("layer_types");
    if (types != j.end() && types->is_array()) {
        if (static_cast<std::int64_t>(types->size()) != cfg.n_layer)
            throw ConfigError(fmt::format("{}: layer_types has {} entries; expected num_hidden_layers = {}", where, types->size(), cfg.n_layer));
        for (std::size_t i = 0; i < types->size(); ++i) {
            const auto& t = (*types)[i];
            if (!t.is_string()) throw ConfigError(fmt::format("{}: layer_types[{}] = {}; expected a string", where, i, json_excerpt(t)));
            cfg.layer_windowed[i] = t.get<std::string>() == "sliding_attention";
        }
        cfg.window_rule = fmt::format("sliding window {} on layers marked sliding_attention in layer_types", *window);
        return;
    }
    if (cfg.model_type == "gemma2" || cfg.model_type == "gpt_oss") {
        // Gemma-2 and gpt-oss without layer_types alternate: layer i slides unless (i + 1) % 2 == 0, so even
        // layers are local and odd ones global (Gemma2Config, GptOssConfig in transformers v4.57.1).
        for (std::int64_t i = 0; i < cfg.n_layer; ++i) cfg.layer_windowed[static_cast<std::size_t>(i)] = (i % 2 == 0);
        cfg.window_rule = fmt::format("sliding window {} on even layers (local/global alternation)", *window);
        return;
    }
    if (const auto pattern = f.optional({"sliding_window_pattern"})) {
        // Gemma-3 style: every pattern-th layer is global.
        for (std::int64_t i = 0; i < cfg.n_layer; ++i) cfg.layer_windowed[static_cast<std::size_t>(i)] = ((i + 1) % *pattern != 0);
        cfg.window_rule = fmt::format("sliding window {} except every {}th layer (sliding_window_pattern)", *window, *pattern);
        return;
    }
    if (j.contains("max_window_layers") && !j["max_window_layers"].is_null() && j.contains("use_sliding_window")) {
        // Qwen2: layers with index >= max_window_layers use the window.
        const auto first = j["max_window_layers"];
        if (!first.is_number_integer() || first.get<std::int64_t>() < 0)
            throw ConfigError(fmt::format("{}: max_window_layers = {}; expected a non-negative integer", where, json_excerpt(first)));
        for (std::int64_t i = first.get<std::int64_t>(); i < cfg.n_layer; ++i) cfg.layer_windowed[static_cast<std::size_t>(i)] = true;
        cfg.window_rule = fmt::format("sliding window {} on layers >= max_window_layers ({})", *window, first.get<std::int64_t>());
        return;
    }
    cfg.layer_windowed.assign(static_cast<std::size_t>(cfg.n_layer), true);
    cfg.window_rule = fmt::format("sliding window {} on every layer", *window);
}

}  // namespace

namespace {

std::int64_t checked_width(std::int64_t heads, std::int64_t d_head, const char* heads_name) {
    std::int64_t out = 0;
    if (__builtin_mul_overflow(heads, d_head, &out))
        throw OverflowError(fmt::format("{} ({}) x head_dim ({}) overflows 64 bits; expected a real model's shape", heads_name,
                                        heads, d_head));
    return out;
}

}  // namespace

std::int64_t ModelConfig::d_q() const { return checked_width(n_head, d_head, "num_attention_heads"); }
std::int64_t ModelConfig::d_kv() const { return checked_width(n_head_kv, d_head, "num_key_value_heads"); }

std::int64_t ModelConfig::layer_window(std::int64_t layer) const {
    return sliding_window && layer_windowed.at(static_cast<std::size_t>(layer)) ? *sliding_window : 0;
}

std::int64_t ModelConfig::keys_attended(std::int64_t layer, std::int64_t pos) const {
    return keys_in_window(layer_window(layer), pos);
}

std::string ModelConfig::attention_kind() const {
    if (mla) return "MLA";
    if (n_head_kv == n_head) return "MHA";
    if (n_head_kv == 1) return "MQA";
    return fmt::format("GQA-{}", n_head_kv);
}

namespace {

// The language model's part of a config, where it was found, its model_type and the class defaults filled in.
struct TextConfig {
    json j;
    std::string where;
    std::string model_type;
    AppliedDefaults applied;
};

// Finds the language model's sub-config (a multimodal wrapper's), names its type and fills its class's defaults.
TextConfig find_text_config(const json& root, const std::string& where, bool class_defaults) {
    // Multimodal configs keep the language model in a sub-config (Gemma-3, LLaVA: text_config; InternVL: llm_config).
    const std::string outer_type = FieldReader(root, where).string("model_type");
    TextConfig lm;
    lm.j = root;
    std::string nested;
    for (const char* key : {"text_config", "llm_config"})
        if (auto tc = root.find(key); tc != root.end() && tc->is_object()) {
            lm.j = *tc;
            nested = key;
            break;
        }
    if (nested.empty() && !text_config_type(outer_type).empty()) {
        lm.j = json::object();  // a wrapper without its text_config builds the text class from its defaults (Gemma3Config)
        nested = "text_config";
    }
    lm.where = nested.empty() ? where : fmt::format("{} ({})", where, nested);
    lm.model_type = FieldReader(lm.j, lm.where).string("model_type");
    if (lm.model_type.empty()) lm.model_type = nested.empty() ? outer_type : std::string(text_config_type(outer_type));
    if (class_defaults) lm.applied = apply_class_defaults(lm.j, lm.model_type);
    return lm;
}

// model_types read by rules kvlab knows besides config_defaults' classes: those this file and the weight
// count test by name, and llama.cpp's architecture names a GGUF gives (deepseek2, phi).
constexpr std::array<std::string_view, 17> named_types{"RefinedWeb", "RefinedWebModel", "deepseek_v32", "deepseek_mtp", "kimi_k2", "deepseek2",
                                                       "llama4", "llama4_text", "cohere", "cohere2", "gemma3", "phi", "qwen2_vl", "qwen2_vl_text",
                                                       "qwen2_5_vl", "qwen2_5_vl_text", "minicpm3"};

// Encoder-only model types: they read their whole input at once and generate nothing, so decoding keeps no
// KV cache. The model_type strings as transformers v4.57.1 names them (models/<name>/configuration_<name>.py).
constexpr std::array<std::string_view, 24> encoder_types{
    "bert",      "roberta",    "distilbert", "albert",     "electra",  "deberta",        "deberta-v2", "xlm-roberta",
    "camembert", "mpnet",      "modernbert", "mobilebert", "megatron-bert", "squeezebert", "funnel",   "longformer",
    "xlm-roberta-xl", "roberta-prelayernorm", "ernie", "rembert", "convbert", "nezha",    "esm",        "data2vec-text"};

// Refuses an encoder-only model (unless `as_decoder`), and says how a model_type kvlab has no rules for is sized.
std::string check_model_type(const FieldReader& f, const std::string& type, const std::string& where, bool as_decoder) {
    const bool encoder = std::find(encoder_types.begin(), encoder_types.end(), type) != encoder_types.end();
    const bool used_as_decoder = f.boolean("is_decoder", false);  // transformers' BertLMHeadModel and kin: causal, with a cache
    if (encoder && !used_as_decoder && !as_decoder)
        throw ConfigError(fmt::format("{}: model_type {} is an encoder-only model, which keeps no KV cache in decoding (it reads its whole "
                                      "input at once and generates no tokens); kvcalc --as-decoder sizes it as if it were a decoder",
                                      where, quote(type, 40)));
    const std::string llama_style = "sized as a Llama-style decoder from the config's fields (every layer caches K and V, "
                                    "num_key_value_heads x head_dim each, per token)";
    if (encoder)
        return fmt::format("model_type {} is an encoder-only model{}: {}", quote(type, 40),
                           used_as_decoder ? " used as a decoder (is_decoder true)" : ", which keeps no KV cache in decoding; --as-decoder",
                           llama_style);
    const auto known = class_default_types();
    if (std::find(known.begin(), known.end(), type) != known.end() || std::find(named_types.begin(), named_types.end(), type) != named_types.end() ||
        type == "gpt_neox" || type == "gpt2")
        return {};
    return fmt::format("{}: {}; check that the model caches that way", type.empty() ? std::string("no model_type")
                                                                                   : fmt::format("model_type {} is not one kvlab has rules for", quote(type, 40)),
                       llama_style);
}

// Names the model and reads what a preset's _kvlab block adds (display name, source, family, files).
void read_kvlab_fields(const json& root, const std::string& where, const std::string& name, ModelConfig& cfg) {
    cfg.name = name;
    cfg.origin_path = where;
    cfg.source = where;
    cfg.display_name = name;
    if (auto k = root.find("_kvlab"); k != root.end() && k->is_object()) {
        const FieldReader kv(*k, where + " (_kvlab)");
        if (const std::string s = kv.string("display_name"); !s.empty()) cfg.display_name = s;
        if (const std::string s = kv.string("source"); !s.empty()) cfg.source = s;
        cfg.preset_family = kv.string("family");
        cfg.hf_id = kv.string("hf_id");
        const std::filesystem::path dir = std::filesystem::path(where).parent_path();
        if (const std::string c = kv.string("checkpoint"); !c.empty()) cfg.checkpoint = dir / c;
        if (const std::string t = kv.string("tokenizer"); !t.empty()) cfg.tokenizer = dir / t;
    }
}

// The activation, model_type, the defaults applied and the family (GPT-2's field names or Llama's).
void read_model_kind(const FieldReader& f, const TextConfig& lm, ModelConfig& cfg) {
    cfg.activation = f.string("hidden_act");
    if (cfg.activation.empty()) cfg.activation = f.string("activation_function");
    cfg.model_type = lm.model_type;
    if (!lm.applied.sizes.empty()) cfg.defaults.push_back(lm.applied.sizes);
    if (!lm.applied.numerics.empty()) cfg.numeric_defaults.push_back(lm.applied.numerics);
    const bool gpt2_names = lm.j.contains("n_embd");
    cfg.family = (cfg.model_type == "gpt2" || gpt2_names) ? Family::gpt2 : Family::llama;
}

// Layers, hidden size, query heads and vocabulary, the layer count capped at max_layers.
void read_shape(const FieldReader& f, const std::string& where, ModelConfig& cfg) {
    cfg.n_layer = f.required({"num_hidden_layers", "n_layer", "num_layers"});
    // per-layer rules (windows, KV bytes) walk the layers: a count no model has is refused, not walked
    if (cfg.n_layer > max_layers)
        throw ConfigError(fmt::format("{}: num_hidden_layers = {}; kvlab sizes at most {} layers (published models have up to a few hundred)",
                                      where, cfg.n_layer, max_layers));
    cfg.d_model = f.required({"hidden_size", "n_embd", "d_model"});
    cfg.n_head = f.required({"num_attention_heads", "n_head"});
    cfg.n_vocab = f.required({"vocab_size"});
}

// The MLP width: given, else GPT-2's and Falcon's 4 x hidden size, else unknown (0).
void read_ffn_width(const FieldReader& f, bool falcon, ModelConfig& cfg) {
    // The MLP width matters to the weights only, never to the KV cache: a config without it is still sized.
    std::string ff_name;
    if (const json* ff = f.find({"intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size"}, &ff_name); ff && !ff->is_null()) {
        cfg.d_ff = f.positive_int(*ff, ff_name);
        cfg.ffn_rule = fmt::format("FFN width {} from {}", cfg.d_ff, ff_name);
    } else if (cfg.family == Family::gpt2 || falcon) {
        // GPT2Config: n_inner None means 4 * n_embd; FalconConfig: ffn_hidden_size None means 4 * hidden_size
        // (transformers models/gpt2/modeling_gpt2.py GPT2MLP, models/falcon/configuration_falcon.py)
        cfg.d_ff = 4 * cfg.d_model;
        cfg.ffn_rule = fmt::format("FFN width {} = 4 x hidden size {} ({} default)", cfg.d_ff, cfg.d_model, falcon ? "Falcon" : "GPT-2");
        cfg.defaults.push_back(cfg.ffn_rule);
    } else {
        cfg.d_ff = 0;
        cfg.ffn_rule = "no intermediate_size: the weights are unknown (the KV cache does not depend on them)";
        cfg.defaults.push_back(cfg.ffn_rule);
    }
}

// Falcon's defaults: a 2048-token context when none is given, its LayerNorms and its two-matrix MLP.
void apply_falcon_layout(const FieldReader& f, ModelConfig& cfg) {
    cfg.falcon = true;
    if (cfg.n_ctx_max == 0) {
        cfg.n_ctx_max = 2048;
        cfg.defaults.push_back("max_position_embeddings 2048 (FalconConfig default)");
    }
    // parallel attention without the new decoder architecture: one input LayerNorm feeds attention and MLP
    const bool new_arch = f.boolean("new_decoder_architecture", false);
    cfg.norms_per_layer = !new_arch && f.boolean("parallel_attn", true) ? 1 : 2;
    cfg.mlp_matrices = 2;
    cfg.norm_bias = true;
}

// head_dim: explicit wins (vLLM PR #2622), else hidden_size / num_attention_heads.
void read_head_dim(const FieldReader& f, const AppliedDefaults& applied, const std::string& where, ModelConfig& cfg) {
    if (auto hd = f.optional({"head_dim"})) {
        cfg.d_head = *hd;
        cfg.head_dim_rule = applied.filled("head_dim") ? fmt::format("head_dim {} ({} default)", *hd, applied.config_class)
                                                       : fmt::format("head_dim {} explicit in config", *hd);
    } else {
        if (cfg.d_model % cfg.n_head != 0)
            throw ConfigError(fmt::format("{}: hidden_size ({}) is not a multiple of num_attention_heads ({}) and no head_dim is given", where, cfg.d_model, cfg.n_head));
        cfg.d_head = cfg.d_model / cfg.n_head;
        cfg.head_dim_rule = fmt::format("head_dim {} = hidden_size {} / num_attention_heads {}", cfg.d_head, cfg.d_model, cfg.n_head);
    }
}

// Checks that the query and KV widths the heads form fit 64 bits, as a ConfigError naming the file.
void check_head_widths(const std::string& where, const ModelConfig& cfg) {
    try {
        cfg.d_q();
        cfg.d_kv();
    } catch (const OverflowError& e) {
        throw ConfigError(fmt::format("{}: {}", where, e.what()));
    }
}

// KV heads: Falcon multi_query, then explicit counts, else MHA; they must divide the query heads.
void read_kv_heads(const FieldReader& f, const AppliedDefaults& applied, const std::string& where, ModelConfig& cfg) {
    std::string kv_name;
    const bool multi_query = f.boolean("multi_query", false) && !f.boolean("new_decoder_architecture", false);
    if (multi_query) {
        cfg.n_head_kv = 1;
        cfg.kv_heads_rule = "1 KV head: multi_query is true (Falcon-style MQA)";
    } else if (const json* v = f.find({"num_key_value_heads", "num_kv_heads", "n_head_kv"}, &kv_name)) {
        cfg.n_head_kv = f.positive_int(*v, kv_name);
        cfg.kv_heads_rule = applied.filled(kv_name) ? fmt::format("{} KV heads ({} default)", cfg.n_head_kv, applied.config_class)
                                                    : fmt::format("{} KV heads from {}", cfg.n_head_kv, kv_name);
    } else {
        cfg.n_head_kv = cfg.n_head;
        cfg.kv_heads_rule = fmt::format("{} KV heads: num_key_value_heads absent, so MHA", cfg.n_head_kv);
    }
    // every width formed later from these fields fits 64 bits (products of two widths are checked where formed)
    check_head_widths(where, cfg);
    if (cfg.n_head % cfg.n_head_kv != 0)
        throw ConfigError(fmt::format("{}: num_attention_heads ({}) is not a multiple of num_key_value_heads ({})", where, cfg.n_head, cfg.n_head_kv));
}

// kv_lora_rank's low-rank attention: DeepSeek's family caches the MLA latent, any other model every head's K and V.
void read_lora_attention(const FieldReader& f, const std::string& where, ModelConfig& cfg) {
    const auto rank = f.optional({"kv_lora_rank"});
    if (!rank) return;
    const auto rope = f.optional({"qk_rope_head_dim"});
    if (!rope) throw ConfigError(fmt::format("{}: kv_lora_rank is set but qk_rope_head_dim is missing; expected a positive integer", where));
    const MlaShape shape{*rank, *rope, f.optional({"q_lora_rank"}).value_or(0), f.optional({"qk_nope_head_dim"}).value_or(0),
                         f.optional({"v_head_dim"}).value_or(cfg.d_head)};
    // Only DeepSeek's family caches the latent (vLLM v0.10.2's ModelConfig.is_deepseek_mla: deepseek_v2,
    // deepseek_v3, deepseek_mtp, kimi_k2; deepseek_v32 since). Other models with these projections
    // (MiniCPM3) cache every head's K and V at the q/k head width, V padded to it
    // (vllm/model_executor/models/minicpm3.py: Attention(num_heads, qk_head_dim, num_kv_heads=num_heads)).
    // (deepseek2: llama.cpp's architecture name for DeepSeek-V2/V3, as a GGUF header gives it)
    static const std::array<std::string_view, 6> latent_types{"deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_mtp", "kimi_k2", "deepseek2"};
    if (std::find(latent_types.begin(), latent_types.end(), cfg.model_type) == latent_types.end()) {
        cfg.lora_attention = shape;
        cfg.n_head_kv = cfg.n_head;
        cfg.d_head = shape.qk_nope_head_dim + shape.qk_rope_head_dim;
        cfg.kv_heads_rule = fmt::format("{} KV heads: model_type {} caches every head's K and V (only DeepSeek-family model types cache "
                                        "the kv_lora_rank latent)", cfg.n_head_kv, cfg.model_type.empty() ? "(none)" : cfg.model_type);
        cfg.head_dim_rule = fmt::format("head_dim {} = qk_nope_head_dim {} + qk_rope_head_dim {} (V is padded to it, as vLLM stores it)",
                                        cfg.d_head, shape.qk_nope_head_dim, shape.qk_rope_head_dim);
        check_head_widths(where, cfg);  // the widths these heads form fit 64 bits, as checked above for the others
    } else {
        cfg.mla = shape;
        cfg.kv_heads_rule = fmt::format("MLA: one latent of kv_lora_rank {} + qk_rope_head_dim {} per token per layer", *rank, *rope);
        // the hidden_size / heads quotient is no width of an MLA head: name the real ones (the tables show the latent)
        if (cfg.mla->qk_nope_head_dim > 0)
            cfg.head_dim_rule = fmt::format("MLA heads: q and k {} wide (qk_nope_head_dim {} + qk_rope_head_dim {}), v {} wide (v_head_dim); "
                                            "the tables' head dim is the cached latent's {}",
                                            cfg.mla->qk_nope_head_dim + *rope, cfg.mla->qk_nope_head_dim, *rope, cfg.mla->v_head_dim, *rank + *rope);
    }
}

// Experts: routed and active counts, their widths, the dense first layers, Llama 4's and Qwen2-MoE's shared expert.
void read_experts(const FieldReader& f, const json& j, const std::string& where, ModelConfig& cfg) {
    cfg.n_expert = f.optional({"num_local_experts", "n_routed_experts", "num_experts"}).value_or(1);
    cfg.n_expert_active = f.optional({"num_experts_per_tok"}).value_or(1);
    if (cfg.n_expert_active > cfg.n_expert)
        throw ConfigError(fmt::format("{}: num_experts_per_tok ({}) exceeds the number of experts ({})", where, cfg.n_expert_active, cfg.n_expert));
    cfg.d_ff_expert = f.optional({"moe_intermediate_size"}).value_or(0);
    cfg.n_expert_shared = f.optional({"n_shared_experts"}).value_or(0);
    if (j.contains("first_k_dense_replace") && j["first_k_dense_replace"].is_number_integer())
        cfg.n_layer_dense = std::min(cfg.n_layer, std::max<std::int64_t>(0, j["first_k_dense_replace"].get<std::int64_t>()));
    // Llama 4: a shared expert beside the routed ones, MoE on every interleave_moe_layer_step-th layer,
    // the dense layers intermediate_size_mlp wide (transformers models/llama4/modeling_llama4.py)
    if (cfg.model_type == "llama4_text" || cfg.model_type == "llama4") {
        cfg.n_expert_shared = 1;
        cfg.moe_layer_step = f.optional({"interleave_moe_layer_step"}).value_or(1);
        cfg.d_ff_dense = f.optional({"intermediate_size_mlp"}).value_or(0);
    }
    // Qwen2-MoE: one shared expert shared_expert_intermediate_size wide, behind a sigmoid gate
    if (const auto shared = f.optional({"shared_expert_intermediate_size"}); shared && cfg.n_expert > 1 && !f.find({"n_shared_experts"})) {
        cfg.n_expert_shared = 1;
        cfg.d_ff_shared = *shared;
        cfg.shared_expert_gate = cfg.model_type.rfind("qwen", 0) == 0;
    }
}

// Whether lm_head shares the embedding, by the config or else its class's default.
void read_tied_embeddings(const FieldReader& f, const json& root, const std::string& where, bool falcon, ModelConfig& cfg) {
    // When a config omits tie_word_embeddings, the model class's default applies: LlamaConfig, MistralConfig
    // and most decoder configs default to false; GPT-2 always ties, Gemma and Cohere configs default to
    // true, and FalconConfig leaves PretrainedConfig's true (FalconForCausalLM ties lm_head to the embedding).
    const bool tie_default = cfg.family == Family::gpt2 || cfg.model_type.rfind("gemma", 0) == 0 || falcon || cfg.model_type == "cohere" ||
                             cfg.model_type == "cohere2";
    cfg.tied_embeddings = FieldReader(root, where).boolean("tie_word_embeddings", f.boolean("tie_word_embeddings", tie_default));
}

// A quantized checkpoint says so (vLLM reads quantization_config from the config, or its text_config).
void read_quant_method(const json& root, const json& j, const std::string& where, ModelConfig& cfg) {
    for (const json* holder : std::array<const json*, 2>{&root, &j})
        if (const auto q = holder->find("quantization_config"); q != holder->end() && q->is_object() && cfg.quant_method.empty())
            cfg.quant_method = FieldReader(*q, where + ": quantization_config").string("quant_method");
}

// Llama 4's chunked local attention (3 layers of 4 see only their attention_chunk_size-token chunk) is
// sized as full attention: vLLM v0.10.2 turns its hybrid allocator off for it by default and gives every
// layer every token; transformers' cache and llama.cpp hold one chunk on those layers
void note_chunked_attention(const FieldReader& f, ModelConfig& cfg) {
    if (const auto chunk = f.optional({"attention_chunk_size"}); chunk && !cfg.sliding_window)
        cfg.window_rule += fmt::format("; attention_chunk_size {} sized as full attention, as vLLM v0.10.2 allocates it "
                                       "(transformers and llama.cpp keep one chunk on its chunked layers)",
                                       *chunk);
}

}  // namespace

ModelConfig parse_model_config(const json& root, const std::string& where, const std::string& name, bool class_defaults, bool as_decoder) {
    if (!root.is_object()) throw ConfigError(fmt::format("{}: top level is {}; expected a JSON object", where, root.type_name()));
    TextConfig lm = find_text_config(root, where, class_defaults);
    std::optional<CrossAttention> cross;
    if (is_encoder_decoder_type(lm.model_type)) lm.j = decoder_view(lm.j, lm.model_type, lm.where, cross.emplace());
    const json& j = lm.j;
    const FieldReader f(j, lm.where);

    ModelConfig cfg;
    read_kvlab_fields(root, where, name, cfg);
    read_model_kind(f, lm, cfg);
    cfg.cross = cross;
    cfg.type_rule = cross ? std::string() : check_model_type(f, cfg.model_type, where, as_decoder);
    read_shape(f, where, cfg);
    const bool falcon = cfg.model_type == "falcon" || cfg.model_type == "RefinedWeb" || cfg.model_type == "RefinedWebModel";
    read_ffn_width(f, falcon, cfg);
    read_max_context(f, where, cfg);
    if (falcon) apply_falcon_layout(f, cfg);
    read_head_dim(f, lm.applied, where, cfg);
    read_kv_heads(f, lm.applied, where, cfg);
    read_lora_attention(f, where, cfg);
    read_experts(f, j, where, cfg);
    read_weight_layout(f, cfg);
    try {
        read_vision_tower(root, where, cfg);
    } catch (const OverflowError& e) {
        throw ConfigError(fmt::format("{}: vision_config: {}", where, e.what()));
    }
    cfg.rope_theta = f.positive_real({"rope_theta"}, 10000.0);
    cfg.norm_eps = f.positive_real({"rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps"}, 1e-5);
    read_tied_embeddings(f, root, where, falcon, cfg);
    read_quant_method(root, j, where, cfg);
    read_sliding_window(f, j, where, cfg);
    note_chunked_attention(f, cfg);
    return cfg;
}

void apply_window_policy(ModelConfig& cfg, std::int64_t window, std::int64_t sink_tokens) {
    if (window < 0) throw UsageError(fmt::format("--window: {}; expected a positive number of positions", window));
    if (sink_tokens < 0) throw UsageError(fmt::format("--sink-tokens: {}; expected 0 or more", sink_tokens));
    if (window > 0) {
        cfg.sliding_window = window;
        cfg.layer_windowed.assign(static_cast<std::size_t>(cfg.n_layer), true);
        cfg.window_rule = fmt::format("sliding window {} on every layer (--window)", window);
    }
    if (sink_tokens == 0) return;
    if (!cfg.sliding_window)
        throw UsageError(fmt::format("--sink-tokens {}: {} has no sliding window for the sinks to stay in; give --window W", sink_tokens, cfg.name));
    if (sink_tokens >= *cfg.sliding_window)
        throw UsageError(fmt::format("--sink-tokens {}: expected fewer than {}'s window of {} positions (sinks and recent tokens share it)",
                                     sink_tokens, cfg.name, *cfg.sliding_window));
    cfg.sink_tokens = sink_tokens;
    cfg.window_rule += fmt::format(": the first {} positions kept as sinks and the last {} (the window's rows, so the same bytes)", sink_tokens,
                                   *cfg.sliding_window - sink_tokens);
}

std::string config_model_name(const json& j, const std::filesystem::path& path) {
    // transformers' save_pretrained records where the model came from (a Hub id or a local path)
    if (const auto it = j.find("_name_or_path"); it != j.end() && it->is_string() && !it->get<std::string>().empty())
        return it->get<std::string>();
    // "config.json", "./config.json", "." all name the folder they are in, by its real name
    std::error_code ec;
    const std::filesystem::path real = std::filesystem::weakly_canonical(std::filesystem::absolute(path, ec), ec);
    if (path.stem() == "config" && !real.parent_path().filename().empty()) return real.parent_path().filename().string();
    return path.stem().string();
}

ModelConfig load_model_config(const std::filesystem::path& path_in, bool as_decoder) {
    std::filesystem::path path = path_in;
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) path /= "config.json";
    // a config.json is a few KiB; 16 MiB leaves room for any real one (multimodal configs included)
    const json j = parse_json(read_input_file(path, "config file (a config.json or a directory holding one)", 16 << 20), path.string());
    return parse_model_config(j, path.string(), config_model_name(j, path), true, as_decoder);
}

}  // namespace kvlab
