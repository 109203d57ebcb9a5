// What the benches share: the median of repeats, a fixed thread team, a temporary directory for the
// files a peer program reads, and the report printed (and written as JSON with --json, atomically: a failed write leaves
// no half-written file).
#pragma once
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <string>
#include <system_error>
#include <vector>

#include <stdlib.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <omp.h>

#include "kvlab/core/error.hpp"

#include "core/atomic_write.hpp"
#include "kvlab/core/printer.hpp"
#include "session/model_source.hpp"

namespace kvlab::bench {

// The middle value (the upper middle of an even count).
inline double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// The team a bench measures with: --threads, or every core for 0, and fixed. Under libgomp's dynamic
// teams (what kvlab's own --threads 0 asks for) a loaded machine runs every region on one core while
// the report says more (docs/performance.md, "Threads on a busy machine"). Returns the thread count.
inline int fix_threads(int threads) {
    const int n_threads = threads == 0 ? omp_get_num_procs() : threads;
    set_thread_count(n_threads, true);  // refuses a negative count; a fixed team, never sized by the load
    return n_threads;
}

// A directory of its own under the system's temporary directory, removed with everything in it:
// two benches on one machine never share a file name.
class TempDir {
public:
    TempDir() {
        std::string templ = (std::filesystem::temp_directory_path() / "kvlab_bench.XXXXXX").string();
        if (!::mkdtemp(templ.data())) throw IoError(fmt::format("cannot create a temporary directory {}", templ));
        path_ = templ;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    const std::filesystem::path& path() const { return path_; }

private:
    std::filesystem::path path_;
};

// --threads, --json and --format, as every bench takes them.
inline void add_common_options(CLI::App& app, int& threads, std::string& json, std::string& format) {
    app.add_option("--threads", threads, "Threads (0 = every core)")->capture_default_str();
    app.add_option("--json", json, "Also write the report as JSON to this file");
    app.add_option("-f,--format", format, "table, csv, json or markdown")->capture_default_str();
}

inline void emit_report(const Report& report, Format format, const std::string& json) {
    print_report(std::cout, report, format);
    if (!json.empty()) write_atomically(json, "--json", [&](std::ostream& out) { print_report(out, report, Format::json); });
}

}  // namespace kvlab::bench
