// Charts of step traces drawn by gnuplot (Debian package gnuplot-nox): per-step FLOPs, bytes moved and
// wall time, cached vs uncached, KV-cache bytes resident, and the running totals that show cached work
// growing linearly and uncached work quadratically; several traces (MHA vs GQA) overlaid. Non-goals: drawing SVG or PNG ourselves.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "report/gnuplot.hpp"  // find_gnuplot
#include "trace/step_trace.hpp"

namespace kvlab {

enum class PlotScale { log, linear };

// One trace on a chart, with the label its series carry when several traces share the chart ("mha").
struct PlotInput {
    const StepTrace* trace;
    std::string label;
};
inline constexpr std::size_t max_plot_traces = 6;  // gnuplot -c passes at most 9 arguments: data, title, 6 labels (+1 spare)

// Writes `output` (.svg or .png, atomically): six panels (per-step FLOPs, bytes and time, KV resident,
// cumulative FLOPs and bytes), every trace overlaid. Throws UsageError for another extension, a missing
// directory or more than max_plot_traces traces, UnavailableError without gnuplot, IoError when
// gnuplot fails (its message included).
void plot_traces(const std::vector<PlotInput>& traces, const std::filesystem::path& output, PlotScale scale);

}  // namespace kvlab
