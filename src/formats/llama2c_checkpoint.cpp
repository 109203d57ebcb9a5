#include "formats/llama2c_checkpoint.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/atomic_write.hpp"
#include "core/checked.hpp"
#include "core/error.hpp"
#include "core/mapped_file.hpp"

static_assert(std::endian::native == std::endian::little, "llama2.c files are little-endian; so must the host be");

namespace kvlab {
namespace {

// The seven int32 hyperparameters, in file order. v0 signals an untied classifier by a negative vocab_size.
struct Llama2cHeader {
    std::int32_t dim = 0;
    std::int32_t hidden_dim = 0;
    std::int32_t n_layers = 0;
    std::int32_t n_heads = 0;
    std::int32_t n_kv_heads = 0;
    std::int32_t vocab_size = 0;
    std::int32_t seq_len = 0;
};

const char* version_name(Llama2cVersion version) { return version == Llama2cVersion::v0 ? "v0" : "v1"; }

std::string describe(const Llama2cHeader& h, bool tied) {
    return fmt::format("dim {}, hidden_dim {}, n_layers {}, n_heads {}, n_kv_heads {}, vocab_size {} ({} classifier), seq_len {}",
                       h.dim, h.hidden_dim, h.n_layers, h.n_heads, h.n_kv_heads, h.vocab_size, tied ? "tied" : "untied",
                       h.seq_len);
}

Llama2cHeader read_header_ints(std::span<const std::byte> bytes, std::uint64_t offset) {
    std::array<std::int32_t, 7> v{};
    std::memcpy(v.data(), bytes.data() + offset, sizeof(v));
    return {v[0], v[1], v[2], v[3], v[4], v[5], v[6]};
}

// Validates the dimensions and turns them into a ModelConfig. `vocab` is already positive.
ModelConfig config_from_header(const Llama2cHeader& h, std::int32_t vocab, bool tied, const std::filesystem::path& path,
                               Llama2cVersion version) {
    const auto fail = [&](const std::string& what) {
        return FormatError(fmt::format("{}: llama2.c {} header ({}): {}", path.string(), version_name(version),
                                       describe(h, tied), what));
    };
    const std::array<std::pair<const char*, std::int32_t>, 7> positives = {{{"dim", h.dim},
                                                                            {"hidden_dim", h.hidden_dim},
                                                                            {"n_layers", h.n_layers},
                                                                            {"n_heads", h.n_heads},
                                                                            {"n_kv_heads", h.n_kv_heads},
                                                                            {"vocab_size", vocab},
                                                                            {"seq_len", h.seq_len}}};
    for (const auto& [name, value] : positives)
        if (value <= 0) throw fail(fmt::format("{} is {}; expected a positive number", name, value));
    if (h.dim % h.n_heads != 0) throw fail(fmt::format("n_heads ({}) does not divide dim ({})", h.n_heads, h.dim));
    if (h.n_kv_heads > h.n_heads || h.n_heads % h.n_kv_heads != 0)
        throw fail(fmt::format("n_kv_heads ({}) does not divide n_heads ({})", h.n_kv_heads, h.n_heads));
    const std::int32_t d_head = h.dim / h.n_heads;
    if (d_head % 2 != 0) throw fail(fmt::format("head size dim/n_heads = {} is odd; RoPE rotates pairs", d_head));

    ModelConfig cfg;
    cfg.name = path.stem().string();
    cfg.display_name = cfg.name;
    cfg.source = fmt::format("llama2.c {} checkpoint {}", version_name(version), path.string());
    cfg.origin_path = path.string();
    cfg.model_type = "llama";
    cfg.preset_family = "llama2.c";
    cfg.family = Family::llama;
    cfg.n_layer = h.n_layers;
    cfg.d_model = h.dim;
    cfg.n_head = h.n_heads;
    cfg.n_head_kv = h.n_kv_heads;
    cfg.d_head = d_head;
    cfg.d_ff = h.hidden_dim;
    cfg.n_vocab = vocab;
    cfg.n_ctx_max = h.seq_len;
    cfg.rope_theta = 10000.0;  // run.c hard-codes both
    cfg.norm_eps = 1e-5;
    cfg.tied_embeddings = tied;
    cfg.layer_windowed.assign(static_cast<std::size_t>(h.n_layers), false);
    cfg.head_dim_rule = "dim / n_heads (llama2.c header)";
    cfg.kv_heads_rule = "n_kv_heads (llama2.c header)";
    return cfg;
}

// Sequential fp32 reads from a mapping whose size was checked against the header first;
// each read checks its range again, so no header path can read past the end.
class FloatReader {
public:
    FloatReader(const MappedFile& file, std::uint64_t offset) : file_(file), offset_(offset) {}

