// Small model configs for the simulator tests: every family and attention layout, shapes chosen so
// each test runs in milliseconds.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "kvlab/calc/model_config.hpp"

namespace kvlab::test {

inline ModelConfig tiny_config(Family family, std::int64_t n_head, std::int64_t n_head_kv, std::int64_t n_layer = 2,
                               std::optional<std::int64_t> window = std::nullopt) {
    ModelConfig c;
    c.family = family;
    c.name = c.display_name = fmt::format("tiny-{}-{}h-{}kv", family == Family::gpt2 ? "gpt2" : "llama", n_head, n_head_kv);
    c.n_layer = n_layer;
    c.d_head = 8;
    c.n_head = n_head;
    c.n_head_kv = n_head_kv;
    c.d_model = 24;
    c.d_ff = 40;
    c.n_vocab = 50;
    c.n_ctx_max = 64;
    c.tied_embeddings = family == Family::gpt2;
    c.layer_windowed.assign(static_cast<std::size_t>(n_layer), window.has_value());
    c.sliding_window = window;
    return c;
}

}  // namespace kvlab::test
