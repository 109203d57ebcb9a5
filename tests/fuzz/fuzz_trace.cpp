// Fuzz target: kvlab trace files, all three formats (the reader tells CSV, JSON Lines and Perfetto JSON
// apart by content; the CTest runs this target once per format's seed corpus), then the summary report
// that `kvlab trace summary` prints from what was read.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string_view>

#include "fuzz_common.hpp"
#include "kvlab/core/printer.hpp"
#include "trace/trace_reader.hpp"
#include "trace/trace_report.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const auto path = kvlab::fuzz::write_scratch("trace.txt", std::string_view(reinterpret_cast<const char*>(data), size));
    kvlab::fuzz::expect_kvlab_errors_only([&] {
        const kvlab::StepTrace trace = kvlab::read_step_trace(path);
        std::ostringstream out;
        kvlab::print_report(out, kvlab::trace_summary_report(trace, kvlab::UnitSystem::iec), kvlab::Format::json);
    });
    return 0;
}
