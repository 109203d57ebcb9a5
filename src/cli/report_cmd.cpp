// `kvlab report`: one self-contained HTML page from a simulate trace, a serve trace or kvcalc's JSON
// (trace/html_report.hpp builds it).
#include <iostream>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "commands.hpp"
#include "options.hpp"
#include "trace/html_report.hpp"

namespace kvlab::cli {

struct ReportOptions {
    std::string input;
    std::string output;
};

void setup_report(CLI::App& app) {
    auto o = std::make_shared<ReportOptions>();
    auto* cmd = app.add_subcommand("report", "One self-contained HTML page (charts, block map, per-op costs, formulas) from a simulate "
                                             "or serve trace or kvcalc's JSON");
    input_file(cmd->add_option("file", o->input, "A kvlab simulate trace (.csv, .jsonl, .json), serve trace (.csv, .jsonl) or kvcalc --format json output"))
        ->required();
    output_file(cmd->add_option("-o,--output", o->output, "The page: FILE.html"))->required();
    cmd->footer("Examples:\n  kvlab simulate -m tiny-llama --trace run.jsonl && kvlab report run.jsonl -o run.html\n"
                "  kvlab serve -m tiny-llama --trace serve.jsonl && kvlab report serve.jsonl -o serve.html\n"
                "  kvlab kvcalc -m llama-3-8b --gpu h100 --explain --format json > kv.json && kvlab report kv.json -o kv.html");
    cmd->callback([o] {
        write_html_report(o->input, o->output);
        std::cout << fmt::format("wrote {}\n", o->output);
    });
}

}  // namespace kvlab::cli
