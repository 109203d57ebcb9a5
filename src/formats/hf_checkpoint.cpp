#include "formats/hf_checkpoint.hpp"

#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/text.hpp"
#include "core/json_input.hpp"
#include "core/mapped_file.hpp"
#include "formats/safetensors.hpp"

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
            for (const auto& [name, t] : files_.back()->tensors()) owner_[name] = 0;
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
    VectorF vector(const std::string& name, std::int64_t n) const { return file_for(name, {n}).read_vector(name, n); }

    const std::string& where() const { return where_; }

private:
    void add_file(const std::filesystem::path& path) { files_.push_back(std::make_unique<SafetensorsFile>(path)); }

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
            if (files_[it->second]->find(name) == nullptr)
                throw FormatError(fmt::format("{}: the index puts tensor {} in {}, which has no such tensor", index.string(), quote(name),
                                              files_[it->second]->path().string()));
            owner_[name] = it->second;
        }
    }

    const SafetensorsFile& file_for(const std::string& name, const std::vector<std::int64_t>& shape) const {
        const auto it = owner_.find(name);
        if (it == owner_.end())
            throw FormatError(fmt::format("{}: tensor '{}' is missing (expected shape [{}])", where_, name, fmt::join(shape, ", ")));
        return *files_[it->second];
    }

    std::vector<std::unique_ptr<SafetensorsFile>> files_;
    std::map<std::string, std::size_t> owner_;  // tensor name -> index into files_
    std::string where_;
};

Weights load_llama_weights(const TensorSource& src, const ModelConfig& cfg, std::int64_t n_read) {
    const std::int64_t d = cfg.d_model, d_q = cfg.d_q(), d_kv = cfg.d_kv(), f = cfg.d_ff, v = cfg.n_vocab;
    if (cfg.attention_bias || src.contains("model.layers.0.self_attn.q_proj.bias"))
        throw FormatError(fmt::format("{}: the model has attention biases (model_type {}); kvlab's llama forward pass has none",
                                      src.where(), quote(cfg.model_type, 40)));
    Weights w;
    w.rope_pairing = RopePairing::halves;  // HF Llama rotates (x[i], x[i+D/2]); wq/wk rows are stored for that
    w.tok_embed = src.matrix("model.embed_tokens.weight", v, d);
    w.layers.resize(static_cast<std::size_t>(n_read));
    for (std::int64_t i = 0; i < n_read; ++i) {
        LayerWeights& l = w.layers[static_cast<std::size_t>(i)];
        const std::string p = fmt::format("model.layers.{}.", i);
        l.attn_norm = src.vector(p + "input_layernorm.weight", d);
        l.wq = src.matrix(p + "self_attn.q_proj.weight", d_q, d);
        l.wk = src.matrix(p + "self_attn.k_proj.weight", d_kv, d);
        l.wv = src.matrix(p + "self_attn.v_proj.weight", d_kv, d);
        l.wo = src.matrix(p + "self_attn.o_proj.weight", d, d_q);
        l.mlp_norm = src.vector(p + "post_attention_layernorm.weight", d);
        l.w1 = src.matrix(p + "mlp.gate_proj.weight", f, d);
        l.w3 = src.matrix(p + "mlp.up_proj.weight", f, d);
        l.w2 = src.matrix(p + "mlp.down_proj.weight", d, f);
    }
    w.final_norm = src.vector("model.norm.weight", d);
    if (!cfg.tied_embeddings) {
        if (!src.contains("lm_head.weight"))
            throw FormatError(fmt::format("{}: tensor 'lm_head.weight' is missing (expected shape [{}, {}]) and config.json does "
                                          "not set tie_word_embeddings: true",
                                          src.where(), v, d));
        w.lm_head = src.matrix("lm_head.weight", v, d);
    }
    return w;
}

// GPT-2's Conv1D stores (in, out) for y = x W + b; kvlab keeps (out, in).
MatrixRM conv1d(const TensorSource& src, const std::string& name, std::int64_t d_in, std::int64_t d_out) {
    return src.matrix(name, d_in, d_out).transpose();
}

Weights load_gpt2_weights(const TensorSource& src, const ModelConfig& cfg, std::int64_t n_read) {
    const std::int64_t d = cfg.d_model, f = cfg.d_ff, v = cfg.n_vocab;
    if (cfg.d_q() != d || cfg.n_head_kv != cfg.n_head)
        throw FormatError(fmt::format("{}: gpt2 needs n_head x d_head == d_model and no grouped KV heads ({} x {} vs {}, {} KV heads)",
                                      src.where(), cfg.n_head, cfg.d_head, d, cfg.n_head_kv));
    // GPT2Model checkpoints name tensors "wte.weight"; GPT2LMHeadModel ones "transformer.wte.weight".
    const std::string root = src.contains("wte.weight") || !src.contains("transformer.wte.weight") ? "" : "transformer.";
    Weights w;
    w.tok_embed = src.matrix(root + "wte.weight", v, d);
    w.pos_embed = src.matrix(root + "wpe.weight", cfg.n_ctx_max, d);
    w.layers.resize(static_cast<std::size_t>(n_read));
    for (std::int64_t i = 0; i < n_read; ++i) {
        LayerWeights& l = w.layers[static_cast<std::size_t>(i)];
        const std::string p = fmt::format("{}h.{}.", root, i);
        l.attn_norm = src.vector(p + "ln_1.weight", d);
        l.attn_norm_bias = src.vector(p + "ln_1.bias", d);
        const MatrixRM qkv = conv1d(src, p + "attn.c_attn.weight", d, 3 * d);  // (3d, d): q rows, then k, then v
        const VectorF qkv_bias = src.vector(p + "attn.c_attn.bias", 3 * d);
        l.wq = qkv.topRows(d);
        l.wk = qkv.middleRows(d, d);
        l.wv = qkv.bottomRows(d);
        l.bq = qkv_bias.head(d);
        l.bk = qkv_bias.segment(d, d);
        l.bv = qkv_bias.tail(d);
        l.wo = conv1d(src, p + "attn.c_proj.weight", d, d);
        l.bo = src.vector(p + "attn.c_proj.bias", d);
        l.mlp_norm = src.vector(p + "ln_2.weight", d);
        l.mlp_norm_bias = src.vector(p + "ln_2.bias", d);
        l.w1 = conv1d(src, p + "mlp.c_fc.weight", d, f);
        l.b1 = src.vector(p + "mlp.c_fc.bias", f);
        l.w2 = conv1d(src, p + "mlp.c_proj.weight", f, d);
        l.b2 = src.vector(p + "mlp.c_proj.bias", d);
    }
    w.final_norm = src.vector(root + "ln_f.weight", d);
    w.final_norm_bias = src.vector(root + "ln_f.bias", d);
    if (!cfg.tied_embeddings && src.contains("lm_head.weight")) w.lm_head = src.matrix("lm_head.weight", v, d);
    return w;
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

}  // namespace kvlab
