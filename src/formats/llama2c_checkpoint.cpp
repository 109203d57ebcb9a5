// The llama2.c checkpoint format, both ways: header detection (v0 and v1), size checks before any
// allocation, reading into the tensor table's order, the v0 writer. ~390 lines, over the house's ~350
// on purpose: reader and writer share the header struct, the file-order lists and the RoPE-table rule,
// and one file per format is easier to check against run.c/export.py than two.
#include "formats/llama2c_checkpoint.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/atomic_write.hpp"
#include "kvlab/core/checked.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/core/mapped_file.hpp"
#include "kvlab/formats/checkpoint.hpp"
#include "kvlab/weights/tensor_table.hpp"

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
    // before any per-layer table is sized from it (a config.json meets the same bound)
    if (h.n_layers > max_layers) throw fail(fmt::format("n_layers is {}; kvlab reads at most {} layers", h.n_layers, max_layers));
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
    // The next n_values floats where they lie in the mapping, to be used in place (the file outlives the
    // weights: Weights::mapped holds it). The format's offsets are multiples of 4 bytes.
    const float* view(std::uint64_t n_values) {
        const std::uint64_t n_bytes = checked_mul(n_values, 4, "tensor bytes");
        if (n_bytes > file_.size_bytes() - std::min(offset_, file_.size_bytes()))
            throw FormatError(fmt::format("{}: truncated: {} bytes needed at offset {}, file has {} bytes",
                                          file_.path().string(), n_bytes, offset_, file_.size_bytes()));
        const float* at = reinterpret_cast<const float*>(file_.bytes().data() + offset_);
        offset_ += n_bytes;
        return at;
    }
    void skip(std::uint64_t n_values) { offset_ += n_values * 4; }
    std::uint64_t offset() const { return offset_; }

private:
    const MappedFile& file_;
    std::uint64_t offset_;
};

// The formats' tensor orders (llama2.c's export.py: legacy_export writes v0, version1_export v1), as
// names of the tensor table; each per-layer tensor is stored for all layers in turn. "rope_tables" is
// v0's legacy freq_cis_real and freq_cis_imag, (seq_len, D/2) each, which kvlab computes itself; lm_head
// is stored only when the classifier is untied.
constexpr std::string_view rope_tables = "rope_tables";
constexpr std::array<std::string_view, 13> v0_order = {"tok_embed", "attn_norm", "wq", "wk", "wv", "wo", "mlp_norm",
                                                       "w1", "w2", "w3", "final_norm", rope_tables, "lm_head"};
constexpr std::array<std::string_view, 12> v1_order = {"attn_norm", "mlp_norm", "final_norm", "tok_embed", "wq", "wk",
                                                       "wv", "wo", "w1", "w2", "w3", "lm_head"};

std::span<const std::string_view> file_order(Llama2cVersion version) {
    if (version == Llama2cVersion::v0) return v0_order;
    return v1_order;
}

std::uint64_t rope_table_floats(const ModelConfig& cfg) {
    return checked_mul(static_cast<std::uint64_t>(cfg.n_ctx_max), static_cast<std::uint64_t>(cfg.d_head / 2) * 2,
                       "llama2.c rope tables");
}

// fn(spec or null for the rope tables) for every tensor of the file, in its order; lm_head is absent
// from the table when the classifier is tied.
template <typename Fn>
void for_each_stored(const std::vector<TensorSpec>& specs, Llama2cVersion version, Fn fn) {
    for (const std::string_view name : file_order(version)) {
        if (name == rope_tables) {
            if (version == Llama2cVersion::v0) fn(nullptr);
            continue;
        }
        for (const TensorSpec& s : specs)
            if (s.name == name) fn(&s);
    }
}