    void read(float* out, std::uint64_t n_values) {
        const std::uint64_t n_bytes = checked_mul(n_values, 4, "tensor bytes");
        if (n_bytes > file_.size_bytes() - std::min(offset_, file_.size_bytes()))
            throw FormatError(fmt::format("{}: truncated: {} bytes needed at offset {}, file has {} bytes",
                                          file_.path().string(), n_bytes, offset_, file_.size_bytes()));
        // the file's pages are given back as they are copied: peak memory is the weights, not weights + file
        auto* dst = reinterpret_cast<std::byte*>(out);
        file_.consume(offset_, n_bytes, [&](std::uint64_t done, std::span<const std::byte> chunk) {
            std::memcpy(dst + done, chunk.data(), chunk.size());
        });
        offset_ += n_bytes;
    }
    MatrixRM matrix(std::int64_t rows, std::int64_t cols) {
        MatrixRM m(rows, cols);
        read(m.data(), static_cast<std::uint64_t>(m.size()));
        return m;
    }
    VectorF vector(std::int64_t n) {
        VectorF v(n);
        read(v.data(), static_cast<std::uint64_t>(n));
        return v;
    }
    void skip(std::uint64_t n_values) { offset_ += n_values * 4; }
    std::uint64_t offset() const { return offset_; }

private:
    const MappedFile& file_;
    std::uint64_t offset_;
};

// One tensor kind, stored for all n_layer layers in turn: the first w.layers.size() layers are read,
// the tensors of the layers after them skipped.
class LayerReader {
public:
    LayerReader(FloatReader& in, const ModelConfig& cfg, Weights& w)
        : in_(in), layers_(w.layers), n_skipped_(static_cast<std::uint64_t>(cfg.n_layer) - w.layers.size()) {}

