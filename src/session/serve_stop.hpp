// When a serve output stops early (ServeOptions::stop_rule), from simulate's rules: a trained checkpoint
// with its tokenizer ends at end-of-text (BOS or EOS, as run.c stops at BOS) unless --ignore-eos or the
// request's "ignore_eos" (the session turns it on for --workload files only); any model with a tokenizer ends when the output's text contains one of --stop's
// strings or the request's "stop" strings (matched in the generated text only, not the prompt, as
// simulate's StopMatcher and vLLM's `stop` do).
#pragma once
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvlab/formats/tokenizer.hpp"
#include "kvlab/serve/scheduler.hpp"

namespace kvlab {

struct ServeStopInputs {
    std::vector<std::string> stop;  // --stop
    bool ignore_eos = false;        // --ignore-eos
    bool end_of_text = false;       // a trained checkpoint: its BOS and EOS end a text
};

// Throws UsageError naming --stop (or the request) for an empty stop string, or stop strings without a
// tokenizer to decode the text. Empty (every output runs to max_tokens) when nothing can stop one.
std::function<std::optional<FinishReason>(std::int64_t, std::span<const TokenId>)> serve_stop_rule(
    const ServeStopInputs& in, std::span<const ServeRequest> requests, const std::optional<Tokenizer>& tokenizer);

}  // namespace kvlab
