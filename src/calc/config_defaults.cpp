#include "calc/config_defaults.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "core/json_input.hpp"

namespace kvlab {
namespace {

using nlohmann::json;

// Read from src/transformers/<file> at v4.57.1 (unchanged through v4.57.6): the __init__ default of each
// key kvlab reads. Left out on purpose: defaults of None (num_key_value_heads None means MHA, head_dim
// None means hidden / heads, which kvlab's reader already applies), and keys a class does not have.
// tie_word_embeddings = true for gpt2 and falcon is PretrainedConfig's default (configuration_utils.py).
const std::vector<ClassDefaults>& tables() {
    static const std::vector<ClassDefaults> t = {
        {"llama", "LlamaConfig", "models/llama/configuration_llama.py",
         {{"vocab_size", 32000}, {"hidden_size", 4096}, {"intermediate_size", 11008}, {"num_hidden_layers", 32}, {"num_attention_heads", 32},
          {"max_position_embeddings", 2048}, {"tie_word_embeddings", false}, {"rope_theta", 10000.0}, {"rms_norm_eps", 1e-6}}},
        {"mistral", "MistralConfig", "models/mistral/configuration_mistral.py",
         {{"vocab_size", 32000}, {"hidden_size", 4096}, {"intermediate_size", 14336}, {"num_hidden_layers", 32}, {"num_attention_heads", 32},
          {"num_key_value_heads", 8}, {"max_position_embeddings", 131072}, {"sliding_window", 4096}, {"tie_word_embeddings", false},
          {"rope_theta", 10000.0}, {"rms_norm_eps", 1e-6}}},
        {"mixtral", "MixtralConfig", "models/mixtral/configuration_mixtral.py",
         {{"vocab_size", 32000}, {"hidden_size", 4096}, {"intermediate_size", 14336}, {"num_hidden_layers", 32}, {"num_attention_heads", 32},
          {"num_key_value_heads", 8}, {"max_position_embeddings", 131072}, {"tie_word_embeddings", false}, {"num_local_experts", 8},
          {"num_experts_per_tok", 2}, {"rope_theta", 1e6}, {"rms_norm_eps", 1e-5}}},
        {"qwen2", "Qwen2Config", "models/qwen2/configuration_qwen2.py",
         {{"vocab_size", 151936}, {"hidden_size", 4096}, {"intermediate_size", 22016}, {"num_hidden_layers", 32}, {"num_attention_heads", 32},
          {"num_key_value_heads", 32}, {"max_position_embeddings", 32768}, {"use_sliding_window", false}, {"sliding_window", 4096},
          {"max_window_layers", 28}, {"tie_word_embeddings", false}, {"rope_theta", 10000.0}, {"rms_norm_eps", 1e-6}}},
        {"qwen2_moe", "Qwen2MoeConfig", "models/qwen2_moe/configuration_qwen2_moe.py",
         {{"vocab_size", 151936}, {"hidden_size", 2048}, {"intermediate_size", 5632}, {"num_hidden_layers", 24}, {"num_attention_heads", 16},
          {"num_key_value_heads", 16}, {"max_position_embeddings", 32768}, {"use_sliding_window", false}, {"sliding_window", 4096},
          {"max_window_layers", 28}, {"tie_word_embeddings", false}, {"num_experts", 60}, {"num_experts_per_tok", 4},
          {"moe_intermediate_size", 1408}, {"rope_theta", 10000.0}, {"rms_norm_eps", 1e-6}}},
        {"qwen3", "Qwen3Config", "models/qwen3/configuration_qwen3.py",
         {{"vocab_size", 151936}, {"hidden_size", 4096}, {"intermediate_size", 22016}, {"num_hidden_layers", 32}, {"num_attention_heads", 32},
          {"num_key_value_heads", 32}, {"head_dim", 128}, {"max_position_embeddings", 32768}, {"use_sliding_window", false},
          {"sliding_window", 4096}, {"max_window_layers", 28}, {"tie_word_embeddings", false}, {"rope_theta", 10000.0}, {"rms_norm_eps", 1e-6}}},
        {"qwen3_moe", "Qwen3MoeConfig", "models/qwen3_moe/configuration_qwen3_moe.py",
         {{"vocab_size", 151936}, {"hidden_size", 2048}, {"intermediate_size", 6144}, {"num_hidden_layers", 24}, {"num_attention_heads", 32},
          {"num_key_value_heads", 4}, {"max_position_embeddings", 32768}, {"use_sliding_window", false}, {"sliding_window", 4096},
          {"tie_word_embeddings", false}, {"num_experts", 128}, {"num_experts_per_tok", 8}, {"moe_intermediate_size", 768},
          {"rope_theta", 10000.0}, {"rms_norm_eps", 1e-6}}},
        {"gemma", "GemmaConfig", "models/gemma/configuration_gemma.py",
         {{"vocab_size", 256000}, {"hidden_size", 3072}, {"intermediate_size", 24576}, {"num_hidden_layers", 28}, {"num_attention_heads", 16},
          {"num_key_value_heads", 16}, {"head_dim", 256}, {"max_position_embeddings", 8192}, {"tie_word_embeddings", true},
          {"rope_theta", 10000.0}, {"rms_norm_eps", 1e-6}}},
        {"gemma2", "Gemma2Config", "models/gemma2/configuration_gemma2.py",
         {{"vocab_size", 256000}, {"hidden_size", 2304}, {"intermediate_size", 9216}, {"num_hidden_layers", 26}, {"num_attention_heads", 8},
          {"num_key_value_heads", 4}, {"head_dim", 256}, {"max_position_embeddings", 8192}, {"sliding_window", 4096},
          {"tie_word_embeddings", true}, {"rope_theta", 10000.0}, {"rms_norm_eps", 1e-6}}},
        // sliding_window_pattern is a kwargs key read with default 6 (layer i is global when (i + 1) % 6 == 0)
        {"gemma3_text", "Gemma3TextConfig", "models/gemma3/configuration_gemma3.py",
         {{"vocab_size", 262208}, {"hidden_size", 2304}, {"intermediate_size", 9216}, {"num_hidden_layers", 26}, {"num_attention_heads", 8},
          {"num_key_value_heads", 4}, {"head_dim", 256}, {"max_position_embeddings", 131072}, {"sliding_window", 4096},
          {"sliding_window_pattern", 6}, {"tie_word_embeddings", true}, {"rope_theta", 1e6}, {"rms_norm_eps", 1e-6}}},
        {"phi3", "Phi3Config", "models/phi3/configuration_phi3.py",
         {{"vocab_size", 32064}, {"hidden_size", 3072}, {"intermediate_size", 8192}, {"num_hidden_layers", 32}, {"num_attention_heads", 32},
          {"max_position_embeddings", 4096}, {"tie_word_embeddings", false}, {"rope_theta", 10000.0}, {"rms_norm_eps", 1e-5}}},
        {"falcon", "FalconConfig", "models/falcon/configuration_falcon.py",
         {{"vocab_size", 65024}, {"hidden_size", 4544}, {"num_hidden_layers", 32}, {"num_attention_heads", 71}, {"multi_query", true},
          {"new_decoder_architecture", false}, {"parallel_attn", true}, {"max_position_embeddings", 2048}, {"tie_word_embeddings", true},
          {"rope_theta", 10000.0}, {"layer_norm_epsilon", 1e-5}}},
        {"gpt2", "GPT2Config", "models/gpt2/configuration_gpt2.py",
         {{"vocab_size", 50257}, {"n_positions", 1024}, {"n_embd", 768}, {"n_layer", 12}, {"n_head", 12}, {"tie_word_embeddings", true},
          {"layer_norm_epsilon", 1e-5}}},
        {"gpt_neox", "GPTNeoXConfig", "models/gpt_neox/configuration_gpt_neox.py",
         {{"vocab_size", 50432}, {"hidden_size", 6144}, {"num_hidden_layers", 44}, {"num_attention_heads", 64}, {"intermediate_size", 24576},
          {"max_position_embeddings", 2048}, {"tie_word_embeddings", false}, {"layer_norm_eps", 1e-5}}},
        // num_experts_per_tok defaults to None here: a real checkpoint supplies it
        {"deepseek_v2", "DeepseekV2Config", "models/deepseek_v2/configuration_deepseek_v2.py",
         {{"vocab_size", 32000}, {"hidden_size", 4096}, {"intermediate_size", 11008}, {"num_hidden_layers", 32}, {"num_attention_heads", 32},
          {"max_position_embeddings", 2048}, {"tie_word_embeddings", false}, {"n_routed_experts", 64}, {"n_shared_experts", 2},
          {"moe_intermediate_size", 1407}, {"first_k_dense_replace", 0}, {"kv_lora_rank", 512}, {"q_lora_rank", 1536},
          {"qk_rope_head_dim", 64}, {"qk_nope_head_dim", 128}, {"v_head_dim", 128}, {"rope_theta", 10000.0}, {"rms_norm_eps", 1e-6}}},
        {"deepseek_v3", "DeepseekV3Config", "models/deepseek_v3/configuration_deepseek_v3.py",
         {{"vocab_size", 129280}, {"hidden_size", 7168}, {"intermediate_size", 18432}, {"moe_intermediate_size", 2048},
          {"num_hidden_layers", 61}, {"num_attention_heads", 128}, {"num_key_value_heads", 128}, {"max_position_embeddings", 4096},
          {"tie_word_embeddings", false}, {"n_routed_experts", 256}, {"n_shared_experts", 1}, {"num_experts_per_tok", 8},
          {"first_k_dense_replace", 3}, {"kv_lora_rank", 512}, {"q_lora_rank", 1536}, {"qk_rope_head_dim", 64}, {"qk_nope_head_dim", 128},
          {"v_head_dim", 128}, {"rope_theta", 10000.0}, {"rms_norm_eps", 1e-6}}},
        // layer_types None alternates sliding / full from layer 0 (as Gemma-2)
        {"gpt_oss", "GptOssConfig", "models/gpt_oss/configuration_gpt_oss.py",
         {{"num_hidden_layers", 36}, {"num_local_experts", 128}, {"vocab_size", 201088}, {"hidden_size", 2880}, {"intermediate_size", 2880},
          {"head_dim", 64}, {"num_attention_heads", 64}, {"num_key_value_heads", 8}, {"sliding_window", 128},
          {"max_position_embeddings", 131072}, {"tie_word_embeddings", false}, {"num_experts_per_tok", 4}, {"rope_theta", 150000.0},
          {"rms_norm_eps", 1e-5}}},
    };
    return t;
}

}  // namespace

const ClassDefaults* class_defaults(std::string_view model_type) {
    const auto& t = tables();
    const auto it = std::find_if(t.begin(), t.end(), [&](const ClassDefaults& c) { return c.model_type == model_type; });
    return it == t.end() ? nullptr : &*it;
}

std::vector<std::string_view> class_default_types() {
    std::vector<std::string_view> out;
    for (const auto& c : tables()) out.push_back(c.model_type);
    return out;
}

AppliedDefaults apply_class_defaults(json& config, std::string_view model_type) {
    const ClassDefaults* c = class_defaults(model_type);
    if (!c || !config.is_object()) return {};
    AppliedDefaults out;
    out.config_class = c->config_class;
    std::vector<std::string> sizes, numerics;
    for (const auto& [key, value] : c->values.items()) {
        if (config.contains(key)) continue;  // present, even as null: the config's own word
        config[key] = value;
        out.keys.push_back(key);
        const bool numeric = key == "rope_theta" || key.find("eps") != std::string::npos;
        (numeric ? numerics : sizes).push_back(fmt::format("{} {}", key, json_excerpt(value)));
    }
    auto line = [&](const std::vector<std::string>& keys) {
        return keys.empty() ? std::string()
                            : fmt::format("{} defaults ({} {}): {}", c->config_class, transformers_release, c->file, fmt::join(keys, ", "));
    };
    out.sizes = line(sizes);
    out.numerics = line(numerics);
    return out;
}

bool AppliedDefaults::filled(std::string_view key) const { return std::find(keys.begin(), keys.end(), key) != keys.end(); }

std::string_view text_config_type(std::string_view wrapper_type) {
    // Gemma3Config.sub_configs: text_config is a Gemma3TextConfig (models/gemma3/configuration_gemma3.py)
    if (wrapper_type == "gemma3") return "gemma3_text";
    return {};
}

}  // namespace kvlab
