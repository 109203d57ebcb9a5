#include "formats/gguf.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvlab/core/error.hpp"
#include "kvlab/core/mapped_file.hpp"
#include "kvlab/core/text.hpp"

namespace kvlab {

namespace {

// The value types of the GGUF spec, by their numbers in the file.
enum GgufType : std::uint32_t {
    u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8, array = 9, u64 = 10, i64 = 11, f64 = 12
};

std::uint64_t scalar_size(std::uint32_t type) {
    switch (type) {
        case u8: case i8: case boolean: return 1;
        case u16: case i16: return 2;
        case u32: case i32: case f32: return 4;
        case u64: case i64: case f64: return 8;
        default: return 0;
    }
}

// Reads little-endian values from the mapped bytes, every read checked against the end of the file.
class Cursor {
public:
    Cursor(std::span<const std::byte> bytes, const std::filesystem::path& path) : bytes_(bytes), path_(path) {}

    [[noreturn]] void fail(const std::string& what) const {
        throw FormatError(fmt::format("{}: GGUF header at byte {}: {}", quote(path_.string()), pos_, what));
    }
    void need(std::uint64_t n, const char* what) const {
        if (n > bytes_.size() - pos_)
            fail(fmt::format("{} needs {} bytes, {} are left in the file", what, n, bytes_.size() - pos_));
    }
    template <typename T>
    T read(const char* what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
        pos_ += sizeof(T);
        return v;
    }
    std::string string(const char* what) {
        const auto n = read<std::uint64_t>(what);
        need(n, what);
        std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), static_cast<std::size_t>(n));
        pos_ += n;
        return s;
    }
    void skip(std::uint64_t n, const char* what) {
        need(n, what);
        pos_ += n;
    }
    std::uint64_t pos() const { return pos_; }

private:
    std::span<const std::byte> bytes_;
    const std::filesystem::path& path_;
    std::uint64_t pos_ = 0;
};

std::int64_t scalar_integer(Cursor& c, std::uint32_t type) {
    switch (type) {
        case u8: return c.read<std::uint8_t>("a u8");
        case i8: return c.read<std::int8_t>("an i8");
        case u16: return c.read<std::uint16_t>("a u16");
        case i16: return c.read<std::int16_t>("an i16");
        case u32: return c.read<std::uint32_t>("a u32");
        case i32: return c.read<std::int32_t>("an i32");
        case i64: return c.read<std::int64_t>("an i64");
        case u64: {
            const auto v = c.read<std::uint64_t>("a u64");
            if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) c.fail(fmt::format("u64 value {} is above 2^63 - 1", v));
            return static_cast<std::int64_t>(v);
        }
        default: c.fail(fmt::format("value type {} is not an integer", type));
    }
}

GgufValue read_value(Cursor& c, std::uint32_t type) {
    GgufValue v;
    switch (type) {
        case f32: v.kind = GgufValue::Kind::real; v.real = c.read<float>("an f32"); break;
        case f64: v.kind = GgufValue::Kind::real; v.real = c.read<double>("an f64"); break;
        case boolean: {
            const auto b = c.read<std::uint8_t>("a bool");
            if (b > 1) c.fail(fmt::format("bool value {}; expected 0 or 1", b));
            v.kind = GgufValue::Kind::boolean;
            v.boolean = b == 1;
            break;
        }
        case string: v.kind = GgufValue::Kind::string; v.text = c.string("a string"); break;
        case array: {
            v.kind = GgufValue::Kind::array;
            const auto elem = c.read<std::uint32_t>("an array's element type");
            v.array_length = c.read<std::uint64_t>("an array's length");
            if (elem == string) {
                // a vocabulary: skipped string by string, each length checked
                for (std::uint64_t i = 0; i < v.array_length; ++i) c.skip(c.read<std::uint64_t>("a string's length"), "a string in an array");
            } else if (elem == array) {
                c.fail("an array of arrays; kvlab reads arrays of numbers, bools and strings");
            } else {
                const std::uint64_t size = scalar_size(elem);
                if (size == 0) c.fail(fmt::format("array element type {}; expected 0..12", elem));
                c.need(v.array_length > std::numeric_limits<std::uint64_t>::max() / size ? std::numeric_limits<std::uint64_t>::max() : v.array_length * size,
                       "an array's elements");
                if (elem == boolean && v.array_length <= (1u << 20)) {
                    for (std::uint64_t i = 0; i < v.array_length; ++i) v.array_booleans.push_back(read_value(c, boolean).boolean);
                } else if (elem == f32 || elem == f64 || v.array_length > (1u << 20)) {
                    c.skip(v.array_length * size, "an array's elements");  // reals and long arrays: only the length matters here
                } else {
                    for (std::uint64_t i = 0; i < v.array_length; ++i) v.array_integers.push_back(scalar_integer(c, elem));
                }
            }
            break;
        }
        default:
            if (scalar_size(type) == 0) c.fail(fmt::format("value type {}; expected 0..12", type));
            v.kind = GgufValue::Kind::integer;
            v.integer = scalar_integer(c, type);
    }
    return v;
}

}  // namespace

