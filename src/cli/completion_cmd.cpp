// `kvlab completion bash|zsh`: a shell completion script written from the command tree itself, so it
// names every subcommand and option there is (and no other): subcommands, options, the names a closed
// option takes (--units iec|si, read from its one_of set), preset names for -m/--model and GPU names
// for --gpu, files elsewhere. Installed by `cmake --install` for bash; zsh loads it through bashcompinit.
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "commands.hpp"
#include "options.hpp"
#include "kvlab/calc/gpu_specs.hpp"
#include "kvlab/calc/presets.hpp"

namespace kvlab::cli {

namespace {

struct Completions {
    std::map<std::string, std::string> words;   // command path -> subcommands and options
    std::map<std::string, std::string> values;  // "path option" -> the values it takes
    std::vector<std::string> parents;           // paths that take a subcommand
};

// "TEXT:{iec,si}=iec" -> "iec si"; empty when the option has no closed set.
std::string choices_of(const CLI::Option* opt) {
    const std::string type = opt->get_type_name();
    const auto open = type.find('{'), close = type.find('}');
    if (open == std::string::npos || close == std::string::npos || close < open) return {};
    std::string set = type.substr(open + 1, close - open - 1);
    for (char& c : set)
        if (c == ',') c = ' ';
    return set;
}

void collect(const CLI::App& app, const std::string& path, const std::string& presets, const std::string& gpus, Completions& out) {
    std::vector<std::string> words;
    for (const CLI::App* sub : const_cast<CLI::App&>(app).get_subcommands([](CLI::App*) { return true; })) {
        words.push_back(sub->get_name());
        collect(*sub, path + " " + sub->get_name(), presets, gpus, out);
    }
    if (!words.empty()) out.parents.push_back('"' + path + '"');
    for (const CLI::Option* opt : app.get_options()) {
        std::vector<std::string> names;
        for (const auto& s : opt->get_snames()) names.push_back("-" + s);
        for (const auto& l : opt->get_lnames()) names.push_back("--" + l);
        std::string values = choices_of(opt);
        if (values.empty() && opt->get_lnames() == std::vector<std::string>{"model"}) values = presets;
        if (values.empty() && opt->get_lnames() == std::vector<std::string>{"gpu"}) values = gpus;
        for (const auto& n : names) {
            words.push_back(n);
            if (!values.empty()) out.values[path + " " + n] = values;
        }
    }
    out.words[path] = fmt::format("{}", fmt::join(words, " "));
}

std::string bash_script(const CLI::App& app) {
    std::vector<std::string> gpu_names;
    for (const GpuSpec& g : load_gpus()) gpu_names.push_back(g.name);
    Completions c;
    collect(app, "kvlab", fmt::format("{}", fmt::join(preset_names(), " ")), fmt::format("{}", fmt::join(gpu_names, " ")), c);
    std::string paths, words, values;
    for (const auto& [path, w] : c.words) {
        if (path != "kvlab") paths += fmt::format("            \"{}\") path=\"$path $w\" ;;\n", path);
        words += fmt::format("        \"{}\") words=\"{}\" ;;\n", path, w);
    }
    for (const auto& [key, v] : c.values) values += fmt::format("        \"{}\") COMPREPLY=($(compgen -W \"{}\" -- \"$cur\")); return ;;\n", key, v);
    return fmt::format(R"(# bash completion for kvlab, written by `kvlab completion bash` from kvlab's own command tree
_kvlab() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}}
    local path=kvlab w i words=
    for ((i = 1; i < COMP_CWORD; i++)); do
        w=${{COMP_WORDS[i]}}
        case "$path $w" in
{}        esac
    done
    case "$path $prev" in
{}    esac
    case "$path" in
{}    esac
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$words" -- "$cur"))
        return
    fi
    case "$path" in
        {})
            COMPREPLY=($(compgen -W "${{words//-*/}}" -- "$cur"))
            return ;;
    esac
    COMPREPLY=($(compgen -f -- "$cur"))
}}
complete -o filenames -o bashdefault -F _kvlab kvlab
)",
                       paths, values, words, fmt::join(c.parents, "|"));
}

}  // namespace

void setup_completion(CLI::App& app) {
    auto shell = std::make_shared<std::string>("bash");
    auto* cmd = app.add_subcommand("completion", "Print a shell completion script: bash, or zsh (through bashcompinit)");
    cmd->add_option("shell", *shell, "bash or zsh")->check(one_of({"bash", "zsh"}))->capture_default_str();
    cmd->footer("Example:\n  source <(kvlab completion bash)   # or install it: cmake --install puts it in share/bash-completion");
    cmd->callback([shell, &app] {
        if (*shell == "zsh") std::cout << "# zsh: bash's completion through bashcompinit\nautoload -U +X bashcompinit && bashcompinit\n";
        std::cout << bash_script(app);
    });
}

}  // namespace kvlab::cli
