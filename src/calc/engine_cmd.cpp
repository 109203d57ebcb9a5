// kvcalc --engine-cmd: each engine's flag names, from its own argument parser (vLLM
// vllm/engine/arg_utils.py, llama.cpp common/arg.cpp, SGLang python/sglang/srt/server_args.py,
// TensorRT-LLM tensorrt_llm/commands/serve.py), mapped onto what kvcalc sizes.
#include "calc/engine_cmd.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvlab/core/error.hpp"
#include "kvlab/core/text.hpp"
#include "kvlab/core/units.hpp"

namespace kvlab {
namespace {

enum class Act {
    ignore, model, context, n_ctx, batch, tp, pp, block, kv_tokens, gpu_blocks, ubatch, nbatch, mnbt,
    dtype, dtype_k, dtype_v, mem_util, kvu, swa_full, draft, spec_config, kv_budget, fa,
    max_running, spec_algo, spec_steps, spec_topk, spec_ntok
};
struct Flag {
    std::string_view names;  // "-c|--ctx-size"
    bool value;              // takes a value
    Act act;
};

// vllm/engine/arg_utils.py (EngineArgs.add_cli_args) and the API server's own flags
constexpr std::array vllm_flags{
    Flag{"--model", true, Act::model}, Flag{"--max-model-len", true, Act::context}, Flag{"--gpu-memory-utilization", true, Act::mem_util},
    Flag{"--kv-cache-dtype", true, Act::dtype}, Flag{"-tp|--tensor-parallel-size", true, Act::tp}, Flag{"-pp|--pipeline-parallel-size", true, Act::pp},
    Flag{"--block-size", true, Act::block}, Flag{"--max-num-seqs", true, Act::batch}, Flag{"--max-num-batched-tokens", true, Act::mnbt},
    Flag{"--num-gpu-blocks-override", true, Act::gpu_blocks}, Flag{"--speculative-config", true, Act::spec_config},
    Flag{"--speculative-model", true, Act::draft}, Flag{"--kv-cache-memory|--kv-cache-memory-bytes", true, Act::kv_budget},
    Flag{"--host|--port|--served-model-name|--dtype|-q|--quantization|--tokenizer|--api-key|--seed|--tool-call-parser|--chat-template|"
         "--download-dir|--load-format|--swap-space|--reasoning-parser|--uvicorn-log-level|--distributed-executor-backend|--limit-mm-per-prompt|"
         "--revision|--generation-config|--kv-transfer-config|--max-logprobs|-dp|--data-parallel-size|--compilation-config|-O|"
         "--max-seq-len-to-capture|--override-generation-config|--hf-overrides|--num-speculative-tokens|--config|--root-path|--max-cudagraph-capture-size|"
         "--cpu-offload-gb|--mm-processor-kwargs|--tokenizer-mode",
         true, Act::ignore},
    Flag{"--trust-remote-code|--enable-prefix-caching|--no-enable-prefix-caching|--enable-chunked-prefill|--no-enable-chunked-prefill|"
         "--disable-log-requests|--enable-auto-tool-choice|--enforce-eager|--disable-custom-all-reduce|--disable-log-stats|"
         "--enable-expert-parallel|--async-scheduling|--enable-log-requests|--disable-frontend-multiprocessing",
         false, Act::ignore}};

// common/arg.cpp (llama-server, llama-cli)
constexpr std::array llamacpp_flags{
    Flag{"-m|--model", true, Act::model}, Flag{"-hf|-hfr|--hf-repo", true, Act::model}, Flag{"-c|--ctx-size", true, Act::n_ctx},
    Flag{"-np|--parallel", true, Act::batch}, Flag{"-ctk|--cache-type-k", true, Act::dtype_k}, Flag{"-ctv|--cache-type-v", true, Act::dtype_v},
    Flag{"-ub|--ubatch-size", true, Act::ubatch}, Flag{"-b|--batch-size", true, Act::nbatch}, Flag{"-kvu|--kv-unified", false, Act::kvu},
    Flag{"--swa-full", false, Act::swa_full}, Flag{"-fa|--flash-attn", false, Act::fa}, Flag{"-md|--model-draft", true, Act::draft},
    Flag{"-ngl|--gpu-layers|--n-gpu-layers|-sm|--split-mode|-ts|--tensor-split|-mg|--main-gpu|-dev|--device|--host|--port|-t|--threads|"
         "-tb|--threads-batch|--temp|-n|--n-predict|--alias|-a|--api-key|-ot|--override-tensor|--log-file|-s|--seed|-p|--prompt|-f|--file|"
         "--chat-template|--reasoning-format|--top-k|--top-p|--min-p|--repeat-penalty|--draft-max|--draft-min|--draft-p-min|-ngld|"
         "--n-gpu-layers-draft|--fit|-fit|--rope-scaling|--rope-freq-base|--yarn-orig-ctx|--keep|--mmproj|-r|--reverse-prompt|--slot-save-path",
         true, Act::ignore},
    Flag{"--jinja|--no-mmap|--mlock|-cb|--cont-batching|--metrics|--no-webui|-cnv|--conversation|-no-cnv|--no-conversation|--verbose|-v|"
         "--no-warmup|-sp|--special|-if|--interactive-first|-i|--interactive|--simple-io|--embedding|--embeddings|--slots|--props",
         false, Act::ignore}};

// python/sglang/srt/server_args.py (argparse also takes a unique prefix: SGLang's own docs write --mem-fraction)
constexpr std::array sglang_flags{
    Flag{"--model-path|--model", true, Act::model}, Flag{"--context-length", true, Act::context},
    Flag{"--mem-fraction-static|--mem-fraction", true, Act::mem_util},
    Flag{"--max-total-tokens", true, Act::kv_tokens}, Flag{"--kv-cache-dtype", true, Act::dtype},
    Flag{"--tp|--tp-size|--tensor-parallel-size", true, Act::tp}, Flag{"--pp|--pp-size|--pipeline-parallel-size", true, Act::pp},
    Flag{"--page-size", true, Act::block}, Flag{"--max-running-requests", true, Act::max_running},
    Flag{"--speculative-draft-model-path|--speculative-draft-model", true, Act::draft}, Flag{"--speculative-algorithm", true, Act::spec_algo},
    Flag{"--speculative-num-steps", true, Act::spec_steps}, Flag{"--speculative-eagle-topk", true, Act::spec_topk},
    Flag{"--speculative-num-draft-tokens", true, Act::spec_ntok},
    Flag{"--host|--port|--dtype|--quantization|--served-model-name|--chunked-prefill-size|--cuda-graph-max-bs|--attention-backend|--dp|"
         "--dp-size|--log-level|--schedule-policy|--tool-call-parser|--reasoning-parser|--random-seed|--tokenizer-path|--api-key|--ep|--ep-size|"
         "--max-prefill-tokens|--chat-template|--load-format|--nnodes|--node-rank|--dist-init-addr",
         true, Act::ignore},
    Flag{"--trust-remote-code|--enable-torch-compile|--enable-dp-attention|--disable-radix-cache|--disable-cuda-graph|--enable-metrics|"
         "--log-requests|--skip-server-warmup",
         false, Act::ignore}};

// tensorrt_llm/commands/serve.py (trtllm-serve)
constexpr std::array trtllm_flags{
    Flag{"--max_seq_len", true, Act::context}, Flag{"--max_batch_size", true, Act::batch}, Flag{"--tp_size", true, Act::tp},
    Flag{"--pp_size", true, Act::pp}, Flag{"--kv_cache_free_gpu_memory_fraction", true, Act::mem_util},
    Flag{"--host|--port|--backend|--ep_size|--max_num_tokens|--max_beam_width|--tokenizer|--log_level|--num_postprocess_workers|"
         "--reasoning_parser|--gpus_per_node|--cluster_size|--extra_llm_api_options|--config",
         true, Act::ignore},
    Flag{"--trust_remote_code", false, Act::ignore}};

template <std::size_t N>
const Flag* find_flag(const std::array<Flag, N>& table, std::string_view name) {
    for (const Flag& f : table) {
        std::string_view names = f.names;
        while (!names.empty()) {
            const auto bar = names.find('|');
            if (names.substr(0, bar) == name) return &f;
            names = bar == std::string_view::npos ? std::string_view{} : names.substr(bar + 1);
        }
    }
    return nullptr;
}

// The program: which engine, and where its arguments start.
std::size_t detect_engine(const std::vector<std::string>& w, EngineCommand& cmd) {
    std::size_t i = 0;
    while (i < w.size() && w[i].find('=') != std::string::npos && w[i].front() != '-') ++i;  // VAR=value before the program
    if (i >= w.size()) throw UsageError("--engine-cmd: empty command; expected vllm serve, llama-server, llama-cli, python -m sglang.launch_server or trtllm-serve");
    const std::string base = w[i].substr(w[i].find_last_of('/') + 1);
    auto module = [&](std::string_view m) { return i + 2 < w.size() && w[i + 1] == "-m" && w[i + 2] == m; };
    if (base == "vllm" && i + 1 < w.size() && w[i + 1] == "serve") return cmd.engine = Engine::vllm, cmd.program = "vllm serve", i + 2;
    if (base.rfind("python", 0) == 0 && module("vllm.entrypoints.openai.api_server"))
        return cmd.engine = Engine::vllm, cmd.program = "python -m vllm.entrypoints.openai.api_server", i + 3;
    if (base == "llama-server" || base == "llama-cli" || base == "llama-server.exe" || base == "llama-cli.exe")
        return cmd.engine = Engine::llamacpp, cmd.program = base, i + 1;
    if (base.rfind("python", 0) == 0 && module("sglang.launch_server"))
        return cmd.engine = Engine::sglang, cmd.program = "python -m sglang.launch_server", i + 3;
    if (base == "trtllm-serve") return cmd.engine = Engine::trtllm, cmd.program = "trtllm-serve", i + 1 + (i + 1 < w.size() && w[i + 1] == "serve");
    throw UsageError(fmt::format("--engine-cmd: {} is no engine command kvlab reads; expected vllm serve, llama-server, llama-cli, "
                                 "python -m sglang.launch_server or trtllm-serve",
                                 quote(w[i])));
}

// llama.cpp's cache type names as kvlab's dtype names.
std::string llamacpp_dtype(const std::string& v, std::string_view flag) {
    if (v == "f16") return "fp16";
    if (v == "f32") return "fp32";
    if (v == "bf16" || v == "q8_0" || v == "q4_0") return v;
    throw UsageError(fmt::format("--engine-cmd: llama.cpp {} {}: kvlab sizes f32, f16, bf16, q8_0 and q4_0", flag, quote(v)));
}

double parse_fraction(const std::string& v, std::string_view flag, std::string_view engine) {
    double x = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (ec != std::errc() || end != v.data() + v.size() || !(x > 0.0 && x <= 1.0))
        throw UsageError(fmt::format("--engine-cmd: {} {} {}: expected a fraction in (0, 1]", engine, flag, quote(v)));
    return x;
}

// vLLM's --speculative-config JSON: the draft's model (EAGLE head, draft model), or MTP / n-gram without one.
void read_speculative_config(const std::string& v, EngineCommand& cmd) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(v);
    } catch (const nlohmann::json::exception&) {
        throw UsageError(fmt::format("--engine-cmd: vllm --speculative-config {}: expected JSON, e.g. '{{\"method\": \"eagle\", \"model\": \"...\"}}'", quote(v)));
    }
    const std::string method = j.is_object() && j.contains("method") && j["method"].is_string() ? j["method"].get<std::string>() : "";
    if (j.is_object() && j.contains("model") && j["model"].is_string()) cmd.draft = j["model"].get<std::string>();
    else if (method.find("mtp") != std::string::npos) cmd.draft = "mtp:1";
    else if (method == "ngram" || method == "suffix") cmd.notes.push_back(fmt::format("--speculative-config: {} drafts keep no KV cache", method));
    cmd.draft_kind = vllm_draft_kind(method, cmd.draft);
}

