// `kvlab serve` as library calls: the command's options checked and turned into a workload (synthetic
// and seeded, or a JSONL file), a pool per layout and scheduler options, before any work; the runs;
// their report and trace.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvlab/calc/gpu_specs.hpp"
#include "kvlab/calc/model_config.hpp"
#include "kvlab/core/printer.hpp"
#include "kvlab/core/units.hpp"
#include "kvlab/formats/tokenizer.hpp"
#include "kvlab/serve/scheduler.hpp"
#include "serve/workload.hpp"
#include "kvlab/weights/weights.hpp"
#include "report/serve_report.hpp"
#include "session/model_source.hpp"

namespace kvlab {

enum class LayoutChoice { paged, contiguous, both };
inline constexpr std::array<Choice<LayoutChoice>, 3> layout_choices{
    {{"paged", LayoutChoice::paged}, {"contiguous", LayoutChoice::contiguous}, {"both", LayoutChoice::both}}};

struct ServeCommand {
    ModelSource source{"tiny-llama", "", "", ""};
    std::int64_t layers = 0;             // 0: all
    // workload: synthetic, or a JSONL file
    std::int64_t requests = 32;
    std::string prompt_len = "16..128";  // the part of each prompt after the shared prefix, in tokens
    std::string output_len = "16..128";  // max tokens each request generates
    double arrival_rate = 0.0;           // requests per step (Poisson); 0: all arrive at step 0
    std::string arrival;                 // "bursty:SIZE/EVERY": SIZE requests arrive together every EVERY steps (instead of --arrival-rate)
    std::int64_t shared_prefix = 0;      // tokens common to every prompt, before its own
    std::string workload;                // JSONL file instead
    std::uint64_t seed = 42;
    // pool
    std::string kv_budget;               // bytes, e.g. 2MiB; empty: --kv-blocks, or room for 4 sequences of --max-model-len
    std::int64_t kv_blocks = 0;
    LayoutChoice layout = LayoutChoice::both;
    std::int64_t block_size = 16;
    ReserveRule reserve = ReserveRule::max_len;
    std::int64_t max_model_len = 0;      // 0: the model's context
    bool prefix_cache = false;
    std::string kv_dtype = "fp32";       // how the pool stores K and V: simulate --kv-dtype's formats, one of them
    KvScale kv_scale = KvScale::tensor;  // fp8/int8 scales
    bool kv_scale_given = false;
    // preemption: recompute, or swap to a host tier of host_kv_budget bytes over a link of host_bandwidth
    PreemptMode preempt = PreemptMode::recompute;
    std::string host_kv_budget;          // bytes, e.g. 64MiB; empty: the KV pool's size
    std::string host_bandwidth;          // bytes per second per direction, e.g. 25GB/s; empty: PCIe 4.0 x16
    // scheduler
    std::int64_t max_batched_tokens = 256;
    std::int64_t max_seqs = 16;
    bool check = false;
    // outputs and sampling (src/serve/outputs.hpp): --n samples or --beam-width beams per request
    std::int64_t n = 1;
    std::int64_t beam_width = 1;
    SamplerOptions sampling;             // --temperature, --top-k, --top-p; its seed is --seed
    std::vector<std::string> stop;       // --stop: an output stops when its text reaches one (session/serve_stop.hpp)
    bool ignore_eos = false;             // --ignore-eos: a trained model's outputs run past end-of-text
    std::string trace;
    std::string plot;                    // also draw the run's chart (.svg or .png), as kvlab trace plot does
    std::string gpu = "h100";            // the GPU preset the modelled time is for
    bool deterministic = false;
    bool quiet = false;
    std::string max_memory;              // empty: 75% of physical RAM
    bool force_memory = false;           // --max-memory may exceed physical RAM
    int threads = 0;
    UnitSystem units = UnitSystem::iec;
    Format format = Format::table;
};

// The workload flags' synthetic requests (exposed for tests): lengths uniform in their ranges, ids
// uniform over the vocabulary, arrivals a Poisson process of `arrival_rate` per step (or `arrival`'s bursts:
// request i at step (i / SIZE) x EVERY), all from `seed`.
std::vector<ServeRequest> synthetic_workload(const ModelConfig& cfg, const ServeCommand& c);

struct PreparedServe {
    ServeCommand command;                 // as resolved (a preset's checkpoint and tokenizer filled in)
    ModelConfig config;
    Weights weights;
    std::optional<Tokenizer> tokenizer;
    std::vector<ServeRequest> requests;
    std::vector<ServeOptions> runs;       // one per layout
    // a narrow --kv-dtype: the same layouts with an fp32 pool of the same budget, to compare with (no trace)
    std::vector<ServeOptions> fp32_runs;
    std::uint64_t token_bytes = 0;        // one token's K and V, every layer, at the pool's stored width
    std::uint64_t pool_bytes = 0;         // the pool: its rows x token_bytes, and per-tensor scales
    nlohmann::json inputs;
    GpuSpec gpu;                          // --gpu: the modelled time's
};

// The host link's default, per direction: PCIe 4.0 x16, 16 GT/s x 16 lanes x 128b/130b encoding / 8 bits
// (PCI-SIG, PCI Express Base Specification 4.0) = 31.5 GB/s.
inline constexpr double pcie4_x16_bytes_per_s = 16e9 * 16 * 128.0 / 130.0 / 8.0;
// "25GB/s", "12.5GiB/s": a size with its unit, per second. Throws UsageError naming `flag`.
double parse_bandwidth(const std::string& text, std::string_view flag);

// Throws UsageError / ConfigError / FormatError / IoError for anything wrong, before any allocation.
PreparedServe prepare_serve(ServeCommand command);


// After the runs: the trace written (--trace) and the report.
// `fp32_results`: p.fp32_runs' (a narrow --kv-dtype), or empty.
Report serve_outcome(const PreparedServe& p, const std::vector<ServeResult>& results, const std::vector<ServeResult>& fp32_results = {});
// After printing: throws Error when --check found a request whose logits left the tolerance.
void check_serve_outcome(const PreparedServe& p, const std::vector<ServeResult>& results);

}  // namespace kvlab
