// The tables of `kvlab trace`: the cached-vs-uncached summary (simulate's own table, rebuilt from a
// trace), the per-step table with its per-op breakdown, and the comparison of two traces.
// Non-goals: reading files (trace_reader does that), plots (trace_plot).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kvlab/core/printer.hpp"
#include "trace/step_trace.hpp"

namespace kvlab {

// The steps a table shows: 0, every, 2*every, ... and always the last. Throws UsageError naming
// --every unless every >= 1.
std::vector<std::int64_t> steps_shown(std::int64_t n_steps, std::int64_t every);

// simulation_report on the trace's records, run summary and inputs: the table simulate printed.
Report trace_summary_report(const StepTrace& trace, UnitSystem units);

// One row per shown step per mode; with `ops`, a second table with one row per op that ran.
Report trace_steps_report(const StepTrace& trace, std::int64_t every, bool ops, UnitSystem units);

// Totals per mode and per-step values of B against A: B - A and B / A. Steps compared are those both
// traces have; `label_a` and `label_b` name the files.
Report trace_compare_report(const StepTrace& a, const StepTrace& b, const std::string& label_a, const std::string& label_b,
                            std::int64_t every, UnitSystem units);

}  // namespace kvlab
