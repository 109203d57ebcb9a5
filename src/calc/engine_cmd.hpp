// kvcalc --engine-cmd "…": an engine's own command line (vllm serve, llama-server / llama-cli,
// python -m sglang.launch_server, trtllm-serve) read with that engine's flag names into what kvcalc sizes.
// Flags that do not change the KV cache are accepted and listed; any other flag is refused by name.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvlab/calc/engine.hpp"

namespace kvlab {

struct EngineCommand {
    Engine engine = Engine::exact;
    std::string program;                             // "vllm serve", "llama-server", ...
    std::string model;                               // the model the command names (positional, -m, --model, --model-path)
    std::optional<std::uint64_t> context;            // vLLM --max-model-len, SGLang --context-length, TensorRT-LLM --max_seq_len
    std::optional<std::uint64_t> n_ctx;              // llama.cpp -c (all sequences together)
    std::optional<std::uint64_t> batch;              // -np, --max-num-seqs, --max-running-requests, --max_batch_size
    std::optional<std::uint64_t> tp, pp, block_size, kv_tokens, ubatch, max_num_batched_tokens, kv_budget;
    std::optional<std::string> dtype;                // kvlab's name of the KV cache dtype
    std::optional<double> mem_util;                  // --gpu-memory-utilization, --mem-fraction-static, ...
    bool kv_unified = false, swa_full = false;
    FlashAttn flash_attn = FlashAttn::unset;         // llama.cpp -fa (bare: on, as older builds took it), -fa on|off|auto|1|0|-1
    std::string draft;                               // a draft model the command names (-md, --speculative-config's model)
    DraftKind draft_kind = DraftKind::unset;         // vLLM: what --speculative-config's method (or model name) makes the draft
    // SGLang: --max-running-requests and --speculative-num-steps / -eagle-topk / -num-draft-tokens (its speculative headroom)
    std::optional<std::uint64_t> max_running_requests, spec_steps, spec_topk, spec_draft_tokens;
    std::string spec_algorithm;                      // SGLang --speculative-algorithm as given
    std::vector<std::string> ignored;                // flags read that do not change the KV cache
    std::vector<std::string> notes;
};

// Throws UsageError naming the flag and the engine for a flag kvlab does not know, a value that is not
// one, or a command of no engine kvlab knows (values quoted and cut).
EngineCommand parse_engine_command(std::string_view command);

// The words of a command line as a POSIX shell splits them: blanks separate, '…' and "…" quote,
// backslash escapes (a backslash-newline joins lines). UsageError for an unclosed quote.
std::vector<std::string> split_command_line(std::string_view command);

}  // namespace kvlab
