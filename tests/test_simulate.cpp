#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
#include <sys/resource.h>
#include <unistd.h>

#include <omp.h>

#include <nlohmann/json.hpp>

#include "kvlab/core/core_use.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/calc/kv_memory.hpp"
#include "kernels/matmul.hpp"
#include "kvlab/weights/random_weights.hpp"
#include "report/simulation_report.hpp"
#include "session/model_source.hpp"
#include "kvlab/sim/simulator.hpp"
#include "trace/step_trace.hpp"
#include "trace/trace_plot.hpp"
#include "kvlab/formats/checkpoint.hpp"
#include "kvlab/formats/npy.hpp"
#include "test_paths.hpp"
#include "sim_configs.hpp"
#include "test_files.hpp"
#include "test_support.hpp"

using namespace kvlab;
using kvlab::test::tiny_config;
namespace fs = std::filesystem;

namespace {

SimulateOptions small_options() {
    SimulateOptions o;
    o.n_prompt = 5;
    o.n_steps = 9;
    return o;
}

using kvlab::test::slurp;

fs::path temp_dir() {
    const fs::path dir = fs::temp_directory_path() / fmt::format("kvlab-test-sim-{}", ::getpid());
    fs::create_directories(dir);
    return dir;
}

}  // namespace

TEST_CASE("Both modes decode the same tokens with matching logits and one record per step per mode") {
    for (const auto& cfg : {tiny_config(Family::llama, 4, 2), tiny_config(Family::gpt2, 3, 3), tiny_config(Family::llama, 4, 1, 2, 3)}) {
        INFO(cfg.name);
        const Weights w = random_weights(cfg, 4, 0.2f);
        const auto r = run_simulation(cfg, w, small_options());
        CHECK(r.n_steps_done == 9);
        CHECK(r.records.size() == 18);
        CHECK(r.generated.size() == 9);
        CHECK_FALSE(r.first_divergent_step.has_value());
        CHECK(r.max_abs_dlogit < 1e-4);
        // cached alone and uncached alone produce the tokens of the lockstep run
        for (const SimMode m : {SimMode::cached, SimMode::uncached}) {
            auto o = small_options();
            o.mode = m;
            CHECK(run_simulation(cfg, w, o).generated == r.generated);
        }
        // step 0 is the prefill: the cached mode runs the whole prompt, then one token per step
        CHECK(r.records[0].mode == StepMode::cached);
        CHECK(r.records[0].n_tokens == 5);
        CHECK(r.records[2].n_tokens == 1);
        CHECK(r.records[3].mode == StepMode::uncached);
        CHECK(r.records[3].n_tokens == 6);  // prompt + one generated token
        CHECK(r.records[17].position == 5 + 8 - 1);
        CHECK(r.records[17].cost == closed_form_step_cost(cfg, StepMode::uncached, 0, 13));
        // 5 prompt + 9 steps - 1: the last generated token is never fed back, so it needs no K and V
        CHECK(r.kv_cache_bytes == kv_bytes_sequence(cfg, DType::fp32, 13, WindowMode::cap).total());
    }
}

TEST_CASE("A stop request ends the run after the current step with the steps done so far") {
    const auto cfg = tiny_config(Family::llama, 4, 2);
    const Weights w = random_weights(cfg, 4);
    std::atomic<bool> stop{false};
    auto o = small_options();
    o.stop = &stop;
    o.on_step = [&](std::int64_t done, std::int64_t) {
        if (done == 3) stop.store(true);
    };
    const auto r = run_simulation(cfg, w, o);
    CHECK(r.interrupted);
    CHECK(r.n_steps_done == 3);
    CHECK(r.records.size() == 6);
}

TEST_CASE("Counting can be switched off without changing the tokens") {
    const auto cfg = tiny_config(Family::llama, 4, 2);
    const Weights w = random_weights(cfg, 4);
    auto o = small_options();
    const auto counted = run_simulation(cfg, w, o);
    o.count = false;
    const auto silent = run_simulation(cfg, w, o);
    CHECK(silent.generated == counted.generated);
    CHECK(silent.records[4].cost.total().flops == 0);
    CHECK(counted.records[4].cost.total().flops > 0);
}

