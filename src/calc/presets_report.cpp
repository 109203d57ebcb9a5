#include "calc/presets_report.hpp"

#include <fmt/format.h>

#include "kvlab/calc/gpu_specs.hpp"
#include "kvlab/calc/param_count.hpp"
#include "kvlab/calc/presets.hpp"

namespace kvlab {

Report model_presets_report(bool with_sources) {
    Table t{"Model presets (" + presets_dir().string() + ")",
            {{"name", "name", false}, {"family", "family", false}, {"n_layer", "layers"}, {"n_head", "heads"}, {"n_head_kv", "kv heads"},
             {"d_head", "head dim"}, {"attention", "attention", false}, {"max_context", "max context"}, {"parameters", "params"},
             {"display_name", "model", false}},
            {}, {}};
    if (with_sources) t.columns.push_back({"source", "source", false});
    for (const auto& name : preset_names()) {
        const auto cfg = load_preset(name);
        std::vector<Cell> row{text_cell(name), text_cell(cfg.preset_family), int_cell(cfg.n_layer), int_cell(cfg.n_head),
                              // MLA: one latent per token, shown as kvcalc's tables show it (1 KV head, the latent's width)
                              int_cell(cfg.mla ? 1 : cfg.n_head_kv), int_cell(cfg.mla ? cfg.mla->kv_lora_rank + cfg.mla->qk_rope_head_dim : cfg.d_head),
                              text_cell(cfg.attention_kind()), int_cell(cfg.n_ctx_max),
                              params_cell(count_params(cfg).total()), text_cell(cfg.display_name)};
        if (with_sources) row.push_back(text_cell(cfg.source));
        t.rows.push_back(std::move(row));
    }
    Report report;
    report.tables.push_back(std::move(t));
    return report;
}

Report gpu_presets_report(bool with_sources) {
    // bandwidth and FLOP/s in decimal units, as the datasheets print them; memory in binary ones
    Table t{"GPU presets (" + (presets_dir() / "gpus.json").string() + ")",
            {{"name", "name", false}, {"display_name", "GPU", false}, {"memory_bytes", "memory"},
             {"driver_bytes", "driver-reported"}, {"bandwidth_bytes_per_s", "bandwidth"}, {"fp16_dense_flops", "FP16 dense"},
             {"aliases", "aliases", false}},
            {}, {}};
    if (with_sources) t.columns.push_back({"source", "source", false});
    for (const GpuSpec& g : load_gpus()) {
        std::vector<Cell> row{
            text_cell(g.name),
            text_cell(g.display_name),
            bytes_cell(g.memory_bytes, UnitSystem::iec),
            g.driver_bytes ? Cell{format_bytes(g.driver_bytes, UnitSystem::iec), g.driver_bytes} : Cell{"unknown", nullptr},
            {format_rate(g.bandwidth_bytes_per_s), g.bandwidth_bytes_per_s},
            {fmt::format("{:.1f} TFLOP/s", g.fp16_dense_flops / 1e12), g.fp16_dense_flops},
            text_cell(fmt::format("{}", fmt::join(g.aliases, ", ")))};
        if (with_sources) row.push_back(text_cell(g.source));
        t.rows.push_back(std::move(row));
    }
    Report report;
    report.tables.push_back(std::move(t));
    report.notes.push_back("memory: the datasheet's 'N GB', which for these parts is N GiB (gpus.json, memory_convention); "
                           "driver-reported: nvidia-smi's memory.total (kvcalc --gpu uses it when known); engines size from CUDA's own total, a little lower (H100 80GB: 79.11-79.18 GiB)");
    report.notes.push_back("bandwidth in decimal units (GB/s = 10^9 B/s, TB/s = 10^12 B/s) and FP16 dense (no 2:4 sparsity) Tensor Core FLOP/s "
                           "with FP32 accumulation (what cuBLAS and PyTorch GEMMs use; GeForce parts run twice as fast accumulating in FP16), "
                           "as the datasheets print them");
    return report;
}

}  // namespace kvlab
