// kvlab entry point: registers the subcommands, runs one, and turns errors into one line + exit code.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <new>

#include <CLI/CLI.hpp>

#include "commands.hpp"
#include "core/error.hpp"
#include "core/interrupt.hpp"
#include "core/text.hpp"

namespace {

// Numbers on the command line are read strictly: CLI11 alone reads 0x10 as 16 and 010 as 8, takes an
// empty value, and turns 2^64 into 2^64-1 and -1 into 2^64-1 for unsigned flags without a word. Every
// integer flag must be plain decimal within its type's range (the value is passed on in canonical form),
// every real flag a finite decimal number.
CLI::Validator decimal_integer(bool is_signed) {
    return CLI::Validator(
        [is_signed](std::string& text) -> std::string {
            const std::string expected = is_signed ? "expected a decimal integer" : "expected a non-negative decimal integer";
            if (text.empty()) return "empty value; " + expected;
            const std::string_view digits = std::string_view(text).substr(is_signed && text[0] == '-' ? 1 : 0);
            if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
                return kvlab::quote(text, 40) + " is not " + expected.substr(std::string("expected ").size());
            if (is_signed) {
                std::int64_t v = 0;
                const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
                if (ec != std::errc()) return kvlab::quote(text, 40) + " is out of range; expected -2^63..2^63-1";
                text = std::to_string(v);
            } else {
                std::uint64_t v = 0;
                const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
                if (ec != std::errc()) return kvlab::quote(text, 40) + " is out of range; expected 0..2^64-1";
                text = std::to_string(v);
            }
            return {};
        },
        "");  // no name: the help already shows INT or UINT
}

CLI::Validator finite_number() {
    return CLI::Validator(
        [](std::string& text) -> std::string {
            double v = 0;
            const bool plain = !text.empty() && text.find_first_not_of("0123456789.eE+-") == std::string::npos;
            const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
            if (!plain || ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v))
                return kvlab::quote(text, 40) + " is not a finite decimal number";
            return {};
        },
        "");
}

void read_numbers_strictly(CLI::App& app) {
    for (CLI::Option* opt : app.get_options()) {
        std::string type = opt->get_type_name();  // "INT", or "INT:POSITIVE" with a validator attached
        type = type.substr(0, type.find(':'));
        if (type == "INT") opt->transform(decimal_integer(true));  // transform: it rewrites 010 as 10
        else if (type == "UINT") opt->transform(decimal_integer(false));
        else if (type == "FLOAT") opt->check(finite_number());
    }
    for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) read_numbers_strictly(*sub);
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"kvlab: why LLM inference caches keys and values, and what that cache costs"};
    app.require_subcommand(1);
    app.set_version_flag("--version", "kvlab 0.1.0");
    kvlab::cli::setup_kvcalc(app);
    kvlab::cli::setup_presets(app);
    kvlab::cli::setup_gpu(app);
    kvlab::cli::setup_simulate(app);
    kvlab::cli::setup_trace(app);
    read_numbers_strictly(app);
    kvlab::install_interrupt_handlers();
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForVersion& e) {
        return app.exit(e);
    } catch (const CLI::ExcludesError& e) {
        std::cerr << "kvlab: error: " << e.what() << ": give one or the other (see kvlab --help)\n";
        return 2;
    } catch (const CLI::ParseError& e) {
        std::cerr << "kvlab: error: " << e.what() << " (see kvlab --help)\n";
        return 2;
    } catch (const kvlab::Error& e) {
        std::cerr << "kvlab: error: " << e.what() << "\n";
        return e.exit_code();
    } catch (const std::bad_alloc&) {
        std::cerr << "kvlab: error: out of memory; lower the sizes asked for (--prompt-len, --steps, --layers, --max-memory)\n";
        return 1;
    } catch (const std::filesystem::filesystem_error& e) {
        // a library message echoes whole paths: cut and escape it
        std::cerr << "kvlab: error: " << e.code().message() << ": " << kvlab::quote(e.path1().string()) << "\n";
        return 1;
    } catch (const std::exception& e) {  // not raised on purpose: shown cut and escaped
        const std::string what = kvlab::quote(e.what(), 300);
        std::cerr << "kvlab: internal error: " << what << "\n";
        return 1;
    }
    return 0;
}