// The first w.layers.size() layers are read, the tensors of the layers after them skipped.
// The matrices are the file's fp32 values in kvlab's own layout (row-major, (out, in), llama2.c's RoPE
// pairing), so they need no transformation, only a place: here views into the mapping, which the caller
// keeps (Weights::mapped) or moves into huge pages (copy_mapped_matrices). The norm vectors are copied
// as they are read.
void read_weights(FloatReader& in, const ModelConfig& cfg, Llama2cVersion version, Weights& w) {
    const std::vector<TensorSpec> specs = tensor_specs(cfg);
    const std::uint64_t n_skipped = static_cast<std::uint64_t>(cfg.n_layer) - w.layers.size();
    for_each_stored(specs, version, [&](const TensorSpec* s) {
        if (s == nullptr) return in.skip(rope_table_floats(cfg));
        for (std::size_t layer = 0; layer < (s->per_layer ? w.layers.size() : 1); ++layer) {
            if (s->is_matrix()) {
                matrix_of(w, *s, layer) = WeightMatrix::view(in.view(s->n_values()), s->rows, s->cols);
                continue;
            }
            allocate_tensor(w, *s, layer);
            in.read(tensor_data(w, *s, layer).data(), s->n_values());
        }
        if (s->per_layer) in.skip(n_skipped * s->n_values());
    });
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

// Every tensor the file stores has the config's shape, and the weights hold nothing else (biases,
// learned positions: the format has no place for them).
void check_weights(const std::filesystem::path& path, const ModelConfig& cfg, const Weights& w) {
    if (static_cast<std::int64_t>(w.layers.size()) != cfg.n_layer)
        throw unwritable(path, fmt::format("weights have {} layers; the config says {}", w.layers.size(), cfg.n_layer));
    const auto shape = [](std::int64_t rows, std::int64_t cols) {
        return cols == 0 ? fmt::format("({})", rows) : fmt::format("({}, {})", rows, cols);
    };
    std::uint64_t stored_bytes = 0;
    for_each_stored(tensor_specs(cfg), Llama2cVersion::v0, [&](const TensorSpec* s) {
        if (s == nullptr) return;
        for (std::size_t layer = 0; layer < (s->per_layer ? w.layers.size() : 1); ++layer) {
            const auto [rows, cols] = held_shape(w, *s, layer);
            if (rows != s->rows || cols != s->cols)
                throw unwritable(path, fmt::format("{}{} is {}; the config needs {}", s->per_layer ? fmt::format("layer {} ", layer) : "",
                                                   s->name, shape(rows, cols), shape(s->rows, s->cols)));
            stored_bytes += 4 * s->n_values();
        }
    });
    if (weights_bytes_held(w) != stored_bytes)
        throw unwritable(path, "the weights hold biases or learned position embeddings; llama2.c has no place for them");
}

// HF "rotate half" rows -> llama2.c neighbour rows, per head of d_head rows:
// neighbour row 2i+j comes from halves row j*D/2 + i (j = 0, 1). Applied to both wq and wk it keeps
// every q.k product, hence the model's outputs.
MatrixRM halves_to_neighbours(const WeightMatrix& w, std::int64_t d_head) {
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

}  // namespace

std::uint64_t llama2c_file_bytes(const ModelConfig& cfg, Llama2cVersion version) {
    std::uint64_t n_floats = 0;
    for_each_stored(tensor_specs(cfg), version, [&](const TensorSpec* s) {
        const std::uint64_t n = s == nullptr ? rope_table_floats(cfg)
                                             : checked_mul(s->n_values(), s->per_layer ? static_cast<std::uint64_t>(cfg.n_layer) : 1,
                                                           "llama2.c weights size");
        n_floats = checked_add(n_floats, n, "llama2.c weights size");
    });
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

LoadedModel load_llama2c_checkpoint(const std::filesystem::path& path, std::optional<std::int64_t> n_layers, WeightPlacement placement) {
    auto file = std::make_shared<const MappedFile>(path, "llama2.c checkpoint");
    Llama2cLayout layout = read_layout(*file);
    LoadedModel model{std::move(layout.config), {}};
    const ModelConfig& cfg = model.config;
    model.weights.rope_pairing = RopePairing::neighbours;
    model.weights.layers.resize(static_cast<std::size_t>(layers_to_read(cfg, n_layers, path)));
    FloatReader in(*file, layout.version == Llama2cVersion::v0 ? llama2c_v0_header_bytes : llama2c_v1_header_bytes);
    read_weights(in, cfg, layout.version, model.weights);
    model.weights.mapped.push_back(std::move(file));  // the matrices are views into it
    if (placement == WeightPlacement::huge_pages) copy_mapped_matrices(cfg, model.weights);
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

    const bool tied = cfg.tied_embeddings;
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
        for_each_stored(tensor_specs(cfg), Llama2cVersion::v0, [&](const TensorSpec* s) {
            if (s == nullptr) {
                write_floats(out, freq_cos.data(), freq_cos.size());
                write_floats(out, freq_sin.data(), freq_sin.size());
                return;
            }
            for (std::size_t layer = 0; layer < (s->per_layer ? weights.layers.size() : 1); ++layer) {
                const bool rotated = permute && (s->name == "wq" || s->name == "wk");
                if (rotated) write_tensor(out, halves_to_neighbours(weights.layers[layer].*(s->layer_matrix), cfg.d_head));
                else write_floats(out, tensor_data(weights, *s, layer).data(), s->n_values());
            }
        });
    });
}

// export.py halves 64 until it divides dim; runq.c's matmul also skips a row's last n % GS columns,
// so the group must divide d_ff too (runq reads the size from the header)
std::int32_t llama2c_v2_group_size(const ModelConfig& cfg) {
    std::int32_t group = 64;
    while (group > 1 && (cfg.d_model % group != 0 || cfg.d_ff % group != 0)) group /= 2;
    return group;
}