GgufHeader read_gguf_header(const std::filesystem::path& path) {
    const MappedFile file(path, "GGUF file");
    Cursor c(file.bytes(), path);
    GgufHeader h;
    const auto magic = c.read<std::uint32_t>("the magic");
    if (magic != 0x46554747u)  // "GGUF" read little-endian
        c.fail("no 'GGUF' magic at the start; expected a llama.cpp GGUF file");
    h.version = c.read<std::uint32_t>("the version");
    if (h.version != 2 && h.version != 3)
        c.fail(fmt::format("version {}; kvlab reads GGUF versions 2 and 3 (version 1 used 32-bit lengths)", h.version));
    h.n_tensors = c.read<std::uint64_t>("the tensor count");
    const auto n_kv = c.read<std::uint64_t>("the metadata count");
    // every pair takes at least 12 bytes (key length, value type): a count the file cannot hold is refused first
    c.need(n_kv > std::numeric_limits<std::uint64_t>::max() / 12 ? std::numeric_limits<std::uint64_t>::max() : n_kv * 12, "the metadata");
    for (std::uint64_t i = 0; i < n_kv; ++i) {
        std::string key = c.string("a metadata key");
        const auto type = c.read<std::uint32_t>("a value type");
        GgufValue v = read_value(c, type);
        if (!h.metadata.emplace(key, std::move(v)).second) c.fail(fmt::format("key {} appears twice", quote(key, 80)));
    }
    if (h.n_tensors == 0) return h;  // a metadata-only file
    // every tensor info takes at least 24 bytes (name length, dimension count, type, offset)
    c.need(h.n_tensors > std::numeric_limits<std::uint64_t>::max() / 24 ? std::numeric_limits<std::uint64_t>::max() : h.n_tensors * 24, "the tensor infos");
    std::vector<std::uint64_t> offsets;
    offsets.reserve(static_cast<std::size_t>(h.n_tensors));
    for (std::uint64_t i = 0; i < h.n_tensors; ++i) {
        c.string("a tensor name");
        const auto n_dims = c.read<std::uint32_t>("a tensor's dimension count");
        if (n_dims > 4) c.fail(fmt::format("a tensor of {} dimensions; expected at most 4 (GGML_MAX_DIMS)", n_dims));
        c.skip(std::uint64_t{8} * n_dims, "a tensor's dimensions");
        c.read<std::uint32_t>("a tensor's type");
        offsets.push_back(c.read<std::uint64_t>("a tensor's offset"));
    }
    std::uint64_t alignment = 32;  // GGUF_DEFAULT_ALIGNMENT
    if (const auto it = h.metadata.find("general.alignment"); it != h.metadata.end()) {
        if (it->second.kind != GgufValue::Kind::integer || it->second.integer <= 0 || (it->second.integer & (it->second.integer - 1)) != 0)
            c.fail("general.alignment is not a power of two; expected e.g. 32");
        alignment = static_cast<std::uint64_t>(it->second.integer);
    }
    const std::uint64_t size = file.bytes().size();
    const std::uint64_t start = c.pos() + (alignment - c.pos() % alignment) % alignment;
    if (start > size) c.fail(fmt::format("the tensor data would start at byte {}, past the end of the {}-byte file", start, size));
    h.tensor_data_start = start;
    h.tensor_data_bytes = size - start;
    for (const auto offset : offsets)
        if (offset > h.tensor_data_bytes)
            c.fail(fmt::format("a tensor at data offset {}, past the {} bytes of tensor data", offset, h.tensor_data_bytes));
    return h;
}