    void matrices(MatrixRM LayerWeights::*member, std::int64_t rows, std::int64_t cols) {
        for (auto& l : layers_) l.*member = in_.matrix(rows, cols);
        in_.skip(n_skipped_ * static_cast<std::uint64_t>(rows * cols));
    }
    void vectors(VectorF LayerWeights::*member, std::int64_t n) {
        for (auto& l : layers_) l.*member = in_.vector(n);
        in_.skip(n_skipped_ * static_cast<std::uint64_t>(n));
    }

private:
    FloatReader& in_;
    std::vector<LayerWeights>& layers_;
    std::uint64_t n_skipped_;
};

// v0 order: embeddings, attention norms, wq, wk, wv, wo, ffn norms, w1, w2, w3, final norm, legacy
// RoPE tables, classifier (untied only).
void read_weights_v0(FloatReader& in, const ModelConfig& cfg, Weights& w) {
    const std::int64_t d = cfg.d_model, d_q = cfg.d_q(), d_kv = cfg.d_kv(), f = cfg.d_ff;
    LayerReader layers(in, cfg, w);
    w.tok_embed = in.matrix(cfg.n_vocab, d);
    layers.vectors(&LayerWeights::attn_norm, d);
    layers.matrices(&LayerWeights::wq, d_q, d);
    layers.matrices(&LayerWeights::wk, d_kv, d);
    layers.matrices(&LayerWeights::wv, d_kv, d);
    layers.matrices(&LayerWeights::wo, d, d_q);
    layers.vectors(&LayerWeights::mlp_norm, d);
    layers.matrices(&LayerWeights::w1, f, d);
    layers.matrices(&LayerWeights::w2, d, f);
    layers.matrices(&LayerWeights::w3, f, d);
    w.final_norm = in.vector(d);
    // Legacy freq_cis_real and freq_cis_imag tables: (seq_len, D/2) each; kvlab computes RoPE itself.
    in.skip(2 * static_cast<std::uint64_t>(cfg.n_ctx_max) * static_cast<std::uint64_t>(cfg.d_head / 2));
    if (!cfg.tied_embeddings) w.lm_head = in.matrix(cfg.n_vocab, d);
}

// v1 order: attention norms, ffn norms, final norm, embeddings, wq, wk, wv, wo, w1, w2, w3, classifier.
void read_weights_v1(FloatReader& in, const ModelConfig& cfg, Weights& w) {
    const std::int64_t d = cfg.d_model, d_q = cfg.d_q(), d_kv = cfg.d_kv(), f = cfg.d_ff;
    LayerReader layers(in, cfg, w);
    layers.vectors(&LayerWeights::attn_norm, d);
    layers.vectors(&LayerWeights::mlp_norm, d);
    w.final_norm = in.vector(d);
    w.tok_embed = in.matrix(cfg.n_vocab, d);
    layers.matrices(&LayerWeights::wq, d_q, d);
    layers.matrices(&LayerWeights::wk, d_kv, d);
    layers.matrices(&LayerWeights::wv, d_kv, d);
    layers.matrices(&LayerWeights::wo, d, d_q);
    layers.matrices(&LayerWeights::w1, f, d);
    layers.matrices(&LayerWeights::w2, d, f);
    layers.matrices(&LayerWeights::w3, f, d);
    if (!cfg.tied_embeddings) w.lm_head = in.matrix(cfg.n_vocab, d);
}

// ---- writing ----

ConfigError unwritable(const std::filesystem::path& path, const std::string& why) {
    return ConfigError(fmt::format("{}: cannot save as llama2.c v0: {}", path.string(), why));
}

std::int32_t header_int(const std::filesystem::path& path, const char* name, std::int64_t value) {
    if (value <= 0 || value > std::numeric_limits<std::int32_t>::max())
        throw unwritable(path, fmt::format("{} = {} does not fit a positive int32", name, value));
    return static_cast<std::int32_t>(value);
}

void check_shape(const std::filesystem::path& path, const std::string& name, std::int64_t rows, std::int64_t cols,
                 std::int64_t want_rows, std::int64_t want_cols) {
    if (rows != want_rows || cols != want_cols)
        throw unwritable(path, fmt::format("{} is ({}, {}); the config needs ({}, {})", name, rows, cols, want_rows, want_cols));
}

void check_weights(const std::filesystem::path& path, const ModelConfig& cfg, const Weights& w) {
    const std::int64_t d = cfg.d_model, d_kv = cfg.d_kv(), f = cfg.d_ff, v = cfg.n_vocab;
    if (static_cast<std::int64_t>(w.layers.size()) != cfg.n_layer)
        throw unwritable(path, fmt::format("weights have {} layers; the config says {}", w.layers.size(), cfg.n_layer));
    check_shape(path, "tok_embed", w.tok_embed.rows(), w.tok_embed.cols(), v, d);
    check_shape(path, "final_norm", w.final_norm.size(), 1, d, 1);
    if (w.lm_head.size() != 0) check_shape(path, "lm_head", w.lm_head.rows(), w.lm_head.cols(), v, d);
    if (w.pos_embed.size() != 0 || w.final_norm_bias.size() != 0)
        throw unwritable(path, "learned position embeddings / norm biases have no place in the format");
    for (std::size_t i = 0; i < w.layers.size(); ++i) {
        const LayerWeights& l = w.layers[i];
        const std::string p = fmt::format("layer {} ", i);
        check_shape(path, p + "attn_norm", l.attn_norm.size(), 1, d, 1);
        check_shape(path, p + "mlp_norm", l.mlp_norm.size(), 1, d, 1);
        check_shape(path, p + "wq", l.wq.rows(), l.wq.cols(), d, d);
        check_shape(path, p + "wk", l.wk.rows(), l.wk.cols(), d_kv, d);
        check_shape(path, p + "wv", l.wv.rows(), l.wv.cols(), d_kv, d);
        check_shape(path, p + "wo", l.wo.rows(), l.wo.cols(), d, d);
        check_shape(path, p + "w1", l.w1.rows(), l.w1.cols(), f, d);
        check_shape(path, p + "w2", l.w2.rows(), l.w2.cols(), d, f);
        check_shape(path, p + "w3", l.w3.rows(), l.w3.cols(), f, d);
        const bool has_bias = l.bq.size() || l.bk.size() || l.bv.size() || l.bo.size() || l.b1.size() || l.b2.size() ||
                              l.attn_norm_bias.size() || l.mlp_norm_bias.size();
        if (has_bias) throw unwritable(path, p + "has biases; llama2.c has none");
    }
}

// HF "rotate half" rows -> llama2.c neighbour rows, per head of d_head rows:
// neighbour row 2i+j comes from halves row j*D/2 + i (j = 0, 1). Applied to both wq and wk it keeps
// every q.k product, hence the model's outputs.
MatrixRM halves_to_neighbours(const MatrixRM& w, std::int64_t d_head) {
    MatrixRM out(w.rows(), w.cols());
    const std::int64_t half = d_head / 2;
    for (std::int64_t head = 0; head < w.rows() / d_head; ++head)
        for (std::int64_t i = 0; i < half; ++i)
            for (std::int64_t j = 0; j < 2; ++j) out.row(head * d_head + 2 * i + j) = w.row(head * d_head + j * half + i);
    return out;
}

// Raw little-endian float32 tensors, as llama2.c reads them.
void write_floats(std::ostream& out, const float* data, std::uint64_t n) {
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * 4));
}
void write_tensor(std::ostream& out, const MatrixRM& m) { write_floats(out, m.data(), static_cast<std::uint64_t>(m.size())); }
void write_tensor(std::ostream& out, const VectorF& v) { write_floats(out, v.data(), static_cast<std::uint64_t>(v.size())); }

}  // namespace

