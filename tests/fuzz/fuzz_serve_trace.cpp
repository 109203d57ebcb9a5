// Fuzz target: kvlab serve traces (CSV and JSON Lines, told apart by content), then the summary and the
// chart data `kvlab trace summary` and `trace plot` build from what was read.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string_view>

#include "fuzz_common.hpp"
#include "kvlab/core/printer.hpp"
#include "trace/serve_trace.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    kvlab::fuzz::expect_kvlab_errors_only([&] {
        const kvlab::ServeTrace trace = kvlab::parse_serve_trace(text, "serve trace");
        std::ostringstream out;
        kvlab::print_report(out, kvlab::serve_trace_summary(trace, kvlab::UnitSystem::iec, kvlab::Format::json), kvlab::Format::json);
    });
    return 0;
}
