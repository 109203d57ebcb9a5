// kvlab entry point: registers the subcommands, runs one, and turns errors into one line + exit code.
#include <iostream>

#include <CLI/CLI.hpp>

#include "commands.hpp"
#include "kvlab/error.hpp"

int main(int argc, char** argv) {
    CLI::App app{"kvlab: why LLM inference caches keys and values, and what that cache costs"};
    app.require_subcommand(1);
    app.set_version_flag("--version", "kvlab 0.1.0");
    kvlab::cli::setup_kvcalc(app);
    kvlab::cli::setup_presets(app);
    kvlab::cli::setup_gpu(app);
    kvlab::cli::setup_simulate(app);
    kvlab::cli::setup_trace(app);
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForVersion& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        std::cerr << "kvlab: error: " << e.what() << " (see kvlab --help)\n";
        return 2;
    } catch (const kvlab::Error& e) {
        std::cerr << "kvlab: error: " << e.what() << "\n";
        return e.exit_code();
    } catch (const std::exception& e) {
        std::cerr << "kvlab: error: " << e.what() << "\n";
        return 1;
    }
    return 0;
}
