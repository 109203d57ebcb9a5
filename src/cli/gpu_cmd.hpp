// `kvlab gpu ...` subcommands (src/cli/gpu_cmd.cpp).
#pragma once
#include <CLI/CLI.hpp>

namespace kvlab::cli {

void add_gpu_command(CLI::App& app);

}  // namespace kvlab::cli
