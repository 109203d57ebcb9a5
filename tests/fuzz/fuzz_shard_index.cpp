// Fuzz target: model.safetensors.index.json, the shard index of a Hugging Face checkpoint directory
// (weight_map: tensor name -> shard file). The directory holds a fixed tiny config.json and one valid
// shard (written once per process); the fuzzer's bytes are the index. Shard names must stay inside the
// directory, each named tensor must exist in its shard.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_common.hpp"
#include "formats/hf_checkpoint.hpp"
#include "fixture_writers.hpp"
#include "kvlab/weights/random_weights.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static const std::filesystem::path dir = kvlab::fixtures::write_sharded_hf(
        kvlab::fuzz::scratch_dir() / "hf", kvlab::random_weights(kvlab::fixtures::tiny_config(), 7, 0.5f));
    kvlab::fuzz::write_scratch("hf/model.safetensors.index.json", std::string_view(reinterpret_cast<const char*>(data), size));
    kvlab::fuzz::expect_kvlab_errors_only([&] { (void)kvlab::load_hf_checkpoint(dir); });
    return 0;
}
