// Where a command's model comes from (simulate, serve): a preset, a config.json, or a checkpoint with
// its real config and weights; and the thread count its kernels run on.
#pragma once
#include <cstdint>
#include <string>

#include "kvlab/calc/model_config.hpp"
#include "kvlab/core/core_use.hpp"
#include "kvlab/formats/checkpoint.hpp"
#include "kvlab/weights/weights.hpp"

namespace kvlab {

struct ModelSource {
    std::string model;       // preset name or path to a config.json
    std::string config;      // a config.json or a directory holding one
    std::string checkpoint;  // llama2.c .bin or Hugging Face directory: real config and weights
    std::string tokenizer;   // llama2.c tokenizer.bin
};

// The model's config. A preset that ships its weights (the trained models in models/) runs them: its
// checkpoint, and its tokenizer unless one is named, as if given with --checkpoint (both filled in `src`).
ModelConfig resolve_model(ModelSource& src);

// The weights of `cfg` (its first cfg.n_layer layers): the checkpoint's (a llama2.c file's matrices
// placed as `placement` says), or random ones from `seed`.
Weights load_model_weights(const ModelSource& src, const ModelConfig& cfg, std::uint64_t seed,
                           WeightPlacement placement = WeightPlacement::huge_pages);

// --max-memory's default: 75% of physical memory.
std::uint64_t default_max_memory();

// The memory a run may use: --max-memory's `text` (a size such as 8GiB), or the default when empty. A
// size above the machine's physical memory is refused (UsageError) unless `force` (--force-memory):
// a run sized for it would swap or be killed part-way instead of being refused up front.
std::uint64_t max_memory_allowed(const std::string& text, bool force);

// --threads: a fixed count, or 0 for all cores (fewer when the machine is busy, `deterministic` or not:
// no output depends on the team's size, kernels/threads.hpp). Throws UsageError for a negative count.
void set_thread_count(int threads, bool deterministic);

// The report's note when the team set by set_thread_count ran on far fewer cores than its threads
// (core_use_note); empty otherwise.
std::string thread_use_note(const CoreUse& use);

}  // namespace kvlab
