// The trained tiny models and PyTorch's outputs for them (models/reference.json, written by
// scripts/train-tiny.py; models/README.md describes the schema), as the unit tests read them.
#pragma once
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "kvlab/formats/checkpoint.hpp"
#include "kvlab/serve/scheduler.hpp"
#include "test_paths.hpp"

namespace kvlab::test {

inline nlohmann::json reference_json() {
    std::ifstream in(std::filesystem::path(models_dir) / "reference.json");
    REQUIRE(in);
    return nlohmann::json::parse(in);
}

// One model's entry of reference.json ("models" -> name -> entry): its checkpoint, loaded.
inline LoadedModel reference_checkpoint(const nlohmann::json& entry) {
    return load_checkpoint(std::filesystem::path(models_dir) / entry.at("checkpoint").get<std::string>());
}

// Each prompt of an entry as a serve request for as many tokens as PyTorch's greedy continuation, which
// goes to `want` in the same order.
inline std::vector<ServeRequest> greedy_requests(const nlohmann::json& entry, std::vector<std::vector<TokenId>>& want) {
    std::vector<ServeRequest> reqs;
    for (const auto& p : entry.at("prompts")) {
        want.push_back(p.at("greedy_ids").get<std::vector<TokenId>>());
        reqs.push_back({p.at("ids").get<std::vector<TokenId>>(), std::ssize(want.back()), 0});
    }
    return reqs;
}

}  // namespace kvlab::test
