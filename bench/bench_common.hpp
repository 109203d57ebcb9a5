// What the benches share: the median of repeats, and the report printed (and written as JSON with
// --json, atomically: a failed write leaves no half-written file).
#pragma once
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "core/atomic_write.hpp"
#include "core/printer.hpp"

namespace kvlab::bench {

// The middle value (the upper middle of an even count).
inline double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

inline void emit_report(const Report& report, Format format, const std::string& json) {
    print_report(std::cout, report, format);
    if (!json.empty()) write_atomically(json, "--json", [&](std::ostream& out) { print_report(out, report, Format::json); });
}

}  // namespace kvlab::bench
