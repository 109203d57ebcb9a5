#include "kvlab/calc/engine.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "kvlab/core/error.hpp"

namespace kvlab {

std::string_view engine_release(Engine engine) {
    switch (engine) {
    case Engine::exact: return "exact math";
    case Engine::vllm: return "vLLM v0.10.2";
    case Engine::llamacpp: return "llama.cpp b8668";
    case Engine::sglang: return "SGLang v0.5.2";
    case Engine::trtllm: return "TensorRT-LLM 1.2.0rc2";
    }
    return "";
}

DType engine_default_dtype(Engine engine) { return engine == Engine::llamacpp || engine == Engine::exact ? DType::fp16 : DType::bf16; }

EngineAnswer engine_answer(Engine engine, const EngineCase& c, const EngineSettings& s) {
    switch (engine) {
    case Engine::vllm: return vllm_answer(c, s);
    case Engine::llamacpp: return llamacpp_answer(c, s);
    case Engine::sglang: return sglang_answer(c, s);
    case Engine::trtllm: return trtllm_answer(c, s);
    case Engine::exact: break;
    }
    throw std::logic_error("engine_answer: exact math has no engine rules");
}

std::string with_thousands(std::uint64_t n) {
    std::string digits = std::to_string(n), out;
    for (std::size_t i = 0; i < digits.size(); ++i) {
        if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
        out += digits[i];
    }
    return out;
}

// llama.cpp prints (float)bytes / (1024.0f * 1024.0f); vLLM, SGLang and TensorRT-LLM divide by 1 << 30 in double.
double mib(std::uint64_t bytes) { return static_cast<double>(static_cast<float>(bytes) / (1024.0f * 1024.0f)); }
double gib(std::uint64_t bytes) { return static_cast<double>(bytes) / static_cast<double>(std::uint64_t{1} << 30); }

std::uint64_t kv_heads_per_rank(const ModelConfig& cfg, std::uint64_t tp, bool ceiling) {
    if (cfg.mla) return 1;  // one latent, whole on every GPU
    const auto kv = static_cast<std::uint64_t>(cfg.n_head_kv);
    if (ceiling) return (kv + tp - 1) / tp;
    return std::max<std::uint64_t>(kv / tp, 1);
}

std::uint64_t kv_row_values_per_rank(const ModelConfig& cfg, std::uint64_t tp, bool ceiling) {
    if (cfg.mla) return static_cast<std::uint64_t>(cfg.mla->kv_lora_rank + cfg.mla->qk_rope_head_dim);
    return kv_heads_per_rank(cfg, tp, ceiling) * static_cast<std::uint64_t>(cfg.d_head);
}

std::optional<std::uint64_t> pool_tokens(const EngineCase& c, const EngineSettings& s, std::uint64_t bytes_per_token) {
    std::optional<std::uint64_t> tokens;
    if (c.kv_budget) tokens = *c.kv_budget / bytes_per_token;
    if (s.kv_tokens) tokens = tokens ? std::min(*tokens, *s.kv_tokens) : *s.kv_tokens;
    return tokens;
}

std::uint64_t engine_value_bytes(DType dtype, std::initializer_list<DType> accepted, std::string_view takes) {
    if (std::find(accepted.begin(), accepted.end(), dtype) == accepted.end())
        throw UsageError(fmt::format("--dtype {}: {}", dtype_name(dtype), takes));
    return dtype == DType::fp16 || dtype == DType::bf16 ? 2 : 1;
}

}  // namespace kvlab
