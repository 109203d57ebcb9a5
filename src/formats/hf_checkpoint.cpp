#include "formats/hf_checkpoint.hpp"

#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/checked.hpp"
#include "core/error.hpp"
#include "core/text.hpp"
#include "core/json_input.hpp"
#include "core/huge_pages.hpp"
#include "core/mapped_file.hpp"
#include "formats/safetensors.hpp"
#include "model/tensor_table.hpp"

namespace kvlab {
namespace {

// Every tensor of a checkpoint, from one file or from the shards an index names.
class TensorSource {
public:
    explicit TensorSource(const std::filesystem::path& dir) {
        const std::filesystem::path single = dir / "model.safetensors";
        const std::filesystem::path index = dir / "model.safetensors.index.json";
        std::error_code ec;  // no-throw overloads: a bad name is a format error naming the file, not a filesystem_error
        if (std::filesystem::is_regular_file(single, ec)) {
            add_file(single);
            for (const auto& [name, t] : files_.back().tensors()) owner_[name] = 0;
            where_ = single.string();
        } else if (std::filesystem::is_regular_file(index, ec)) {
            read_index(dir, index);
            where_ = index.string();
        } else {
            throw FormatError(fmt::format("{}: no model.safetensors or model.safetensors.index.json in this directory", dir.string()));
        }
    }

    bool contains(const std::string& name) const { return owner_.count(name) != 0; }

    MatrixRM matrix(const std::string& name, std::int64_t rows, std::int64_t cols) const {
        return file_for(name, {rows, cols}).read_matrix(name, rows, cols);
    }
    // Where an F32 matrix of exactly (rows, cols) lies: its shard and its first byte there, for the loader
    // to copy as it is stored; nullopt for another dtype. Throws FormatError when missing or of another shape.
    std::optional<FileCopy> f32_span(const std::string& name, std::int64_t rows, std::int64_t cols, std::filesystem::path& shard) const {
        const SafetensorsFile& file = file_for(name, {rows, cols});
        const std::optional<std::uint64_t> at = file.f32_offset(name, rows, cols);
        if (!at) return std::nullopt;
        shard = file.path();
        return FileCopy{*at, static_cast<std::uint64_t>(rows) * static_cast<std::uint64_t>(cols) * sizeof(float), nullptr};
    }
    VectorF vector(const std::string& name, std::int64_t n) const { return file_for(name, {n}).read_vector(name, n); }

    const std::string& where() const { return where_; }

    // the stored bytes of the tensors whose names start with one of `prefixes`
    std::uint64_t bytes_under(const std::vector<std::string>& prefixes) const {
        std::uint64_t out = 0;
        for (const auto& [name, file] : owner_)
            for (const auto& prefix : prefixes)
                if (name.rfind(prefix, 0) == 0) {
                    const SafetensorsTensor* t = files_[file].find(name);
                    out = checked_add(out, t->end_bytes - t->begin_bytes, "stored vision bytes");
                    break;
                }
        return out;
    }

    // every tensor's stored bytes, summed per dtype (a tensor counted once, in the file that holds it)
    std::map<std::string, std::uint64_t> bytes_by_dtype() const {
        std::map<std::string, std::uint64_t> out;
        for (const auto& [name, file] : owner_) {
            const SafetensorsTensor* t = files_[file].find(name);
            out[t->dtype] = checked_add(out[t->dtype], t->end_bytes - t->begin_bytes, "stored weight bytes");
        }
        return out;
    }

private:
    void add_file(const std::filesystem::path& path) { files_.emplace_back(path); }

    void read_index(const std::filesystem::path& dir, const std::filesystem::path& index) {
        const nlohmann::json j = parse_json(read_input_file(index, "shard index", 64 << 20), index.string());
        if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
            throw FormatError(fmt::format("{}: expected an object with a \"weight_map\" object", index.string()));
        std::map<std::string, std::size_t> shard_ids;
        for (const auto& [name, shard] : j["weight_map"].items()) {
            if (!shard.is_string())
                throw FormatError(fmt::format("{}: weight_map entry {} is not a file name", index.string(), quote(name)));
            const std::string file = shard.get<std::string>();
            // A shard is a plain file next to the index: no directories, no escaping the checkpoint.
            if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos)
                throw FormatError(fmt::format("{}: weight_map entry {} names shard {}; expected a file name in the same directory",
                                              index.string(), quote(name), quote(file)));
            auto it = shard_ids.find(file);
            if (it == shard_ids.end()) {
                const std::filesystem::path path = dir / file;
                std::error_code ec;
                if (!std::filesystem::is_regular_file(path, ec))
                    throw FormatError(fmt::format("{}: shard {} (holding {}) does not exist", index.string(), quote(file), quote(name)));
                add_file(path);
                it = shard_ids.emplace(file, files_.size() - 1).first;
            }
            if (files_[it->second].find(name) == nullptr)
                throw FormatError(fmt::format("{}: the index puts tensor {} in {}, which has no such tensor", index.string(), quote(name),
                                              files_[it->second].path().string()));
            owner_[name] = it->second;
        }
    }

