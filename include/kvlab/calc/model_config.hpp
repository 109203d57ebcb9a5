// ModelConfig: a validated model description read from a Hugging Face style config.json
// (or a kvlab preset, which is the same format plus a "_kvlab" block). Non-goal: weights.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvlab {

enum class Family { llama, gpt2 };  // which forward pass the simulator runs

// DeepSeek-V2/V3 multi-head latent attention: one compressed latent per token per layer.
struct MlaShape {
    std::int64_t kv_lora_rank = 0;
    std::int64_t qk_rope_head_dim = 0;
    std::int64_t q_lora_rank = 0;       // 0: queries projected directly (no q LoRA)
    std::int64_t qk_nope_head_dim = 0;  // per-head non-RoPE query/key width
    std::int64_t v_head_dim = 0;
};

// An encoder-decoder model (T5, BART, Whisper): the decoder's layers (n_layer), heads and head width size
// both of its caches. Self-attention: one K and V row per layer per generated token (grows, as a decoder-only
// model's). Cross-attention: K and V of the encoder's output, encoder_len rows per decoder layer, computed
// once at prefill from the encoder and never grown (docs/kv-memory.md, "Encoder-decoder models").
struct CrossAttention {
    std::int64_t n_layer_encoder = 0;
    std::int64_t encoder_len = 0;  // tokens (Whisper: audio frames after its convolutions) the encoder reads; 0: not known
    std::string encoder_len_rule;  // where encoder_len came from
};

struct ModelConfig {
    std::string name;           // preset name or file stem, e.g. "llama-2-7b"
    std::string display_name;   // e.g. "Llama-2 7B"
    std::string source;         // where the values were read from (HF id or file path)
    std::string origin_path;    // file the config was read from
    std::string model_type;     // HF model_type, e.g. "llama", "mistral", "gpt2"
    // How a model_type kvlab has no rules for (or none, or an encoder's under --as-decoder) was sized; "" for known types
    std::string type_rule;
    std::string activation;     // hidden_act / activation_function as written ("silu", "gelu_new"), "" if absent
    std::string hf_id;          // "_kvlab".hf_id for presets: the Hugging Face id it was read from, else ""
    std::string preset_family;  // "_kvlab".family for presets ("llama", "mistral", "gpt2", "llama2.c"), else ""
    // "_kvlab".checkpoint / .tokenizer of a preset that ships its weights (the models trained in models/),
    // resolved against the preset file's folder; empty otherwise. `simulate --model` runs them.
    std::filesystem::path checkpoint;
    std::filesystem::path tokenizer;
    Family family = Family::llama;

    std::int64_t n_layer = 0;     // L
    std::int64_t d_model = 0;     // hidden_size
    std::int64_t n_head = 0;      // H, query heads
    std::int64_t n_head_kv = 0;   // Hkv
    std::int64_t d_head = 0;      // D
    std::int64_t d_ff = 0;        // intermediate_size (per expert for MoE)
    std::int64_t n_vocab = 0;     // V
    std::int64_t n_ctx_max = 0;   // max_position_embeddings
    std::int64_t n_expert = 1;        // MoE experts per layer (1 = dense)
    std::int64_t n_expert_active = 1; // experts used per token
    std::int64_t d_ff_expert = 0;     // moe_intermediate_size when it differs from d_ff (DeepSeek), else 0
    std::int64_t n_expert_shared = 0; // DeepSeek shared experts per MoE layer
    std::int64_t n_layer_dense = 0;   // DeepSeek first_k_dense_replace: leading dense layers
    std::int64_t d_ff_dense = 0;      // the dense layers' MLP width when it differs from d_ff (Llama 4's intermediate_size_mlp), else 0
    std::int64_t d_ff_shared = 0;     // a shared expert's width when it differs from the routed ones' (Qwen2-MoE), else 0
    std::int64_t moe_layer_step = 1;  // every step-th layer is MoE, the rest dense (Llama 4's interleave_moe_layer_step)
    bool shared_expert_gate = false;  // Qwen2-MoE: a (1, d) gate on the shared expert
    bool attention_bias = false;      // q/k/v projections carry biases (Qwen2: q/k/v only)
    bool out_bias = false;            // the attention output projection carries a bias (attention_bias in Llama-style configs)
    double rope_theta = 10000.0;
    double norm_eps = 1e-5;
    bool tied_embeddings = false;

