#include "kvlab/formats/checkpoint.hpp"

#include <cstddef>
#include <exception>
#include <vector>

#include <fmt/format.h>
#include <omp.h>

#include "kvlab/core/checked.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/core/huge_pages.hpp"
#include "kvlab/core/mapped_file.hpp"
#include "kvlab/core/text.hpp"
#include "formats/hf_checkpoint.hpp"
#include "formats/llama2c_checkpoint.hpp"
#include "kvlab/weights/tensor_table.hpp"

namespace kvlab {

namespace {

enum class Reader { hf, llama2c };

// Which reader a path needs, and for Hugging Face the directory it names.
Reader pick_reader(const std::filesystem::path& path, std::filesystem::path& hf_dir) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec))
        throw UsageError(fmt::format("{}: checkpoint not found; expected a llama2.c .bin file or a Hugging Face directory", path.string()));
    if (std::filesystem::is_directory(path)) {
        hf_dir = path;
        return Reader::hf;
    }
    if (path.extension() == ".safetensors") {
        hf_dir = path.has_parent_path() ? path.parent_path() : ".";
        return Reader::hf;
    }
    // a config.json given as --checkpoint would otherwise read as a nonsense llama2.c header
    const std::string head = read_input_head(path, "checkpoint", 256);
    if (const auto first = head.find_first_not_of(" \t\r\n"); first != std::string::npos && head[first] == '{')
        throw UsageError(fmt::format("--checkpoint: {} is a JSON file (a config.json?), not a checkpoint; give a config with "
                                     "--config, and --checkpoint a llama2.c .bin or a Hugging Face directory (config.json and "
                                     "safetensors)", quote(path.string())));
    return Reader::llama2c;
}

}  // namespace

LoadedModel load_checkpoint(const std::filesystem::path& path, std::optional<std::int64_t> n_layers, WeightPlacement placement) {
    std::filesystem::path hf_dir;
    return pick_reader(path, hf_dir) == Reader::hf ? load_hf_checkpoint(hf_dir, n_layers, placement) : load_llama2c_checkpoint(path, n_layers, placement);
}

std::int64_t layers_to_read(const ModelConfig& cfg, std::optional<std::int64_t> n_layers, const std::filesystem::path& path) {
    if (!n_layers) return cfg.n_layer;
    if (*n_layers < 1 || *n_layers > cfg.n_layer)
        throw UsageError(fmt::format("--layers: {}; expected 1..{} (the layers of {})", *n_layers, cfg.n_layer, path.string()));
    return *n_layers;
}

void copy_checkpoint_ranges(const std::filesystem::path& path, std::span<const FileCopy> copies, std::string_view what) {
    const std::vector<std::vector<FileCopy>> parts = split_copies(copies, omp_get_max_threads());
    std::vector<std::exception_ptr> errors(parts.size());
    const auto n = static_cast<std::int64_t>(parts.size());
#pragma omp parallel for schedule(static, 1)
    for (std::int64_t i = 0; i < n; ++i) {
        const auto k = static_cast<std::size_t>(i);
        try {
            copy_file_ranges(path, parts[k], what);
        } catch (...) {  // an exception must not leave an OpenMP region: kept, and the first rethrown below
            errors[k] = std::current_exception();
        }
    }
    for (const std::exception_ptr& e : errors)
        if (e) std::rethrow_exception(e);
}

namespace {

// Which of the mapped files a matrix is a view into (an index into w.mapped), or -1.
std::ptrdiff_t mapped_file_of(const Weights& w, const WeightMatrix& m) {
    if (!m.is_view() || m.size() == 0) return -1;
    const auto* at = reinterpret_cast<const std::byte*>(m.data());
    for (std::size_t i = 0; i < w.mapped.size(); ++i) {
        const std::byte* base = w.mapped[i]->bytes().data();
        if (at >= base && at < base + w.mapped[i]->size_bytes()) return static_cast<std::ptrdiff_t>(i);
    }
    return -1;
}

}  // namespace

MatrixBytes matrix_bytes(const ModelConfig& cfg, const Weights& w) {
    MatrixBytes out;
    for_each_tensor(tensor_specs(cfg), w.layers.size(), [&](const TensorSpec& s, std::size_t layer) {
        if (!s.is_matrix()) return;
        const WeightMatrix& m = matrix_of(w, s, layer);
        const std::uint64_t bytes = checked_mul(static_cast<std::uint64_t>(m.size()), sizeof(float), "weight bytes");
        out.total = checked_add(out.total, bytes, "weight bytes");
        if (mapped_file_of(w, m) >= 0) out.in_place = checked_add(out.in_place, bytes, "weight bytes");
    });
    return out;
}

void copy_mapped_matrices(const ModelConfig& cfg, Weights& w) {
    if (w.mapped.empty()) return;
    const std::vector<TensorSpec> specs = tensor_specs(cfg);
    const auto file_of = [&](const WeightMatrix& m) { return mapped_file_of(w, m); };
    // the arena: a piece for each matrix that is a view into a file, in forward order
    std::uint64_t arena_bytes = 0;
    for_each_tensor(specs, w.layers.size(), [&](const TensorSpec& s, std::size_t layer) {
        if (s.is_matrix() && file_of(matrix_of(w, s, layer)) >= 0)
            arena_bytes = checked_add(arena_bytes, HugeArena::footprint(checked_mul(s.n_values(), sizeof(float), "weight bytes")),
                                      "weight bytes");
    });
    auto arena = std::make_shared<HugeArena>(static_cast<std::size_t>(arena_bytes));
    std::vector<std::vector<FileCopy>> copies(w.mapped.size());  // per file
    std::vector<std::pair<WeightMatrix*, const float*>> moved;   // each view and its place in the arena
    for_each_tensor(specs, w.layers.size(), [&](const TensorSpec& s, std::size_t layer) {
        if (!s.is_matrix()) return;
        WeightMatrix& m = matrix_of(w, s, layer);
        const std::ptrdiff_t file = file_of(m);
        if (file < 0) return;
        const auto n_bytes = static_cast<std::size_t>(m.size()) * sizeof(float);
        auto* data = static_cast<float*>(arena->take(n_bytes));
        const std::byte* base = w.mapped[static_cast<std::size_t>(file)]->bytes().data();
        const auto offset = static_cast<std::uint64_t>(reinterpret_cast<const std::byte*>(m.data()) - base);
        copies[static_cast<std::size_t>(file)].push_back(FileCopy{offset, n_bytes, reinterpret_cast<std::byte*>(data)});
        moved.emplace_back(&m, data);
    });
    for (std::size_t i = 0; i < w.mapped.size(); ++i) {
        w.mapped[i]->drop_pages(0, w.mapped[i]->size_bytes());  // the views are not read again; the copy reads the page cache
        copy_checkpoint_ranges(w.mapped[i]->path(), copies[i], "checkpoint");
    }
    for (const auto& [m, data] : moved) *m = WeightMatrix::view(data, m->rows(), m->cols());
    w.backing = std::move(arena);
    w.mapped.clear();
}

ModelConfig load_checkpoint_config(const std::filesystem::path& path) {
    std::filesystem::path hf_dir;
    return pick_reader(path, hf_dir) == Reader::hf ? load_model_config(hf_dir) : load_llama2c_config(path);
}

}  // namespace kvlab
