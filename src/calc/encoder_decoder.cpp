#include "calc/encoder_decoder.hpp"

#include <array>
#include <optional>
#include <span>

#include <fmt/format.h>

#include "kvlab/core/error.hpp"

namespace kvlab {
namespace {

using nlohmann::json;

constexpr std::array<std::string_view, 3> t5_types{"t5", "mt5", "umt5"};
constexpr std::array<std::string_view, 2> bart_types{"bart", "mbart"};

bool one_of(std::string_view type, std::span<const std::string_view> types) {
    for (const std::string_view t : types)
        if (t == type) return true;
    return false;
}

// A positive integer under `key`, or nullopt when absent; ConfigError naming the key otherwise.
std::optional<std::int64_t> field(const json& j, const char* key, const std::string& where) {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) return std::nullopt;
    if (!it->is_number_integer() || it->get<std::int64_t>() <= 0 || it->get<std::int64_t>() > (std::int64_t{1} << 40))
        throw ConfigError(fmt::format("{}: {} = {}; expected a positive integer", where, key, it->dump()));
    return it->get<std::int64_t>();
}

std::int64_t required(const json& j, const char* key, const std::string& where) {
    if (const auto v = field(j, key, where)) return *v;
    throw ConfigError(fmt::format("{}: missing {}, which an encoder-decoder config needs; expected a positive integer", where, key));
}

// Copies `from` (when present) to kvlab's key `to`.
void copy_key(json& out, const json& j, const char* from, const char* to, const std::string& where) {
    out.erase(to);
    if (const auto v = field(j, from, where)) out[to] = *v;
}

}  // namespace

bool is_encoder_decoder_type(std::string_view type) {
    return one_of(type, t5_types) || one_of(type, bart_types) || type == "whisper";
}

json decoder_view(const json& j, const std::string& type, const std::string& where, CrossAttention& cross) {
    json out = j;
    if (one_of(type, t5_types)) {
        // T5Config (models/t5/configuration_t5.py): num_decoder_layers None means num_layers; attention is
        // num_heads x d_kv wide, which need not be d_model (t5-3b: 32 x 128 against d_model 1024)
        const std::int64_t n_enc = required(j, "num_layers", where);
        cross.n_layer_encoder = n_enc;
        out["num_hidden_layers"] = field(j, "num_decoder_layers", where).value_or(n_enc);
        out["num_attention_heads"] = required(j, "num_heads", where);
        out["head_dim"] = required(j, "d_kv", where);
        out["hidden_size"] = required(j, "d_model", where);
        copy_key(out, j, "d_ff", "intermediate_size", where);
        // relative position buckets set no length; old T5 configs keep n_positions 512, the input length
        // T5 was pre-trained on (Raffel et al. 2020, section 3.1.2: "a maximum sequence length of 512")
        if (const auto n = field(j, "n_positions", where)) {
            cross.encoder_len = *n;
            cross.encoder_len_rule = fmt::format("encoder length {} from n_positions (T5's pre-training input length; its relative "
                                                 "positions set no limit)", *n);
        } else {
            cross.encoder_len_rule = "T5's relative positions set no input length and the config has no n_positions";
        }
        return out;
    }
    const bool whisper = type == "whisper";
    // BartConfig / WhisperConfig: encoder_layers, decoder_layers, decoder_attention_heads, d_model, decoder_ffn_dim
    cross.n_layer_encoder = required(j, "encoder_layers", where);
    out["num_hidden_layers"] = required(j, "decoder_layers", where);
    out["num_attention_heads"] = required(j, "decoder_attention_heads", where);
    out["hidden_size"] = required(j, "d_model", where);
    out.erase("head_dim");
    copy_key(out, j, "decoder_ffn_dim", "intermediate_size", where);
    if (whisper) {
        // the encoder always reads 30 s of audio: 3000 mel frames of 10 ms, halved by its stride-2 convolution
        // (openai/whisper whisper/audio.py: N_FRAMES = 3000, N_SAMPLES_PER_TOKEN = HOP_LENGTH * 2)
        copy_key(out, j, "max_target_positions", "max_position_embeddings", where);
        cross.encoder_len = required(j, "max_source_positions", where);
        cross.encoder_len_rule = fmt::format("encoder length {} frames from max_source_positions, fixed: Whisper pads or cuts every input to "
                                             "30 s, 3000 mel frames, which its stride-2 convolution halves (openai/whisper audio.py)",
                                             cross.encoder_len);
    } else if (const auto n = field(j, "max_position_embeddings", where)) {
        cross.encoder_len = *n;
        cross.encoder_len_rule = fmt::format("encoder length {} from max_position_embeddings (the longest input its learned positions "
                                             "cover; a shorter prompt holds fewer rows: --encoder-len)", *n);
    } else {
        cross.encoder_len_rule = "the config has no max_position_embeddings";
    }
    return out;
}

std::string encoder_decoder_rule(const std::string& type, const ModelConfig& cfg) {
    const CrossAttention& c = *cfg.cross;
    return fmt::format("model_type {} is an encoder-decoder model ({} encoder layers, {} decoder layers): two caches per sequence, "
                       "the decoder's self-attention (one K and V row per decoder layer per generated token, grows) and its "
                       "cross-attention (K and V of the encoder's output, {} rows per decoder layer, written once at prefill, "
                       "never grows); {}; the weight count covers the decoder's layers only (no encoder, no cross-attention projections)",
                       type, c.n_layer_encoder, cfg.n_layer, c.encoder_len > 0 ? std::to_string(c.encoder_len) : "encoder length",
                       c.encoder_len_rule);
}

}  // namespace kvlab