    // Sliding-window attention: window length, and which layers use it (size n_layer).
    std::optional<std::int64_t> sliding_window;
    std::vector<bool> layer_windowed;
    // StreamingLLM sinks: a windowed layer keeps its first sink_tokens positions and the last
    // sliding_window - sink_tokens (still sliding_window rows; kvlab keeps keys at their text positions)
    std::int64_t sink_tokens = 0;
    // simulate --sink-positions cache: attention scores a sink as if it sat at its slot in the cache (StreamingLLM
    // section 3.2), not at its text position; false (text): keys keep the positions they were rotated with
    bool sink_cache_positions = false;
    std::optional<MlaShape> mla;
    std::optional<CrossAttention> cross;  // encoder-decoder models only
    // DeepSeek-style low-rank attention projections whose cache is not the latent (MiniCPM3 caches every
    // head's K and V): the shapes for the parameter count only; mla above is unset for such a model
    std::optional<MlaShape> lora_attention;

    // Which rules produced d_head and n_head_kv, said to the user (e.g. "head_dim explicit in config").
    std::string head_dim_rule;
    std::string kv_heads_rule;
    std::string window_rule;
    std::string ctx_rule;       // where n_ctx_max came from (a key, model_max_length, rope_scaling), "" if no key
    std::string ffn_rule;       // where d_ff came from; d_ff = 0 when the config does not say (weights unknown)
    std::vector<std::string> defaults;  // values the config omitted that a class or family default supplied, which change a size
    std::vector<std::string> numeric_defaults;  // the same for values only the forward pass reads (rope_theta, eps): --explain
    // The weights' bytes as stored beside the config (safetensors headers), when a caller read them:
    // the GPU fit then uses them instead of parameters x --weights-dtype. With the rule said to the user.
    std::optional<std::uint64_t> stored_weight_bytes;
    std::uint64_t stored_vision_bytes = 0;  // the part of stored_weight_bytes a vision tower holds (never read by decode)
    std::string quant_method;   // quantization_config.quant_method ("fp8", "mxfp4", "awq", ...), "" when none
    std::string stored_weights_rule;
    bool gguf_mla_full_kv = false;  // a GGUF without llama.cpp's MLA split: llama.cpp caches full K and V per head
    bool falcon = false;        // Falcon: GELU MLP of 2 matrices, LayerNorms with bias (model_type falcon)
    // The weights' layout beyond the shapes, for the parameter count (param_count.cpp says per family):
    std::int64_t norms_per_layer = 2;  // d-wide norms per layer: Falcon-7B and Phi 1, Gemma 2/3 4
    std::int64_t mlp_matrices = 3;     // gated MLP (gate, up, down) 3; GELU MLP (Falcon, GPT-NeoX, Phi) 2
    bool mlp_bias = false;             // the MLP's matrices carry biases (GPT-NeoX, Phi, gpt-oss's experts)
    bool norm_bias = false;            // LayerNorms with a bias beside the weight (Falcon, GPT-NeoX, Phi)
    bool qk_norm = false;              // per-head q and k norms, head_dim wide each (Qwen3, Gemma 3)
    bool lm_head_bias = false;         // Phi
    bool router_bias = false;          // gpt-oss
    bool attention_sinks = false;      // gpt-oss: one learned sink per head per layer
    // A multimodal config's vision tower and projector, which engines load beside the text model: counted for
    // Gemma 3's SigLIP and Qwen2.5-VL's vision transformer (vision_params > 0, vision_rule says how); other
    // vision_configs are named in vision_rule and not counted (vision_params 0). Both empty for a text-only config.
    std::uint64_t vision_params = 0;
    std::string vision_rule;