namespace {

// A GGUF header's metadata read as an architecture's hyperparameters: `arch.key` values by key.
struct GgufFields {
    const GgufHeader& h;
    std::string where;    // "<path> (GGUF metadata)", for messages
    std::string arch;     // general.architecture
    std::int64_t n_layer = 0;  // block_count, once read (a scalar)

    const GgufValue* find(const std::string& key) const {
        const auto it = h.metadata.find(key);
        return it == h.metadata.end() ? nullptr : &it->second;
    }

    // `arch.key`: a scalar, or a per-layer array of one value; a per-layer array whose values differ is
    // refused. As in llama.cpp's loader (llama_model_loader::get_key_or_arr, which load_hparams uses for
    // head_count, head_count_kv and feed_forward_length), a scalar stands for every layer and an array must
    // have exactly one entry per layer: a 1-entry array for 32 layers is "wrong array length; expected 32, got 1".
    std::optional<std::int64_t> uniform(const std::string& key, bool required) const {
        const std::string name = quote(arch + "." + key, 80);
        const GgufValue* v = find(arch + "." + key);
        if (!v) {
            if (required) throw ConfigError(fmt::format("{}: no {}; expected a positive integer", where, name));
            return std::nullopt;
        }
        if (v->kind == GgufValue::Kind::integer) return v->integer;
        if (v->kind == GgufValue::Kind::array && n_layer > 0 && v->array_length != static_cast<std::uint64_t>(n_layer))
            throw ConfigError(fmt::format("{}: {} has {} entr{}; expected one per layer ({}), or a single value that is not an array "
                                          "(llama.cpp refuses it: wrong array length)",
                                          where, name, v->array_length, v->array_length == 1 ? "y" : "ies", n_layer));
        if (v->kind == GgufValue::Kind::array && n_layer > 0 && !v->array_integers.empty()) {
            const auto [lo, hi] = std::minmax_element(v->array_integers.begin(), v->array_integers.end());
            if (*lo != *hi)
                throw ConfigError(fmt::format("{}: {} differs between layers ({}..{}); per-layer shapes are not sized yet", where, name, *lo, *hi));
            return *lo;
        }
        throw ConfigError(fmt::format("{}: {} is not an integer", where, name));
    }
};

// The experts' own width, shared experts and leading dense layers (llama.cpp's LLM_KV_EXPERT_* keys, as
// convert_hf_to_gguf.py writes them from moe_intermediate_size, n_shared_experts /
// shared_expert_intermediate_size and first_k_dense_replace); Llama 4: the experts' width is
// intermediate_size, the dense layers' the feed-forward length.
void read_experts(const GgufFields& f, nlohmann::json& j) {
    const auto experts = f.uniform("expert_count", false);
    if (!experts || *experts <= 1) return;
    j["num_local_experts"] = *experts;
    j["num_experts_per_tok"] = f.uniform("expert_used_count", false).value_or(1);
    if (const auto ff_exp = f.uniform("expert_feed_forward_length", false)) {
        if (f.arch == "llama4") {
            if (j.contains("intermediate_size")) j["intermediate_size_mlp"] = j["intermediate_size"];
            j["intermediate_size"] = *ff_exp;
        } else {
            j["moe_intermediate_size"] = *ff_exp;
        }
    }
    if (const auto n = f.uniform("expert_shared_count", false)) j["n_shared_experts"] = *n;
    if (const auto ff = f.uniform("expert_shared_feed_forward_length", false)) j["shared_expert_intermediate_size"] = *ff;
    if (const auto n = f.uniform("leading_dense_block_count", false)) j["first_k_dense_replace"] = *n;
    if (const auto n = f.uniform("interleave_moe_layer_step", false)) j["interleave_moe_layer_step"] = *n;
    // experts but no feed_forward_length: every layer is MoE, and the experts' width is the only one
    if (!j.contains("intermediate_size") && j.contains("moe_intermediate_size")) j["intermediate_size"] = j["moe_intermediate_size"];
}

// MLA's latent and head sizes. Returns true when the file predates the MLA split (llama.cpp then caches
// full K and V for every head).
bool read_mla(const GgufFields& f, nlohmann::json& j, std::optional<std::int64_t> key_len, std::optional<std::int64_t> value_len) {
    const auto rank = f.uniform("attention.kv_lora_rank", false);
    if (!rank) {
        if (key_len && value_len && *key_len != *value_len)
            throw ConfigError(fmt::format("{}: key_length {} and value_length {} differ; kvlab sizes K and V of one head size", f.where,
                                          *key_len, *value_len));
        return false;
    }
    j["kv_lora_rank"] = *rank;
    if (const auto q_rank = f.uniform("attention.q_lora_rank", false)) j["q_lora_rank"] = *q_rank;
    const auto rope = f.uniform("rope.dimension_count", true).value();
    j["qk_rope_head_dim"] = rope;
    // convert_hf_to_gguf.py since llama.cpp b5137 (#12801) writes the MLA split: one KV "head" whose key is the
    // latent + rope (key_length) and the per-head sizes in key_length_mla / value_length_mla. Older files have
    // only the per-head sizes, and llama.cpp then caches full K and V for every head.
    const auto key_mla = f.uniform("attention.key_length_mla", false), value_mla = f.uniform("attention.value_length_mla", false);
    const auto per_head_k = key_mla ? key_mla : key_len, per_head_v = value_mla ? value_mla : value_len;
    if (per_head_k && *per_head_k > rope) j["qk_nope_head_dim"] = *per_head_k - rope;
    // no value_length (MiniCPM3's converter writes none): llama.cpp's default head width, embedding_length / head_count
    // (llama-model.cpp, load_hparams: n_embd_head_v = n_embd / n_head unless the key is set)
    // (a head count of 0 or below is refused with its own message when the fields are read)
    const auto hidden = j["hidden_size"].get<std::int64_t>(), heads = j["num_attention_heads"].get<std::int64_t>();
    if (per_head_v) j["v_head_dim"] = *per_head_v;
    else if (heads > 0 && hidden >= heads) j["v_head_dim"] = hidden / heads;
    return !key_mla;
}

// Which layers llama.cpp windows is the architecture's rule (llama-model.cpp, set_swa_pattern): Gemma-2
// and gpt-oss every other layer from the first, Gemma-3 five of every six; a per-layer bool array wins.
// Returns a note when the window is ignored.
std::string read_window(const GgufFields& f, nlohmann::json& j) {
    const auto window = f.uniform("attention.sliding_window", false);
    if (!window || *window <= 0) return {};
    j["sliding_window"] = *window;
    if (const GgufValue* pattern = f.find(f.arch + ".attention.sliding_window_pattern"); pattern && !pattern->array_booleans.empty()) {
        if (static_cast<std::int64_t>(pattern->array_booleans.size()) != f.n_layer)
            throw ConfigError(fmt::format("{}: {} has {} entries; expected block_count", f.where,
                                          quote(f.arch + ".attention.sliding_window_pattern", 80), pattern->array_booleans.size()));
        for (const bool b : pattern->array_booleans) j["layer_types"].push_back(b ? "sliding_attention" : "full_attention");
    } else if (f.arch == "gemma3") {
        j["sliding_window_pattern"] = 6;
    } else if (f.arch != "gemma2" && f.arch != "gpt-oss") {
        j["use_sliding_window"] = false;
        return fmt::format("{} {} ignored: kvlab does not know which layers llama.cpp windows for architecture {}",
                           quote(f.arch + ".attention.sliding_window", 80), *window, quote(f.arch, 40));
    }
    return {};
}

// The shape every architecture has: layers, widths, heads, context, vocabulary.
void read_shape(GgufFields& f, nlohmann::json& j) {
    // llama.cpp's architecture names where Hugging Face's model_type differs (the config rules key on those)
    static const std::map<std::string, std::string> hf_type{
        {"gemma3", "gemma3_text"}, {"qwen2moe", "qwen2_moe"}, {"qwen3moe", "qwen3_moe"}, {"gpt-oss", "gpt_oss"}, {"llama4", "llama4_text"},
        {"phi2", "phi"},           {"gptneox", "gpt_neox"},   {"command-r", "cohere"}};
    const auto type_it = hf_type.find(f.arch);
    j["model_type"] = type_it == hf_type.end() ? f.arch : type_it->second;
    if (const GgufValue* blocks = f.find(f.arch + ".block_count"); blocks && blocks->kind != GgufValue::Kind::integer)
        throw ConfigError(fmt::format("{}: {} is not an integer; expected the number of layers", f.where, quote(f.arch + ".block_count", 80)));
    f.n_layer = *f.uniform("block_count", true);
    j["num_hidden_layers"] = f.n_layer;
    j["hidden_size"] = *f.uniform("embedding_length", true);
    j["num_attention_heads"] = *f.uniform("attention.head_count", true);
    if (const auto kv = f.uniform("attention.head_count_kv", false)) j["num_key_value_heads"] = *kv;
    if (const auto key_len = f.uniform("attention.key_length", false)) j["head_dim"] = *key_len;
    if (const auto ctx = f.uniform("context_length", false)) j["max_position_embeddings"] = *ctx;
    if (const auto ff = f.uniform("feed_forward_length", false)) j["intermediate_size"] = *ff;
    if (const auto n = f.uniform("vocab_size", false)) j["vocab_size"] = *n;
    else if (const GgufValue* tokens = f.find("tokenizer.ggml.tokens"); tokens && tokens->kind == GgufValue::Kind::array)
        j["vocab_size"] = tokens->array_length;
    else j["vocab_size"] = 1;  // the KV cache does not depend on it; the weights then are not counted
}

}  // namespace

