#include "trace/perfetto_trace.hpp"

#include <algorithm>
#include <cmath>
#include <ostream>

#include <fmt/format.h>

#include "core/json_input.hpp"
#include "trace/step_trace.hpp"

namespace kvlab {

namespace {

// Chrome trace timestamps are microseconds; ns / 1000 keeps full precision as a JSON number.
double us(std::int64_t ns) { return static_cast<double>(ns) / 1000.0; }

nlohmann::json slice(const std::string& name, const char* cat, int pid, std::int64_t ts_ns, std::int64_t dur_ns,
                     nlohmann::json args) {
    return {{"name", name}, {"cat", cat},  {"ph", "X"},  {"ts", us(ts_ns)},
            {"dur", us(dur_ns)}, {"pid", pid}, {"tid", 1}, {"args", std::move(args)}};
}

nlohmann::json counter(const char* name, int pid, std::int64_t ts_ns, const char* key, std::uint64_t value) {
    return {{"name", name}, {"ph", "C"}, {"ts", us(ts_ns)}, {"pid", pid}, {"tid", 1}, {"args", {{key, value}}}};
}

}  // namespace

std::int64_t modelled_op_ns(const OpCost& c) {
    const double seconds = std::max(static_cast<double>(c.flops) / model_flop_per_s,
                                    static_cast<double>(c.bytes_total()) / model_bytes_per_s);
    return std::llround(seconds * 1e9);
}

int perfetto_pid(StepMode mode) { return mode == StepMode::cached ? 1 : 2; }

void write_perfetto_trace(std::ostream& out, const RunSummary& run, const std::vector<StepRecord>& records,
                          const nlohmann::json& inputs, bool deterministic) {
    std::vector<nlohmann::json> events;
    for (const StepMode mode : {StepMode::cached, StepMode::uncached}) {
        const bool present = std::any_of(records.begin(), records.end(), [&](const StepRecord& r) { return r.mode == mode; });
        if (!present) continue;
        const int pid = perfetto_pid(mode);
        const char* label = mode == StepMode::cached ? "cached (KV cache)" : "uncached (full recompute)";
        events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 1}, {"args", {{"name", label}}}});
        events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"tid", 1}, {"args", {{"sort_index", pid}}}});
        events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 1}, {"args", {{"name", "forward"}}}});
    }

    // Each mode's steps run back to back from t = 0, so the two processes line up step by step;
    // gaps for sampling and the logit comparison are left out.
    const auto fields = trace_op_fields(deterministic);
    std::int64_t clock_ns[2] = {0, 0};
    for (const auto& r : records) {
        const int pid = perfetto_pid(r.mode);
        std::int64_t& t0 = clock_ns[pid - 1];
        std::int64_t op_ns[n_ops];
        std::int64_t sum_ops = 0;
        for (int i = 0; i < n_ops; ++i) {
            op_ns[i] = deterministic ? modelled_op_ns(r.cost.ops[static_cast<std::size_t>(i)])
                                     : r.cost.wall_ns[static_cast<std::size_t>(i)];
            sum_ops += op_ns[i];
        }
        // measured: the forward call's time, which holds every op's; a step never ends before its ops
        const std::int64_t step_ns = deterministic ? sum_ops : std::max(r.wall_ns, sum_ops);

        const nlohmann::json full = trace_record_json(r, deterministic);
        nlohmann::json args = nlohmann::json::object();  // the step columns; per-op columns go to the op slices
        for (const auto& [key, value] : full.items())
            if (key.find('.') == std::string::npos) args[key] = value;
        if (deterministic) args["modelled_ns"] = step_ns;
        events.push_back(slice(fmt::format("step {}{}", r.step, r.step == 0 ? " (prefill)" : ""), "step", pid, t0, step_ns,
                               std::move(args)));
        std::int64_t t = t0;
        for (int i = 0; i < n_ops; ++i) {
            const Op op = static_cast<Op>(i);
            const OpCost& c = r.cost.at(op);
            if (c == OpCost{} && r.cost.wall_ns_of(op) == 0) continue;  // ops this family does not run
            nlohmann::json op_args = {{"step", r.step}};
            for (const auto& f : fields) op_args[f] = full.at(fmt::format("{}.{}", op_name(op), f));
            op_args["bytes_total"] = c.bytes_total();
            if (deterministic) op_args["modelled_ns"] = op_ns[i];
            events.push_back(slice(std::string(op_name(op)), "op", pid, t, op_ns[i], std::move(op_args)));
            t += op_ns[i];
        }
        events.push_back(counter("FLOPs per step", pid, t0, "flops", r.cost.total().flops));
        events.push_back(counter("bytes per step", pid, t0, "bytes", r.cost.total().bytes_total()));
        events.push_back(counter("KV cache resident", pid, t0, "bytes", r.kv_bytes_resident));
        t0 += step_ns;
    }

    nlohmann::json other = {
        {"kvlab_trace", trace_format_version},
        {"generator", "kvlab simulate"},
        {"time", deterministic ? "modelled" : "measured"},
        {"run", run_summary_json(run)},
        {"inputs", inputs},
    };
    if (deterministic) {
        other["time_note"] = fmt::format(
            "--deterministic: no measured time; each op lasts max(flops / F, bytes / B) on a nominal machine with "
            "F = {:g} FLOP/s and B = {:g} B/s (ridge {:g} FLOP/byte); a step lasts the sum of its ops",
            model_flop_per_s, model_bytes_per_s, model_flop_per_s / model_bytes_per_s);
    } else {
        other["time_note"] =
            "measured wall time: a step slice is the forward call; op slices are each op's measured time summed over "
            "layers, laid out in execution order from the step's start (the rest of the step is timer and bookkeeping "
            "overhead); qk, softmax and av run as one fused kernel whose measured time is split by their FLOPs";
    }
    other["layout"] = "each mode's steps back to back from t = 0 (sampling and the logit comparison left out)";

    out << "{\"traceEvents\":[\n";
    for (std::size_t i = 0; i < events.size(); ++i) out << json_dump(events[i]) << (i + 1 < events.size() ? ",\n" : "\n");
    out << "],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":" << json_dump(other) << "}\n";
}

}  // namespace kvlab
