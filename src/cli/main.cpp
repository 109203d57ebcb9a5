// kvlab entry point: registers the subcommands, runs one, and turns errors into one line + exit code.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "commands.hpp"
#include "options.hpp"
#include "kvlab/core/error.hpp"
#include "core/file_roles.hpp"
#include "core/interrupt.hpp"
#include "kvlab/core/text.hpp"

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

// An empty text value is refused too: every text option's default is "not given", so `--checkpoint ""`
// (an unset shell variable) would otherwise run on random weights and `--trace ""` write nothing, both
// with success. Only --prompt takes empty text: a prompt of no text is the BOS token alone.
void refuse_empty_text(CLI::App& app) {
    for (CLI::Option* opt : app.get_options()) {
        std::string type = opt->get_type_name();
        type = type.substr(0, type.find(':'));
        if (type != "TEXT" || opt->get_lnames() == std::vector<std::string>{"prompt"}) continue;
        opt->check(CLI::Validator([](std::string& text) -> std::string { return text.empty() ? "empty value; expected a non-empty one (an option left out takes its default)" : ""; }, ""));
    }
    for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) refuse_empty_text(*sub);
}

// "kvlab kvcalcc", "kvlab trace sumary x": CLI11 alone says "A subcommand is required". Walks the
// leading words of the command line down the subcommand tree; a word that names no subcommand where
// one is required is refused with the nearest name, or the list.
void check_subcommand_names(CLI::App& app, int argc, char** argv) {
    CLI::App* at = &app;
    std::string path = "kvlab";
    for (int i = 1; i < argc; ++i) {
        const std::string word = argv[i];
        if (word.empty() || word[0] == '-' || at->get_require_subcommand_min() == 0) return;  // options: CLI11's
        std::vector<std::string> names;
        CLI::App* next = nullptr;
        for (CLI::App* sub : at->get_subcommands([](CLI::App*) { return true; })) {
            names.push_back(sub->get_name());
            if (sub->get_name() == word) next = sub;
        }
        if (!next) {
            std::string best;
            std::size_t best_d = word.size() / 3 + 2;  // a typo, not another word
            for (const auto& n : names)
                if (const std::size_t dn = kvlab::edit_distance(word, n); dn < best_d) best = n, best_d = dn;
            const std::string hint = best.empty() ? fmt::format("expected one of: {}", fmt::join(names, ", "))
                                                  : fmt::format("did you mean '{}'?", best);
            throw kvlab::UsageError(fmt::format("unknown subcommand {} of '{}'; {} (see {} --help)", kvlab::quote(word, 40), path, hint, path));
        }
        at = next;
        path += " " + word;
    }
    if (at->get_require_subcommand_min() > 0) {
        std::vector<std::string> names;
        for (CLI::App* sub : at->get_subcommands([](CLI::App*) { return true; })) names.push_back(sub->get_name());
        throw kvlab::UsageError(fmt::format("'{}' needs a subcommand: {} (see {} --help)", path, fmt::join(names, ", "), path));
    }
}

// Inputs are sacred: the values of the options marked input_file / output_file (options.hpp) in the
// subcommands the parse reached, checked against each other before the command runs. A comma list
// (kvcalc -m a.json,b.json) is several inputs.
void check_files_given(const CLI::App& app) {
    std::vector<kvlab::NamedPath> inputs, outputs;
    for (const CLI::App* at = &app;;) {
        for (const CLI::Option* opt : at->get_options()) {
            const auto role = kvlab::cli::file_roles().find(opt);
            if (role == kvlab::cli::file_roles().end()) continue;
            const std::string flag = !opt->get_lnames().empty()   ? "--" + opt->get_lnames().front()
                                     : !opt->get_snames().empty() ? "-" + opt->get_snames().front()
                                                                  : "the " + opt->get_name() + " argument";
            for (const std::string& value : opt->results()) {
                if (role->second == kvlab::cli::FileRole::output) {
                    outputs.push_back({flag, value});
                    continue;
                }
                inputs.push_back({flag, value});
                if (value.find(',') != std::string::npos)
                    for (std::size_t at_comma = 0, next; at_comma <= value.size(); at_comma = next + 1) {
                        next = std::min(value.find(',', at_comma), value.size());
                        inputs.push_back({flag, value.substr(at_comma, next - at_comma)});
                    }
            }
        }
        if (at->get_subcommands().empty()) break;
        at = at->get_subcommands().front();
    }
    kvlab::check_file_roles(inputs, outputs);
}

