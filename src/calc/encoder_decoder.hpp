// Encoder-decoder configs (T5, BART, Whisper and their kin) read as their decoder: the fields that size the
// decoder's caches under the names kvlab's reader knows, and the cross-attention shape beside them.
#pragma once
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kvlab/calc/model_config.hpp"

namespace kvlab {

// t5, mt5, umt5, bart, mbart, whisper (transformers v4.57.1 model_type names).
bool is_encoder_decoder_type(std::string_view model_type);

// A copy of `j` whose num_hidden_layers, num_attention_heads, hidden_size (and head_dim, intermediate_size,
// max_position_embeddings where the type has them) are the decoder's, with the encoder's layers and input
// length in `cross`. Throws ConfigError naming the config's own key when one is missing or not a positive integer.
nlohmann::json decoder_view(const nlohmann::json& j, const std::string& model_type, const std::string& where, CrossAttention& cross);

// The rule said to the user: which caches are sized, from which fields.
std::string encoder_decoder_rule(const std::string& model_type, const ModelConfig& cfg);

}  // namespace kvlab
