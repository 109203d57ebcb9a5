// Fuzz target: a Hugging Face config.json as kvcalc and simulate read it, and the sizes formed from it
// (KV bytes, weight bytes, parameter counts): every product of config values must be checked.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_common.hpp"
#include "core/json_input.hpp"
#include "kvlab/calc/kv_memory.hpp"
#include "kvlab/calc/model_config.hpp"
#include "kvlab/calc/param_count.hpp"
#include "kvlab/weights/random_weights.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    kvlab::fuzz::expect_kvlab_errors_only([&] {
        const kvlab::ModelConfig cfg = kvlab::parse_model_config(kvlab::parse_json(text, "config.json"), "config.json", "fuzz");
        (void)kvlab::weights_bytes(cfg);
        (void)kvlab::count_params(cfg);
        for (const std::uint64_t tokens : {std::uint64_t{1}, std::uint64_t{4096}, std::uint64_t{1} << 40})
            (void)kvlab::kv_bytes_sequence(cfg, kvlab::DType::fp16, tokens, kvlab::WindowMode::cap);
    });
    return 0;
}
