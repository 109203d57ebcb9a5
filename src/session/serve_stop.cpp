#include "session/serve_stop.hpp"

#include <algorithm>
#include <memory>

#include <fmt/format.h>

#include "kvlab/core/error.hpp"
#include "kvlab/sim/stop.hpp"

namespace kvlab {

namespace {

// What one request stops at: its end tokens and stop strings.
struct RequestStops {
    std::vector<TokenId> end_tokens;
    std::vector<std::string> strings;
};

// The text of the generated tokens, as simulate prints it after the prompt.
std::string generated_text(const Tokenizer& tokenizer, std::span<const TokenId> generated) {
    TextDecoder decoder(tokenizer);
    std::string text;
    for (const TokenId id : generated) text += decoder.next(id);
    return text;
}

}  // namespace

std::function<std::optional<FinishReason>(std::int64_t, std::span<const TokenId>)> serve_stop_rule(
    const ServeStopInputs& in, std::span<const ServeRequest> requests, const std::optional<Tokenizer>& tokenizer) {
    StopMatcher{in.stop};  // refuses an empty stop string, naming --stop
    auto stops = std::make_shared<std::vector<RequestStops>>(requests.size());
    bool any = false;
    for (std::size_t i = 0; i < requests.size(); ++i) {
        RequestStops& r = (*stops)[i];
        r.strings = in.stop;
        r.strings.insert(r.strings.end(), requests[i].stop.begin(), requests[i].stop.end());
        if (in.end_of_text && !in.ignore_eos && !requests[i].ignore_eos) r.end_tokens = {Tokenizer::bos_id, Tokenizer::eos_id};
        any = any || !r.end_tokens.empty() || !r.strings.empty();
        if (!r.strings.empty() && !tokenizer)
            throw UsageError(fmt::format("{}: stop strings are matched in the text, which needs --tokenizer (or a model that ships one)",
                                         in.stop.empty() ? fmt::format("request {}'s \"stop\"", i) : std::string("--stop")));
    }
    if (!any) return {};
    // each call decodes the output's text again (a few hundred tokens: microseconds), so the rule keeps no
    // state: a preempted output that starts over is matched afresh
    std::shared_ptr<const Tokenizer> tok = tokenizer ? std::make_shared<const Tokenizer>(*tokenizer) : nullptr;
    return [stops, tok](std::int64_t request, std::span<const TokenId> generated) -> std::optional<FinishReason> {
        const RequestStops& r = (*stops)[static_cast<std::size_t>(request)];
        if (std::find(r.end_tokens.begin(), r.end_tokens.end(), generated.back()) != r.end_tokens.end()) return FinishReason::end_of_text;
        if (r.strings.empty()) return std::nullopt;
        const std::string text = generated_text(*tok, generated);
        for (const std::string& s : r.strings)
            if (text.find(s) != std::string::npos) return FinishReason::stop_string;
        return std::nullopt;
    };
}

}  // namespace kvlab
