// llama2.c checkpoints: read the legacy v0 layout and the v1 "ak42" layout (fp32), write v0, and write
// the int8 v2 layout llama2.c's runq.c reads (for the weight-precision benchmark). Facts:
// docs/checkpoints.md. Non-goal: reading v2.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>

#include "kvlab/formats/checkpoint.hpp"

namespace kvlab {

enum class Llama2cVersion { v0, v1 };

inline constexpr std::uint64_t llama2c_v0_header_bytes = 7 * 4;  // 7 int32
inline constexpr std::uint64_t llama2c_v1_header_bytes = 256;
inline constexpr std::uint32_t llama2c_v1_magic = 0x616b3432;   // "ak42" read as a little-endian uint32

// Exact size of a checkpoint file holding `cfg` in the given layout: header + fp32 tensors
// (+ v0's two legacy RoPE tables of n_ctx_max*d_head/2 floats) (+ classifier when untied).
// The loader checks files against it, the writer produces it. Throws OverflowError.
std::uint64_t llama2c_file_bytes(const ModelConfig& cfg, Llama2cVersion version);

// Reads either layout (v1 recognised by its magic). Config: family llama, rope_theta 10000, eps 1e-5,
// n_ctx_max = seq_len, name = file stem; weights use RopePairing::neighbours.
// Throws FormatError naming the file for any header, size or dimension problem; InputError if it cannot be
// opened, IoError if a read fails.
// n_layers: see load_checkpoint.
// placement: where the matrices live (formats/checkpoint.hpp; the file holds them in kvlab's own layout,
// so either works).
LoadedModel load_llama2c_checkpoint(const std::filesystem::path& path, std::optional<std::int64_t> n_layers = std::nullopt,
                                    WeightPlacement placement = WeightPlacement::huge_pages);
// The config alone (header checked against the file size, no tensor read): what a run must know
// before it allocates anything. Same errors as load_llama2c_checkpoint.
ModelConfig load_llama2c_config(const std::filesystem::path& path);

// Throws ConfigError (naming `path`) when `cfg` cannot be written as llama2.c v0; checks the config
// only, so a caller can refuse before building any weights. save_llama2c_v0 calls it first.
void check_llama2c_v0_config(const std::filesystem::path& path, const ModelConfig& cfg);

// Writes `weights` as llama2.c v0 via a temporary file renamed into place. Untied iff weights.lm_head
// is non-empty. Weights with RopePairing::halves get their wq/wk rows permuted to neighbour order, so
// the written model computes the same function. Throws ConfigError when the model cannot be expressed
// in v0 (not llama family, biases, rope_theta != 10000, ...), IoError when writing fails.
void save_llama2c_v0(const std::filesystem::path& path, const ModelConfig& cfg, const Weights& weights);

// Writes `weights` as llama2.c v2 (export.py's version2_export: int8 in groups of up to 64 values with
// fp32 scales; the norms fp32), which runq.c reads. Same refusals as save_llama2c_v0, and ConfigError
// for weights in RoPE halves order or a matrix that does not split into groups.
void save_llama2c_v2(const std::filesystem::path& path, const ModelConfig& cfg, const Weights& weights);
// The quantization group size save_llama2c_v2 writes for `cfg`: 64, halved until it divides d_model
// (export.py's rule) and d_ff (runq.c's matmul needs it).
std::int32_t llama2c_v2_group_size(const ModelConfig& cfg);

}  // namespace kvlab
