// `kvlab presets`: the model presets with their attention shapes and computed parameter counts;
// `--gpus`: the GPU presets kvcalc --gpu takes.
#include <iostream>

#include "commands.hpp"
#include "options.hpp"
#include "calc/presets_report.hpp"

namespace kvlab::cli {

struct PresetsOptions {
    bool gpus = false;
    Format format = Format::table;
};

void setup_presets(CLI::App& app) {
    auto opts = std::make_shared<PresetsOptions>();
    auto* cmd = app.add_subcommand("presets", "List model presets (name, family, layers, heads, head dim, attention, max context, parameters)");
    cmd->add_flag("--gpus", opts->gpus, "List the GPU presets instead (memory, bandwidth, FP16 FLOP/s) that kvcalc --gpu takes");
    add_format_option(cmd, opts->format);
    cmd->footer("Examples:\n  kvlab presets\n  kvlab presets --gpus --format csv");
    cmd->callback([opts] {
        const bool with_sources = opts->format != Format::table;  // sources are long; csv/json/markdown keep them
        print_report(std::cout, opts->gpus ? gpu_presets_report(with_sources) : model_presets_report(with_sources), opts->format);
    });
}

}  // namespace kvlab::cli
