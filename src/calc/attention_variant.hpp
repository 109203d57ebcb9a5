// Attention layouts for what-if comparisons, one grammar for every command that takes them (kvcalc
// --attention, gpu attention --attention): native (the model's own KV heads), mha (as many KV heads as
// query heads), mqa (one), gqa:N or kv:N (N).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvlab {

struct AttentionVariant {
    std::string label;           // "native", "mha", "gqa:8", "mqa", "kv:4"
    std::int64_t n_head_kv = 0;  // 0: native; -1: mha (= the query heads); else the KV head count
};

// One variant, or a comma-separated list. Throws UsageError naming `flag`.
AttentionVariant parse_attention_variant(std::string_view spec, std::string_view flag = "--attention");
std::vector<AttentionVariant> parse_attention_variants(std::string_view text, std::string_view flag = "--attention");

// The KV heads of `variant` for a model with n_head query heads and n_head_kv of its own. Throws
// UsageError naming `flag` when the count does not divide the query heads.
std::int64_t variant_kv_heads(const AttentionVariant& variant, std::int64_t n_head, std::int64_t n_head_kv,
                              std::string_view flag = "--attention");

}  // namespace kvlab
