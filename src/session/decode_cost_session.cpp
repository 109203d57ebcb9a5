// `kvlab simulate --cost-at`: the attention layouts of --attention's comma list on one shape, costed by
// the closed form (report/decode_cost.hpp) at the asked-for contexts. No weights are built.
#include <algorithm>

#include <fmt/format.h>

#include "kvlab/core/error.hpp"
#include "kvlab/core/text.hpp"
#include "kvlab/core/units.hpp"
#include "kvlab/kv/kv_cache.hpp"
#include "kvlab/model/mla.hpp"
#include "report/decode_cost.hpp"
#include "session/model_source.hpp"
#include "session/simulate_session.hpp"

namespace kvlab {

namespace {

// --cost-at's contexts, ascending and distinct, each from 1 to the model's maximum.
std::vector<std::int64_t> cost_contexts(const std::string& text, const ModelConfig& cfg) {
    std::vector<std::int64_t> out;
    for (const std::uint64_t t : parse_count_list(text, "--cost-at")) {
        if (t < 1 || (cfg.n_ctx_max > 0 && t > static_cast<std::uint64_t>(cfg.n_ctx_max)))
            throw UsageError(fmt::format("--cost-at: {} tokens; expected 1..{} ({}'s context)", t, cfg.n_ctx_max, cfg.name));
        out.push_back(static_cast<std::int64_t>(t));
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
}

// One storage for every layout's cache: --kv-dtype's single format.
KvStorage cost_storage(const SimulateRequest& o) {
    const std::vector<std::string> names = split_list(o.kv_dtype);
    if (names.size() != 1)
        throw UsageError(fmt::format("--kv-dtype {}: --cost-at compares attention layouts at one cache format; expected one", o.kv_dtype));
    return KvStorage{parse_dtype(names.front(), "--kv-dtype"), o.kv_scale};
}

// The lines of the comparison: each --attention layout on the shape, an MLA one once per decode path.
std::vector<DecodeCostLine> cost_lines(const SimulateRequest& o, const ModelConfig& full, const KvStorage& storage) {
    std::vector<DecodeCostLine> lines;
    for (const std::string& spec : split_list(o.attention)) {
        SimulateRequest one = o;
        one.attention = spec;
        DecodeCostLine line;
        line.cfg = shaped_config(one, full);
        check_kv_storage(storage, kv_row_values(line.cfg));
        line.kv_row_bytes = storage.dtype == DType::fp32 ? 0 : kv_stored_row_bytes(storage, kv_row_heads(line.cfg), kv_row_head_dim(line.cfg));
        line.kv_token_bytes = kv_stored_token_bytes(storage, line.cfg);
        if (!line.cfg.mla) {
            line.label = line.cfg.attention_kind();
            lines.push_back(line);
            continue;
        }
        for (const MlaPath path : {MlaPath::naive, MlaPath::absorbed}) {
            if (o.mla_given && path != o.mla_path) continue;
            line.path = path;
            line.label = fmt::format("MLA r={} {}", line.cfg.mla->kv_lora_rank, choice_name(mla_path_choices, path));
            lines.push_back(line);
        }
    }
    constexpr std::size_t max_lines = 8;
    if (lines.empty() || lines.size() > max_lines)
        throw UsageError(fmt::format("--attention {}: {} layouts to compare; --cost-at takes 1 to {}", o.attention, lines.size(), max_lines));
    return lines;
}

}  // namespace

Report decode_cost_comparison(const SimulateRequest& request) {
    ModelSource source{request.model, request.config, request.checkpoint, request.tokenizer};
    const ModelConfig full = resolve_model(source);
    SimulateRequest o = request;
    o.checkpoint.clear();  // the shape alone: no weights are read, so a trained model's shape takes what-ifs too
    const std::vector<std::int64_t> contexts = cost_contexts(o.cost_at, full);
    const KvStorage storage = cost_storage(o);
    const std::vector<DecodeCostLine> lines = cost_lines(o, full, storage);
    if (!o.plot.empty()) plot_decode_cost(lines, contexts, o.plot, o.units);
    nlohmann::json inputs = {{"command", "simulate --cost-at"}, {"model", full.name}, {"layers", lines.front().cfg.n_layer},
                             {"attention", o.attention}, {"kv_dtype", std::string(dtype_name(storage.dtype))},
                             {"contexts", contexts}, {"weights", "fp32 (counted, none built)"}};
    return decode_cost_report(lines, contexts, o.units, std::move(inputs));
}

}  // namespace kvlab
