// Fuzz target: a GGUF header (magic, version, counts, typed key/value pairs, arrays of numbers, bools
// and strings), then the model shape read from it as kvcalc --gguf does.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_common.hpp"
#include "formats/gguf.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const auto path = kvlab::fuzz::write_scratch("model.gguf", std::string_view(reinterpret_cast<const char*>(data), size));
    kvlab::fuzz::expect_kvlab_errors_only([&] {
        const kvlab::GgufHeader header = kvlab::read_gguf_header(path);
        (void)kvlab::gguf_model_config(header, path);
    });
    return 0;
}