    // H*D: width of all query heads; Hkv*D: width of one K or V row. Overflow-checked: they throw
    // OverflowError naming the fields when the product passes 2^63-1 (parse_model_config checks them first).
    std::int64_t d_q() const;
    std::int64_t d_kv() const;
    std::int64_t n_group() const { return n_head / n_head_kv; }
    // The per-layer window rule, stated once (KV-cache sizes, the forward pass and its costs use it):
    // layer l attends to its last sliding_window positions if it is a windowed layer, else to all of
    // them (layer_window = 0). keys_attended: keys a query at position pos sees in layer l.
    std::int64_t layer_window(std::int64_t layer) const;
    std::int64_t keys_attended(std::int64_t layer, std::int64_t pos) const;
    std::string attention_kind() const;  // "MHA", "GQA-8", "MQA", "MLA"
};

// The rows one layer's KV cache keeps per token: Hkv*D keys and Hkv*D values, or for MLA one latent row
// of kv_lora_rank + qk_rope_head_dim values (c_KV and the decoupled RoPE key, DeepSeek-V2 eq. 9 and 17) and
// no value row. kv_row_heads / kv_row_values: the KV "heads" and the values of one row; kv_rows_per_token: 2 or 1.
inline std::int64_t kv_row_heads(const ModelConfig& cfg) { return cfg.mla ? 1 : cfg.n_head_kv; }
inline std::int64_t kv_row_head_dim(const ModelConfig& cfg) { return cfg.mla ? cfg.mla->kv_lora_rank + cfg.mla->qk_rope_head_dim : cfg.d_head; }
inline std::int64_t kv_row_values(const ModelConfig& cfg) { return cfg.mla ? kv_row_head_dim(cfg) : cfg.d_kv(); }
inline std::int64_t kv_rows_per_token(const ModelConfig& cfg) { return cfg.mla ? 1 : 2; }

// Keys a query at position `pos` attends under a window of `window` positions (0: no window).
inline std::int64_t keys_in_window(std::int64_t window, std::int64_t pos) {
    return window > 0 && window < pos + 1 ? window : pos + 1;
}

// The cache policy of --window W (every layer a sliding-window layer of W positions; 0: the model's own)
// and --sink-tokens S (StreamingLLM: the window also keeps positions 0..S-1), applied to `cfg` with the
// rule said in window_rule. Throws UsageError for a negative value, sinks without a window, or S >= W.
void apply_window_policy(ModelConfig& cfg, std::int64_t window, std::int64_t sink_tokens);

// Parse and validate; `where` names the file in error messages. Throws ConfigError.
// The most layers a config may have (published models have up to a few hundred).
inline constexpr std::int64_t max_layers = 65536;
// class_defaults: fill keys the config omits from its model_type's transformers class (config_defaults.hpp);
// false for metadata that is not a transformers config (GGUF), where an absent key stays absent.
// An encoder-only model_type (bert, roberta, ...: no KV cache in decoding) is a ConfigError unless
// `as_decoder` (kvcalc --as-decoder) or the config says is_decoder; type_rule says how it was sized.
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& where, const std::string& name, bool class_defaults = true,
                               bool as_decoder = false);
// The name a config file gives its model: its "_name_or_path" (written by transformers'
// save_pretrained), else the real name of the folder holding a config.json, else the file's stem.
std::string config_model_name(const nlohmann::json& j, const std::filesystem::path& path);
// Read a config.json, or a directory holding one. Throws ConfigError / IoError.
ModelConfig load_model_config(const std::filesystem::path& path, bool as_decoder = false);

}  // namespace kvlab