// One flag's value (or presence) into the command.
void apply_flag(const Flag& f, const std::string& name, const std::string& v, EngineCommand& cmd) {
    const std::string where = fmt::format("{} {}", cmd.program, name);
    switch (f.act) {
    case Act::ignore: cmd.ignored.push_back(name); break;
    case Act::fa:  // common/arg.cpp: on|enabled|1, off|disabled|0, auto|-1 (PR #15434, #15746); bare -fa (before b6327): on
        cmd.flash_attn = v.empty() || v == "on" || v == "enabled" || v == "1" ? FlashAttn::on
                         : v == "off" || v == "disabled" || v == "0"             ? FlashAttn::off
                         : v == "auto" || v == "-1"                              ? FlashAttn::automatic
                                                                                 : throw UsageError(fmt::format(
                                                                                       "--engine-cmd: llama.cpp {} {}: expected on, off or auto", name, quote(v)));
        break;
    case Act::model: cmd.model = v; break;
    case Act::context: cmd.context = parse_count(v, where); break;
    case Act::n_ctx: cmd.n_ctx = parse_count(v, where); break;
    case Act::batch: cmd.batch = parse_count(v, where); break;
    case Act::tp: cmd.tp = parse_count(v, where); break;
    case Act::pp: cmd.pp = parse_count(v, where); break;
    case Act::block: cmd.block_size = parse_count(v, where); break;
    case Act::kv_tokens: cmd.kv_tokens = parse_count(v, where); break;
    case Act::gpu_blocks: cmd.kv_tokens = parse_count(v, where); cmd.notes.push_back("gpu_blocks"); break;
    case Act::ubatch: cmd.ubatch = cmd.ubatch ? std::min(*cmd.ubatch, parse_count(v, where)) : parse_count(v, where); break;
    case Act::nbatch: cmd.ubatch = std::min(cmd.ubatch.value_or(512), parse_count(v, where)); break;  // n_ubatch = min(-ub, -b)
    case Act::mnbt: cmd.max_num_batched_tokens = parse_count(v, where); break;
    case Act::dtype: if (v != "auto") cmd.dtype = v; break;
    case Act::dtype_k:
    case Act::dtype_v: {
        const std::string d = llamacpp_dtype(v, name);
        if (cmd.dtype && *cmd.dtype != d)
            throw UsageError(fmt::format("--engine-cmd: llama.cpp -ctk and -ctv differ ({} and {}); kvlab sizes one cache type for K and V", *cmd.dtype, d));
        cmd.dtype = d;
        break;
    }
    case Act::mem_util: cmd.mem_util = parse_fraction(v, name, cmd.program); break;
    case Act::kvu: cmd.kv_unified = true; break;
    case Act::swa_full: cmd.swa_full = true; break;
    case Act::draft: cmd.draft = v; break;
    case Act::spec_config: read_speculative_config(v, cmd); break;
    case Act::kv_budget: cmd.kv_budget = parse_size(v.find_first_not_of("0123456789") == std::string::npos ? v + "B" : v, where); break;
    case Act::max_running: cmd.batch = cmd.max_running_requests = parse_count(v, where); break;
    case Act::spec_algo: cmd.spec_algorithm = v; break;  // resolved once every flag is read (read_speculative_algorithm)
    case Act::spec_steps: cmd.spec_steps = parse_count(v, where); break;
    case Act::spec_topk: cmd.spec_topk = parse_count(v, where); break;
    case Act::spec_ntok: cmd.spec_draft_tokens = parse_count(v, where); break;
    }
}

