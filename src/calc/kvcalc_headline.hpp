// kvcalc's headline: the answer to the question asked, in 1-3 lines, from the figures its tables print.
// run_kvcalc fills one CaseFacts per model, attention layout and KV dtype beside the cells it fills from
// the same variables, so the headline and the tables cannot disagree.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "calc/kvcalc.hpp"

namespace kvlab {

struct CaseFacts {
    std::string model, attention, dtype;  // attention as the tables print it ("GQA-8 (native)")
    std::string attention_kind;           // without "(native)": "GQA-8"
    std::uint64_t bytes_per_token = 0;    // all GPUs together
    struct Size {
        std::uint64_t context = 0, batch = 0, bytes_batch = 0, bytes_batch_gpu = 0;
    };
    std::vector<Size> sizes;  // per context x batch, in table order

    // --gpu / --gpu-mem
    bool on_gpu = false, weights_fit = false;
    std::uint64_t weights_gpu = 0, usable = 0, kv_budget = 0, tp_needed = 0;  // tp_needed: 0 if no TP fits
    struct Fit {
        std::uint64_t context = 0, batch = 0, kv_gpu = 0;   // kv_gpu: the batch's KV per GPU as held
        bool fits = false;
        std::optional<std::uint64_t> max_batch;              // at this context (none past the model's max)
        std::uint64_t max_context = 0;                       // at this batch
        bool max_context_is_model_max = false;
        std::optional<double> ms_per_step, tokens_per_s;     // the decode roofline, with a bandwidth
    };
    std::vector<Fit> fits;  // per context x batch, in table order (empty when the weights do not fit)

    // --kv-budget (exact engine)
    std::uint64_t n_blocks = 0, n_tokens = 0, block_size = 0;
    std::vector<std::pair<std::uint64_t, double>> concurrency;  // (tokens per request, requests at once)
};

// The headline: with a GPU, does it fit (and what does if not, or the headroom and decode roofline if
// so); with --kv-budget, the blocks and requests at once; else the KV per token and per batch.
std::vector<std::string> kvcalc_headline(const std::vector<CaseFacts>& cases, const KvcalcRequest& request);

}  // namespace kvlab
