// kvlab_bench_weight_dtype: cached decode speed with the weights read narrow (simulate --weight-dtype),
// as ratios to fp32 measured in the same run. A decode step of a model whose weights do not fit the
// CPU's caches streams every weight from DRAM once, so its speed should follow the bytes: the target
// (issue "Performance that holds on any host") is bf16 >= 1.7x fp32's tokens/s on stories110M's shape.
// The formats run in turn within each repeat (forwards, then backwards), medians reported.
// With KVLAB_PEER_RUNQ set to a llama2.c runq.c binary (built -Ofast -march=native -fopenmp), the same
// weights also go to runq as its int8 checkpoint (llama2.c v2) and the two int8 paths' decode speeds
// are compared, alternating runs, the same threads (OMP_NUM_THREADS): per decoded token, and the whole
// process (kvlab's CLI, which quantizes the fp32 checkpoint at load) at 1 and 2 threads.
// docs/performance.md, "Weight precision".
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <vector>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <omp.h>

#include "bench_common.hpp"
#include "child_process.hpp"
#include "kvlab/calc/presets.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/core/printer.hpp"
#include "kvlab/core/units.hpp"
#include "formats/llama2c_checkpoint.hpp"
#include "kernels/narrow_weights.hpp"
#include "kvlab/weights/random_weights.hpp"
#include "kvlab/sim/simulator.hpp"

using namespace kvlab;
using kvlab::bench::median;