// a value llama.cpp's -fa takes (newer builds); older builds' -fa took none
bool is_fa_value(std::string_view t) {
    constexpr std::array<std::string_view, 8> values{"on", "off", "auto", "1", "0", "-1", "enabled", "disabled"};
    return std::find(values.begin(), values.end(), t) != values.end();
}

template <std::size_t N>
void read_flags(const std::vector<std::string>& w, std::size_t i, const std::array<Flag, N>& table, EngineCommand& cmd) {
    const std::string engine(choice_name(engine_choices, cmd.engine));
    for (; i < w.size(); ++i) {
        const std::string& tok = w[i];
        if (tok.empty() || tok.front() != '-') {
            if (!cmd.model.empty())
                throw UsageError(fmt::format("--engine-cmd: {} takes one model; {} is a second argument that is no flag", cmd.program, quote(tok)));
            cmd.model = tok;
            continue;
        }
        const auto eq = tok.find('=');
        const std::string name = tok.substr(0, eq);
        const Flag* f = find_flag(table, name);
        if (!f)
            throw UsageError(fmt::format("--engine-cmd: {} is no {} flag kvlab knows ({}); kvcalc --help lists the engine flags it reads",
                                         quote(name), engine, cmd.program));
        std::string value;
        if (eq != std::string::npos) value = tok.substr(eq + 1);
        else if (f->value) {
            if (i + 1 >= w.size()) throw UsageError(fmt::format("--engine-cmd: {} {} needs a value", engine, name));
            value = w[++i];
        } else if (f->act == Act::fa && i + 1 < w.size() && is_fa_value(w[i + 1])) {
            value = w[++i];  // -fa takes on|off|auto in newer builds, nothing in older ones
        }
        apply_flag(*f, name, value, cmd);
    }
}

