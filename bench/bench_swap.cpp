// `kvlab serve --preempt swap`'s bookkeeping (docs/serving.md, "Swap or recompute"), as ratios within one
// run: the same workload served with --preempt recompute (the reference) and --preempt swap, alternately,
// `repeats` times each. Per run: the swap copies' wall time (ServeStep::swap_ns) over the run's step
// time, and each layout's bookkeeping share (schedule_ns / step time) against the reference's.
// Target: the swap copies add at most 2% of step time (median over the repeats).
// Not a test: run `build/release/bench/kvlab_bench_swap [--json FILE]`.
#include <algorithm>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <omp.h>

#include "bench_common.hpp"
#include "kvlab/core/printer.hpp"
#include "kvlab/serve/scheduler.hpp"
#include "session/serve_session.hpp"

using namespace kvlab;
using namespace kvlab::bench;

namespace {

struct Shares {
    double swap = 0.0;      // swap copies / step time
    double schedule = 0.0;  // all bookkeeping / step time
    std::int64_t swaps = 0;
};

Shares shares(const ServeResult& r) {
    std::int64_t step = 0, sched = 0, swap = 0;
    Shares s;
    for (const ServeStep& st : r.steps) {
        step += st.forward_ns + st.schedule_ns;
        sched += st.schedule_ns;
        swap += st.swap_ns;
        s.swaps += st.n_swapped_out;
    }
    s.swap = static_cast<double>(swap) / static_cast<double>(std::max<std::int64_t>(1, step));
    s.schedule = static_cast<double>(sched) / static_cast<double>(std::max<std::int64_t>(1, step));
    return s;
}

std::string spread(const std::vector<double>& v) {
    return fmt::format("{:.3f}% ({:.3f}-{:.3f}%)", 100 * median(v), 100 * *std::min_element(v.begin(), v.end()),
                       100 * *std::max_element(v.begin(), v.end()));
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"kvlab bench: serve --preempt swap's bookkeeping against --preempt recompute in the same run"};
    int repeats = 5, threads = 0;
    std::string budget = "512KiB", json, format = "table";
    std::int64_t requests = 16;
    app.add_option("-r,--repeats", repeats, "Runs of each mode, alternated")->capture_default_str();
    app.add_option("--requests", requests, "Requests of serve's default lengths on tiny-llama")->capture_default_str();
    app.add_option("--kv-budget", budget, "The pool (small enough to preempt)")->capture_default_str();
    add_common_options(app, threads, json, format);
    CLI11_PARSE(app, argc, argv);
    try {
        const int n_threads = fix_threads(threads);
        ServeCommand c;
        c.requests = requests;
        c.kv_budget = budget;
        c.layout = LayoutChoice::paged;
        c.quiet = true;
        c.threads = n_threads;
        const PreparedServe recompute = prepare_serve(c);
        c.preempt = PreemptMode::swap;
        const PreparedServe swap = prepare_serve(c);
        std::vector<double> swap_share, swap_sched, ref_sched;
        std::int64_t swaps = 0;
        for (int i = 0; i < repeats; ++i) {
            ref_sched.push_back(shares(run_serving(recompute.config, recompute.weights, recompute.requests, recompute.runs.front())).schedule);
            const Shares s = shares(run_serving(swap.config, swap.weights, swap.requests, swap.runs.front()));
            swap_share.push_back(s.swap);
            swap_sched.push_back(s.schedule);
            swaps = s.swaps;
        }
        Report report;
        Table t;
        t.title = fmt::format("serve --preempt swap vs recompute: tiny-llama, {} requests, {} pool, {} threads, {} runs each ({} swaps a run)",
                              requests, budget, n_threads, repeats, swaps);
        t.columns = {{"figure", "figure", false}, {"median", "median (min-max)"}};
        t.rows.push_back({text_cell("swap copies / step time"), text_cell(spread(swap_share))});
        t.rows.push_back({text_cell("bookkeeping / step time, swap"), text_cell(spread(swap_sched))});
        t.rows.push_back({text_cell("bookkeeping / step time, recompute (reference)"), text_cell(spread(ref_sched))});
        t.notes.push_back("measured wall time on this host: the shares vary from run to run; the byte counts behind them are exact");
        t.notes.push_back(fmt::format("target: the swap copies add at most 2% of step time: median {:.3f}%, {}", 100 * median(swap_share),
                                      median(swap_share) <= 0.02 ? "met" : "NOT met"));
        report.tables.push_back(std::move(t));
        emit_report(report, parse_choice(format_choices, format, "--format"), json);
    } catch (const std::exception& e) {
        fmt::print(stderr, "kvlab_bench_swap: {}\n", e.what());
        return 1;
    }
    return 0;
}
