// What a serving engine allocates for the KV cache, and the lines it prints, as opposed to the exact
// math of kv_memory.hpp. Each engine is pinned to one release whose allocation rules were read from its
// source (docs/kv-memory.md, "Engines", cites the files): llama.cpp pads cells and sizes iSWA caches,
// vLLM cuts a budget into 16-token blocks per layer group, SGLang counts token slots (+ one padding
// page), TensorRT-LLM rounds up to whole blocks. One file per engine: engine_<name>.cpp.
#pragma once
#include <array>
#include <initializer_list>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvlab/calc/model_config.hpp"
#include "kvlab/core/choice.hpp"
#include "kvlab/core/dtype.hpp"

namespace kvlab {

enum class Engine { exact, vllm, llamacpp, sglang, trtllm };
inline constexpr std::array<Choice<Engine>, 5> engine_choices{
    {{"exact", Engine::exact}, {"vllm", Engine::vllm}, {"llama.cpp", Engine::llamacpp}, {"sglang", Engine::sglang}, {"trtllm", Engine::trtllm}}};

// The release each engine's rules were read from, e.g. "llama.cpp b8668".
std::string_view engine_release(Engine engine);

// A release whose rules or printed lines kvlab knows (engine_versions.cpp), as a sortable key: llama.cpp
// build bNNNN -> NNNN; vLLM, SGLang and TensorRT-LLM x.y.z -> x * 1000000 + y * 1000 + z.
struct EngineRelease {
    std::uint64_t key = 0;
    std::string_view name;    // "b5913", "0.8.0"
    std::string_view change;  // what this release changed, with its source
};
// The known releases of one engine, oldest first; the last is the pinned one (none for exact math).
std::vector<EngineRelease> engine_releases(Engine engine);
// --engine NAME or NAME@VERSION: the engine, the known release that answers (the pinned one without a
// version; the nearest known for an unknown one, said in `note`). UsageError for an unknown engine name
// or a version that is not one (the text quoted and cut).
struct EngineSpec {
    Engine engine = Engine::exact;
    std::uint64_t version = 0;  // the answering release's key (0 for exact math)
    std::string note;           // set when the asked version is not a known release
};
EngineSpec parse_engine_spec(std::string_view text, std::string_view flag = "--engine");
// "llama.cpp b5913", "vLLM v0.8.0": the release a key names (`version` 0: the pinned one).
std::string engine_release_name(Engine engine, std::uint64_t version);
// The KV dtype an engine uses when none is asked for (llama.cpp f16; the others the model's bf16).
DType engine_default_dtype(Engine engine);

// The engine's own knobs that change the allocation, at its defaults.
// llama.cpp -fa: on, off, auto (from b6327, PR #15434, also its default), or not given (the release's default)
enum class FlashAttn { unset, on, off, automatic };

// What a speculative draft is, as vLLM decides it (SpeculativeConfig's method): an EAGLE head, a separate draft model,
// MTP layers; unset: not known (sized as a draft whose layers join the pool).
enum class DraftKind { unset, eagle, draft_model, mtp };
// vLLM's rule (SpeculativeConfig.__post_init__, v0.10.x): the "method" when given ("eagle", "eagle3": EAGLE; "draft_model";
// any "*mtp": MTP); without one the draft's name: "eagle-" or "eagle3" in it (any case) is an EAGLE head, else a draft model.
// Other methods (medusa, mlp_speculator, ngram, suffix) and no draft: unset.
DraftKind vllm_draft_kind(std::string_view method, std::string_view model);
// --draft CONFIG: vLLM's name rule, else a draft of at most 2 layers is an EAGLE head (EAGLE and EAGLE-3 heads have one
// decoder layer), else a separate draft model.
DraftKind draft_kind_of(const ModelConfig& draft);

struct EngineSettings {
    std::uint64_t block_size = 0;      // 0: the engine's default (vLLM 16, SGLang page 1, TensorRT-LLM 32); llama.cpp has none
    std::uint64_t ubatch = 512;        // llama.cpp -ub: enters the size of the sliding-window cache
    bool kv_unified = false;           // llama.cpp -kvu: one stream shared by all sequences
    bool swa_full = false;             // llama.cpp --swa-full: sliding-window layers get every cell
    FlashAttn flash_attn = FlashAttn::unset;  // llama.cpp -fa: enters the cache padding before b6870
    std::optional<std::uint64_t> max_num_batched_tokens;  // vLLM; unset: 8192 (API server, GPU >= 70 GiB, not an A100), else 2048
    std::optional<std::uint64_t> kv_tokens;  // a token cap the engine was given: vLLM num_gpu_blocks_override x block,
                                             // SGLang --max-total-tokens, TensorRT-LLM kv_cache_config.max_tokens
    std::optional<std::uint64_t> n_ctx;      // llama.cpp -c as given (--engine-cmd), else context x batch
    std::uint64_t version = 0;               // the release whose rules and printed lines answer (0: the pinned one)
    std::uint64_t pp = 1;                    // pipeline-parallel stages (vLLM, SGLang, TensorRT-LLM; llama.cpp: devices)
    std::vector<std::uint64_t> stage_budgets;  // one KV budget per stage when they differ (else EngineCase::kv_budget)
    const ModelConfig* draft = nullptr;      // a speculative-decoding draft (EAGLE head, draft model, MTP layers)
    DraftKind draft_kind = DraftKind::unset;  // what the draft is (vLLM v0.10.x refuses a separate draft model)
    bool speculative = false;                // a speculative algorithm runs even without a draft that keeps KV (SGLang NGRAM)
    // SGLang's speculative headroom: --max-running-requests, --speculative-num-steps, --speculative-eagle-topk,
    // --speculative-num-draft-tokens (--engine-cmd); unset: SGLang's defaults (engine_sglang.cpp)
    std::optional<std::uint64_t> max_running_requests, spec_steps, spec_topk, spec_draft_tokens;
};

// One question: this model (whole; the engine applies TP by its own rule), this KV dtype, `batch`
// sequences of `context` tokens (vLLM: max_model_len; llama.cpp: -c context x batch -np batch), and
// the bytes of KV each GPU has (what the engine reports, or kvcalc's GPU-fit estimate), if known.
struct EngineCase {
    const ModelConfig* model = nullptr;
    DType dtype = DType::fp16;
    std::uint64_t context = 0;
    std::uint64_t batch = 1;
    std::uint64_t tp = 1;
    std::optional<std::uint64_t> kv_budget;
    std::uint64_t gpu_memory = 0;  // the GPU's memory (0: unknown), for defaults that depend on it
    bool gpu_is_a100 = false;      // the GPU's name holds "a100" (vLLM's smaller default step for A100s)
};

struct EngineAnswer {
    std::string settings;                          // the engine's flags this answer stands for
    std::optional<std::uint64_t> bytes_allocated;  // KV bytes the engine allocates per GPU
    std::optional<std::uint64_t> token_capacity;   // tokens its cache holds
    std::optional<double> concurrency;             // requests of `context` tokens it serves at once
    std::vector<std::string> log_lines;            // in the engine's own format
    std::vector<std::string> notes;
};

// Throws UsageError when the engine has no such cache dtype or the case is outside its rules.
EngineAnswer engine_answer(Engine engine, const EngineCase& c, const EngineSettings& s);

// The engines, one per file (engine_answer dispatches).
EngineAnswer llamacpp_answer(const EngineCase& c, const EngineSettings& s);
EngineAnswer vllm_answer(const EngineCase& c, const EngineSettings& s);
EngineAnswer sglang_answer(const EngineCase& c, const EngineSettings& s);
EngineAnswer trtllm_answer(const EngineCase& c, const EngineSettings& s);

// The layers each pipeline stage holds, first to last, as each engine splits them: vLLM's get_pp_indices
// (an even share, the remainder one each to the stages before the last, from the second-to-last back),
// SGLang and TensorRT-LLM the same even split with the remainder on the first stages, llama.cpp its
// -ts-proportional split by device. UsageError for more stages than layers.
std::vector<std::uint64_t> pp_layer_split(Engine engine, std::uint64_t n_layers, std::uint64_t pp);

// Helpers the engines share: 1234567 -> "1,234,567" (vLLM's f"{n:,}"); bytes / 2^20 and / 2^30 as the
// engines compute them; KV heads one GPU holds under TP with floor (vLLM, SGLang) or ceiling (TensorRT-LLM).
std::string with_thousands(std::uint64_t n);
double mib(std::uint64_t bytes);
double gib(std::uint64_t bytes);
std::uint64_t kv_heads_per_rank(const ModelConfig& cfg, std::uint64_t tp, bool ceiling);
// Values one GPU holds per layer for one token's K (or V): KV heads per rank x head_dim; MLA: the latent.
std::uint64_t kv_row_values_per_rank(const ModelConfig& cfg, std::uint64_t tp, bool ceiling);
// Tokens a pool sized from memory holds: the budget // bytes per token, capped by --kv-tokens; nullopt
// when neither was given (SGLang and TensorRT-LLM size their pools so).
std::optional<std::uint64_t> pool_tokens(const EngineCase& c, const EngineSettings& s, std::uint64_t bytes_per_token);
// Whether llama.cpp's -ctk/-ctv has this cache type (of those kvlab sizes: f32, f16, bf16, q8_0, q4_0).
bool llamacpp_has_cache_type(DType dtype);
// Bytes per value of a cache dtype the engine takes (fp16/bf16 2, fp8/int8 1); UsageError naming the
// engine's own choices (`takes`) for any other.
std::uint64_t engine_value_bytes(DType dtype, std::initializer_list<DType> accepted, std::string_view takes);

}  // namespace kvlab
