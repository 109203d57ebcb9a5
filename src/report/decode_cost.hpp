// `kvlab simulate --cost-at`: what one decoded token's attention costs at given context lengths, for
// several attention layouts of one shape (MHA, GQA, MQA, MLA naive and absorbed), from the closed form of
// the cost model (model/cost.hpp, closed_form_step_cost: exact, the figures a run counts), without
// running the model. A table, a headline, and with --plot a two-panel chart drawn by gnuplot.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "kvlab/calc/model_config.hpp"
#include "kvlab/core/printer.hpp"
#include "kvlab/model/cost.hpp"

namespace kvlab {

// One line of the comparison: a shape, the way its MLA attention decodes, and how the cache stores a row.
struct DecodeCostLine {
    std::string label;             // "MHA", "GQA-8", "MLA r=512 absorbed"
    ModelConfig cfg;
    MlaPath path = MlaPath::absorbed;  // MLA configs only
    std::uint64_t kv_row_bytes = 0;    // one stored K (or V, or latent) row; 0: fp32
    std::uint64_t kv_token_bytes = 0;  // the cache one token takes, every layer (kv_stored_token_bytes)
};

// The attention block of every layer (attn_norm through o_proj: the ops that differ between layouts) when
// one token is decoded at position context - 1, so that it attends `context` positions: FLOPs and bytes
// read, summed from closed_form_step_cost.
struct DecodeCost {
    std::uint64_t flops = 0;
    std::uint64_t kv_read = 0;     // from the cache
    std::uint64_t bytes_read = 0;  // from the cache and activations; the weights left out (a batch shares them)
};
DecodeCost attention_decode_cost(const DecodeCostLine& line, std::int64_t context);

// The headline: at the longest context, each line against the first (bytes read, FLOPs), and for MLA the
// lesson (absorbed against naive). 1-3 lines, also the chart's title.
std::vector<std::string> decode_cost_headline(const std::vector<DecodeCostLine>& lines, std::int64_t context, UnitSystem units);

// The report: a row per line per context (ascending), the headline, the inputs given.
Report decode_cost_report(const std::vector<DecodeCostLine>& lines, const std::vector<std::int64_t>& contexts, UnitSystem units,
                          nlohmann::json inputs);

// Draws `output` (.svg or .png, atomically): bytes read (top) and FLOPs (bottom) per decoded token against
// context, log-log, from the smallest to the largest of `contexts`, one line per layout. Throws UsageError
// (extension, naming --plot), UnavailableError without gnuplot. `units`: the title's bytes.
void plot_decode_cost(const std::vector<DecodeCostLine>& lines, const std::vector<std::int64_t>& contexts,
                      const std::filesystem::path& output, UnitSystem units);

}  // namespace kvlab
