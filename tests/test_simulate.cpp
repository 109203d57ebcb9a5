#include <doctest/doctest.h>

#include <chrono>
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
#include "kvlab/sim/simulator.hpp"
#include "trace/step_trace.hpp"
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
    const std::int64_t cpu0 = rusage_ns();
    const auto wall0 = std::chrono::steady_clock::now();
    const CoreUseClock clock;
    volatile double x = 1.0;
    CoreUse use;
    while ((use = clock.elapsed()).cpu_ns < 50'000'000) x = x * 1.0000001 + 1e-9;
    const std::int64_t cpu1 = rusage_ns();
    const auto wall_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - wall0).count();
    CHECK(use.cpu_ns <= cpu1 - cpu0 + 2'000'000);  // inside the rusage span, give or take its tick
    CHECK(use.cpu_ns >= cpu1 - cpu0 - 10'000'000);
    CHECK(use.wall_ns <= wall_ns);
    CHECK(use.wall_ns >= wall_ns - 5'000'000);

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
