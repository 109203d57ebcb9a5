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

// The numbers behind a chart: each data column's largest value over every trace (0-based, as in the data
// file's header line), and every per-step time in ms (both modes), whose 99th percentile clips the time panel.
struct PlotStats {
    double col_max[16] = {};
    std::vector<double> step_ms;
};
// The data file gnuplot reads: per trace a block, per step a row of the columns named on its "# " line,
// '?' where a mode has no record (docs/cli-trace.md).
std::string trace_plot_data(const std::vector<PlotInput>& traces, PlotStats& stats);
// The time panel's clip: the 99th percentile of the per-step times (nearest rank) when the largest is
// more than 1.5x it (a spike that would flatten the panel), else 0 (no clip).
double time_clip_ms(std::vector<double> step_ms);

// Writes `output` (.svg or .png, atomically): eight panels (per-step FLOPs, bytes and time (clipped at
// time_clip_ms, the steps above it marked), KV resident, cumulative FLOPs, bytes and time, and the running
// speed-up uncached / cached in wall and modelled GPU time), every trace overlaid. Throws UsageError for another extension, a missing
// directory or more than max_plot_traces traces, UnavailableError without gnuplot, IoError when
// gnuplot fails (its message included).
void plot_traces(const std::vector<PlotInput>& traces, const std::filesystem::path& output, PlotScale scale);

}  // namespace kvlab
