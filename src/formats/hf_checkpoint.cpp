#include "formats/hf_checkpoint.hpp"

#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "kvlab/core/checked.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/core/text.hpp"
#include "core/json_input.hpp"
#include "kvlab/core/mapped_file.hpp"
#include "formats/safetensors.hpp"
#include "kvlab/weights/tensor_table.hpp"

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
    // An F32 matrix of exactly (rows, cols) as it lies in its shard's mapping, `file` set to that mapping: for
    // the loader to read in place. nullptr for another dtype, or for F32 bytes that do not start on a float
    // (a file mixing dtypes may leave them 2 bytes off; matrix() copies those). Throws FormatError when
    // missing or of another shape.
    const float* f32_in_place(const std::string& name, std::int64_t rows, std::int64_t cols,
                              std::shared_ptr<const MappedFile>& file) const {
        const SafetensorsFile& shard = file_for(name, {rows, cols});
        const std::optional<std::uint64_t> at = shard.f32_offset(name, rows, cols);
        if (!at || *at % alignof(float) != 0) return nullptr;  // the mapping starts on a page: offset alignment is address alignment
        file = shard.mapping();
        return reinterpret_cast<const float*>(file->bytes().data() + *at);
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

// Every tensor of the table from the checkpoint, in forward order. F32 matrices in kvlab's layout (every
// Llama matrix: HF's rotate-half pairing is the forward pass's RopePairing::halves, not a reordering of
// rows) need no transformation, only a place: here views into their shard's mapping, which the weights
// keep (Weights::mapped), for the caller to read in place or move into huge pages (copy_mapped_matrices),
// as llama2.c checkpoints are. The rest is converted as it is read: BF16/F16 widened, GPT-2's Conv1D
// weights stored (in, out) transposed to kvlab's (out, in), its c_attn (q, k and v weights and biases
// fused) read once per layer and sliced. `root` prefixes the names ("transformer." in GPT2LMHeadModel files).
Weights read_weights(const TensorSource& src, const ModelConfig& cfg, std::int64_t n_read, const std::string& root) {
    const std::vector<TensorSpec> specs = tensor_specs(cfg);
    Weights w;
    w.layers.resize(static_cast<std::size_t>(n_read));
    auto name_of = [&](const TensorSpec& s, std::size_t layer) {  // lm_head sits beside the transformer module, never under its root
        return (s.name == "lm_head" ? "" : root) + fmt::format(fmt::runtime(s.hf_name), layer);
    };
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
            std::shared_ptr<const MappedFile> file;
            if (s.hf_slice >= 0) {
                m = fused_w.middleRows(s.hf_slice * s.rows, s.rows);  // slice of the fused rows
            } else if (s.hf_transposed) {
                m = src.matrix(name, s.cols, s.rows).transpose();
            } else if (const float* at = src.f32_in_place(name, s.rows, s.cols, file)) {  // F32 in kvlab's layout
                m = WeightMatrix::view(at, s.rows, s.cols);
                if (std::find(w.mapped.begin(), w.mapped.end(), file) == w.mapped.end()) w.mapped.push_back(std::move(file));
            } else {
                m = src.matrix(name, s.rows, s.cols);  // BF16 or F16 widened (or F32 off a float's alignment, copied)
            }
        } else {
            VectorF& v = vector_of(w, s, layer);
            v = s.hf_slice >= 0 ? VectorF(fused_b.segment(s.hf_slice * s.rows, s.rows)) : src.vector(name, s.rows);
        }
    });
    return w;
}

Weights load_llama_weights(const TensorSource& src, const ModelConfig& cfg, std::int64_t n_read) {
    if (cfg.attention_bias || src.contains("model.layers.0.self_attn.q_proj.bias"))
        throw FormatError(fmt::format("{}: the model has attention biases (model_type {}); kvlab's llama forward pass has none",
                                      src.where(), quote(cfg.model_type, 40)));
    Weights w = read_weights(src, cfg, n_read, "");
    // HF Llama rotates (x[i], x[i+D/2]); wq/wk rows are stored for that. HF deepseek_v2 stores its RoPE rows
    // for neighbouring pairs: its rotary code first regroups each head's (x[2i], x[2i+1]) into halves.
    w.rope_pairing = cfg.mla ? RopePairing::neighbours : RopePairing::halves;
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

LoadedModel load_hf_checkpoint(const std::filesystem::path& dir, std::optional<std::int64_t> n_layers, WeightPlacement placement) {
    LoadedModel model{load_model_config(dir), {}};
    const ModelConfig& cfg = model.config;
    if (cfg.mla && cfg.mla->q_lora_rank > 0)
        throw FormatError(fmt::format("{}: MLA with a compressed query (q_lora_rank {}) is not supported; kvlab reads MLA files "
                                      "without q_lora_rank (DeepSeek-V2-Lite's form)", dir.string(), cfg.mla->q_lora_rank));
    if (cfg.n_expert != 1)
        throw FormatError(fmt::format("{}: mixture-of-experts weights ({} experts) are not supported", dir.string(), cfg.n_expert));
    const TensorSource src(dir);
    const std::int64_t n_read = layers_to_read(cfg, n_layers, dir);
    model.weights = cfg.family == Family::gpt2 ? load_gpt2_weights(src, cfg, n_read) : load_llama_weights(src, cfg, n_read);
    if (placement == WeightPlacement::huge_pages) copy_mapped_matrices(cfg, model.weights);
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