std::uint64_t llama2c_file_bytes(const ModelConfig& cfg, Llama2cVersion version) {
    const auto u = [](std::int64_t x) { return static_cast<std::uint64_t>(x); };
    const std::uint64_t d = u(cfg.d_model), d_q = checked_mul(u(cfg.n_head), u(cfg.d_head), "llama2.c query width");
    const std::uint64_t d_kv = checked_mul(u(cfg.n_head_kv), u(cfg.d_head), "llama2.c kv width");
    // Per layer: two norms (d) + wq (d_q,d) + wk, wv (d_kv,d) + wo (d,d_q) + w1, w3 (f,d) + w2 (d,f).
    std::uint64_t per_layer = checked_mul(2, d, "llama2.c layer size");
    per_layer = checked_add(per_layer, checked_mul(checked_mul(2, d_q, "llama2.c layer size"), d, "llama2.c layer size"), "llama2.c layer size");
    per_layer = checked_add(per_layer, checked_mul(checked_mul(2, d_kv, "llama2.c layer size"), d, "llama2.c layer size"), "llama2.c layer size");
    per_layer = checked_add(per_layer, checked_mul(checked_mul(3, u(cfg.d_ff), "llama2.c layer size"), d, "llama2.c layer size"), "llama2.c layer size");
    const std::uint64_t embed = checked_mul(u(cfg.n_vocab), d, "llama2.c embedding size");
    std::uint64_t n_floats = checked_add(embed, checked_mul(u(cfg.n_layer), per_layer, "llama2.c weights size"), "llama2.c weights size");
    n_floats = checked_add(n_floats, d, "llama2.c weights size");  // final norm
    if (version == Llama2cVersion::v0)  // freq_cis_real + freq_cis_imag, (seq_len, D/2) each
        n_floats = checked_add(n_floats, checked_mul(u(cfg.n_ctx_max), u(cfg.d_head / 2) * 2, "llama2.c rope tables"), "llama2.c weights size");
    if (!cfg.tied_embeddings) n_floats = checked_add(n_floats, embed, "llama2.c weights size");
    const std::uint64_t header = version == Llama2cVersion::v0 ? llama2c_v0_header_bytes : llama2c_v1_header_bytes;
    return checked_add(header, checked_mul(n_floats, 4, "llama2.c file size"), "llama2.c file size");
}