    const SafetensorsFile& file_for(const std::string& name, const std::vector<std::int64_t>& shape) const {
        const auto it = owner_.find(name);
        if (it == owner_.end())
            throw FormatError(fmt::format("{}: tensor '{}' is missing (expected shape [{}])", where_, name, fmt::join(shape, ", ")));
        return files_[it->second];
    }

    std::vector<SafetensorsFile> files_;  // one per shard, mapped while the weights are read
    std::map<std::string, std::size_t> owner_;  // tensor name -> index into files_
    std::string where_;
};

// Every tensor of the table from the checkpoint, in forward order. F32 matrices in kvlab's layout need no
// transformation, only a place: pieces of one arena of huge pages, back to back in forward order, filled
// from the shards with pread (copy_checkpoint_ranges), as llama2.c checkpoints get; each starts on a
// 64-byte line whatever its offset in the file. The rest is converted as it is read: BF16/F16 widened,
// GPT-2's Conv1D weights stored (in, out) transposed to kvlab's (out, in), its c_attn (q, k and v
// weights and biases fused) read once per layer and sliced. `root` prefixes the names ("transformer." in
// GPT2LMHeadModel files).
Weights read_weights(const TensorSource& src, const ModelConfig& cfg, std::int64_t n_read, const std::string& root) {
    const std::vector<TensorSpec> specs = tensor_specs(cfg);
    Weights w;
    w.layers.resize(static_cast<std::size_t>(n_read));
    auto name_of = [&](const TensorSpec& s, std::size_t layer) {  // lm_head sits beside the transformer module, never under its root
        return (s.name == "lm_head" ? "" : root) + fmt::format(fmt::runtime(s.hf_name), layer);
    };
    // the F32 matrices stored as kvlab holds them, and the arena they are copied into
    auto stored_as_is = [&](const TensorSpec& s, std::size_t layer, std::filesystem::path& shard) -> std::optional<FileCopy> {
        const std::string name = name_of(s, layer);
        if (!s.is_matrix() || s.hf_slice >= 0 || s.hf_transposed || !src.contains(name)) return std::nullopt;
        return src.f32_span(name, s.rows, s.cols, shard);
    };
    std::uint64_t arena_bytes = 0;
    for_each_tensor(specs, w.layers.size(), [&](const TensorSpec& s, std::size_t layer) {
        std::filesystem::path shard;
        if (const auto span = stored_as_is(s, layer, shard))
            arena_bytes = checked_add(arena_bytes, HugeArena::footprint(span->bytes), "weight bytes");
    });
    const auto arena = arena_bytes > 0 ? std::make_shared<HugeArena>(static_cast<std::size_t>(arena_bytes)) : nullptr;
    std::map<std::filesystem::path, std::vector<FileCopy>> copies;  // per shard
    MatrixRM fused_w;  // this layer's c_attn weight (3 x out, in) and bias (3 x out), kept for the slices after the first
    VectorF fused_b;
    for_each_tensor(specs, w.layers.size(), [&](const TensorSpec& s, std::size_t layer) {
        const std::string name = name_of(s, layer);
        if (s.name == "lm_head" && !src.contains(name)) {
            if (cfg.family == Family::gpt2) return;  // GPT-2 files tie it to wte whatever the config says
            throw FormatError(fmt::format("{}: tensor '{}' is missing (expected shape [{}, {}]) and config.json does not set "
                                          "tie_word_embeddings: true", src.where(), name, s.rows, s.cols));
        }
        if (s.hf_slice == 0 && s.is_matrix()) fused_w = src.matrix(name, s.cols, 3 * s.rows).transpose();
        if (s.hf_slice == 0 && !s.is_matrix()) fused_b = src.vector(name, 3 * s.rows);
        if (s.is_matrix()) {
            WeightMatrix& m = matrix_of(w, s, layer);
            std::filesystem::path shard;
            if (s.hf_slice >= 0) m = fused_w.middleRows(s.hf_slice * s.rows, s.rows);  // slice of the fused rows
            else if (s.hf_transposed) m = src.matrix(name, s.cols, s.rows).transpose();
            else if (std::optional<FileCopy> span = stored_as_is(s, layer, shard)) {  // F32 in kvlab's layout: copied below
                span->dst = static_cast<std::byte*>(arena->take(span->bytes));
                m = WeightMatrix::view(reinterpret_cast<const float*>(span->dst), s.rows, s.cols);
                copies[shard].push_back(*span);
            } else {
                m = src.matrix(name, s.rows, s.cols);  // BF16 or F16, widened
            }
        } else {
            VectorF& v = vector_of(w, s, layer);
            v = s.hf_slice >= 0 ? VectorF(fused_b.segment(s.hf_slice * s.rows, s.rows)) : src.vector(name, s.rows);
        }
    });
    for (const auto& [shard, spans] : copies) copy_checkpoint_ranges(shard, spans, "safetensors file");
    w.backing = arena;  // the F32 matrices are views into it
    return w;
}

Weights load_llama_weights(const TensorSource& src, const ModelConfig& cfg, std::int64_t n_read) {
    if (cfg.attention_bias || src.contains("model.layers.0.self_attn.q_proj.bias"))
        throw FormatError(fmt::format("{}: the model has attention biases (model_type {}); kvlab's llama forward pass has none",
                                      src.where(), quote(cfg.model_type, 40)));
    Weights w = read_weights(src, cfg, n_read, "");
    w.rope_pairing = RopePairing::halves;  // HF Llama rotates (x[i], x[i+D/2]); wq/wk rows are stored for that
    return w;
}

Weights load_gpt2_weights(const TensorSource& src, const ModelConfig& cfg, std::int64_t n_read) {
    if (cfg.d_q() != cfg.d_model || cfg.n_head_kv != cfg.n_head)
        throw FormatError(fmt::format("{}: gpt2 needs n_head x d_head == d_model and no grouped KV heads ({} x {} vs {}, {} KV heads)",
                                      src.where(), cfg.n_head, cfg.d_head, cfg.d_model, cfg.n_head_kv));
    // GPT2Model checkpoints name tensors "wte.weight"; GPT2LMHeadModel ones "transformer.wte.weight".
    const std::string root = src.contains("wte.weight") || !src.contains("transformer.wte.weight") ? "" : "transformer.";
    return read_weights(src, cfg, n_read, root);
}

}  // namespace

