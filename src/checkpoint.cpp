#include "kvlab/checkpoint.hpp"

#include <fmt/format.h>

#include "kvlab/error.hpp"
#include "kvlab/hf_checkpoint.hpp"
#include "kvlab/llama2c_checkpoint.hpp"

namespace kvlab {

LoadedModel load_checkpoint(const std::filesystem::path& path) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec))
        throw UsageError(fmt::format("{}: checkpoint not found; expected a llama2.c .bin file or a Hugging Face directory", path.string()));
    if (std::filesystem::is_directory(path)) return load_hf_checkpoint(path);
    if (path.extension() == ".safetensors") return load_hf_checkpoint(path.has_parent_path() ? path.parent_path() : ".");
    return load_llama2c_checkpoint(path);
}

}  // namespace kvlab