namespace {

struct DecodeRate {
    double tokens_per_s = 0.0;
    double weight_bytes_per_step = 0.0;  // counted, at the stored width
};

// Decode steps (1..) of one run.
DecodeRate decode_rate(const SimulationResult& r) {
    std::int64_t ns = 0, n = 0;
    std::uint64_t bytes = 0;
    for (const StepRecord& rec : r.records)
        if (rec.step > 0) {
            ns += rec.wall_ns;
            bytes += rec.cost.total().bytes_weights_read;
            ++n;
        }
    return {static_cast<double>(n) / (static_cast<double>(ns) * 1e-9), static_cast<double>(bytes) / static_cast<double>(n)};
}

// kvlab's q8_0 beside runq.c on the same weights, greedy from BOS over the same positions, two ways:
// decode tok/s (each program's own timing of its forwards; kvlab in this process, runq as a child, in
// turn) at the bench's thread count, and the whole process (kvlab's CLI loading the fp32 checkpoint and
// quantizing it, against runq loading its int8 one) in alternating pairs at 1 and 2 threads.
std::vector<Table> peer_tables(const ModelConfig& cfg, const Weights& w, int n_threads, int repeats, std::int64_t steps) {
    Table t;
    t.title = fmt::format("q8_0 vs llama2.c runq.c (int8, its own groups of {} with fp32 scales): {}, {} steps from BOS, {} thread{}",
                          llama2c_v2_group_size(cfg), cfg.display_name, steps, n_threads, n_threads == 1 ? "" : "s");
    t.columns = {{"program", "program", false}, {"tokens_per_s", "decode tok/s"}, {"vs_runq", "vs runq.c"}, {"threads", "threads (kvlab) / cores (runq)"},
                 {"met", "kvlab >= runq.c", false}};
    const bench::PeerProgram runq = bench::find_peer("KVLAB_PEER_RUNQ", "runq.c");
    if (!runq.skipped.empty()) {
        t.notes.push_back("skipped: " + runq.skipped);
        return {t};
    }
    const std::filesystem::path &runq_path = runq.binary, &tokenizer = runq.tokenizer;
    const bench::TempDir dir;  // unique: two benches on one machine do not collide
    const std::filesystem::path ckpt = dir.path() / "model_q80.bin", fp32_ckpt = dir.path() / "model.bin";
    save_llama2c_v2(ckpt, cfg, w);
    save_llama2c_v0(fp32_ckpt, cfg, w);
    const std::string n = std::to_string(steps);
    const std::vector<std::string> runq_args = {runq_path.string(), ckpt.string(), "-z", tokenizer.string(), "-t", "0", "-n", n};
    auto omp_env = [](int threads) { return std::vector<std::string>{"OMP_NUM_THREADS=" + std::to_string(threads)}; };
    std::string command = "OMP_NUM_THREADS=" + std::to_string(n_threads);
    for (const auto& a : runq_args) command += " " + a;
    std::vector<double> ours, theirs, their_cores;
    for (int r = 0; r < repeats; ++r) {
        SimulateOptions o;
        o.mode = SimMode::cached;
        o.prompt_ids = {1};      // BOS, as runq's empty prompt
        o.n_steps = steps;       // positions 0..steps-1, the forwards runq runs for -n steps
        o.weight_dtype = DType::q8_0;
        o.quality = false;       // alone, as runq runs
        ours.push_back(decode_rate(run_simulation(cfg, w, o)).tokens_per_s);
        const bench::ChildRun c = bench::run_child(runq_args, omp_env(n_threads));
        theirs.push_back(bench::peer_tokens_per_s(c, command));
        their_cores.push_back(c.cpu_s / c.wall_s);
    }
    const double a = median(ours), b = median(theirs), cores = median(their_cores);
    const bool peer_threads_real = n_threads == 1 || cores >= 0.75 * n_threads;
    t.rows.push_back({text_cell("kvlab --weight-dtype q8_0"), real_cell(a, 1), ratio_cell(a / b), int_cell(n_threads),
                      text_cell(!peer_threads_real ? "not compared" : a >= b ? "met" : "not met")});
    t.rows.push_back({text_cell("llama2.c runq.c"), real_cell(b, 1), ratio_cell(1.0), real_cell(cores, 2), text_cell("-")});
    t.notes.push_back(fmt::format("runq: {}", command));
    t.notes.push_back("per decoded token (each program's own timing of its forwards); kvlab widens q8_0 weights to fp32 in its GEMV, runq "
                      "also quantizes the activations and multiplies int8 by int8; runq's cores = its CPU time / wall time");
    if (!peer_threads_real)
        t.notes.push_back(fmt::format("runq used {:.2f} cores of {}: built without -fopenmp? Not compared", cores, n_threads));

    std::vector<bench::WholeProcess> whole;
    for (const int threads : {1, 2}) {
        const std::vector<std::string> kvlab_args = {KVLAB_CLI_PATH, "simulate", "-q", "--checkpoint", fp32_ckpt.string(), "--mode", "cached",
                                                     "--prompt-ids", "1", "-n", n, "--threads", std::to_string(threads),
                                                     "--weight-dtype", "q8_0", "--no-quality", "-f", "json"};
        whole.push_back(bench::compare_whole_process(threads, repeats, kvlab_args, runq_args, omp_env(threads), "runq.c"));
    }
    Table wt = bench::whole_process_table(fmt::format("whole process, q8_0 vs llama2.c runq.c: {}, start, load, {} steps, exit (pairs in "
                                                      "alternating order, medians)", cfg.display_name, steps),
                                          whole, "runq.c", 0.0, [](bool) { return text_cell("-"); });
    wt.notes.insert(wt.notes.begin(), "kvlab: simulate --checkpoint (the fp32 llama2.c file) --weight-dtype q8_0 --no-quality: it reads the fp32 weights "
                       "in place (mapped) and quantizes them at load into fresh huge pages; runq maps its int8 file (llama2.c v2) of the "
                       "same weights and uses it in place, but for the token embedding, widened to fp32 into its heap");
    return {t, wt};
}

}  // namespace

