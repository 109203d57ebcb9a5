// The workload reader: the requests `kvlab serve --workload FILE` runs, one JSON object per line.
#pragma once
#include <string>
#include <vector>

#include "kvlab/calc/model_config.hpp"
#include "kvlab/formats/tokenizer.hpp"
#include "kvlab/serve/scheduler.hpp"

namespace kvlab {

// A JSONL workload: one object per line, {"prompt": text} (needs a tokenizer) or {"prompt_ids": [...]},
// "max_tokens", optional "arrival_step". Throws FormatError naming the file and line.
std::vector<ServeRequest> read_workload(const std::string& path, const ModelConfig& cfg, const Tokenizer* tokenizer);

}  // namespace kvlab
