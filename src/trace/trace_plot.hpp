// Charts of a step trace drawn by gnuplot (Debian package gnuplot-nox): per-step FLOPs, bytes moved and
// wall time, cached vs uncached, and KV-cache bytes resident. Non-goals: drawing SVG or PNG ourselves.
#pragma once
#include <filesystem>

#include "trace/step_trace.hpp"

namespace kvlab {

enum class PlotScale { log, linear };

// Where gnuplot is: $KVLAB_GNUPLOT if set, else the first `gnuplot` on PATH. Throws UnavailableError
// naming the gnuplot-nox package when there is none.
std::filesystem::path find_gnuplot();

// Writes `output` (.svg or .png, atomically). Throws UsageError for another extension or a missing
// directory, UnavailableError without gnuplot, IoError when gnuplot fails (its message included).
void plot_trace(const StepTrace& trace, const std::filesystem::path& output, PlotScale scale);

}  // namespace kvlab
