// --engine NAME@VERSION: the releases whose rules or printed lines kvlab knows, per engine, and the
// pipeline-parallel layer split each engine uses. docs/kv-memory.md ("Engine releases") tabulates the
// same list with its sources; every rule that depends on the release reads the key set here.
#include <algorithm>
#include <charconv>

#include <fmt/format.h>

#include "kvlab/calc/engine.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/core/text.hpp"

namespace kvlab {
namespace {

// The release each engine answers for without a version (its rules were read from that release's source).
std::uint64_t pinned_key(Engine engine) {
    switch (engine) {
    case Engine::vllm: return 10002;       // v0.10.2
    case Engine::llamacpp: return 8668;    // b8668
    case Engine::sglang: return 5002;      // v0.5.2
    case Engine::trtllm: return 1002000;   // 1.2.0rc2
    case Engine::exact: break;
    }
    return 0;
}

// "0.8.5", "v0.8.5", "1.2.0rc2", "0.10.1.1" -> x * 1000000 + y * 1000 + z (a pre-release suffix and a fourth part dropped);
// llama.cpp: "b5913" or "5913" -> 5913. nullopt for anything else.
std::optional<std::uint64_t> version_key(Engine engine, std::string_view v) {
    auto number = [](std::string_view& s) -> std::optional<std::uint64_t> {
        std::uint64_t n = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
        if (ec != std::errc() || end == s.data() || n >= 1000) return std::nullopt;
        s.remove_prefix(static_cast<std::size_t>(end - s.data()));
        return n;
    };
    if (engine == Engine::llamacpp) {
        if (!v.empty() && v.front() == 'b') v.remove_prefix(1);
        std::uint64_t n = 0;
        const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
        if (ec != std::errc() || end != v.data() + v.size() || v.empty() || n == 0 || n > 1000000) return std::nullopt;
        return n;
    }
    if (!v.empty() && v.front() == 'v') v.remove_prefix(1);
    std::uint64_t key = 0;
    for (int part = 0; part < 3; ++part) {
        const auto n = number(v);
        if (!n) return std::nullopt;
        key = key * 1000 + *n;
        if (part < 2) {
            if (v.empty() || v.front() != '.') return std::nullopt;
            v.remove_prefix(1);
        }
    }
    // what may follow: a pre-release (rc2, .post1, .dev5, +cu128) or a fourth part
    if (!v.empty() && std::string_view(".+rcabdevpost").find(v.front()) == std::string_view::npos) return std::nullopt;
    return key;
}

std::string key_name(Engine engine, std::uint64_t key) {
    if (engine == Engine::llamacpp) return fmt::format("b{}", key);
    for (const auto& r : engine_releases(engine))
        if (r.key == key) return std::string(r.name);
    return fmt::format("{}.{}.{}", key / 1000000, key / 1000 % 1000, key % 1000);
}

}  // namespace

std::vector<EngineRelease> engine_releases(Engine engine) {
    switch (engine) {
    case Engine::llamacpp:
        return {{5137, "b5137", "DeepSeek's MLA cache: a K row of kv_lora_rank + rope dims and a V row of kv_lora_rank per layer (before: "
                                "every head's K and V); as kvlab issue 48's survey of logs dates it"},
                {5460, "b5460", "the size line `size = ... (N cells, L layers, S seqs)` (%2u seqs) under the prefix `llama_kv_cache_unified:`; "
                                "one cache of -c cells shared by every sequence, padded to 256 cells with flash attention, 32 without "
                                "(tag-bracketed: b5400 still printed `KV self size`; tag b5460 = 3079e9ac, as vendored in llama.rn df03ca5a)"},
                {5912, "b5912", "the last build with one shared cache and `%2u seqs` (build-pinned: ab140198, the build before PR #14363's "
                                "merge; llama.cpp issue #14847 runs it, where b5913 fails in the streams code)"},
                {5913, "b5913", "KV streams (PR #14363, \"add high-throughput mode\", merged as 225e7a14 = build 5913: issue #14724 reports "
                                "`version: 5913 (225e7a14)`): without -kvu each of -np sequences gets ceil(-c / -np) cells; the seqs column "
                                "`S/ N seqs` (%2u/%2u; the PR's own batched-bench log prints it)"},
                {6018, "b6018", "the last tag seen with `%2u/%2u seqs` (bda62193, vendored in llama.rn fda6c280)"},
                {6081, "b6081", "the seqs column `S/N seqs` (%2u/%u) (tag-bracketed b6018..b6081: d31192b4, vendored in llama.rn 97012ad0)"},
                {6218, "b6218", "the last tag seen with the class llama_kv_cache_unified (13aeb7ae, vendored in llama.rn ee37aa52)"},
                {6250, "b6250", "the prefix `llama_kv_cache:`: PR #15467 (\"kv-cache : drop the \"unified\" prefix\", merged 2025-08-21) "
                                "renamed the class llama_kv_cache_unified, whose constructor's __func__ the size line prints (tag-bracketed "
                                "b6218..b6250: e92734d5, vendored in llama.rn 06b178cf, has llama_kv_cache)"},
                {6318, "b6318", "the last tag seen with -fa off by default (81017865, vendored in llama.rn 248e8453)"},
                {6327, "b6327", "-fa auto the default (PR #15434, flash_attn_type; tag-bracketed b6318..b6327: 4d74393b, llama.rn a7e6c076); "
                                "the cache is made before auto resolves, so it pads as with flash attention (256)"},
                {6786, "b6786", "a real log line: ROCm/ROCm issue #5534's b6786 log prints `llama_kv_cache:`"},
                {6851, "b6851", "the last tag seen padding the cache by get_padding, 256 or 32 (2b9bd9bf, vendored in llama.rn a658fc54)"},
                {6870, "b6870", "no cache padding: PR #16812 (\"memory : remove KV cache size padding\"; tag-bracketed b6851..b6870: "
                                "338074c3, vendored in llama.rn a464809d, passes n_pad 1)"},
                {6975, "b6975", "PR #17046 (\"kv-cache : pad the cache size to 256 for performance\"; llama.rn's b7003 pads to 256), which the pinned rules date from; "
                                "llama-server's -md draft context per slot is llama_n_ctx_seq cells, all of -c with -kvu (before: -c / -np; "
                                "the server commit was not identified, kvlab dates it here)"},
                {7832, "b7832", "DeepSeek's MLA cache keeps no V tensor (V 0.00 MiB; PR #19067)"},
                {8668, "b8668", "the pinned build whose source kvlab's rules were read from"}};
    case Engine::vllm:
        return {{7003, "0.7.3", "V1 logs `# GPU blocks: N` and `Maximum concurrency for L tokens per request` with L unseparated "
                                "(the lines PR #13596 replaced); no budget line"},
                {8000, "0.8.0", "`GPU KV cache size: N tokens`, both counts with thousands separators (PR #13596)"},
                {10000, "0.10.0", "the worker's `Available KV cache memory: X.XX GiB` (%.2f; gpu_worker.py:255) before the pool lines: a "
                                  "v0.10.0 log in Jransom33/Chatterbox-turbo-vllm's README (1ed9a58f); also in issue #21348's July 2025 "
                                  "logs; absent from PR #17122's v0.8.4 log"},
                {10002, "0.10.2", "the pinned release whose source kvlab's rules were read from"},
                {15002, "0.15.2", "the budget and the not-enough-memory error in format_gib's form, GiB rounded to 2 decimals without "
                                  "padding zeros (`4.5 GiB`, `24.0 GiB`; issue #34076's log)"}};
    case Engine::sglang: return {{5002, "0.5.2", "the pinned release whose source kvlab's rules were read from"}};
    case Engine::trtllm:
        return {{13000, "0.13.0", "`Number of blocks in KV cache primary pool: N` (issue #2268's log); no overlap-scheduler token"},
                {1002000, "1.2.0rc2", "the pinned release whose source kvlab's rules were read from"}};
    case Engine::exact: break;
    }
    return {};
}

std::string engine_release_name(Engine engine, std::uint64_t version) {
    const std::uint64_t key = version ? version : pinned_key(engine);
    switch (engine) {
    case Engine::vllm: return "vLLM v" + key_name(engine, key);
    case Engine::llamacpp: return "llama.cpp " + key_name(engine, key);
    case Engine::sglang: return "SGLang v" + key_name(engine, key);
    case Engine::trtllm: return "TensorRT-LLM " + key_name(engine, key);
    case Engine::exact: break;
    }
    return "exact math";
}

EngineSpec parse_engine_spec(std::string_view text, std::string_view flag) {
    const auto at = text.find('@');
    const std::string_view name = text.substr(0, at);
    EngineSpec spec;
    spec.engine = parse_choice(engine_choices, name, flag);
    if (at == std::string_view::npos) {
        spec.version = pinned_key(spec.engine);
        return spec;
    }
    const std::string_view asked = text.substr(at + 1);
    if (spec.engine == Engine::exact) throw UsageError(fmt::format("{} {}: exact math has no releases; expected exact alone", flag, quote(text)));
    const auto key = version_key(spec.engine, asked);
    if (!key)
        throw UsageError(fmt::format("{} {}: {} is not a {} version; expected {}", flag, quote(text), quote(asked), name,
                                     spec.engine == Engine::llamacpp ? "a build, e.g. llama.cpp@b5913" : "x.y.z, e.g. vllm@0.8.5"));
    const auto releases = engine_releases(spec.engine);
    const auto nearest = std::min_element(releases.begin(), releases.end(), [&](const EngineRelease& a, const EngineRelease& b) {
        const auto da = a.key > *key ? a.key - *key : *key - a.key, db = b.key > *key ? b.key - *key : *key - b.key;
        return da < db;
    });
    spec.version = nearest->key;
    if (nearest->key != *key)
        spec.note = fmt::format("{} {}: kvlab knows no release {}; the nearest it knows, {}, answers (known: {})", flag, printable(text),
                                printable(asked), engine_release_name(spec.engine, nearest->key), [&] {
                                    std::string all;
                                    for (const auto& r : releases) all += (all.empty() ? "" : ", ") + std::string(r.name);
                                    return all;
                                }());
    return spec;
}

std::vector<std::uint64_t> pp_layer_split(Engine engine, std::uint64_t n_layers, std::uint64_t pp) {
    if (pp == 0 || pp > n_layers)
        throw UsageError(fmt::format("--pp {}: the model has {} layers; expected 1 to {} pipeline stages", pp, n_layers, n_layers));
    std::vector<std::uint64_t> parts(pp, n_layers / pp);
    const std::uint64_t rest = n_layers % pp;
    if (engine == Engine::vllm || engine == Engine::sglang) {
        // vllm/distributed/utils.py get_pp_indices (SGLang's python/sglang/srt/distributed/utils.py is its copy):
        // `for i in range(2, remaining_layers + 2): partitions[-i] += 1`, so the last stage never gets one
        for (std::uint64_t i = 2; i < rest + 2; ++i) parts[(pp - i + pp) % pp] += 1;
    } else if (engine == Engine::trtllm) {
        // tensorrt_llm/mapping.py pp_layers (read at commit 05ebebb2): torch.tensor_split(torch.arange(num_layers), pp_size),
        // "If num_layers % pp_size = n != 0, first n ranks get one extra layer"; resource_manager.py get_pp_layers builds the
        // KV cache manager's layers from it (a draft's layers on the last rank). Older releases split num_layers // pp_size.
        for (std::uint64_t i = 0; i < rest; ++i) parts[i] += 1;
    } else {
        // llama.cpp (llama-model.cpp load_tensors, -sm layer, equal -ts): layer il goes to the first device whose cumulative
        // share exceeds il / (n_layer + 1), the output layer counting as one more
        std::fill(parts.begin(), parts.end(), 0);
        for (std::uint64_t il = 0; il < n_layers; ++il) {
            const float at = static_cast<float>(il) / static_cast<float>(n_layers + 1);
            std::uint64_t dev = 0;
            while (dev + 1 < pp && !(at < static_cast<float>(dev + 1) / static_cast<float>(pp))) ++dev;
            parts[dev] += 1;
        }
    }
    return parts;
}

}  // namespace kvlab
