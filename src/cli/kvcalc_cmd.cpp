// `kvlab kvcalc`: KV-cache memory per token, sequence, batch and GPU for presets or any HF config.json.
#include <algorithm>
#include <filesystem>
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "commands.hpp"
#include "options.hpp"
#include "kvlab/core/error.hpp"
#include "calc/engine_cmd.hpp"
#include "calc/kvcalc.hpp"
#include "kvlab/calc/presets.hpp"
#include "formats/gguf.hpp"
#include "formats/hf_checkpoint.hpp"
#include "report/kv_plot.hpp"
#include "kvlab/core/text.hpp"
#include "kvlab/core/units.hpp"

namespace kvlab::cli {

struct KvcalcOptions {
    std::vector<std::string> models;     // empty: every "llama" family preset
    std::vector<std::string> configs;    // config.json files or directories holding one, repeatable
    std::vector<std::string> ggufs;      // GGUF files: their metadata, repeatable
    std::string attention = "native";
    std::string kv_heads;                // empty: not given
    std::string dtypes = "fp16,fp8";
    std::string contexts;                // empty: 4096 and each model's max context
    std::string batches = "1";
    WindowMode window_mode = WindowMode::cap;
    std::string block_size = "0";
    std::string tp = "1";
    bool tp_given = false;               // --tp on the command line
    std::string gpus;                    // --gpus N: N GPUs, tensor parallel (empty: not given)
    bool as_decoder = false;             // --as-decoder: size an encoder-only config as if it decoded
    std::string gpu;
    std::string gpu_mem;
    std::string gpu_bandwidth;
    std::string weights_dtype = "bf16";
    double mem_util = 0.9;
    std::string kv_budget;
    UnitSystem units = UnitSystem::iec;
    Format format = Format::table;
    bool explain = false;
    std::string plot;                    // also draw KV memory against context here (.svg or .png)
    Engine engine = Engine::exact;
    std::string engine_spec;             // --engine NAME[@VERSION] as given (empty: exact math)
    std::uint64_t engine_version = 0;    // the release that answers
    std::string pp = "1";                // --pp: pipeline stages (llama.cpp: devices)
    std::string draft;                   // --draft MODEL|CONFIG|mtp:N
    std::string engine_cmd;              // --engine-cmd "…": the engine's own command line
    std::optional<std::uint64_t> n_ctx;  // llama.cpp -c from --engine-cmd
    std::optional<std::uint64_t> max_running_requests, spec_steps, spec_topk, spec_draft_tokens;  // SGLang's, from --engine-cmd
    bool speculative = false;            // --engine-cmd names a speculative algorithm (SGLang's NGRAM keeps no draft KV)
    DraftKind draft_kind = DraftKind::unset;  // vLLM's --speculative-config method (or its model's name) from --engine-cmd
    std::vector<std::string> notes;      // said under the report (the release that answers, the command's ignored flags)
    bool dtypes_given = false;           // -d on the command line (else an engine's default cache type)
    std::string kv_tokens;
    std::string ubatch = "512";
    bool kv_unified = false;
    bool swa_full = false;
    std::string flash_attn;              // llama.cpp -fa: on, off, auto (empty: the release's default)
    FlashAttn fa_cmd = FlashAttn::unset; // -fa from --engine-cmd
    std::string max_num_batched_tokens;
    std::int64_t window = 0;             // --window W: every layer keeps its last W positions
    std::int64_t sink_tokens = 0;        // --sink-tokens S: StreamingLLM sinks inside the window
    std::int64_t encoder_len = 0;        // --encoder-len N: an encoder-decoder model's input length (0: its config's)
};

namespace {

// The GPU and the tensor-parallel degree: --tp, or a GPU count (--gpus N, --gpu NxNAME) read as TP N and
// said in a note; counts that disagree are refused.
void set_tp_and_gpu(const KvcalcOptions& o, KvcalcRequest& r) {
    r.tp = parse_count(o.tp, "--tp");
    const GpuCount named = split_gpu_count(o.gpu);
    if (named.counted && named.n_gpus == 0) throw UsageError(fmt::format("--gpu: {} names 0 GPUs; expected a count of 1 or more", quote(o.gpu)));
    if (!o.gpu.empty()) r.gpu = find_gpu(named.name);
    const std::uint64_t n_gpus = o.gpus.empty() ? named.n_gpus : parse_count(o.gpus, "--gpus");
    const std::string given = o.gpus.empty() ? fmt::format("--gpu {}", o.gpu) : fmt::format("--gpus {}", o.gpus);
    if (named.counted && !o.gpus.empty() && named.n_gpus != n_gpus)
        throw UsageError(fmt::format("--gpus {} and --gpu {} count different GPUs; give the count once", o.gpus, o.gpu));
    if (!named.counted && o.gpus.empty()) return;
    if (o.tp_given && r.tp != n_gpus)
        throw UsageError(fmt::format("{} and --tp {} disagree: kvcalc spreads a model over its GPUs by tensor parallelism, so {} GPUs is --tp {}; "
                                     "give one of them", given, o.tp, n_gpus, n_gpus));
    r.tp = n_gpus;
    r.tp_rule = fmt::format("{}: {} GPUs, sized as tensor parallelism over them, the same as {}--tp {}: each GPU holds 1/{} of the weights "
                            "and of the KV heads (with --pp P the GPUs used are {} x P, TP within each stage; data parallelism is not modelled)",
                            given, n_gpus, r.gpu && named.counted ? fmt::format("--gpu {} ", named.name) : "", n_gpus, n_gpus, n_gpus);
}

// --draft: a preset or Hugging Face id, a config.json (or its directory), a GGUF, or mtp:N (N layers of each model's shape).
void set_draft(const KvcalcOptions& o, KvcalcRequest& r) {
    if (o.draft.empty()) return;
    if (o.draft.rfind("mtp:", 0) == 0) {
        r.draft_mtp_layers = parse_count(std::string_view(o.draft).substr(4), "--draft mtp:N");
        if (r.draft_mtp_layers == 0) throw UsageError("--draft mtp:0: expected mtp:N with N >= 1 MTP layers");
        return;
    }
    const std::filesystem::path path(o.draft);
    if (path.extension() == ".gguf") r.draft = load_gguf_config(o.draft);
    else r.draft = load_model(o.draft);
}

// --engine NAME[@VERSION]: the engine and the release that answers (a note when the version is not one kvlab knows).
void set_engine(KvcalcOptions& o, std::string_view text) {
    const EngineSpec spec = parse_engine_spec(text);
    o.engine = spec.engine;
    o.engine_version = spec.version;
    if (!spec.note.empty()) o.notes.push_back(spec.note);
}

// The model an --engine-cmd names, when kvlab knows it: a GGUF or config path that exists, else a preset or HF id.
void take_command_model(const EngineCommand& cmd, KvcalcOptions& o) {
    const bool given = !o.models.empty() || !o.configs.empty() || !o.ggufs.empty();
    const std::filesystem::path path(cmd.model);
    std::error_code ec;
    bool known = !cmd.model.empty() && std::filesystem::exists(path, ec);
    if (!known && !cmd.model.empty()) {
        try {
            (void)load_preset(cmd.model);
            known = true;
        } catch (const UsageError&) {
        }
    }
    if (known && given)
        throw UsageError(fmt::format("--engine-cmd names the model {}, which kvlab knows; give the model once (drop -m, --config or --gguf)", quote(cmd.model)));
    if (known && path.extension() == ".gguf") o.ggufs.push_back(cmd.model);
    else if (known && std::filesystem::exists(path, ec)) o.configs.push_back(cmd.model);
    else if (known) o.models.push_back(cmd.model);
    else if (!given)
        throw UsageError(fmt::format("--engine-cmd: the model {} is no preset, Hugging Face id or file kvlab knows; give its shape with -m, --config "
                                     "or --gguf", cmd.model.empty() ? std::string("(none)") : quote(cmd.model)));
    else if (!cmd.model.empty())
        o.notes.push_back(fmt::format("--engine-cmd: the command's model {} is not one kvlab knows; sized with the model given by -m, --config or --gguf",
                                      quote(cmd.model)));
}

// --engine-cmd: the command's values into the options, as the equivalent kvcalc flags would set them.
void apply_engine_command(KvcalcOptions& o, bool engine_given) {
    const EngineCommand cmd = parse_engine_command(o.engine_cmd);
    if (engine_given && o.engine != cmd.engine)
        throw UsageError(fmt::format("--engine {} and --engine-cmd ({}) name different engines; give the engine once", o.engine_spec, cmd.program));
    if (!engine_given) set_engine(o, choice_name(engine_choices, cmd.engine));
    take_command_model(cmd, o);
    if (cmd.context) o.contexts = std::to_string(*cmd.context);
    if (cmd.batch) o.batches = std::to_string(*cmd.batch);
    if (cmd.engine == Engine::llamacpp) {  // -c and -np stated directly: the exact math sizes -c / -np tokens a sequence
        // llama-server without -np: its auto mode runs 4 slots in one unified cache (tools/server/server.cpp: "n_parallel is
        // set to auto, using n_parallel = 4 and kv_unified = true", PR #16736; kvlab applies it from b6975)
        const bool auto_slots = !cmd.batch && cmd.program.rfind("llama-server", 0) == 0 && o.engine_version >= 6975;
        const std::uint64_t n_seq = auto_slots ? 4 : cmd.batch.value_or(1);
        if (auto_slots) {
            o.batches = "4", o.kv_unified = true;
            o.notes.push_back("--engine-cmd: no -np: llama-server's auto mode, 4 slots sharing one unified cache (n_parallel = 4, kv_unified = true)");
        }
        o.n_ctx = cmd.n_ctx.value_or(4096);
        o.contexts = std::to_string(std::max<std::uint64_t>(*o.n_ctx / n_seq, 1));
        if (!cmd.n_ctx) o.notes.push_back("--engine-cmd: no -c; llama.cpp's default -c 4096 sized");
    }
    if (cmd.tp) o.tp = std::to_string(*cmd.tp), o.tp_given = true;
    if (cmd.pp) o.pp = std::to_string(*cmd.pp);
    if (cmd.block_size) o.block_size = std::to_string(*cmd.block_size);
    if (cmd.kv_tokens) o.kv_tokens = std::to_string(*cmd.kv_tokens);
    if (cmd.ubatch) o.ubatch = std::to_string(*cmd.ubatch);
    if (cmd.max_num_batched_tokens) o.max_num_batched_tokens = std::to_string(*cmd.max_num_batched_tokens);
    if (cmd.kv_budget && o.kv_budget.empty()) o.kv_budget = std::to_string(*cmd.kv_budget) + "B";
    if (cmd.dtype) o.dtypes = *cmd.dtype, o.dtypes_given = true;
    if (cmd.mem_util) o.mem_util = *cmd.mem_util;
    o.kv_unified = o.kv_unified || cmd.kv_unified;
    o.swa_full = o.swa_full || cmd.swa_full;
    o.fa_cmd = cmd.flash_attn;
    if (!cmd.draft.empty() && o.draft.empty()) o.draft = cmd.draft;  // --draft names the shape of a draft kvlab does not know
    o.max_running_requests = cmd.max_running_requests, o.spec_steps = cmd.spec_steps, o.spec_topk = cmd.spec_topk;
    o.spec_draft_tokens = cmd.spec_draft_tokens;
    o.speculative = !cmd.spec_algorithm.empty();
    o.draft_kind = cmd.draft_kind;
    for (const auto& n : cmd.notes) o.notes.push_back("--engine-cmd: " + n);
    if (!cmd.ignored.empty())
        o.notes.push_back(fmt::format("--engine-cmd: read as {}; flags that do not change the KV cache, ignored: {}", cmd.program, fmt::join(cmd.ignored, " ")));
}

// --engine and its settings (the engine's own knobs, the release, --pp, --draft); refused without an engine.
void set_engine_settings(const KvcalcOptions& o, KvcalcRequest& r) {
    r.engine = o.engine;
    auto& es = r.engine_settings;
    es.block_size = r.block_size;
    if (!o.kv_tokens.empty()) es.kv_tokens = parse_count(o.kv_tokens, "--kv-tokens");
    es.ubatch = parse_count(o.ubatch, "--ubatch");
    es.kv_unified = o.kv_unified;
    es.swa_full = o.swa_full;
    es.flash_attn = o.flash_attn.empty() ? o.fa_cmd : o.flash_attn == "on" ? FlashAttn::on : o.flash_attn == "off" ? FlashAttn::off : FlashAttn::automatic;
    if (!o.max_num_batched_tokens.empty()) es.max_num_batched_tokens = parse_count(o.max_num_batched_tokens, "--max-num-batched-tokens");
    es.version = o.engine_version;
    es.n_ctx = o.n_ctx;
    es.max_running_requests = o.max_running_requests, es.spec_steps = o.spec_steps, es.spec_topk = o.spec_topk;
    es.spec_draft_tokens = o.spec_draft_tokens;
    es.speculative = o.speculative;
    es.pp = parse_count(o.pp, "--pp");
    if (es.pp == 0) throw UsageError("--pp 0: expected 1 or more pipeline stages");
    r.pp = es.pp;  // also the generic tables' deployment: each GPU holds its stage's layers (kvcalc_pp.hpp)
    set_draft(o, r);
    // the engine command's method (or draft name) decides; else --draft's shape: mtp:N, or draft_kind_of's rule
    es.draft_kind = o.draft_kind != DraftKind::unset ? o.draft_kind : r.draft_mtp_layers ? DraftKind::mtp : r.draft ? draft_kind_of(*r.draft) : DraftKind::unset;
    const bool engine_knob = !o.kv_tokens.empty() || o.ubatch != "512" || o.kv_unified || o.swa_full || !o.max_num_batched_tokens.empty() ||
                             !o.draft.empty() || !o.flash_attn.empty();
    if (engine_knob && o.engine == Engine::exact)
        throw UsageError("--kv-tokens, --ubatch, --kv-unified, --swa-full, --flash-attn, --max-num-batched-tokens, --draft: these are engine settings; "
                         "expected --engine vllm, llama.cpp, sglang or trtllm with them");
}

// --encoder-len: the cross-attention rows of every encoder-decoder model listed; refused when none is one.
void apply_encoder_len(std::vector<ModelConfig>& models, std::int64_t encoder_len) {
    if (encoder_len == 0) return;
    if (encoder_len < 0) throw UsageError(fmt::format("--encoder-len: {}; expected a positive number of tokens", encoder_len));
    bool any = false;
    for (ModelConfig& cfg : models)
        if (cfg.cross) {
            cfg.cross->encoder_len = encoder_len;
            cfg.cross->encoder_len_rule = fmt::format("encoder length {} (--encoder-len)", encoder_len);
            any = true;
        }
    if (!any)
        throw UsageError(fmt::format("--encoder-len {}: no model listed is an encoder-decoder model (T5, BART, Whisper); expected one "
                                     "with a cross-attention cache", encoder_len));
}

KvcalcRequest make_request(const KvcalcOptions& o) {
    KvcalcRequest r;
    // presets first, then configs, in the order given: one table row per model
    for (const auto& m : o.models)
        for (const auto& name : split_list(m)) r.models.push_back(load_preset(name));
    for (const auto& c : o.configs) {
        ModelConfig cfg = load_model_config(c, o.as_decoder);
        // a checkpoint directory: its safetensors headers give the weights' exact bytes (no tensor is read)
        if (const auto stored = stored_weights(c)) {
            cfg.stored_weight_bytes = stored->bytes;
            cfg.stored_vision_bytes = stored->vision_bytes;
            std::vector<std::string> parts;
            for (const auto& [dtype, bytes] : stored->bytes_by_dtype) parts.push_back(fmt::format("{} {} B", dtype, bytes));
            cfg.stored_weights_rule = fmt::format("weights {} B as stored ({}; from the headers of {}), used by the GPU fit instead of "
                                                  "parameters x --weights-dtype", stored->bytes, fmt::join(parts, ", "), stored->where);
            if (stored->vision_bytes > 0)
                cfg.stored_weights_rule += fmt::format("; {} B of them the vision tower's, which a decode step does not read",
                                                       stored->vision_bytes);
        }
        r.models.push_back(std::move(cfg));
    }
    for (const auto& g : o.ggufs) r.models.push_back(load_gguf_config(g));
    if (r.models.empty()) {
        for (const auto& name : preset_names()) {
            auto cfg = load_preset(name);
            if (cfg.preset_family == "llama") r.models.push_back(std::move(cfg));
        }
    }
    // --window / --sink-tokens: the cache policy simulate runs, sized the same way (sinks share the W rows)
    for (auto& cfg : r.models) apply_window_policy(cfg, o.window, o.sink_tokens);
    apply_encoder_len(r.models, o.encoder_len);
    if (!o.kv_heads.empty()) {
        const auto n = static_cast<std::int64_t>(parse_count(o.kv_heads, "--kv-heads"));
        r.variants = {{fmt::format("kv:{}", n), n}};
    } else {
        r.variants = parse_attention_variants(o.attention);
    }
    r.dtypes.clear();
    if (o.engine != Engine::exact && !o.dtypes_given) r.dtypes = {engine_default_dtype(o.engine)};
    else
        for (const auto& d : split_list(o.dtypes)) r.dtypes.push_back(parse_dtype(d, "--dtype"));
    if (!o.contexts.empty()) r.contexts = parse_count_list(o.contexts, "--context");
    r.batches = parse_count_list(o.batches, "--batch");
    r.window_mode = o.window_mode;
    r.block_size = o.block_size == "0" ? 0 : parse_count(o.block_size, "--block-size");
    set_tp_and_gpu(o, r);
    if (!o.gpu_mem.empty()) {
        GpuSpec g;
        g.name = g.display_name = fmt::format("GPU with {}", o.gpu_mem);
        g.memory_bytes = parse_size(o.gpu_mem, "--gpu-mem");
        r.gpu = g;
    }
    if (!o.gpu_bandwidth.empty()) {
        if (!r.gpu) throw UsageError("--gpu-bandwidth: needs --gpu or --gpu-mem");
        r.gpu->bandwidth_bytes_per_s = parse_size(o.gpu_bandwidth, "--gpu-bandwidth");
    }
    r.weights_dtype = parse_dtype(o.weights_dtype, "--weights-dtype");
    if (!(o.mem_util > 0.0 && o.mem_util <= 1.0)) throw UsageError(fmt::format("--mem-util: {}; expected a fraction in (0, 1]", o.mem_util));
    r.mem_util = o.mem_util;
    if (!o.kv_budget.empty()) {
        // one budget per GPU (rank) as each printed it: the engine runs on the smallest (vLLM unifies on the fewest blocks)
        for (const auto& b : split_list(o.kv_budget)) r.kv_budget_ranks.push_back(parse_size(b, "--kv-budget"));
        r.kv_budget = *std::min_element(r.kv_budget_ranks.begin(), r.kv_budget_ranks.end());
    }
    r.units = o.units;
    r.explain = o.explain;
    set_engine_settings(o, r);
    return r;
}

// --pp, and the settings an engine's allocation depends on (the "Engine settings" group of --help).
void add_engine_options(CLI::App* cmd, KvcalcOptions& o) {
    const char* eg = "Engine settings (with --engine)";
    cmd->add_option("--pp", o.pp, "Pipeline-parallel stages (GPUs used: TP x PP; each GPU holds its stage's layers; with --engine: that engine's split, llama.cpp devices with -sm layer)")->capture_default_str();
    input_file(cmd->add_option("--draft", o.draft, "Speculative-decoding draft: a preset, config.json or GGUF (EAGLE head, draft model), or mtp:N "
                                                    "(N MTP layers of the model's shape)"))->group(eg);
    cmd->add_option("--kv-tokens", o.kv_tokens, "Token cap the engine was given: vLLM blocks override x block size, SGLang --max-total-tokens, "
                                                 "TensorRT-LLM max_tokens")->group(eg);
    cmd->add_option("--ubatch", o.ubatch, "llama.cpp -ub (enters the sliding-window cache size)")->capture_default_str()->group(eg);
    cmd->add_flag("--kv-unified", o.kv_unified, "llama.cpp -kvu: one KV stream shared by all sequences")->group(eg);
    cmd->add_flag("--swa-full", o.swa_full, "llama.cpp --swa-full: sliding-window layers get every cell")->group(eg);
    cmd->add_option("--flash-attn", o.flash_attn, "llama.cpp -fa on|off|auto: pads the cache to 256 cells (on, auto) or 32 (off) before b6870 "
                                                   "(default: off before b6327, auto since)")
        ->check(one_of({"on", "off", "auto"}))->group(eg);
    cmd->add_option("--max-num-batched-tokens", o.max_num_batched_tokens,
                    "vLLM: tokens per step, part of a sliding-window request's blocks (default 8192, 2048 on A100s and GPUs under 70 GiB)")->group(eg);
}

}  // namespace

void setup_kvcalc(CLI::App& app) {
    auto o = std::make_shared<KvcalcOptions>();
    auto* cmd = app.add_subcommand("kvcalc", "KV-cache memory for Llama-style models: per token, sequence, batch and GPU");
    input_file(cmd->add_option("-m,--model", o->models,
                    "Preset names or Hugging Face ids, repeatable or comma-separated (default: all Llama-family presets)"));
    input_file(cmd->add_option("-c,--config", o->configs, "Hugging Face config.json files or directories holding one, repeatable; beside -m presets"));
    input_file(cmd->add_option("--gguf", o->ggufs, "GGUF files (llama.cpp): the model shape from the metadata, no tensor read; repeatable"));
    auto* attention = cmd->add_option("-a,--attention", o->attention, "Attention layouts: native,mha,gqa:N,mqa")->capture_default_str();
    cmd->add_option("--kv-heads", o->kv_heads, "What-if KV head count (instead of --attention)")->excludes(attention);
    cmd->add_option("-d,--dtype", o->dtypes, "KV dtypes: fp32,fp16,bf16,fp8 (=fp8_e4m3),fp8_e5m2,int8,int4,q8_0,q4_0")->capture_default_str();
    cmd->add_option("--context", o->contexts, "Context lengths in tokens, e.g. 4k,32k,128k (k = 1024; default: 4096 and the model's max)");
    cmd->add_option("-b,--batch", o->batches, "Batch sizes (sequences), e.g. 1,8,64")->capture_default_str();
    add_choice(cmd, "--window-mode", o->window_mode, window_mode_choices, "Sliding-window layers: cap (hold min(W,T) tokens) or ignore");
    cmd->add_option("--block-size", o->block_size, "Paged allocation: tokens per block (vLLM default 16); 0 = contiguous")->capture_default_str();
    cmd->add_option("--tp", o->tp, "Tensor-parallel degree")->capture_default_str();
    cmd->add_option("--gpus", o->gpus, "Number of GPUs: the model is split over them by tensor parallelism (= --tp N)");
    auto* gpu = cmd->add_option("--gpu", o->gpu, "GPU preset (presets/gpus.json), e.g. h100-sxm-80gb, h100; 2xh100 = --gpu h100 --gpus 2");
    cmd->add_option("--gpu-mem", o->gpu_mem, "GPU memory instead of a preset, e.g. 80GiB or 24GB")->excludes(gpu);
    cmd->add_option("--gpu-bandwidth", o->gpu_bandwidth, "Memory bandwidth in bytes/s for the roofline, e.g. 3350GB (per second)");
    cmd->add_option("--weights-dtype", o->weights_dtype, "dtype of the weights for the GPU fit")->capture_default_str();
    cmd->add_option("--mem-util", o->mem_util, "Fraction of GPU memory the engine may use (vLLM gpu_memory_utilization)")->capture_default_str();
    cmd->add_option("--kv-budget", o->kv_budget, "KV budget an engine reported, per GPU, e.g. 3.8125GiB (or one per rank, comma-separated: the smallest counts): gives blocks, tokens, concurrency");
    cmd->add_option("--window", o->window, "Every layer keeps only its last W positions (the cache policy of simulate --window)")
        ->check(given_nonzero("expected a positive number of positions"));
    cmd->add_option("--sink-tokens", o->sink_tokens, "StreamingLLM sinks: the window also keeps the first S positions (S < W; same bytes)");
    cmd->add_option("--engine", o->engine_spec,
                    "Also what this engine allocates and the lines it prints: vllm, llama.cpp, sglang, trtllm, or NAME@VERSION for that release's "
                    "rules and log format (default releases: vLLM v0.10.2, llama.cpp b8668, SGLang v0.5.2, TensorRT-LLM 1.2.0rc2)");
    cmd->add_option("--engine-cmd", o->engine_cmd,
                    "The engine's own command line, e.g. \"vllm serve MODEL --max-model-len 32768 -tp 2\" (vllm serve, llama-server, llama-cli, "
                    "python -m sglang.launch_server, trtllm-serve): its flags in place of kvcalc's");
    add_engine_options(cmd, *o);
    add_units_option(cmd, o->units);
    add_format_option(cmd, o->format);
    cmd->add_flag("--explain", o->explain, "Print each formula with the numbers substituted");
    cmd->add_option("--encoder-len", o->encoder_len,
                    "Encoder-decoder models (T5, BART, Whisper): tokens the encoder reads, the cross-attention cache's rows per "
                    "decoder layer (default: the config's n_positions, max_position_embeddings or Whisper's 1500 frames)");
    cmd->add_flag("--as-decoder", o->as_decoder,
                  "Size an encoder-only config (bert, roberta, ...), which keeps no KV cache, as if it were a Llama-style decoder");
    output_file(cmd->add_option("--plot", o->plot, "Also draw KV memory against context, one line per model/layout/dtype/batch (+ the GPU's KV budget): FILE.svg or FILE.png"));
    cmd->footer("Examples:\n  kvlab kvcalc -m llama-3-8b -d fp16,fp8 --context 8k,128k --batch 1,8\n"
                "  kvlab kvcalc --config path/to/config.json --gpu h100 --explain\n"
                "  kvlab kvcalc -m gpt-oss-20b --engine llama.cpp --context 128k\n"
                "  kvlab kvcalc -m qwen3-8b --engine vllm --kv-budget 20GiB --context 32k\n"
                "  kvlab kvcalc -m deepseek-v3 --engine llama.cpp@b5489 --context 4k\n"
                "  kvlab kvcalc --engine-cmd \"vllm serve Qwen/Qwen2.5-7B-Instruct -tp 2 -pp 2\" --kv-budget 20GiB");
    auto* dtype_opt = cmd->get_option("--dtype");
    auto* engine_opt = cmd->get_option("--engine");
    auto* tp_opt = cmd->get_option("--tp");
    cmd->callback([o, dtype_opt, engine_opt, tp_opt] {
        o->dtypes_given = dtype_opt->count() > 0;
        o->tp_given = tp_opt->count() > 0;
        if (engine_opt->count() > 0) set_engine(*o, o->engine_spec);
        if (!o->engine_cmd.empty()) apply_engine_command(*o, engine_opt->count() > 0);
        // a GGUF is llama.cpp's file: without --engine, say also what llama.cpp allocates for it
        bool gguf_default_engine = !o->ggufs.empty() && engine_opt->count() == 0 && o->engine_cmd.empty();
        if (gguf_default_engine && o->dtypes_given)  // only with cache types llama.cpp has (-d fp8 stays exact math)
            for (const auto& d : split_list(o->dtypes))
                if (!llamacpp_has_cache_type(parse_dtype(d, "--dtype"))) gguf_default_engine = false;
        if (gguf_default_engine) set_engine(*o, "llama.cpp");
        const KvcalcRequest request = make_request(*o);
        Report report = run_kvcalc(request);  // every input checked before anything is drawn
        for (const auto& note : o->notes) report.notes.push_back(note);
        if (gguf_default_engine) report.notes.push_back("--gguf: llama.cpp's allocation shown (--engine llama.cpp); --engine exact for the exact math alone");
        if (!o->plot.empty()) {
            plot_kv_memory(request, o->plot);
            report.notes.push_back("chart of KV memory against context written to " + o->plot);
        }
        print_report(std::cout, report, o->format);
    });
}

}  // namespace kvlab::cli