// SGLang's --speculative-algorithm: EAGLE, EAGLE3 and STANDALONE keep a draft model's KV; NEXTN (and EAGLE without a draft
// path, which server_args.py points at the model itself for DeepSeek-V3) is the model's MTP layer (num_nextn_predict_layers,
// 1 in DeepSeek-V3's config); NGRAM / LOOKAHEAD draft without a model.
void read_speculative_algorithm(EngineCommand& cmd) {
    if (cmd.spec_algorithm.empty()) return;
    std::string algo = cmd.spec_algorithm;
    std::transform(algo.begin(), algo.end(), algo.begin(), [](unsigned char ch) { return static_cast<char>(std::toupper(ch)); });
    if (algo == "NGRAM" || algo == "LOOKAHEAD") cmd.notes.push_back(fmt::format("--speculative-algorithm {}: its drafts keep no KV cache", algo));
    else if (cmd.draft.empty() && (algo == "NEXTN" || algo == "EAGLE")) cmd.draft = "mtp:1";
    else if (algo != "EAGLE" && algo != "EAGLE3" && algo != "STANDALONE" && algo != "NEXTN")
        throw UsageError(fmt::format("--engine-cmd: sglang --speculative-algorithm {}: kvlab reads EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM", quote(algo)));
}

}  // namespace

