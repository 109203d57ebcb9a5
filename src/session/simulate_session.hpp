// `kvlab simulate` as library calls: a request (the command's options) is checked and prepared in
// full before any work (model, weights, tokenizer, prompt, memory, output paths), run by the caller
// (which owns the token stream, progress and Ctrl-C), and turned into a report and a trace.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvlab/calc/gpu_specs.hpp"
#include "kvlab/calc/model_config.hpp"
#include "kvlab/core/printer.hpp"
#include "kvlab/core/units.hpp"
#include "kvlab/formats/npy.hpp"
#include "kvlab/formats/tokenizer.hpp"
#include "kvlab/sim/simulator.hpp"
#include "kvlab/weights/weights.hpp"

namespace kvlab {

// --sink-positions: where attention places StreamingLLM's sinks once the window has evicted keys: at their
// positions in the text (as stored), or at their slots in the cache (StreamingLLM, section 3.2).
enum class SinkPositions { text, cache };
inline constexpr std::array<Choice<SinkPositions>, 2> sink_positions_choices{{{"text", SinkPositions::text}, {"cache", SinkPositions::cache}}};

// The prompt a trained model with a tokenizer decodes when none is given (--prompt, --prompt-ids, --prompt-len).
inline constexpr const char* default_text_prompt = "Once upon a time";

struct SimulateRequest {
    std::string model = "stories15m";  // preset name or path to a config.json
    std::string config;                // a config.json or a directory holding one
    std::string checkpoint;            // llama2.c .bin or Hugging Face directory: real config and weights
    std::string tokenizer;             // llama2.c tokenizer.bin: text prompt in, text out
    std::string prompt;                // text prompt, encoded with --tokenizer (BOS first)
    std::string save_checkpoint;       // write the model run as llama2.c v0
    std::string eval;                  // text file: teacher-forced NLL and perplexity instead of decoding
    std::int64_t layers = 0;           // 0: all of the model's layers
    std::string attention = "native"; // what-if KV heads on random weights: native, mha, gqa:N, mqa
    SimMode mode = SimMode::both;
    ForwardKernel kernel = ForwardKernel::fast;  // reference: model/reference.hpp beside the fast path
    std::int64_t prompt_len = 32;
    std::string prompt_ids;            // comma-separated token ids, instead of a random prompt
    std::int64_t steps = 128;
    double temperature = 0.0;
    std::int64_t top_k = 0;
    double top_p = 1.0;
    std::uint64_t seed = 42;
    SamplerRule sampler = SamplerRule::kvlab;  // --sampler: kvlab's rule, or llama2.c's (run.c's tokens)
    std::vector<std::string> stop;     // --stop STR (repeatable): the text ends before the first one (needs a tokenizer)
    bool ignore_eos = false;           // --ignore-eos: run every step even after the model writes end-of-text
    std::string trace;
    bool deterministic = false;
    bool quiet = false;
    std::string max_memory;            // empty: 75% of physical RAM
    bool force_memory = false;           // --max-memory may exceed physical RAM
    int threads = 0;                   // 0: all cores
    UnitSystem units = UnitSystem::iec;
    Format format = Format::table;
    bool prompt_given = false;        // --prompt given (an empty text is a prompt too: BOS alone)
    bool prompt_len_given = false;    // --prompt-len given: random ids even for a trained model
    std::string kv_dtype = "fp32";     // --kv-dtype: one storage, or a comma list compared side by side
    KvScale kv_scale = KvScale::tensor;
    bool kv_scale_given = false;
    bool mode_given = false;           // --mode on the command line (a narrow --kv-dtype defaults to cached)
    std::int64_t window = 0;           // --window W: every layer keeps its last W positions (0: the model's own)
    std::int64_t sink_tokens = 0;      // --sink-tokens S: and its first S (StreamingLLM)
    SinkPositions sink_positions = SinkPositions::text;  // --sink-positions: the sinks' positions, in the text or the cache
    std::string weight_dtype = "fp32"; // --weight-dtype: how the matmuls read the weights; a comma list compares them
    bool no_quality = false;           // --no-quality: policies run without the fp32 model beside them
    MlaPath mla_path = MlaPath::absorbed;  // --mla: how an MLA model's attention reads its latent cache (model/mla.hpp)
    bool mla_given = false;
    std::string gpu = "h100";          // --gpu: the GPU preset whose roofline models each step's time
    std::int64_t repeat = 1;           // --repeat: runs of the timed part; wall figures as median and range
    std::string logits;                // --logits FILE.npy: each step's logits, float32 (steps, vocab)
    std::string cost_at;               // --cost-at T1,T2..: the closed-form cost of a decoded token's attention, no run
    std::string plot;                  // --plot FILE.svg|.png: with --cost-at, its chart
};

// The shape simulate runs: the model's first --layers layers, with the --attention what-if (one layout:
// native, mha, gqa:N, mqa, mla:R) applied. Throws UsageError for a what-if the shape or weights refuse.
ModelConfig shaped_config(const SimulateRequest& request, const ModelConfig& full);

// --cost-at: what one decoded token's attention costs at each context, for every layout of --attention's
// comma list (mla:R as both paths unless --mla names one), from the cost model's closed form without
// running the model (report/decode_cost.hpp); with --plot, the chart too.
Report decode_cost_comparison(const SimulateRequest& request);

// Everything a run needs, checked: the config (its first --layers layers), the weights, the
// simulator's options (prompt ids filled in), the tokenizer, the run's inputs for reports and traces.
struct PreparedSimulation {
    SimulateRequest request;        // as resolved: a preset's checkpoint and tokenizer filled in
    ModelConfig config;
    Weights weights;
    SimulateOptions sim;
    std::optional<Tokenizer> tokenizer;
    std::vector<TokenId> eval_ids;  // --eval: the text's token ids
    nlohmann::json inputs;
    bool tokens_meaningful = false; // a tokenizer, a given prompt or real weights: worth streaming
    // The runs to compare: --kv-dtype x --weight-dtype as parsed (one of them may list several); one run
    // when both name one (in sim.kv_storage, sim.weight_dtype).
    struct Policy {
        KvStorage kv;
        DType weights = DType::fp32;
    };
    std::vector<Policy> policies;
    GpuSpec gpu;                              // --gpu, resolved
    std::shared_ptr<NpyRowWriter> logits;     // --logits: rows added by sim.on_logits, finished by simulation_outcome
};

// Throws UsageError / ConfigError / FormatError / IoError for anything wrong with the request, before
// allocating; sets the OpenMP thread count (--threads).
PreparedSimulation prepare_simulation(SimulateRequest request);
// --eval: teacher-forced mean NLL and perplexity of the text.
Report eval_report(const PreparedSimulation& prepared);
// After run_simulation: the trace written (--trace) and the report. Throws Interrupted when no step finished.
// --kv-dtype or --weight-dtype with several formats: one row per policy (bytes, traffic, speed, quality
// against the fp32 weights and full cache).
Report kv_policy_report(const PreparedSimulation& p, const std::vector<SimulationResult>& runs);
Report simulation_outcome(const PreparedSimulation& prepared, const SimulationResult& result);
// --repeat N: the N - 1 runs after `first`, tokens and logits not streamed again; fills first.repeats with
// every run's wall time per mode. Throws Interrupted when a Ctrl-C stops one.
void repeat_simulation(const PreparedSimulation& prepared, SimulationResult& first, std::atomic<bool>& stop);
// After printing the report: throws Error when cached and uncached diverged, Interrupted after Ctrl-C.
void check_outcome(const PreparedSimulation& prepared, const SimulationResult& result);

}  // namespace kvlab