TEST_CASE("Bad sizes and contexts are refused before any work") {
    const auto cfg = tiny_config(Family::llama, 4, 2);  // 64 positions of context
    auto o = small_options();
    o.n_prompt = 60;
    o.n_steps = 6;  // 60 + 6 - 1 = 65 positions
    CHECK_THROWS_WITH_AS(simulation_positions(cfg, o), doctest::Contains("exceed the context"), UsageError);
    o.n_steps = 5;  // 60 + 5 - 1 = 64: the 5th token is generated from position 63 and never fed back
    CHECK(simulation_positions(cfg, o) == 64);
    o.n_prompt = 0;
    CHECK_THROWS_AS(simulation_positions(cfg, o), UsageError);
    o.n_prompt = 5;
    o.n_steps = 0;
    CHECK_THROWS_AS(simulation_positions(cfg, o), UsageError);
    o.n_steps = -3;
    CHECK_THROWS_AS(simulation_positions(cfg, o), UsageError);
    o.n_steps = 4;
    o.prompt_ids = {1, 2, 50};
    CHECK_THROWS_WITH_AS(simulation_positions(cfg, o), doctest::Contains("--prompt-ids"), UsageError);
}

TEST_CASE("Mixture-of-experts and MLA configs are refused; --layers keeps the real layer shapes") {
    CHECK_THROWS_WITH_AS(simulation_config(load_preset("mixtral-8x7b"), std::nullopt), doctest::Contains("not simulated"), ConfigError);
    CHECK_THROWS_WITH_AS(simulation_config(test::data_config("deepseek-mla.json"), std::nullopt), doctest::Contains("MLA"),
                         ConfigError);
    const auto full = load_preset("llama-3-8b");
    const auto two = simulation_config(full, 2);
    CHECK(two.n_layer == 2);
    CHECK(two.d_model == full.d_model);
    CHECK(two.n_head_kv == full.n_head_kv);
    CHECK(two.layer_windowed.size() == 2);
    CHECK_THROWS_AS(simulation_config(full, 0), UsageError);
    CHECK_THROWS_AS(simulation_config(full, 33), UsageError);
}

TEST_CASE("The memory check refuses a run over the limit and suggests how many layers fit") {
    const auto cfg = load_preset("llama-3-8b");
    const SimulateOptions o{.mode = SimMode::both, .n_prompt = 32, .n_steps = 32};
    const auto e = estimate_simulation_memory(cfg, o);
    CHECK(e.weights == weights_bytes(cfg));
    CHECK(e.weights == 8030261248ull * 4);  // Llama-3-8B's published 8,030,261,248 parameters in fp32
    CHECK(e.kv_cache == kv_bytes_sequence(cfg, DType::fp32, 63, WindowMode::cap).total());  // 32 + 32 - 1 positions
    CHECK(e.activations == Transformer::activation_bytes(cfg, {63, 63, true}));
    CHECK_THROWS_WITH_AS(check_simulation_memory(cfg, o, 8ull << 30), doctest::Contains("--layers"), UsageError);
    CHECK(check_simulation_memory(cfg, o, e.total()).total() == e.total());
}