std::vector<std::string> split_command_line(std::string_view s) {
    std::vector<std::string> words;
    std::string cur;
    bool in_word = false;
    for (std::size_t i = 0; i < s.size(); ++i) {
        const char ch = s[i];
        if (ch == '\\' && i + 1 < s.size()) {
            if (s[i + 1] != '\n') cur += s[i + 1], in_word = true;
            ++i;
        } else if (ch == '\'') {
            const auto close = s.find(ch, i + 1);
            if (close == std::string_view::npos) throw UsageError(fmt::format("--engine-cmd: unclosed ' quote in {}", quote(s)));
            cur += s.substr(i + 1, close - i - 1);
            in_word = true;
            i = close;
        } else if (ch == '"') {  // inside "…" a backslash escapes " \ $ ` (POSIX), else stays
            std::size_t j = i + 1;
            for (; j < s.size() && s[j] != '"'; ++j) {
                if (s[j] == '\\' && j + 1 < s.size() && std::string_view("\"\\$`").find(s[j + 1]) != std::string_view::npos) ++j;
                cur += s[j];
            }
            if (j >= s.size()) throw UsageError(fmt::format("--engine-cmd: unclosed \" quote in {}", quote(s)));
            in_word = true;
            i = j;
        } else if (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r') {
            if (in_word) words.push_back(cur), cur.clear(), in_word = false;
        } else {
            cur += ch;
            in_word = true;
        }
    }
    if (in_word) words.push_back(cur);
    return words;
}

EngineCommand parse_engine_command(std::string_view command) {
    const auto words = split_command_line(command);
    EngineCommand cmd;
    const std::size_t first = detect_engine(words, cmd);
    switch (cmd.engine) {
    case Engine::vllm: read_flags(words, first, vllm_flags, cmd); break;
    case Engine::llamacpp: read_flags(words, first, llamacpp_flags, cmd); break;
    case Engine::sglang: read_flags(words, first, sglang_flags, cmd), read_speculative_algorithm(cmd); break;
    case Engine::trtllm: read_flags(words, first, trtllm_flags, cmd); break;
    case Engine::exact: break;
    }
    // vLLM --num-gpu-blocks-override counts blocks: the token cap is blocks x --block-size (16 by default)
    if (const auto it = std::find(cmd.notes.begin(), cmd.notes.end(), "gpu_blocks"); it != cmd.notes.end()) {
        cmd.notes.erase(it);
        cmd.kv_tokens = *cmd.kv_tokens * cmd.block_size.value_or(16);
    }
    return cmd;
}

}  // namespace kvlab
