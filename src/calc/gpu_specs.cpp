#include "kvlab/calc/gpu_specs.hpp"

#include <algorithm>
#include <cctype>

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

GpuSpec find_gpu(std::string_view name) {
    const auto gpus = load_gpus();
    std::vector<std::string> names;
    for (const auto& g : gpus) {
        if (g.name == name || std::find(g.aliases.begin(), g.aliases.end(), name) != g.aliases.end()) return g;
        names.push_back(g.name);
    }
    throw UsageError(fmt::format("--gpu: unknown GPU {}; did you mean: {}? (known: {})", quote(name), fmt::join(closest_names(name, names, 3), ", "),
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