TEST_CASE("A cached-only run sizes its activations for the prompt, not the whole sequence") {
    const auto cfg = load_preset("stories15m");
    SimulateOptions o{.mode = SimMode::cached, .n_prompt = 32, .n_steps = 128};
    const TransformerSize cached = simulation_size(cfg, o);
    CHECK(cached.n_positions == 159);  // 32 prompt + 128 steps - 1 (the last token is not fed back)
    CHECK(cached.n_tokens == 32);      // the prefill call is the widest
    CHECK_FALSE(cached.uncached);
    o.mode = SimMode::uncached;
    const TransformerSize uncached = simulation_size(cfg, o);
    CHECK(uncached.n_tokens == 159);
    CHECK(uncached.uncached);
    o.mode = SimMode::cached;
    const auto e_cached = estimate_simulation_memory(cfg, o);
    o.mode = SimMode::both;
    const auto e_both = estimate_simulation_memory(cfg, o);
    // 32 + 128 - 1 = 159 positions: (159 - 32) fewer rows of x, xb, q, att, k_new, v_new, gate, up, and no
    // k_act/v_act (159 rows each): 4 * (127 * (2*288 + 2*288 + 2*288 + 2*768) + 159 * 2*288)
    // = 4 * (127 * 3264 + 91584) = 2024448 B; plus each thread's GEMM token tile for the widest input
    // (f = 768) packs up to 159 instead of 32 tokens (a tile is capped at 4 SIMD registers of tokens, so
    // the difference depends on the build)
    const std::int64_t tile_floats = gemm_scratch_floats(768, 159) - gemm_scratch_floats(768, 32);
    CHECK(e_both.activations - e_cached.activations == 2024448 + omp_get_max_threads() * 4 * tile_floats);
}

TEST_CASE("CSV and JSONL traces parse back with one record per step per mode and documented columns") {
    const auto cfg = tiny_config(Family::llama, 4, 2);
    const Weights w = random_weights(cfg, 4);
    const auto r = run_simulation(cfg, w, small_options());
    const nlohmann::json inputs = {{"model", cfg.name}, {"steps", 9}};
    const fs::path dir = temp_dir();

    const RunSummary run = run_summary(cfg, small_options(), r);
    write_step_trace(dir / "t.csv", run, r.records, inputs, false);
    std::istringstream csv(slurp(dir / "t.csv"));
    std::string line;
    std::vector<std::string> comments, rows;
    while (std::getline(csv, line)) (line.rfind("#", 0) == 0 ? comments : rows).push_back(line);
    CHECK(comments.size() == 2 + run_summary_json(run).size() + 2);  // title, units, run summary, two inputs
    REQUIRE(rows.size() == 1 + 18);
    const auto columns = trace_columns(false);
    std::string header;
    for (std::size_t i = 0; i < columns.size(); ++i) header += (i ? "," : "") + columns[i];
    CHECK(rows[0] == header);
    CHECK(rows[1].rfind("cached,0,prefill,4,5,", 0) == 0);  // mode, step, phase, position, n_tokens

    write_step_trace(dir / "t.jsonl", run, r.records, inputs, false);
    std::istringstream jsonl(slurp(dir / "t.jsonl"));
    std::vector<nlohmann::json> lines;
    while (std::getline(jsonl, line)) lines.push_back(nlohmann::json::parse(line));
    REQUIRE(lines.size() == 1 + 18);
    CHECK(lines[0]["kvlab_trace"] == trace_format_version);
    CHECK(lines[0]["inputs"]["model"] == cfg.name);
    const auto& last = lines[18];
    CHECK(last["mode"] == "uncached");
    CHECK(last["step"] == 8);
    CHECK(last["flops"].get<std::uint64_t>() == r.records[17].cost.total().flops);
    CHECK(last["n_keys"] == 13);
    CHECK(last.contains("wall_ns"));
    for (const auto& c : columns) CHECK(last.contains(c));
    for (const auto& entry : fs::directory_iterator(dir)) CHECK(entry.path().filename().string()[0] != '.');  // no temp left
    fs::remove_all(dir);
}

TEST_CASE("Deterministic traces of two runs are byte-identical and carry no wall time") {
    const auto cfg = tiny_config(Family::gpt2, 3, 3);
    const Weights w = random_weights(cfg, 4);
    const fs::path dir = temp_dir();
    for (const char* name : {"a.csv", "b.csv", "a.jsonl", "b.jsonl", "a.json", "b.json"}) {
        const auto r = run_simulation(cfg, w, small_options());
        write_step_trace(dir / name, run_summary(cfg, small_options(), r), r.records, {{"seed", 4}}, true);
    }
    CHECK(slurp(dir / "a.csv") == slurp(dir / "b.csv"));
    CHECK(slurp(dir / "a.jsonl") == slurp(dir / "b.jsonl"));
    CHECK(slurp(dir / "a.json") == slurp(dir / "b.json"));  // Perfetto: modelled time, no measurement
    CHECK(slurp(dir / "a.csv").find(",wall_ns") == std::string::npos);  // the column, not the units line
    fs::remove_all(dir);
}