// --version on kvlab and on every subcommand ("kvlab simulate --version"), from the CMake project version.
void add_version_flags(CLI::App& app) {
    app.set_version_flag("--version", "kvlab " KVLAB_VERSION);
    for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) add_version_flags(*sub);
}

// The subcommands the parse reached, "kvlab trace summary": the help to point an error to.
std::string command_path(const CLI::App& app) {
    std::string path = "kvlab";
    for (const CLI::App* at = &app; !at->get_subcommands().empty();) {
        at = at->get_subcommands().front();
        path += " " + at->get_name();
    }
    return path;
}

// CLI11 lists unexpected arguments last first ("2 --kv-heads"): put them back in command-line order;
// an unknown option of the subcommand gets the nearest option name it has.
std::string unexpected_arguments(const CLI::App& app, int argc, char** argv) {
    const std::vector<std::string> left = app.remaining(true);
    std::vector<std::string> in_order;
    for (int i = 1; i < argc; ++i)
        if (std::find(left.begin(), left.end(), argv[i]) != left.end()) in_order.emplace_back(argv[i]);
    if (!in_order.empty() && in_order[0].rfind("--", 0) == 0) {
        const std::string word = in_order[0].substr(0, in_order[0].find('='));
        const CLI::App* at = &app;
        while (!at->get_subcommands().empty()) at = at->get_subcommands().front();
        std::string best;
        std::size_t best_d = word.size() / 3 + 1;
        for (const CLI::Option* opt : at->get_options())
            for (const std::string& name : opt->get_lnames())
                if (const std::size_t d = kvlab::edit_distance(word, "--" + name); d < best_d) best = "--" + name, best_d = d;
        return fmt::format("unknown option {}{}", kvlab::quote(word, 40), best.empty() ? "" : fmt::format("; did you mean '{}'?", best));
    }
    return fmt::format("unexpected arguments: {}", kvlab::quote(fmt::format("{}", fmt::join(in_order, " ")), 80));
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"kvlab: why LLM inference caches keys and values, and what that cache costs", "kvlab"};
    app.require_subcommand(1);
    kvlab::cli::setup_kvcalc(app);
    kvlab::cli::setup_presets(app);
    kvlab::cli::setup_gpu(app);
    kvlab::cli::setup_simulate(app);
    kvlab::cli::setup_serve(app);
    kvlab::cli::setup_trace(app);
    kvlab::cli::setup_report(app);
    kvlab::cli::setup_completion(app);
    read_numbers_strictly(app);
    refuse_empty_text(app);
    add_version_flags(app);
    app.parse_complete_callback([&app] { check_files_given(app); });  // runs before the subcommand's callback
    kvlab::install_interrupt_handlers();
    kvlab::track_inputs(true);  // a command never writes over a file it has read (core/file_roles.hpp)
    try {
        check_subcommand_names(app, argc, argv);
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForVersion& e) {
        return app.exit(e);
    } catch (const CLI::ExcludesError& e) {
        std::cerr << "kvlab: error: " << kvlab::one_line(e.what()) << ": give one or the other (see " << command_path(app) << " --help)\n";
        return 2;
    } catch (const CLI::ExtrasError&) {
        std::cerr << "kvlab: error: " << kvlab::one_line(unexpected_arguments(app, argc, argv)) << " (see " << command_path(app) << " --help)\n";
        return 2;
    } catch (const CLI::ConversionError& e) {
        // a decimal integer that passed the 64-bit check but not the option's narrower type (--threads is
        // an int): CLI11 says only "Could not convert: --threads = 3000000000"
        std::string what = e.what();
        if (const auto at = what.find(" = "); what.rfind("Could not convert: ", 0) == 0 && at != std::string::npos)
            what = fmt::format("{}: {} is out of range for this option; expected a smaller number", what.substr(19, at - 19), kvlab::quote(what.substr(at + 3), 40));
        std::cerr << "kvlab: error: " << kvlab::one_line(what) << " (see " << command_path(app) << " --help)\n";
        return 2;
    } catch (const CLI::ParseError& e) {
        std::cerr << "kvlab: error: " << kvlab::one_line(e.what()) << " (see " << command_path(app) << " --help)\n";
        return 2;
    } catch (const kvlab::Error& e) {
        std::cerr << "kvlab: error: " << kvlab::one_line(e.what()) << "\n";
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
