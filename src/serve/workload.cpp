// The workload reader: one request per line of a JSON Lines file (docs/serving.md, "Workloads").
#include "serve/workload.hpp"

#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/json_input.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/core/mapped_file.hpp"
#include "kvlab/core/text.hpp"

namespace kvlab {

namespace {

// A request's own sampling keys (vLLM's per-request SamplingParams): "stop" (a string or an array of
// non-empty strings), "ignore_eos" (true/false), "seed" (a whole number >= 0), "n" (outputs, a whole number >= 1).
template <class Fail>
void read_sampling_keys(const nlohmann::json& j, ServeRequest& r, const Fail& fail) {
    if (j.contains("stop")) {
        const nlohmann::json& s = j["stop"];
        const nlohmann::json list = s.is_string() ? nlohmann::json::array({s}) : s;
        if (!list.is_array()) throw fail("\"stop\" must be a string or an array of strings");
        for (const auto& x : list) {
            if (!x.is_string() || x.get_ref<const std::string&>().empty()) throw fail(fmt::format("\"stop\": {} is not a non-empty string", json_excerpt(x)));
            r.stop.push_back(x.get<std::string>());
        }
    }
    if (j.contains("ignore_eos")) {
        if (!j["ignore_eos"].is_boolean()) throw fail("\"ignore_eos\" must be true or false");
        r.ignore_eos = j["ignore_eos"].get<bool>();
    }
    if (j.contains("seed")) {
        if (!j["seed"].is_number_unsigned()) throw fail(fmt::format("\"seed\": {} is not a whole number >= 0", json_excerpt(j["seed"])));
        r.seed = j["seed"].get<std::uint64_t>();
    }
    if (j.contains("n")) {
        if (!j["n"].is_number_integer() || j["n"].get<std::int64_t>() < 1 || j["n"].get<std::int64_t>() > (1 << 20))
            throw fail(fmt::format("\"n\": {} is not a whole number of outputs in 1..2^20", json_excerpt(j["n"])));
        r.n = j["n"].get<std::int64_t>();
    }
}

}  // namespace

std::vector<ServeRequest> read_workload(const std::string& path, const ModelConfig& cfg, const Tokenizer* tokenizer) {
    const std::string text = read_input_file(path, "workload file", 256 << 20);
    std::istringstream in(text);
    std::vector<ServeRequest> reqs;
    std::string line;
    for (std::int64_t n = 1; std::getline(in, line); ++n) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines are allowed
        const std::string where = fmt::format("{}:{}", path, n);
        const nlohmann::json j = parse_json(line, where);
        auto fail = [&](const std::string& what) { return FormatError(fmt::format("{}: {}", where, what)); };
        if (!j.is_object()) throw fail("expected one JSON object per line, e.g. {\"prompt\": \"Once upon a time\", \"max_tokens\": 32}");
        static const std::set<std::string> keys{"prompt", "prompt_ids", "max_tokens", "arrival_step", "stop", "ignore_eos", "seed", "n"};
        for (const auto& item : j.items())
            if (!keys.contains(item.key()))
                throw fail(fmt::format("unknown key {}; expected prompt or prompt_ids, max_tokens, and optionally arrival_step, stop, ignore_eos, seed, n",
                                       quote(item.key())));
        ServeRequest r;
        if (j.contains("prompt") == j.contains("prompt_ids")) throw fail("expected exactly one of \"prompt\" (text) and \"prompt_ids\" (token ids)");
        if (j.contains("prompt")) {
            if (!j["prompt"].is_string()) throw fail("\"prompt\" must be a string");
            if (!tokenizer) throw fail("\"prompt\" is text, which needs --tokenizer (or a model that ships one); or give \"prompt_ids\"");
            const std::string& s = j["prompt"].get_ref<const std::string&>();
            if (tokenizer->min_tokens(s.size(), true) > cfg.n_ctx_max)
                throw fail(fmt::format("the prompt's {} bytes encode to more than the {} positions of {}", s.size(), cfg.n_ctx_max, cfg.name));
            r.prompt = tokenizer->encode(s, true, false);
        } else {
            const nlohmann::json& ids = j["prompt_ids"];
            if (!ids.is_array() || ids.empty()) throw fail("\"prompt_ids\" must be a non-empty array of token ids");
            if (std::ssize(ids) > cfg.n_ctx_max) throw fail(fmt::format("{} prompt ids; the context of {} is {}", ids.size(), cfg.name, cfg.n_ctx_max));
            for (const auto& id : ids) {
                if (!id.is_number_integer() || id.get<std::int64_t>() < 0 || id.get<std::int64_t>() >= cfg.n_vocab)
                    throw fail(fmt::format("prompt id {} is not a token id in [0, {})", json_excerpt(id), cfg.n_vocab));
                r.prompt.push_back(id.get<TokenId>());
            }
        }
        if (!j.contains("max_tokens") || !j["max_tokens"].is_number_integer() || j["max_tokens"].get<std::int64_t>() < 1)
            throw fail("\"max_tokens\" must be a whole number >= 1");
        r.max_tokens = j["max_tokens"].get<std::int64_t>();
        if (j.contains("arrival_step")) {
            if (!j["arrival_step"].is_number_integer() || j["arrival_step"].get<std::int64_t>() < 0)
                throw fail("\"arrival_step\" must be a whole number >= 0");
            r.arrival_step = j["arrival_step"].get<std::int64_t>();
        }
        read_sampling_keys(j, r, fail);
        reqs.push_back(std::move(r));
    }
    if (reqs.empty()) throw FormatError(fmt::format("{}: no requests; expected one JSON object per line", path));
    return reqs;
}

}  // namespace kvlab