TEST_CASE("An unwritable or misnamed trace path is refused before any work") {
    CHECK_THROWS_WITH_AS(check_trace_writable("/nonexistent-dir-kvlab/t.csv"), doctest::Contains("does not exist"), UsageError);
    CHECK_THROWS_WITH_AS(check_trace_writable("trace.txt"), doctest::Contains(".csv, .jsonl or .json"), UsageError);
    const fs::path dir = temp_dir();
    CHECK_NOTHROW(check_trace_writable(dir / "ok.csv"));
    CHECK(fs::is_empty(dir));  // the probe file is removed
    fs::remove_all(dir);
}

TEST_CASE("The report shows cached and uncached side by side with their ratio") {
    const auto cfg = tiny_config(Family::llama, 4, 2);
    const Weights w = random_weights(cfg, 4);
    const auto o = small_options();
    const auto r = run_simulation(cfg, w, o);
    const Report report = simulation_report(cfg, o, r, {{"model", cfg.name}}, UnitSystem::iec);
    REQUIRE(report.tables.size() == 1);
    const Table& t = report.tables[0];
    REQUIRE(t.columns.size() == 4);
    CHECK(t.columns[3].key == "uncached_over_cached");
    const auto cached = mode_totals(r.records, StepMode::cached), uncached = mode_totals(r.records, StepMode::uncached);
    CHECK(uncached.cost.flops > cached.cost.flops);
    CHECK(t.rows[2][1].value == cached.cost.flops);  // the FLOPs row
    bool growth = false;
    for (const auto& n : t.notes) growth = growth || n.find("step 1 -> step 8") != std::string::npos;
    CHECK(growth);
}