namespace {

// The header of a mapped file, validated against the file size; nothing past the header is read.
struct Llama2cLayout {
    ModelConfig config;
    Llama2cVersion version = Llama2cVersion::v0;
};

Llama2cLayout read_layout(const MappedFile& file) {
    const std::filesystem::path& path = file.path();
    const std::span<const std::byte> bytes = file.bytes();
    const std::uint64_t size = file.size_bytes();
    if (size < llama2c_v0_header_bytes)
        throw FormatError(fmt::format("{}: file is {} bytes; a llama2.c checkpoint starts with a {}-byte header",
                                      path.string(), size, llama2c_v0_header_bytes));

    std::uint32_t magic = 0;
    std::memcpy(&magic, bytes.data(), 4);
    const Llama2cVersion version = magic == llama2c_v1_magic ? Llama2cVersion::v1 : Llama2cVersion::v0;
    Llama2cHeader header;
    std::int32_t vocab = 0;
    bool tied = true;
    if (version == Llama2cVersion::v1) {
        if (size < llama2c_v1_header_bytes)
            throw FormatError(fmt::format("{}: file is {} bytes; a llama2.c v1 (\"ak42\") checkpoint starts with a {}-byte header",
                                          path.string(), size, llama2c_v1_header_bytes));
        std::int32_t file_version = 0;
        std::memcpy(&file_version, bytes.data() + 4, 4);
        if (file_version != 1)
            throw FormatError(fmt::format("{}: llama2.c \"ak42\" checkpoint version {}; kvlab reads version 1 (fp32) only",
                                          path.string(), file_version));
        header = read_header_ints(bytes, 8);
        const auto shared = std::to_integer<std::uint8_t>(bytes[8 + 7 * 4]);
        if (shared > 1)
            throw FormatError(fmt::format("{}: llama2.c v1 shared_classifier byte is {}; expected 0 or 1", path.string(), shared));
        tied = shared == 1;
        vocab = header.vocab_size;
    } else {
        header = read_header_ints(bytes, 0);
        tied = header.vocab_size > 0;
        // abs(INT32_MIN) does not exist; leave it negative so validation rejects it.
        vocab = header.vocab_size == std::numeric_limits<std::int32_t>::min() ? header.vocab_size : std::abs(header.vocab_size);
    }
    Llama2cLayout layout{config_from_header(header, vocab, tied, path, version), version};
    const ModelConfig& cfg = layout.config;

    std::uint64_t expected = 0;
    try {
        expected = llama2c_file_bytes(cfg, version);
    } catch (const OverflowError&) {
        throw FormatError(fmt::format("{}: llama2.c {} header ({}) implies a file larger than 2^64 bytes", path.string(),
                                      version_name(version), describe(header, tied)));
    }
    if (expected != size) {
        std::string hint;
        ModelConfig other = cfg;
        other.tied_embeddings = !tied;
        bool other_fits = false;
        try {
            other_fits = llama2c_file_bytes(other, version) == size;
        } catch (const OverflowError&) {
            other_fits = false;
        }
        if (other_fits)
            hint = fmt::format("; that size fits a {} classifier", tied ? "separate (untied)" : "tied");
        throw FormatError(fmt::format("{}: llama2.c {} header ({}) implies {} bytes, but the file has {} bytes{}", path.string(),
                                      version_name(version), describe(header, tied), expected, size, hint));
    }
    return layout;
}

}  // namespace

ModelConfig load_llama2c_config(const std::filesystem::path& path) { return read_layout(MappedFile(path, "llama2.c checkpoint")).config; }

LoadedModel load_llama2c_checkpoint(const std::filesystem::path& path, std::optional<std::int64_t> n_layers) {
    const MappedFile file(path, "llama2.c checkpoint");
    Llama2cLayout layout = read_layout(file);
    LoadedModel model{std::move(layout.config), {}};
    const ModelConfig& cfg = model.config;
    model.weights.rope_pairing = RopePairing::neighbours;
    model.weights.layers.resize(static_cast<std::size_t>(layers_to_read(cfg, n_layers, path)));
    if (layout.version == Llama2cVersion::v0) {
        FloatReader in(file, llama2c_v0_header_bytes);
        read_weights_v0(in, cfg, model.weights);
    } else {
        FloatReader in(file, llama2c_v1_header_bytes);
        read_weights_v1(in, cfg, model.weights);
    }
    return model;
}

