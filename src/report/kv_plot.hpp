// `kvlab kvcalc --plot`: the chart people expect from a KV calculator, KV-cache memory against context
// length, one line per model, attention layout, KV dtype and batch of the request (windows and paging
// applied as in the tables), and with --gpu the memory the KV cache may use on it. Drawn by gnuplot.
#pragma once
#include <filesystem>

#include "calc/kvcalc.hpp"

namespace kvlab {

inline constexpr std::size_t max_kv_plot_series = 12;

// Writes `output` (.svg or .png, atomically). x: context from 0 to the largest --context (else the
// largest model maximum, else 4096); y: KV bytes per GPU for the batch, in one binary unit. Throws
// UsageError (bad extension, more than max_kv_plot_series lines), UnavailableError without gnuplot.
void plot_kv_memory(const KvcalcRequest& request, const std::filesystem::path& output);

}  // namespace kvlab