TEST_CASE("A fixed team that ran on far fewer cores than its threads is named in a note, and only then") {
    // The clock against two other readings of the same quantities over the same span: getrusage's CPU
    // time (user + system, every thread: OpenMP workers of earlier tests may still spin) and std::chrono's
    // steady clock. 50 ms of arithmetic on this thread makes the span long enough to compare.
    auto rusage_ns = [] {
        rusage u{};
        getrusage(RUSAGE_SELF, &u);
        return (static_cast<std::int64_t>(u.ru_utime.tv_sec) + u.ru_stime.tv_sec) * 1'000'000'000 +
               (static_cast<std::int64_t>(u.ru_utime.tv_usec) + u.ru_stime.tv_usec) * 1'000;
    };
    // The wall time is bracketed by steady-clock readings taken around the clock's start and its last
    // reading (the steady clock is monotonic: an exact ordering, whatever the machine's load)
    const std::int64_t cpu0 = rusage_ns();
    const auto wall0 = std::chrono::steady_clock::now();
    const CoreUseClock clock;
    const auto wall1 = std::chrono::steady_clock::now();
    volatile double x = 1.0;
    CoreUse use;
    std::chrono::steady_clock::time_point before_last;
    for (;;) {
        before_last = std::chrono::steady_clock::now();
        if ((use = clock.elapsed()).cpu_ns >= 50'000'000) break;
        x = x * 1.0000001 + 1e-9;
    }
    const auto after_last = std::chrono::steady_clock::now();
    const std::int64_t cpu1 = rusage_ns();
    const auto ns = [](auto d) { return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count(); };
    CHECK(use.cpu_ns <= cpu1 - cpu0 + 2'000'000);  // inside the rusage span, give or take its tick
    CHECK(use.cpu_ns >= cpu1 - cpu0 - 10'000'000);
    CHECK(use.wall_ns <= ns(after_last - wall0));
    CHECK(use.wall_ns >= ns(before_last - wall1));

    const std::int64_t second = 1'000'000'000;
    // 2 threads on 0.97 cores (what a busy 2-core machine gave with spinning waits): 0.97 < 0.75 * 2
    const std::string busy = core_use_note({second, 970'000'000}, 2, false, true, 2);
    CHECK(busy.find("2 threads ran on 0.97 cores") != std::string::npos);
    CHECK(busy.find("other programs") != std::string::npos);
    const std::string more_threads = core_use_note({second, 2 * second}, 4, false, true, 2);  // 2.0 < 0.75 * 4
    CHECK(more_threads.find("may run on 2 CPUs") != std::string::npos);
    CHECK(core_use_note({second, 1'500'000'000}, 2, false, true, 2).empty());   // exactly 3/4 of the team: fine
    CHECK(core_use_note({second, 970'000'000}, 2, true, true, 2).empty());      // --threads 0: OpenMP sized the team
    CHECK(core_use_note({second, 970'000'000}, 2, false, false, 2).empty());    // passive waits sleep: CPU time falls short
    CHECK(core_use_note({second, 500'000'000}, 1, false, true, 2).empty());     // one thread waits for nobody
    CHECK(core_use_note({99'000'000, 10'000'000}, 2, false, true, 2).empty());  // under 100 ms: start-up weighs too much
}

TEST_CASE("--kernel reference runs the readable forward beside the fast path: same tokens, logits within 1e-4, both timed") {
    for (const Family family : {Family::llama, Family::gpt2}) {
        const ModelConfig cfg = tiny_config(family, 4, 2);
        const Weights w = random_weights(cfg, 21);
        SimulateOptions o = small_options();
        o.kernel = ForwardKernel::reference;
        for (const SimMode mode : {SimMode::cached, SimMode::both}) {
            o.mode = mode;
            const SimulationResult r = run_simulation(cfg, w, o);
            REQUIRE(r.reference_kernel);
            const ReferenceKernelRun& ref = *r.reference_kernel;
            CHECK(ref.n_steps == o.n_steps);
            CHECK(ref.wall_ns.size() == static_cast<std::size_t>(o.n_steps));
            // greedy on the same logits (to ~1e-6): the same argmax at every step, barring an exact near-tie
            CHECK(ref.n_same_token == o.n_steps);
            CHECK_FALSE(ref.first_other_token);
            CHECK(ref.max_rel_dlogit < 1e-4);
            CHECK(ref.max_rel_dlogit > 0.0);  // two different summation orders: not bit-identical, so it was compared
            // the reference changes nothing the fast path reports
            o.kernel = ForwardKernel::fast;
            CHECK(run_simulation(cfg, w, o).generated == r.generated);
            o.kernel = ForwardKernel::reference;
        }
        o.mode = SimMode::uncached;
        CHECK_THROWS_AS(run_simulation(cfg, w, o), UsageError);
        o.mode = SimMode::cached;
        o.kv_storage.dtype = DType::fp16;
        CHECK_THROWS_AS(run_simulation(cfg, w, o), UsageError);
    }
}

namespace {

// Two steps per mode with hand-set counts and wall times, on a made-up GPU of 1e15 BF16 FLOP/s and 1e12 B/s.
struct HandRun {
    RunSummary run;
    std::vector<StepRecord> records;
    nlohmann::json inputs = {{"model", "hand"},
                             {"gpu", {{"name", "test-gpu"}, {"display_name", "Test GPU"}, {"bf16_dense_flops", 1e15},
                                      {"bandwidth_bytes_per_s", 1000000000000ull}}}};
    HandRun() {
        run.display_name = "hand";
        run.mode = SimMode::both;
        run.n_prompt = 4;
        run.n_steps = run.n_steps_done = 2;
        run.kv_cache_bytes = 1024;
        auto add = [&](StepMode mode, std::int64_t step, std::uint64_t flops, std::uint64_t bytes, std::int64_t wall_ns) {
            StepRecord r;
            r.mode = mode;
            r.step = step;
            r.n_tokens = 1;
            r.cost.add(Op::q_proj, OpCost{.flops = flops, .bytes_weights_read = bytes});
            r.wall_ns = wall_ns;
            records.push_back(r);
        };
        // modelled = max(flops / 1e15, bytes / 1e12):
        add(StepMode::cached, 0, 2'000'000'000'000, 1'000'000'000, 10'000'000);    // max(2 ms, 1 ms) = 2 ms
        add(StepMode::uncached, 0, 2'000'000'000'000, 1'000'000'000, 20'000'000);  // 2 ms
        add(StepMode::cached, 1, 1'000'000'000, 4'000'000'000, 10'000'000);        // max(1 us, 4 ms) = 4 ms
        add(StepMode::uncached, 1, 30'000'000'000'000, 6'000'000'000, 40'000'000); // max(30 ms, 6 ms) = 30 ms
    }
};

const Cell* row_cell(const Table& t, const std::string& key, std::size_t col) {
    for (const auto& row : t.rows)
        if (row[0].value == key) return &row[col];
    return nullptr;
}

}  // namespace

TEST_CASE("Modelled GPU time sums each step's roofline time: hand arithmetic in the headline and the table") {
    const HandRun h;
    // cached 2 + 4 = 6 ms, uncached 2 + 30 = 32 ms: 32 / 6 = 5.33x; wall (10 + 10) vs (20 + 40) ms: 3.0x;
    // FLOPs (2e12 + 3e13) / (2e12 + 1e9) = 15.99x, bytes (1e9 + 6e9) / (1e9 + 4e9) = 1.4x
    const Report r = simulation_report(h.run, h.records, h.inputs, UnitSystem::iec);
    REQUIRE(r.headline.size() == 2);
    CHECK(r.headline[0] == "cached decoding: 3.0x faster here (wall, one run: timings vary), 5.3x modelled on Test GPU");
    CHECK(r.headline[1] == "from 16.0x fewer FLOPs and 1.4x fewer bytes moved (counted, exact); the cache held 1.00 KiB for 2 positions "
                           "(uncached keeps none)");
    const Table& t = r.tables.at(0);
    REQUIRE(row_cell(t, "modelled_gpu_ms", 1));
    CHECK(row_cell(t, "modelled_gpu_ms", 1)->value.get<double>() == doctest::Approx(6.0));
    CHECK(row_cell(t, "modelled_gpu_ms", 2)->value.get<double>() == doctest::Approx(32.0));
    CHECK(row_cell(t, "modelled_gpu_tokens_per_s", 1)->value.get<double>() == doctest::Approx(2 / 6e-3));  // 2 steps in 6 ms
    CHECK(row_cell(t, "wall_ms", 3)->value.get<double>() == doctest::Approx(3.0));
    // a trace without the GPU (written before --gpu) has no modelled figures, and says nothing false
    nlohmann::json no_gpu = h.inputs;
    no_gpu.erase("gpu");
    const Report old = simulation_report(h.run, h.records, no_gpu, UnitSystem::iec);
    CHECK(old.headline[0] == "cached decoding: 3.0x faster here (wall, one run: timings vary)");
    CHECK_FALSE(row_cell(old.tables.at(0), "modelled_gpu_ms", 1));
}

TEST_CASE("--repeat's runs give the wall figures as median and range; one run carries a noise note with the host's load") {
    HandRun h;
    // speed-ups 60/20 = 3.0, 50/25 = 2.0, 40/10 = 4.0: median 3.0, range 2.0-4.0
    h.run.repeats.cached_ns = {20'000'000, 25'000'000, 10'000'000};
    h.run.repeats.uncached_ns = {60'000'000, 50'000'000, 40'000'000};
    const Report r = simulation_report(h.run, h.records, h.inputs, UnitSystem::iec);
    CHECK(r.headline[0] == "cached decoding: 3.0x faster here (wall, median of 3 runs: 2.0-4.0x), 5.3x modelled on Test GPU");
    // cached wall: 10, 20, 25 ms -> median 20.0 (10.0-25.0); ms/token over 2 steps: 10.000 (5.000-12.500)
    const Table& t = r.tables.at(0);
    CHECK(row_cell(t, "wall_ms", 1)->text == "20.0 (10.0-25.0)");
    CHECK(row_cell(t, "ms_per_token", 1)->text == "10.000 (5.000-12.500)");
    CHECK(row_cell(t, "tokens_per_s", 2)->text == "40.00 (33.33-50.00)");  // 2 steps in 60, 50, 40 ms
    CHECK(timing_note(h.run, {}).find("the median of 3 runs") != std::string::npos);
    CHECK(spread_of({4, 1, 3, 2}).median == 2.5);  // an even count: the mean of the middle two
    h.run.repeats = {};
    const std::string one = timing_note(h.run, {1.5, 2});
    CHECK(one.find("counted: exact") != std::string::npos);
    CHECK(one.find("one run on a host with load average 1.50 over 2 cores") != std::string::npos);
}

TEST_CASE("--deterministic keeps dynamic teams: no output depends on the team's size, so a fixed team bought only its slowdown") {
    set_thread_count(0, true);
    CHECK(omp_get_dynamic() != 0);
    set_thread_count(2, true);
    CHECK(omp_get_dynamic() == 0);  // --threads N: a fixed team, as asked
    // the records do not depend on the team size: one thread and two give the same tokens, counts and logits
    const auto cfg = tiny_config(Family::llama, 4, 2);
    const Weights w = random_weights(cfg, 4);
    const auto o = small_options();
    set_thread_count(1, true);
    const auto one = run_simulation(cfg, w, o);
    set_thread_count(2, true);
    const auto two = run_simulation(cfg, w, o);
    set_thread_count(0, false);
    REQUIRE(one.records.size() == two.records.size());
    CHECK(one.generated == two.generated);
    CHECK(one.max_abs_dlogit == two.max_abs_dlogit);
    for (std::size_t i = 0; i < one.records.size(); ++i) CHECK(one.records[i].cost == two.records[i].cost);
}

TEST_CASE("The chart's data: running speed-up in wall and modelled GPU time from hand-set steps, and the time panel's clip") {
    const HandRun h;
    StepTrace trace;
    trace.inputs = h.inputs;
    trace.run = h.run;
    trace.records = h.records;
    PlotStats stats;
    std::istringstream data(trace_plot_data({{&trace, ""}}, stats));
    std::string header, row0, row1;
    std::getline(data, header);
    std::getline(data, row0);
    std::getline(data, row1);
    CHECK(header.find("sum_ms_c sum_ms_u speedup_wall speedup_gpu") != std::string::npos);
    auto fields = [](const std::string& line) {
        std::istringstream in(line);
        std::vector<double> v;
        for (double x; in >> x;) v.push_back(x);
        return v;
    };
    const auto a = fields(row0), b = fields(row1);
    REQUIRE(a.size() == 16);
    REQUIRE(b.size() == 16);
    // step 0: wall 20 / 10 ms = 2, modelled 2 / 2 ms = 1; step 1 (running sums): (20 + 40) / (10 + 10) = 3,
    // (2 + 30) / (2 + 4) ms = 5.33
    CHECK(a[14] == doctest::Approx(2.0));
    CHECK(a[15] == doctest::Approx(1.0));
    CHECK(b[12] == doctest::Approx(20.0));  // cached wall so far, ms
    CHECK(b[13] == doctest::Approx(60.0));
    CHECK(b[14] == doctest::Approx(3.0));
    CHECK(b[15] == doctest::Approx(32.0 / 6.0));
    CHECK(stats.step_ms.size() == 4);
    // the clip: 100 steps of 1 ms and one of 50: the 99th percentile (rank 100 of 101) is 1 ms; no spike, no clip
    std::vector<double> ms(100, 1.0);
    ms.push_back(50.0);
    CHECK(time_clip_ms(ms) == 1.0);
    ms.back() = 1.4;
    CHECK(time_clip_ms(ms) == 0.0);
}

TEST_CASE("--logits rows read back from the .npy match PyTorch's reference logits; the header follows the format") {
    std::ifstream in(fs::path(test::models_dir) / "reference.json");
    REQUIRE(in);
    const nlohmann::json ref = nlohmann::json::parse(in);
    const nlohmann::json& model_ref = ref.at("models").at("tiny-llama");
    const LoadedModel model = load_checkpoint(fs::path(test::models_dir) / model_ref.at("checkpoint").get<std::string>());
    const nlohmann::json& prompt = model_ref.at("prompts").at(0);  // "Once upon a time": ids 1 453 456 261 455
    SimulateOptions o;
    o.mode = SimMode::cached;
    o.prompt_ids = prompt.at("ids").get<std::vector<TokenId>>();
    o.n_steps = 41;  // rows 0..40: the logits after positions P-1 .. P+39 (P = 5)
    const test::TempDir dir("kvlab-npy");
    const fs::path path = dir.path() / "logits.npy";
    {
        NpyRowWriter writer(path, "--logits", static_cast<std::uint64_t>(o.n_steps), static_cast<std::uint64_t>(model.config.n_vocab));
        o.on_logits = [&](const VectorF& l) { writer.add_row({l.data(), static_cast<std::size_t>(l.size())}); };
        run_simulation(model.config, model.weights, o);  // greedy: the tokens PyTorch's greedy run chose (the reference's teacher-forced ids)
        writer.finish();
    }
    const std::string bytes = slurp(path);
    // NumPy format 1.0: magic, version 1.0, little-endian uint16 header length, an ASCII dict ending in '\n',
    // the data starting on a multiple of 64 bytes
    REQUIRE(bytes.size() > 10);
    CHECK(bytes.substr(0, 6) == "\x93NUMPY");
    CHECK(bytes[6] == '\x01');
    CHECK(bytes[7] == '\x00');
    const std::size_t header_len = static_cast<unsigned char>(bytes[8]) | static_cast<std::size_t>(static_cast<unsigned char>(bytes[9])) << 8;
    const std::size_t data_at = 10 + header_len;
    CHECK(data_at % 64 == 0);
    const std::string header = bytes.substr(10, header_len);
    const std::int64_t V = model.config.n_vocab;
    CHECK(header.rfind(fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': (41, {}), }}", V), 0) == 0);
    CHECK(header.back() == '\n');
    REQUIRE(bytes.size() == data_at + 41 * static_cast<std::size_t>(V) * 4);
    auto row = [&](std::size_t r) {
        std::vector<float> v(static_cast<std::size_t>(V));
        std::memcpy(v.data(), bytes.data() + data_at + r * v.size() * 4, v.size() * 4);
        return v;
    };
    // reference logits[p] follow ids[0..p]: row s is position P-1+s, so rows 0, 20, 40 are its keys 4, 24, 44
    for (const int s : {0, 20, 40}) {
        CAPTURE(s);
        const auto want = prompt.at("logits").at(std::to_string(4 + s)).get<std::vector<float>>();
        const auto got = row(static_cast<std::size_t>(s));
        double d = 0, scale = 1;
        for (std::size_t i = 0; i < want.size(); ++i) {
            d = std::max(d, static_cast<double>(std::abs(got[i] - want[i])));
            scale = std::max(scale, static_cast<double>(std::abs(want[i])));
        }
        CHECK(d / scale <= 1e-4);  // the tolerance the reference forward is held to (test_reference_forward.cpp)
    }
    // an interrupted run's file says the rows it holds: the header is rewritten in place, same length
    const std::string short_header = npy_preamble(3, 512, data_at);
    CHECK(short_header.size() == data_at);
    CHECK(npy_preamble(3, 512).size() == 128);  // 10 + 61 (the dict) + 1 (newline) = 72 bytes, padded to 128
}