// llama2.c's export.py version2_export, as runq.c reads it: a 256-byte header ("ak42", version 2, the
// seven ints, the shared-classifier byte, the int32 group size, zeros), the norms in fp32 (attention
// norms of every layer, MLP norms, the final norm), then each matrix quantized (quantize_q80): in
// groups of GS consecutive values of the flattened tensor, scale = max|w| / 127 (fp32) and
// q = round(w / scale) to nearest even, the tensor's int8 values followed by its scales. Matrices in
// order: tok_embed, then wq, wk, wv, wo, w1, w2, w3 of every layer in turn, then lm_head when untied.
// GS starts at 64 and halves until it divides d_model (as export.py does) and d_ff (runq.c needs it).
void save_llama2c_v2(const std::filesystem::path& path, const ModelConfig& cfg, const Weights& weights) {
    try {  // the same constraints as v0 (llama, no biases, theta 10000, shapes), named for the file written
        check_llama2c_v0_config(path, cfg);
        check_weights(path, cfg, weights);
    } catch (const ConfigError& e) {
        std::string why = e.what();
        if (const auto at = why.find("llama2.c v0"); at != std::string::npos) why.replace(at, 11, "llama2.c v2");
        throw ConfigError(why);
    }
    const std::int32_t group = llama2c_v2_group_size(cfg);
    const bool shared = weights.lm_head.size() == 0;
    std::vector<const WeightMatrix*> matrices{&weights.tok_embed};
    for (WeightMatrix LayerWeights::*m : {&LayerWeights::wq, &LayerWeights::wk, &LayerWeights::wv, &LayerWeights::wo, &LayerWeights::w1,
                                      &LayerWeights::w2, &LayerWeights::w3})
        for (const LayerWeights& lw : weights.layers) matrices.push_back(&(lw.*m));
    if (!shared) matrices.push_back(&weights.lm_head);
    for (const WeightMatrix* m : matrices)
        if (m->size() % group != 0)
            throw ConfigError(fmt::format("{}: a {}x{} matrix does not split into quantization groups of {}", path.string(), m->rows(), m->cols(), group));
    if (weights.rope_pairing != RopePairing::neighbours)
        throw ConfigError(fmt::format("{}: llama2.c v2 is written from weights in llama2.c's RoPE pairing (neighbours) only", path.string()));

    const std::array<std::int32_t, 7> params = {header_int(path, "d_model", cfg.d_model), header_int(path, "d_ff", cfg.d_ff),
                                                header_int(path, "n_layer", cfg.n_layer), header_int(path, "n_head", cfg.n_head),
                                                header_int(path, "n_head_kv", cfg.n_head_kv), header_int(path, "n_vocab", cfg.n_vocab),
                                                header_int(path, "n_ctx_max", cfg.n_ctx_max)};
    std::array<char, llama2c_v1_header_bytes> header{};
    const std::uint32_t magic = llama2c_v1_magic;
    const std::int32_t version = 2;
    std::memcpy(header.data(), &magic, 4);
    std::memcpy(header.data() + 4, &version, 4);
    std::memcpy(header.data() + 8, params.data(), sizeof params);
    header[36] = shared ? 1 : 0;
    std::memcpy(header.data() + 37, &group, 4);

    for (const WeightMatrix* m : matrices)  // int8 cannot hold a NaN or an infinity, and converting one is undefined
        if (!m->map().allFinite()) throw ConfigError(fmt::format("{}: a weight is not finite; llama2.c v2 stores int8", path.string()));
    write_atomically(path, "llama2.c v2 file", [&](std::ostream& out) {
        out.write(header.data(), header.size());
        for (const LayerWeights& lw : weights.layers) write_floats(out, lw.attn_norm.data(), static_cast<std::uint64_t>(lw.attn_norm.size()));
        for (const LayerWeights& lw : weights.layers) write_floats(out, lw.mlp_norm.data(), static_cast<std::uint64_t>(lw.mlp_norm.size()));
        write_floats(out, weights.final_norm.data(), static_cast<std::uint64_t>(weights.final_norm.size()));
        std::vector<std::int8_t> q;
        std::vector<float> scales;
        for (const WeightMatrix* m : matrices) {
            const float* w = m->data();
            const auto n = static_cast<std::size_t>(m->size());
            q.resize(n);
            scales.resize(n / static_cast<std::size_t>(group));
            for (std::size_t g = 0; g < scales.size(); ++g) {
                const float* wg = w + g * static_cast<std::size_t>(group);
                float amax = 0.0f;
                for (std::int32_t i = 0; i < group; ++i) amax = std::max(amax, std::fabs(wg[i]));
                const float scale = amax / 127.0f;
                scales[g] = scale;
                for (std::int32_t i = 0; i < group; ++i)
                    q[g * static_cast<std::size_t>(group) + static_cast<std::size_t>(i)] =
                        scale > 0.0f ? static_cast<std::int8_t>(std::nearbyint(wg[i] / scale)) : std::int8_t{0};
            }
            out.write(reinterpret_cast<const char*>(q.data()), static_cast<std::streamsize>(q.size()));
            write_floats(out, scales.data(), scales.size());
        }
    });
}

}  // namespace kvlab
