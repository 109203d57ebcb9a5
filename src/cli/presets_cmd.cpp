// `kvlab presets`: the model presets with their attention shapes and computed parameter counts.
#include <iostream>

#include <fmt/format.h>

#include "commands.hpp"
#include "options.hpp"
#include "calc/param_count.hpp"
#include "calc/presets.hpp"
#include "core/printer.hpp"

namespace kvlab::cli {

struct PresetsOptions {
    Format format = Format::table;
};

void setup_presets(CLI::App& app) {
    auto opts = std::make_shared<PresetsOptions>();
    auto* cmd = app.add_subcommand("presets", "List model presets (name, family, layers, heads, head dim, attention, max context, parameters)");
    add_format_option(cmd, opts->format);
    cmd->callback([opts] {
        const Format format = opts->format;
        Table t{"Model presets (" + presets_dir().string() + ")",
                {{"name", "name", false}, {"family", "family", false}, {"n_layer", "layers"}, {"n_head", "heads"}, {"n_head_kv", "kv heads"},
                 {"d_head", "head dim"}, {"attention", "attention", false}, {"max_context", "max context"}, {"parameters", "params"},
                 {"display_name", "model", false}, {"source", "source", false}},
                {}, {}};
        for (const auto& name : preset_names()) {
            const auto cfg = load_preset(name);
            const auto params = count_params(cfg).total();
            t.rows.push_back({text_cell(name), text_cell(cfg.preset_family), int_cell(cfg.n_layer), int_cell(cfg.n_head), int_cell(cfg.n_head_kv),
                              int_cell(cfg.d_head), text_cell(cfg.attention_kind()), int_cell(cfg.n_ctx_max),
                              {params >= 1000000000 ? fmt::format("{:.2f}B", params / 1e9) : fmt::format("{:.2f}M", params / 1e6), params},
                              text_cell(cfg.display_name), text_cell(cfg.source)});
        }
        Report report;
        report.tables.push_back(std::move(t));
        if (format == Format::table) report.tables[0].columns.pop_back();  // sources are long; CSV/JSON/markdown keep them
        if (format == Format::table)
            for (auto& row : report.tables[0].rows) row.pop_back();
        print_report(std::cout, report, format);
    });
}

}  // namespace kvlab::cli
