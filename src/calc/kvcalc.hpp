// kvcalc: KV-cache memory reports for one or more models, attention variants, dtypes, contexts and batches.
// The sizes come from kv_memory.hpp; this file arranges them (paging, TP, GPU fit, budgets) into tables.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "calc/attention_variant.hpp"
#include "kvlab/calc/engine.hpp"
#include "kvlab/core/dtype.hpp"
#include "kvlab/calc/gpu_specs.hpp"
#include "kvlab/calc/kv_memory.hpp"
#include "kvlab/calc/model_config.hpp"
#include "kvlab/core/printer.hpp"

namespace kvlab {


struct KvcalcRequest {
    std::vector<ModelConfig> models;
    std::vector<AttentionVariant> variants{{"native", 0}};
    std::vector<DType> dtypes{DType::fp16, DType::fp8_e4m3};
    std::vector<std::uint64_t> contexts;          // empty: 4096 and each model's max context
    std::vector<std::uint64_t> batches{1};
    WindowMode window_mode = WindowMode::cap;
    std::uint64_t block_size = 0;                 // 0: contiguous allocation, no paging
    std::uint64_t tp = 1;                         // tensor-parallel degree
    std::uint64_t pp = 1;                         // pipeline stages: GPUs used = tp x pp; the fullest stage is sized (kvcalc_pp.hpp)
    std::string tp_rule;                          // how a GPU count (--gpus N, --gpu NxNAME) became tp, said in a note
    std::optional<GpuSpec> gpu;                   // from --gpu or --gpu-mem
    DType weights_dtype = DType::bf16;
    double mem_util = 0.9;                        // fraction of GPU memory the engine may use
    std::optional<std::uint64_t> kv_budget;       // bytes of KV an engine reported (per GPU; the smallest rank's)
    std::vector<std::uint64_t> kv_budget_ranks;   // every rank's budget as given
    UnitSystem units = UnitSystem::iec;
    bool explain = false;
    Engine engine = Engine::exact;                // --engine: also what that engine allocates and prints
    EngineSettings engine_settings;               // its draft pointer is set per model by append_engine_tables
    std::optional<ModelConfig> draft;             // --draft MODEL|CONFIG: a speculative-decoding draft
    std::uint64_t draft_mtp_layers = 0;           // --draft mtp:N: N more layers of each model's own shape (MTP)
};

Report run_kvcalc(const KvcalcRequest& request);
// The --engine tables (what the engine allocates, the lines it prints), appended by run_kvcalc (kvcalc_engine.cpp).
void append_engine_tables(Report& report, const KvcalcRequest& request);

// The pieces run_kvcalc is made of, for other views of the same request (kvcalc --plot):
// the model with a variant's KV heads (UsageError for what-if heads on MLA);
ModelConfig apply_variant(const ModelConfig& cfg, const AttentionVariant& variant);
// bytes one sequence of T tokens holds (windows per the request's mode, paging per its block size);
std::uint64_t sequence_bytes(const ModelConfig& cfg, DType dtype, std::uint64_t n_tokens, const KvcalcRequest& request);
// the largest T (<= limit) with batch x sequence_bytes(T) <= budget, 0 if even T = 1 does not fit;
std::uint64_t max_context(const ModelConfig& cfg, DType dtype, std::uint64_t batch, std::uint64_t budget, std::uint64_t limit,
                          const KvcalcRequest& request);
// floor(memory x util) in exact integer arithmetic (util to 6 decimals).
std::uint64_t usable_bytes(std::uint64_t memory, double util);
// Bytes of the model's weights (all GPUs together): as stored beside its config when they were read
// (the native layout only: a what-if attention layout has other K and V widths), else parameters x
// --weights-dtype. `active`: only what one token reads (a MoE's routed experts), always estimated for MoE.
std::uint64_t model_weight_bytes(const ModelConfig& cfg, bool native_layout, const KvcalcRequest& request, bool active = false);
// Bytes of weights one decode step at batch B reads (all GPUs together): every weight of a dense model
// (as model_weight_bytes); for a MoE, the routed experts some token of the batch uses, in expectation
// under uniform routing (decode_params_read), at --weights-dtype or, with the checkpoint's stored bytes,
// that share of them; rounded to the nearest byte.
std::uint64_t decode_weight_bytes(const ModelConfig& cfg, bool native_layout, const KvcalcRequest& request, std::uint64_t batch);

// Per-GPU view of a model under tensor parallelism: KV heads per GPU = max(Hkv / TP, 1).
// Throws UsageError when TP and Hkv do not divide one way or the other (as vLLM refuses).
ModelConfig per_gpu_config(const ModelConfig& cfg, std::uint64_t tp);

// vLLM-style budget arithmetic: blocks = floor(budget / (block_size * bytes_per_token)).
struct BudgetFit {
    std::uint64_t n_blocks = 0;
    std::uint64_t n_tokens = 0;   // n_blocks * block_size
};
BudgetFit fit_budget(std::uint64_t budget_bytes, std::uint64_t bytes_per_token, std::uint64_t block_size);

}  // namespace kvlab
