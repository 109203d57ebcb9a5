#include "kvlab/calc/gpu_specs.hpp"

#include <algorithm>
#include <cctype>
#include <limits>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "kvlab/core/error.hpp"
#include "kvlab/core/text.hpp"
#include "core/json_input.hpp"
#include "kvlab/core/mapped_file.hpp"
#include "kvlab/calc/presets.hpp"

namespace kvlab {

std::vector<GpuSpec> load_gpus() {
    const auto path = presets_dir() / "gpus.json";
    const nlohmann::json j = parse_json(read_input_file(path, "GPU table", 16 << 20), path.string());
    if (!j.contains("gpus") || !j["gpus"].is_array()) throw ConfigError(fmt::format("{}: missing array 'gpus'", path.string()));
    std::vector<GpuSpec> out;
    for (const auto& g : j["gpus"]) {
        GpuSpec s;
        try {
            s.name = g.at("name").get<std::string>();
            s.display_name = g.value("display_name", s.name);
            s.memory_bytes = g.at("memory_bytes").get<std::uint64_t>();
            s.bandwidth_bytes_per_s = g.at("memory_bandwidth_bytes_per_s").get<std::uint64_t>();
            s.fp16_dense_flops = g.at("fp16_dense_flops").get<double>();
            s.bf16_dense_flops = g.value("bf16_dense_flops", s.fp16_dense_flops);
            s.source = g.value("source", "");
            s.driver_bytes = g.value("driver_reported_bytes", std::uint64_t{0});
            s.aliases = g.value("aliases", std::vector<std::string>{});
        } catch (const nlohmann::json::exception& e) {
            throw ConfigError(fmt::format("{}: GPU entry {}: {}", path.string(), json_excerpt(g), e.what()));
        }
        if (s.memory_bytes == 0 || s.bandwidth_bytes_per_s == 0)
            throw ConfigError(fmt::format("{}: GPU {} has zero memory or bandwidth; expected positive integers", path.string(), s.name));
        out.push_back(std::move(s));
    }
    return out;
}

GpuCount split_gpu_count(std::string_view text) {
    // "2xh100", "8x a100", "2*h100": digits, then x (either case) or *, then the name
    std::size_t i = 0;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
    if (i == 0 || i == text.size() || i > 6 || (text[i] != 'x' && text[i] != 'X' && text[i] != '*')) return {1, std::string(text), false};
    std::string_view rest = text.substr(i + 1);
    while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
    return {std::stoull(std::string(text.substr(0, i))), std::string(rest), true};
}

namespace {

std::string lower(std::string_view s) {
    std::string out(s);
    std::transform(out.begin(), out.end(), out.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    return out;
}

// Up to 3 GPU names nearest `name`: a GPU one of whose names (or aliases) the input holds, or that holds
// the input ("nvidia-h100" and "h100-pcie" hold h100), comes first, the longest such name first; the rest
// by edit distance to their nearest name.
std::vector<std::string> gpu_suggestions(std::string_view name, const std::vector<GpuSpec>& gpus) {
    const std::string in = lower(name);
    std::vector<std::tuple<std::size_t, std::size_t, std::string>> scored;  // (distance, -length of a held name, GPU)
    for (const auto& g : gpus) {
        std::size_t best = std::string::npos, held = 0;
        std::vector<std::string> keys{g.name};
        keys.insert(keys.end(), g.aliases.begin(), g.aliases.end());
        for (const auto& key : keys) {
            if (!in.empty() && (in.find(key) != std::string::npos || key.find(in) != std::string::npos)) {
                best = 0;
                held = std::max(held, std::min(key.size(), in.size()));
            }
            best = std::min(best, edit_distance(in, key));
        }
        scored.emplace_back(best, std::numeric_limits<std::size_t>::max() - held, g.name);
    }
    std::sort(scored.begin(), scored.end());
    std::vector<std::string> out;
    for (std::size_t i = 0; i < scored.size() && i < 3; ++i) out.push_back(std::get<2>(scored[i]));
    return out;
}

}  // namespace

GpuSpec find_gpu(std::string_view name) {
    const auto gpus = load_gpus();
    const std::string key = lower(name);  // "H100" is h100: GPU names are not case-sensitive
    std::vector<std::string> names;
    for (const auto& g : gpus) {
        if (lower(g.name) == key || std::any_of(g.aliases.begin(), g.aliases.end(), [&](const std::string& a) { return lower(a) == key; })) return g;
        names.push_back(g.name);
    }
    if (const GpuCount count = split_gpu_count(name); count.counted)
        throw UsageError(fmt::format("--gpu: {} is {} GPUs; --gpu names one, e.g. --gpu {}; kvcalc takes the count as --gpus {} (tensor "
                                     "parallelism, the same as --tp {})",
                                     quote(name), count.n_gpus, gpu_suggestions(count.name, gpus).front(), count.n_gpus, count.n_gpus));
    throw UsageError(fmt::format("--gpu: unknown GPU {}; did you mean: {}? (known: {})", quote(name), fmt::join(gpu_suggestions(name, gpus), ", "),
                                 fmt::join(names, ", ")));
}

std::uint64_t usable_gpu_bytes(const GpuSpec& gpu) { return gpu.driver_bytes ? gpu.driver_bytes : gpu.memory_bytes; }

bool gpu_is_a100(const GpuSpec& gpu) {
    auto holds = [](std::string s) {
        std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
        return s.find("a100") != std::string::npos;
    };
    return holds(gpu.name) || holds(gpu.display_name);
}

RooflineTime roofline_time(const GpuSpec& gpu, double flops, double bytes) {
    if (gpu.bandwidth_bytes_per_s == 0 || !(gpu.bf16_dense_flops > 0))
        throw UsageError(fmt::format("GPU {}: the modelled time needs its memory bandwidth and BF16 peak, and it has no {}", quote(gpu.name),
                                     gpu.bandwidth_bytes_per_s == 0 ? "bandwidth" : "BF16 peak"));
    return {flops / gpu.bf16_dense_flops, bytes / static_cast<double>(gpu.bandwidth_bytes_per_s)};
}

}  // namespace kvlab
