#include "kvlab/sim/stop.hpp"

#include <algorithm>

#include "kvlab/core/error.hpp"

namespace kvlab {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
    for (const std::string& s : stops_)
        if (s.empty()) throw UsageError("--stop: an empty string; expected the text that ends the generation, e.g. --stop \"The end\"");
}

StopMatcher::Step StopMatcher::push(std::string_view piece) {
    if (stopped_) return {"", true};
    std::string text = std::move(held_);
    text.append(piece);
    held_.clear();
    // the earliest stop string in the text (held text included); on one start, the first listed
    std::size_t first = std::string::npos;
    for (const std::string& s : stops_) {
        const std::size_t at = text.find(s);
        if (at < first) {
            first = at;
            matched_ = s;
        }
    }
    if (first != std::string::npos) {
        stopped_ = true;
        text.resize(first);
        return {std::move(text), true};
    }
    // hold the longest tail that the next piece could complete into a stop string
    std::size_t hold = 0;
    for (const std::string& s : stops_)
        for (std::size_t k = std::min(s.size() - 1, text.size()); k > hold; --k)
            if (std::string_view(text).substr(text.size() - k) == std::string_view(s).substr(0, k)) {
                hold = k;
                break;
            }
    held_ = text.substr(text.size() - hold);
    text.resize(text.size() - hold);
    return {std::move(text), false};
}

std::string StopMatcher::finish() {
    std::string out = std::move(held_);
    held_.clear();
    return stopped_ ? std::string() : out;
}

}  // namespace kvlab
