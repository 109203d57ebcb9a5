#include "calc/attention_variant.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kvlab/core/error.hpp"
#include "kvlab/core/text.hpp"
#include "kvlab/core/units.hpp"

namespace kvlab {

AttentionVariant parse_attention_variant(std::string_view spec, std::string_view flag) {
    if (spec == "native") return {"native", 0};
    if (spec == "mha") return {"mha", -1};
    if (spec == "mqa") return {"mqa", 1};
    if (spec.rfind("gqa:", 0) == 0 || spec.rfind("kv:", 0) == 0)
        return {std::string(spec), static_cast<std::int64_t>(parse_count(spec.substr(spec.find(':') + 1), flag))};
    throw UsageError(fmt::format("{}: unknown attention variant {}; expected native, mha, mqa or gqa:N (comma-separated)",
                                 flag, quote(std::string(spec), 40)));
}

std::vector<AttentionVariant> parse_attention_variants(std::string_view text, std::string_view flag) {
    std::vector<AttentionVariant> out;
    for (const auto& item : split_list(text)) out.push_back(parse_attention_variant(item, flag));
    if (out.empty()) throw UsageError(fmt::format("{}: expected at least one of native, mha, mqa, gqa:N", flag));
    return out;
}

std::int64_t variant_kv_heads(const AttentionVariant& v, std::int64_t n_head, std::int64_t n_head_kv, std::string_view flag) {
    if (v.n_head_kv == 0) return n_head_kv;
    if (v.n_head_kv < 0) return n_head;
    if (v.n_head_kv > n_head || n_head % v.n_head_kv != 0) {
        std::vector<std::string> divisors;  // the counts that work, as the user would type them
        for (std::int64_t d = 1; d <= n_head && divisors.size() < 12; ++d)
            if (n_head % d == 0) divisors.push_back(fmt::format("gqa:{}", d));
        throw UsageError(fmt::format("{}: '{}' needs a KV head count that divides the {} query heads: {}", flag, v.label, n_head,
                                     fmt::join(divisors, ", ")));
    }
    return v.n_head_kv;
}

}  // namespace kvlab