ModelConfig gguf_model_config(const GgufHeader& h, const std::filesystem::path& path) {
    GgufFields f{h, fmt::format("{} (GGUF metadata)", path.string()), {}};
    const GgufValue* arch_v = f.find("general.architecture");
    if (!arch_v || arch_v->kind != GgufValue::Kind::string || arch_v->text.empty())
        throw ConfigError(fmt::format("{}: no general.architecture; expected the model's architecture name", f.where));
    f.arch = arch_v->text;

    // the same fields as a Hugging Face config, so one reader checks them all (config.json rules apply)
    nlohmann::json j;
    read_shape(f, j);
    read_experts(f, j);
    const bool mla_full_kv = read_mla(f, j, f.uniform("attention.key_length", false), f.uniform("attention.value_length", false));
    const std::string window_note = read_window(f, j);
    nlohmann::json kv = {{"source", fmt::format("GGUF v{} header of {}", h.version, path.string())}};
    if (const GgufValue* n = f.find("general.name"); n && n->kind == GgufValue::Kind::string && !n->text.empty()) kv["display_name"] = n->text;
    j["_kvlab"] = kv;
    ModelConfig cfg = parse_model_config(j, f.where, path.stem().string(), /*class_defaults=*/false);
    if (h.n_tensors > 0) {  // the weights as the file stores them (quantized or not), for the GPU fit
        cfg.stored_weight_bytes = h.tensor_data_bytes;
        cfg.stored_weights_rule = fmt::format("weights as the GGUF stores them: its {} tensors' data, {} B (the file from byte {}), "
                                              "instead of parameters x --weights-dtype",
                                              h.n_tensors, h.tensor_data_bytes, h.tensor_data_start);
    }
    cfg.gguf_mla_full_kv = mla_full_kv && cfg.mla.has_value();
    if (!window_note.empty()) cfg.defaults.push_back(window_note);
    if (!f.find(f.arch + ".vocab_size") && !f.find("tokenizer.ggml.tokens")) {
        cfg.d_ff = 0;  // no vocabulary size: the weights are unknown
        cfg.defaults.push_back("no vocabulary size in the metadata: the weights are unknown");
    }
    return cfg;
}

ModelConfig load_gguf_config(const std::filesystem::path& path) { return gguf_model_config(read_gguf_header(path), path); }

}  // namespace kvlab