LoadedModel load_hf_checkpoint(const std::filesystem::path& dir, std::optional<std::int64_t> n_layers) {
    LoadedModel model{load_model_config(dir), {}};
    const ModelConfig& cfg = model.config;
    if (cfg.mla) throw FormatError(fmt::format("{}: multi-head latent attention weights are not supported", dir.string()));
    if (cfg.n_expert != 1)
        throw FormatError(fmt::format("{}: mixture-of-experts weights ({} experts) are not supported", dir.string(), cfg.n_expert));
    const TensorSource src(dir);
    const std::int64_t n_read = layers_to_read(cfg, n_layers, dir);
    model.weights = cfg.family == Family::gpt2 ? load_gpt2_weights(src, cfg, n_read) : load_llama_weights(src, cfg, n_read);
    return model;
}

std::optional<StoredWeights> stored_weights(const std::filesystem::path& dir) {
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec) || (!std::filesystem::is_regular_file(dir / "model.safetensors", ec) &&
                                                    !std::filesystem::is_regular_file(dir / "model.safetensors.index.json", ec)))
        return std::nullopt;
    const TensorSource src(dir);
    StoredWeights w;
    w.where = src.where();
    w.bytes_by_dtype = src.bytes_by_dtype();
    for (const auto& [dtype, bytes] : w.bytes_by_dtype) w.bytes = checked_add(w.bytes, bytes, "stored weight bytes");
    // the vision side as transformers names it: Gemma 3 (vision_tower., multi_modal_projector.), Qwen2.5-VL
    // (visual.), with the model. prefix checkpoints saved by transformers 4.52+ carry
    w.vision_bytes = src.bytes_under({"vision_tower.", "multi_modal_projector.", "visual.", "model.vision_tower.",
                                      "model.multi_modal_projector.", "model.visual."});
    return w;
}

}  // namespace kvlab
