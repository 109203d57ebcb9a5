// One setup function per subcommand; each adds its options to `app` and runs on parse.
#pragma once
#include <CLI/CLI.hpp>

namespace kvlab::cli {

void setup_kvcalc(CLI::App& app);
void setup_presets(CLI::App& app);
void setup_gpu(CLI::App& app);
void setup_simulate(CLI::App& app);
void setup_serve(CLI::App& app);
void setup_trace(CLI::App& app);
void setup_report(CLI::App& app);
void setup_completion(CLI::App& app);  // after the others: it reads their options

}  // namespace kvlab::cli
