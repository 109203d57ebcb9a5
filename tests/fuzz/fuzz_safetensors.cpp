// Fuzz target: a safetensors file: the 8-byte header length, the JSON header (dtypes, shapes, byte
// spans checked as a whole), then every 1-D or 2-D float tensor read as kvlab reads weights.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_common.hpp"
#include "formats/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const auto path = kvlab::fuzz::write_scratch("model.safetensors", std::string_view(reinterpret_cast<const char*>(data), size));
    kvlab::fuzz::expect_kvlab_errors_only([&] {
        const kvlab::SafetensorsFile file(path);
        for (const auto& [name, t] : file.tensors()) {
            if (t.dtype != "F32" && t.dtype != "F16" && t.dtype != "BF16") continue;
            if (t.shape.size() == 1) (void)file.read_vector(t.name, t.shape[0]);
            if (t.shape.size() == 2) (void)file.read_matrix(t.name, t.shape[0], t.shape[1]);
        }
    });
    return 0;
}
