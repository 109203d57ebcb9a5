// Reading step traces back (CSV, JSON Lines or Perfetto JSON, told apart by content, not by name) into
// the records and run summary simulate wrote, checking every value. Non-goals: other tools' traces.
#pragma once
#include <filesystem>

#include "trace/step_trace.hpp"

namespace kvlab {

// Throws FormatError naming the file and line for empty, truncated, mixed-format, wrong-column or
// inconsistent files (totals that are not the sum of their ops, steps out of order), IoError if unreadable.
StepTrace read_step_trace(const std::filesystem::path& path);

}  // namespace kvlab
