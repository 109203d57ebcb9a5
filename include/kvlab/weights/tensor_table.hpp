// The tensor table: every weight tensor a config's model has, once — kvlab's name, its Hugging Face
// name, its shape, how random weights initialise it, and the Weights member that holds it. Random
// initialisation, byte sizes, shape checks and every reader and writer (llama2.c v0/v1,
// safetensors folders) loop over it instead of spelling the tensors out.
//
// Order: the forward pass's (embeddings, then per layer attention norm, q, k, v, o, MLP norm, gate,
// up, down, then final norm and classifier); random_weights draws its matrices in this order, so a
// seed gives the same weights as every earlier kvlab. File formats keep their own orders as lists of
// these names (formats/llama2c_checkpoint.cpp).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvlab/calc/model_config.hpp"
#include "kvlab/weights/weights.hpp"

namespace kvlab {

// How random_weights fills a tensor: N(0, sigma), ones (norm weights) or zeros (biases).
enum class TensorInit { normal, ones, zeros };

struct TensorSpec {
    std::string_view name;     // kvlab's name, as the Weights member: "wq", "attn_norm", "tok_embed"
    bool per_layer = false;    // one per layer (LayerWeights) or one per model (Weights)
    std::int64_t rows = 0;     // (rows, cols) for matrices, (rows) for vectors (cols = 0)
    std::int64_t cols = 0;
    TensorInit init = TensorInit::normal;
    // The Hugging Face tensor: its name, "{}" standing for the layer index (gpt2 names take the checkpoint's
    // "transformer." root in front); a GPT-2 Conv1D weight is stored transposed, (in, out); q, k and v
    // (weights and biases) are slices of gpt2's fused c_attn: `hf_slice` 0, 1 or 2 of 3 along the outputs.
    std::string_view hf_name;
    bool hf_transposed = false;
    int hf_slice = -1;
    // The member: exactly one of the four is set
    WeightMatrix Weights::*matrix = nullptr;
    VectorF Weights::*vector = nullptr;
    WeightMatrix LayerWeights::*layer_matrix = nullptr;
    VectorF LayerWeights::*layer_vector = nullptr;

    bool is_matrix() const { return matrix != nullptr || layer_matrix != nullptr; }
    std::uint64_t n_values() const;  // rows * cols (matrices) or rows (vectors); checked
};

// The tensors of `cfg` (llama or gpt2 family), in forward order. Throws ConfigError for a family kvlab
// does not run, OverflowError when a width overflows.
std::vector<TensorSpec> tensor_specs(const ModelConfig& cfg);
// fn(spec, layer) for every tensor of layers 0..n_layers-1 in forward order: the model-wide tensors
// before the first per-layer one, then layer by layer, then the remaining model-wide ones (layer 0).
template <typename Fn>
void for_each_tensor(std::span<const TensorSpec> specs, std::size_t n_layers, Fn fn) {
    std::size_t first = 0, last = specs.size();  // the per-layer run is specs[first, last)
    while (first < specs.size() && !specs[first].per_layer) ++first;
    last = first;
    while (last < specs.size() && specs[last].per_layer) ++last;
    for (std::size_t i = 0; i < first; ++i) fn(specs[i], std::size_t{0});
    for (std::size_t layer = 0; layer < n_layers; ++layer)
        for (std::size_t i = first; i < last; ++i) fn(specs[i], layer);
    for (std::size_t i = last; i < specs.size(); ++i) fn(specs[i], std::size_t{0});
}

// The spec named `name` (throws Error if the config has none: a table/format mismatch is a bug).
const TensorSpec& find_spec(std::span<const TensorSpec> specs, std::string_view name);

// The tensor of `spec` in `w` (layer `layer` for per-layer specs): its floats, after it is allocated.
// The writable span is of the tensor's own values (a view is copied first: WeightMatrix::owned).
std::span<float> tensor_data(Weights& w, const TensorSpec& spec, std::size_t layer);
std::span<const float> tensor_data(const Weights& w, const TensorSpec& spec, std::size_t layer);
// The member holding a matrix (or vector) spec's tensor, to assign a whole tensor (or a view) without a copy.
WeightMatrix& matrix_of(Weights& w, const TensorSpec& spec, std::size_t layer);
const WeightMatrix& matrix_of(const Weights& w, const TensorSpec& spec, std::size_t layer);
VectorF& vector_of(Weights& w, const TensorSpec& spec, std::size_t layer);
// Allocate it at the spec's shape (values unset).
void allocate_tensor(Weights& w, const TensorSpec& spec, std::size_t layer);
// Its shape as held in `w`, for checks: (rows, cols), cols = 0 for vectors.
std::pair<std::int64_t, std::int64_t> held_shape(const Weights& w, const TensorSpec& spec, std::size_t layer);

// Bytes the Weights for `cfg` take in fp32 (what random_weights allocates and the loaders fill; a
// test pins them equal). Untied models hold lm_head, tied ones reuse tok_embed. Throws OverflowError.
std::uint64_t weights_bytes(const ModelConfig& cfg);
// Bytes actually held by `weights` (sum of tensor sizes * 4).
std::uint64_t weights_bytes_held(const Weights& weights);

}  // namespace kvlab