int main(int argc, char** argv) {
    std::string model = "stories110m", dtypes = "fp32,bf16,fp16,q8_0", format = "table", json;
    std::int64_t prompt = 16, steps = 16, peer_steps = 128;
    int repeats = 5, threads = 0;
    CLI::App app{"kvlab weight storage speed benchmark: cached decode per --weight-dtype, as ratios to fp32"};
    app.add_option("-m,--model", model, "Preset whose shape runs (random weights)")->capture_default_str();
    app.add_option("--weight-dtype", dtypes, "Formats; fp32 is added first if missing")->capture_default_str();
    app.add_option("-p,--prompt-len", prompt, "Prompt tokens")->check(CLI::Range(1, 4096))->capture_default_str();
    app.add_option("-n,--steps", steps, "Decode steps measured per run")->check(CLI::Range(2, 4096))->capture_default_str();
    app.add_option("--peer-steps", peer_steps, "runq.c comparison: tokens from BOS (runq -n)")->check(CLI::Range(3, 100000))->capture_default_str();
    app.add_option("-r,--repeats", repeats, "Runs per format; medians are reported")->check(CLI::PositiveNumber)->capture_default_str();
    bench::add_common_options(app, threads, json, format);
    CLI11_PARSE(app, argc, argv);
    try {
        const Format fmt_out = parse_choice(format_choices, format, "--format");
        if (!json.empty()) check_output_path(json, "--json");
        const int n_threads = bench::fix_threads(threads);
        const ModelConfig cfg = load_preset(model);
        std::vector<DType> list{DType::fp32};
        for (const auto& d : split_list(dtypes))
            if (const DType t = parse_dtype(d, "--weight-dtype"); t != DType::fp32) {
                check_weight_dtype(t);
                check_weight_shapes(cfg, t);
                list.push_back(t);
            }
        const Weights w = random_weights(cfg, 7);
        std::vector<std::vector<double>> rates(list.size());
        std::vector<double> bytes(list.size());
        for (int r = 0; r < repeats; ++r)
            for (std::size_t j = 0; j < list.size(); ++j) {
                const std::size_t i = r % 2 ? list.size() - 1 - j : j;  // forwards, then backwards: no format always first
                SimulateOptions o;
                o.mode = SimMode::cached;
                o.n_prompt = prompt;
                o.n_steps = steps + 1;  // step 0 is the prefill
                o.weight_dtype = list[i];
                o.prompt_ids = simulation_prompt(cfg, o);
                const DecodeRate d = decode_rate(run_simulation(cfg, w, o));
                rates[i].push_back(d.tokens_per_s);
                bytes[i] = d.weight_bytes_per_step;
            }
        Report report;
        report.inputs = {{"model", cfg.name}, {"prompt_len", prompt}, {"steps", steps}, {"repeats", repeats}, {"threads", n_threads}};
        Table t;
        t.title = fmt::format("Cached decode per weight storage: {} (random weights), {} prompt tokens, {} steps, {} runs each, {} thread{}",
                              cfg.display_name, prompt, steps, repeats, n_threads, n_threads == 1 ? "" : "s");
        t.columns = {{"weight_dtype", "weights", false}, {"weight_bytes_per_step", "weights read/step"}, {"bytes_vs_fp32", "bytes vs fp32"},
                     {"tokens_per_s", "decode tok/s"},   {"speed_vs_fp32", "tok/s vs fp32"},          {"weight_bytes_per_s", "weights read/s"},
                     {"met", "bf16 >= 1.7x fp32", false}};
        const double fp32_rate = median(rates[0]);
        for (std::size_t i = 0; i < list.size(); ++i) {
            const double rate = median(rates[i]), speed = rate / fp32_rate;
            t.rows.push_back({text_cell(std::string(dtype_name(list[i]))), bytes_cell(static_cast<std::uint64_t>(bytes[i]), UnitSystem::iec),
                              ratio_cell(bytes[i] / bytes[0]), real_cell(rate, 1), ratio_cell(speed),
                              bytes_cell(static_cast<std::uint64_t>(bytes[i] * rate), UnitSystem::si),
                              text_cell(list[i] != DType::bf16 ? "-" : speed >= 1.7 ? "met" : "not met")});
        }
        t.notes.push_back("weights read/step: the counted bytes of a decode step's weights at the stored width (block scales included; the "
                          "embedding row and norms stay fp32); weights read/s = that x decode tok/s");
        t.notes.push_back("a narrow run also decodes the same tokens with the fp32 weights for its quality figures, outside the timed forward");
        report.tables.push_back(std::move(t));
        if (cfg.family == Family::llama && std::find(list.begin(), list.end(), DType::q8_0) != list.end())
            for (Table& pt : peer_tables(cfg, w, n_threads, repeats, peer_steps)) report.tables.push_back(std::move(pt));
        bench::emit_report(report, fmt_out, json);
    } catch (const kvlab::Error& e) {
        std::cerr << "kvlab_bench_weight_dtype: error: " << e.what() << "\n";
        return e.exit_code();
    }
    return 0;
}
