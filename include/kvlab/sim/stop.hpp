// StopMatcher: ends a generation when its text contains a stop string, as engines' `stop` parameter does
// (OpenAI's and vLLM's `stop`). Text comes in piece by piece (one token's text at a time); what comes out
// is the text safe to print: everything before the first stop string, which is itself not printed (vLLM's
// default, include_stop_str_in_output=False). A stop string may span several tokens: text that could be
// the start of one is held back until the next piece settles it. Matching is on bytes.
// Non-goals: stop token ids (the caller compares ids), regular expressions.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace kvlab {

class StopMatcher {
public:
    // Throws UsageError naming --stop for an empty stop string (it would match before any text).
    explicit StopMatcher(std::vector<std::string> stops);

    struct Step {
        std::string text;      // printable now: never part of a stop string
        bool stopped = false;  // a stop string ended the text; `text` runs up to it, excluded
    };
    // The next piece of text. After a stop every call returns {"", true}.
    Step push(std::string_view piece);
    // The end of the generation without a stop: the text held back, now known to be plain text.
    std::string finish();

    bool stopped() const { return stopped_; }
    const std::string& matched() const { return matched_; }  // the stop string that ended the text, else ""
    bool empty() const { return stops_.empty(); }

private:
    std::vector<std::string> stops_;
    std::string held_;  // the longest tail of the text so far that is a proper prefix of a stop string
    std::string matched_;
    bool stopped_ = false;
};

}  // namespace kvlab
