// Fuzz target: llama2.c checkpoints, legacy v0 and v1 ("ak42"): the header, the size it implies, the
// tensors. The reader compares the implied size with the file's before allocating anything.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_common.hpp"
#include "formats/llama2c_checkpoint.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const auto path = kvlab::fuzz::write_scratch("model.bin", std::string_view(reinterpret_cast<const char*>(data), size));
    kvlab::fuzz::expect_kvlab_errors_only([&] { (void)kvlab::load_llama2c_checkpoint(path); });
    return 0;
}