void check_llama2c_v0_config(const std::filesystem::path& path, const ModelConfig& cfg) {
    if (cfg.family != Family::llama) throw unwritable(path, "only the llama family fits the format (this is gpt2)");
    if (cfg.mla || cfg.n_expert != 1) throw unwritable(path, "MLA and mixture-of-experts models do not fit the format");
    const bool windowed = std::find(cfg.layer_windowed.begin(), cfg.layer_windowed.end(), true) != cfg.layer_windowed.end();
    if (windowed) throw unwritable(path, "sliding-window attention does not fit the format");
    if (cfg.attention_bias) throw unwritable(path, "the model has attention biases; llama2.c has none");
    if (cfg.rope_theta != 10000.0)
        throw unwritable(path, fmt::format("rope_theta is {}; the format has no field for it and readers assume 10000", cfg.rope_theta));
    if (cfg.norm_eps != 1e-5)
        throw unwritable(path, fmt::format("norm_eps is {}; the format has no field for it and readers assume 1e-5", cfg.norm_eps));
    if (cfg.n_head <= 0 || cfg.d_q() != cfg.d_model)
        throw unwritable(path, fmt::format("n_head ({}) x d_head ({}) != d_model ({}); the format derives the head size from dim",
                                           cfg.n_head, cfg.d_head, cfg.d_model));
    if (cfg.d_head % 2 != 0) throw unwritable(path, fmt::format("d_head ({}) is odd", cfg.d_head));
    for (const auto& [name, value] : {std::pair<const char*, std::int64_t>{"d_model", cfg.d_model}, {"d_ff", cfg.d_ff},
                                      {"n_layer", cfg.n_layer}, {"n_head", cfg.n_head}, {"n_head_kv", cfg.n_head_kv},
                                      {"n_vocab", cfg.n_vocab}, {"n_ctx_max", cfg.n_ctx_max}})
        header_int(path, name, value);
}

void save_llama2c_v0(const std::filesystem::path& path, const ModelConfig& cfg, const Weights& weights) {
    check_llama2c_v0_config(path, cfg);
    check_weights(path, cfg, weights);

    const bool tied = weights.lm_head.size() == 0;
    const std::int32_t vocab = header_int(path, "n_vocab", cfg.n_vocab);
    const std::array<std::int32_t, 7> header = {header_int(path, "d_model", cfg.d_model),
                                                header_int(path, "d_ff", cfg.d_ff),
                                                header_int(path, "n_layer", cfg.n_layer),
                                                header_int(path, "n_head", cfg.n_head),
                                                header_int(path, "n_head_kv", cfg.n_head_kv),
                                                tied ? vocab : -vocab,
                                                header_int(path, "n_ctx_max", cfg.n_ctx_max)};

    // Legacy tables, (seq_len, D/2) each: cos and sin of pos * theta^(-2i/D), as llama2.c's export wrote.
    const std::int64_t half = cfg.d_head / 2;
    std::vector<float> freq_cos(static_cast<std::size_t>(cfg.n_ctx_max * half));
    std::vector<float> freq_sin(freq_cos.size());
    for (std::int64_t pos = 0; pos < cfg.n_ctx_max; ++pos)
        for (std::int64_t i = 0; i < half; ++i) {
            const double angle = static_cast<double>(pos) * std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(cfg.d_head));
            freq_cos[static_cast<std::size_t>(pos * half + i)] = static_cast<float>(std::cos(angle));
            freq_sin[static_cast<std::size_t>(pos * half + i)] = static_cast<float>(std::sin(angle));
        }

    const bool permute = weights.rope_pairing == RopePairing::halves;
    write_atomically(path, "--save-checkpoint", [&](std::ostream& out) {
        out.write(reinterpret_cast<const char*>(header.data()), sizeof(header));
        write_tensor(out, weights.tok_embed);
        for (const auto& l : weights.layers) write_tensor(out, l.attn_norm);
        for (const auto& l : weights.layers) write_tensor(out, permute ? halves_to_neighbours(l.wq, cfg.d_head) : l.wq);
        for (const auto& l : weights.layers) write_tensor(out, permute ? halves_to_neighbours(l.wk, cfg.d_head) : l.wk);
        for (const auto& l : weights.layers) write_tensor(out, l.wv);
        for (const auto& l : weights.layers) write_tensor(out, l.wo);
        for (const auto& l : weights.layers) write_tensor(out, l.mlp_norm);
        for (const auto& l : weights.layers) write_tensor(out, l.w1);
        for (const auto& l : weights.layers) write_tensor(out, l.w2);
        for (const auto& l : weights.layers) write_tensor(out, l.w3);
        write_tensor(out, weights.final_norm);
        write_floats(out, freq_cos.data(), freq_cos.size());
        write_floats(out, freq_sin.data(), freq_sin.size());
        if (!tied) write_tensor(out, weights.lm_head);
    });
}

}  // namespace kvlab
