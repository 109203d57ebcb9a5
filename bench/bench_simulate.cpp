// Speed of `kvlab simulate` as ratios to references measured in the same run with the same threads:
// a STREAM-style read bandwidth (sum over a buffer much larger than the LLC) and Eigen GEMM FLOP/s.
// Optionally compares decode speed with llama2.c's run.c (KVLAB_PEER_RUNC). Not a test: run
// `build/release/bench/kvlab_bench_simulate [--json FILE]`; method and results in docs/performance.md.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <Eigen/Core>
#include <fmt/format.h>
#include <omp.h>

#include "bench_common.hpp"
#include "bench_references.hpp"
#include "child_process.hpp"
#include "decode_replay.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/calc/kv_memory.hpp"
#include "formats/llama2c_checkpoint.hpp"
#include "kvlab/calc/presets.hpp"
#include "kvlab/core/printer.hpp"
#include "kernels/matmul.hpp"
#include "kvlab/weights/random_weights.hpp"
#include "report/simulation_report.hpp"
#include "kvlab/sim/simulator.hpp"
#include "trace/trace_reader.hpp"

namespace {

using namespace kvlab;
using namespace kvlab::bench;

struct BenchOptions {
    std::vector<std::string> models = {"stories15m", "stories110m"};
    int threads = 0;                    // 0: every core
    int repeats = 5;                    // each measure is the median over repeats
    std::int64_t prompt_len = 32;       // cached and uncached runs
    std::int64_t steps = 128;           // cached decode steps
    std::int64_t uncached_steps = 32;   // uncached steps (quadratic work: fewer)
    std::int64_t prefill_len = 128;     // prompt of the prefill measure
    std::int64_t stream_mib = 1024;     // read-bandwidth buffer
    std::vector<std::int64_t> gemm_sizes = {512, 1024, 2048};  // GEMM reference: the best (n, n) @ (n, n)
    std::int64_t peer_steps = 255;      // llama2.c comparison: positions 0..254, both time 1..254
    std::vector<std::string> peer_models = {"stories15m", "stories110m"};  // llama2.c comparison shapes
    std::string json;                   // also write the JSON report here
    std::string format = "table";
};


struct RssResult {
    std::string name;
    std::uint64_t peak = 0, model_bytes = 0;  // model_bytes: weights + KV cache + logits
};

// `kvlab simulate` (the CLI this bench was built with), cached mode, default prompt and steps.
RssResult bench_rss(const std::string& model, const BenchOptions& o, int n_threads) {
    const ModelConfig cfg = simulation_config(load_model(model), std::nullopt);
    const auto n_positions = static_cast<std::uint64_t>(o.prompt_len + o.steps - 1);  // the last token is not fed back
    RssResult r;
    r.name = cfg.display_name;
    r.model_bytes = weights_bytes(cfg) + kv_bytes_sequence(cfg, DType::fp32, n_positions, WindowMode::cap).total() +
                    static_cast<std::uint64_t>(cfg.n_vocab) * sizeof(float);
    // the median of `repeats` runs: one run in several peaks ~150 KiB higher (allocator and thread timing)
    std::vector<double> peaks;
    for (int i = 0; i < o.repeats; ++i)
        peaks.push_back(static_cast<double>(run_child({KVLAB_CLI_PATH, "simulate", "-q", "-m", model, "--mode", "cached",
                                                       "-p", std::to_string(o.prompt_len), "-n", std::to_string(o.steps),
                                                       "--threads", std::to_string(n_threads), "-f", "json"})
                                                .peak_rss));
    r.peak = static_cast<std::uint64_t>(stat_of(peaks).median);
    return r;
}

// One measured run's throughputs, from its step records.
struct RunRates {
    double tokens_per_s = 0;
    double bytes_per_s = 0;  // weights read + KV read + KV written
    double flops_per_s = 0;
};

RunRates rates_of(const std::vector<StepRecord>& records, std::size_t first, std::int64_t tokens) {
    std::int64_t wall_ns = 0;
    std::uint64_t bytes = 0, flops = 0;
    for (std::size_t i = first; i < records.size(); ++i) {
        const OpCost c = records[i].cost.total();
        wall_ns += records[i].wall_ns;
        bytes += c.bytes_weights_read + c.bytes_kv_read + c.bytes_kv_written;
        flops += c.flops;
    }
    const double s = static_cast<double>(wall_ns) * 1e-9;
    return {static_cast<double>(tokens) / s, static_cast<double>(bytes) / s, static_cast<double>(flops) / s};
}

SimulateOptions sim_options(SimMode mode, std::int64_t prompt_len, std::int64_t steps, bool count) {
    SimulateOptions o;
    o.mode = mode;
    o.n_prompt = prompt_len;
    o.n_steps = steps;
    o.count = count;
    return o;
}

struct ModelResult {
    std::string name;
    std::uint64_t weights_bytes = 0;
    std::uint64_t replay_bytes_per_step = 0;   // what the decode replay reads per step (mean over its sampled steps)
    std::int64_t replay_sample_steps = 0;      // steps in one replay sample
    ReadPattern replay_pattern{};
    Stat decode_tok, decode_bytes, uncached_tok, uncached_flops, prefill_tok, prefill_flops;
    Stat decode_tok_nocount, uncached_tok_nocount;
    Stat decode_overhead, uncached_overhead;  // per repeat: tok/s off / tok/s on - 1, the two runs adjacent
    Stat replay_tok;                                           // the decode replay's steps per second
    Stat replay_waits_tok, waits_of_replay;                    // the same with the decode's waits (diagnostic)
    std::int64_t waits_per_step = 0;
    Stat decode_of_replay, uncached_of_gemm, prefill_of_gemm;  // per repeat: rate / the reference sampled just before
};

ModelResult bench_model(const std::string& model, const BenchOptions& o, References& refs) {
    const ModelConfig cfg = simulation_config(load_model(model), std::nullopt);
    const Weights weights = random_weights(cfg, 42);
    ModelResult m;
    m.name = cfg.display_name;
    m.weights_bytes = weights_bytes(cfg);
    // the decode's ceiling: its own reads replayed, positions prompt_len .. prompt_len + steps - 2
    DecodeReplay replay(cfg, weights, o.prompt_len, o.steps - 1);
    m.replay_bytes_per_step = replay.bytes_per_step();
    std::vector<double> decode_tok, decode_bytes, decode_tok_off, unc_tok, unc_flops, unc_tok_off, pre_tok, pre_flops;
    std::vector<double> decode_of_replay, waits_of_replay, unc_of_gemm, pre_of_gemm, decode_overhead, unc_overhead;
    for (int r = 0; r < o.repeats; ++r) {
        // counting on and off run back to back, in alternating order, so a slow phase of a shared machine
        // hits both alike and drift within a repeat cancels over repeats
        const bool on_first = r % 2 == 0;
        for (const bool count : {on_first, !on_first}) {
            // cached: step 0 is the prefill of the prompt, steps 1.. decode one token each
            refs.read_bandwidth();  // the machine's DRAM figure, sampled alongside
            // the counted decode's ceiling: replay samples right before and right after it, the better of
            // the two (a single sample before it left stories110M's decode above its ceiling in this
            // host's slow phases, where both are bound by the same memory)
            const double before = count ? replay.steps_per_s() : 0.0;
            const auto cached = run_simulation(cfg, weights, sim_options(SimMode::cached, o.prompt_len, o.steps, count));
            const auto n_decode = static_cast<std::int64_t>(cached.records.size()) - 1;
            const RunRates dec = rates_of(cached.records, 1, n_decode);
            (count ? decode_tok : decode_tok_off).push_back(dec.tokens_per_s);
            if (count) {
                const double ceiling = std::max(before, replay.steps_per_s());
                decode_bytes.push_back(dec.bytes_per_s);
                decode_of_replay.push_back(dec.tokens_per_s / ceiling);
            }
            // uncached: every step is a full forward over the sequence so far
            const double gemm = refs.gemm_rate();
            const auto unc =
                run_simulation(cfg, weights, sim_options(SimMode::uncached, o.prompt_len, o.uncached_steps, count));
            const RunRates u = rates_of(unc.records, 0, static_cast<std::int64_t>(unc.records.size()));
            (count ? unc_tok : unc_tok_off).push_back(u.tokens_per_s);
            if (count) {
                unc_flops.push_back(u.flops_per_s);
                unc_of_gemm.push_back(u.flops_per_s / gemm);
            }
        }
        decode_overhead.push_back(decode_tok_off.back() / decode_tok.back() - 1.0);
        unc_overhead.push_back(unc_tok_off.back() / unc_tok.back() - 1.0);
        // what waiting alone costs: the replay with the decode's waits beside a replay sample of its own,
        // after the counted pair, so that both runs of the pair follow the same reads
        const double replay_now = replay.steps_per_s();
        waits_of_replay.push_back(replay.waits_steps_per_s() / replay_now);
        // prefill: one batched forward over a longer prompt
        const double gemm = refs.gemm_rate();
        const auto pre = run_simulation(cfg, weights, sim_options(SimMode::cached, o.prefill_len, 1, true));
        const RunRates p = rates_of(pre.records, 0, o.prefill_len);
        pre_tok.push_back(p.tokens_per_s);
        pre_flops.push_back(p.flops_per_s);
        pre_of_gemm.push_back(p.flops_per_s / gemm);
    }
    m.decode_tok = stat_of(decode_tok);
    m.decode_bytes = stat_of(decode_bytes);
    m.decode_tok_nocount = stat_of(decode_tok_off);
    m.uncached_tok = stat_of(unc_tok);
    m.uncached_flops = stat_of(unc_flops);
    m.uncached_tok_nocount = stat_of(unc_tok_off);
    m.prefill_tok = stat_of(pre_tok);
    m.prefill_flops = stat_of(pre_flops);
    m.decode_of_replay = stat_of(decode_of_replay);
    m.replay_tok = stat_of(replay.samples);
    m.replay_waits_tok = stat_of(replay.wait_samples);
    m.waits_of_replay = stat_of(waits_of_replay);
    m.waits_per_step = replay.waits_per_step();
    m.replay_pattern = replay.pattern();
    m.replay_sample_steps = replay.sample_steps();
    m.uncached_of_gemm = stat_of(unc_of_gemm);
    m.prefill_of_gemm = stat_of(pre_of_gemm);
    m.decode_overhead = stat_of(decode_overhead);
    m.uncached_overhead = stat_of(unc_overhead);
    return m;
}

// llama2.c comparison: `kvlab simulate --checkpoint` (the binary of this build) and run.c decode the same
// random-weight checkpoint of each shape, greedy from BOS, the same positions. Three questions:
// - decode speed as each program prints it (forward calls only), at the bench's thread count;
// - whole-process wall time of the same generation (start, load, decode, exit), kvlab and run.c run in
//   pairs in alternating order, at 1 and 2 threads; a thread count run.c cannot use (CPU time / wall
//   time well below it: built without OpenMP) is skipped, not compared;
// - the same for one token (`-n 1`: start, load, one forward, exit), the time to the first token.
struct PeerResult {
    std::string preset;   // the shape's preset
    std::string shape;    // display name of the shape
    bool ran = false;
    std::string skipped;  // why not, when !ran
    Stat kvlab_tok, peer_tok;
    double bytes_per_token = 0;  // weights + KV read + KV written per decode step, as counted
    std::uint64_t kvlab_rss = 0, peer_rss = 0, model_bytes = 0;  // peak RSS (median); weights + KV + logits
    // the decode replay of the same positions (steps per second), in every round the better of two samples
    // taken right before and right after the program's run: for kvlab, the matrices copied into huge pages,
    // 64-byte aligned (the fastest placement of these bytes measured; kvlab itself reads the file in place
    // with aligned loads, kernels/matmul.hpp), and for run.c the mapped file it reads in place
    Stat ceiling_tok, file_ceiling_tok;
    ReadPattern ceiling_pattern{}, file_ceiling_pattern{};
    std::vector<WholeProcess> whole;
    // the same with one token (start, load, one forward, exit): issue 19's "time to the first token at most
    // run.c's"; a thread count skipped above is skipped here too
    std::vector<WholeProcess> first_token;
    std::string command_kvlab, command_peer;
};

// A ceiling sample, in a child process of this benchmark (`--replay-child`, below), so that it can be taken
// in the same round as the runs it divides while this process stays small: it loads the checkpoint with
// the placement given (kvlab's huge-page copy, or the file mapped in place as run.c reads it) and replays
// three samples of positions 1 .. steps - 1; the child prints "kvlab-replay <steps per second, the best of
// the three> <the read pattern that won most often>" as the last line on stderr.
struct ReplaySample {
    double steps_per_s = 0;
    std::size_t pattern = 0;
};

ReplaySample replay_in_child(const std::filesystem::path& checkpoint, WeightPlacement placement, int steps, int threads) {
    const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    const ChildRun c = run_child({self, "--replay-child", checkpoint.string(), "--replay-placement",
                                  placement == WeightPlacement::huge_pages ? "huge-pages" : "mapped-file", "--peer-steps",
                                  std::to_string(steps), "--threads", std::to_string(threads)});
    const std::string tag = "kvlab-replay ";
    const auto at = c.err.rfind(tag);
    if (at == std::string::npos) throw IoError(fmt::format("the replay child printed no result: {}", c.err.substr(0, 200)));
    char* end = nullptr;
    ReplaySample s;
    s.steps_per_s = std::strtod(c.err.c_str() + at + tag.size(), &end);
    s.pattern = static_cast<std::size_t>(std::strtoul(end, nullptr, 10));
    if (!(s.steps_per_s > 0) || s.pattern >= kNumPatterns) throw IoError(fmt::format("the replay child printed '{}'", c.err.substr(at, 80)));
    return s;
}

// The child's side: one replay sample of the checkpoint as placed.
void replay_child(const std::filesystem::path& checkpoint, WeightPlacement placement, int steps) {
    const LoadedModel model = load_llama2c_checkpoint(checkpoint, std::nullopt, placement);
    DecodeReplay replay(model.config, model.weights, 1, steps - 1);
    double rate = 0;
    for (int i = 0; i < 3; ++i) rate = std::max(rate, replay.steps_per_s());
    std::cerr << fmt::format("kvlab-replay {:.6f} {}\n", rate, replay.pattern_index());
}

std::vector<PeerResult> bench_peer(const BenchOptions& o, int n_threads) {
    const PeerProgram runc = find_peer("KVLAB_PEER_RUNC", "run.c");
    if (!runc.skipped.empty()) {
        PeerResult p;
        p.skipped = "llama2.c comparison skipped: " + runc.skipped;
        return {p};
    }
    const std::filesystem::path &run_path = runc.binary, &tokenizer = runc.tokenizer;
    std::vector<PeerResult> out;
    for (const std::string& shape : o.peer_models) {
        PeerResult p;
        const ModelConfig cfg = simulation_config(load_model(shape), std::nullopt);
        p.preset = shape;
        p.shape = cfg.display_name;
        const bench::TempDir dir;  // unique names: two benches on one machine do not collide
        const std::filesystem::path ckpt = dir.path() / (shape + ".bin"), trace = dir.path() / (shape + ".csv");
        save_llama2c_v0(ckpt, cfg, random_weights(cfg, 42));  // the weights are freed before any child forks
        p.model_bytes = weights_bytes(cfg) +
                        kv_bytes_sequence(cfg, DType::fp32, static_cast<std::uint64_t>(o.peer_steps - 1), WindowMode::cap).total() +
                        static_cast<std::uint64_t>(cfg.n_vocab) * sizeof(float);
        const std::string steps = std::to_string(o.peer_steps);
        auto kvlab_args = [&](int threads, bool with_trace, const std::string& n) {
            // prompt = BOS, greedy; with a trace: per-step forward times, steps 1.. (positions 1..steps-1)
            std::vector<std::string> a = {KVLAB_CLI_PATH, "simulate", "-q", "--checkpoint", ckpt.string(), "--mode", "cached",
                                          "--prompt-ids", "1", "-n", n, "--threads", std::to_string(threads), "-f", "json"};
            if (with_trace) a.insert(a.end(), {"--trace", trace.string()});
            return a;
        };
        // run.c: empty prompt = BOS, greedy; it times forwards 1..steps-1 and prints tok/s on stderr
        auto run_args = [&](const std::string& n) {
            return std::vector<std::string>{run_path.string(), ckpt.string(), "-z", tokenizer.string(), "-t", "0", "-n", n};
        };
        const std::vector<std::string> peer_args = run_args(steps);
        auto omp_env = [](int threads) { return "OMP_NUM_THREADS=" + std::to_string(threads); };
        for (const auto& a : kvlab_args(n_threads, true, steps)) p.command_kvlab += (p.command_kvlab.empty() ? "" : " ") + a;
        p.command_peer = omp_env(n_threads);
        for (const auto& a : peer_args) p.command_peer += " " + a;

        std::vector<double> ours, theirs, rss_ours, rss_theirs, ceil_copy, ceil_file;
        // each program's ceiling in the same round: the timed positions' reads over the memory it reads,
        // sampled right before and right after its run; the round's ceiling is the better of the two, so
        // that a host slowing down or speeding up during the run does not leave the run above its ceiling
        auto sample = [&](WeightPlacement placement) { return replay_in_child(ckpt, placement, o.peer_steps, n_threads); };
        std::size_t wins_copy[kNumPatterns] = {}, wins_file[kNumPatterns] = {};  // kept samples per winning pattern
        auto keep_better = [](const ReplaySample& before, const ReplaySample& after, std::vector<double>& out, std::size_t (&wins)[kNumPatterns]) {
            const ReplaySample& best = after.steps_per_s >= before.steps_per_s ? after : before;
            out.push_back(best.steps_per_s);
            ++wins[best.pattern];
        };
        for (int r = 0; r < o.repeats; ++r) {
            const ReplaySample copy_before = sample(WeightPlacement::huge_pages);
            const ChildRun k = run_child(kvlab_args(n_threads, true, steps));
            keep_better(copy_before, sample(WeightPlacement::huge_pages), ceil_copy, wins_copy);
            const StepTrace t = read_step_trace(trace);
            std::int64_t wall_ns = 0;
            std::uint64_t bytes = 0;
            for (const StepRecord& rec : t.records)
                if (rec.step >= 1) {
                    const OpCost c = rec.cost.total();
                    wall_ns += rec.wall_ns;
                    bytes += c.bytes_weights_read + c.bytes_kv_read + c.bytes_kv_written;
                }
            const auto n_timed = static_cast<double>(t.records.size() - 1);
            ours.push_back(n_timed / (static_cast<double>(wall_ns) * 1e-9));
            p.bytes_per_token = static_cast<double>(bytes) / n_timed;
            rss_ours.push_back(static_cast<double>(k.peak_rss));

            const ReplaySample file_before = sample(WeightPlacement::mapped_file);
            const ChildRun c = run_child(peer_args, {omp_env(n_threads)});
            keep_better(file_before, sample(WeightPlacement::mapped_file), ceil_file, wins_file);
            theirs.push_back(peer_tokens_per_s(c, p.command_peer));
            rss_theirs.push_back(static_cast<double>(c.peak_rss));
        }
        p.kvlab_tok = stat_of(ours);
        p.peer_tok = stat_of(theirs);
        p.ceiling_tok = stat_of(ceil_copy);
        p.file_ceiling_tok = stat_of(ceil_file);
        p.ceiling_pattern = kReadPatterns[most_won(wins_copy)];
        p.file_ceiling_pattern = kReadPatterns[most_won(wins_file)];
        p.kvlab_rss = static_cast<std::uint64_t>(stat_of(rss_ours).median);
        p.peer_rss = static_cast<std::uint64_t>(stat_of(rss_theirs).median);

        for (const int threads : {1, 2})
            p.whole.push_back(compare_whole_process(threads, o.repeats, kvlab_args(threads, false, steps), peer_args, {omp_env(threads)}, "run.c"));
        // one token each (`-n 1`: BOS in, one forward, one token out), the peer's threads checked above
        for (const WholeProcess& w : p.whole) {
            WholeProcess f;
            if (w.skipped.empty())
                f = compare_whole_process(w.threads, o.repeats, kvlab_args(w.threads, false, "1"), run_args("1"), {omp_env(w.threads)}, "run.c", false);
            else {
                f.threads = w.threads;
                f.skipped = w.skipped;
            }
            p.first_token.push_back(f);
        }
        p.ran = true;
        out.push_back(std::move(p));
    }
    return out;
}

// The host, for the JSON report: the CPU's model, the vector ISA flags that matter to these kernels, the
// huge-page mode and the decode GEMV's stream count on this CPU.
nlohmann::json host_info() {
    // the first processor's flags and identity: a VM's "model name" is often generic ("AMD EPYC"), while
    // vendor, family, model and stepping still tell the core apart (AMD family 25 is Zen 3 and 4, 26 Zen 5)
    std::ifstream in("/proc/cpuinfo");
    std::string line, flags;
    nlohmann::json id = nlohmann::json::object();
    auto value = [&] {
        const auto colon = line.find(':');
        const auto start = colon == std::string::npos ? line.size() : line.find_first_not_of(" \t", colon + 1);
        return start == std::string::npos ? std::string() : line.substr(start);
    };
    auto key_is = [&](const char* key) {  // "cpu family\t: 26": the key, then only tabs or spaces up to the colon
        const std::size_t n = std::strlen(key);
        return line.compare(0, n, key) == 0 && line.find_first_not_of(" \t", n) == line.find(':');
    };
    while (std::getline(in, line)) {
        if (key_is("vendor_id")) id["vendor"] = value();
        else if (key_is("cpu family")) id["family"] = std::atoi(value().c_str());
        else if (key_is("model")) id["model"] = std::atoi(value().c_str());
        else if (key_is("stepping")) id["stepping"] = std::atoi(value().c_str());
        else if (key_is("flags")) {
            flags = value();
            break;
        }
    }
    std::vector<std::string> isa;
    for (const char* f : {"sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_fp16", "amx_bf16"})
        if ((" " + flags + " ").find(std::string(" ") + f + " ") != std::string::npos) isa.emplace_back(f);
    // the kernel's transparent-huge-page mode, the bracketed word of "always [madvise] never": where it
    // is madvise, only advised memory (kvlab's weights and caches, the references' buffers) gets them
    std::string thp;
    if (std::ifstream mode("/sys/kernel/mm/transparent_hugepage/enabled"); std::getline(mode, line))
        if (const auto open = line.find('['), close = line.find(']'); open != std::string::npos && close > open)
            thp = line.substr(open + 1, close - open - 1);
    return {{"cores", omp_get_num_procs()}, {"cpu_id", id}, {"isa", isa}, {"transparent_hugepages", thp.empty() ? "unknown" : thp},
            {"gemv_streams", gemv_streams()}};
}

std::string cpu_model() {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
    return "unknown";
}

std::string utc_now() {
    const std::time_t t = std::time(nullptr);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
    return buf;
}

Report make_report(const BenchOptions& o, int n_threads, const References& ref, const std::vector<ModelResult>& models,
                   const std::vector<RssResult>& rss, std::uint64_t rss_floor, const std::vector<PeerResult>& peers) {
    const Stat bw = stat_of(ref.bw_samples), gemm = stat_of(ref.gemm_samples);
    Report report;
    report.inputs = {{"cpu", cpu_model()},         {"host", host_info()},         {"threads", n_threads},
                     {"date_utc", utc_now()},      {"repeats", o.repeats},        {"prompt_len", o.prompt_len},
                     {"steps", o.steps},           {"uncached_steps", o.uncached_steps}, {"prefill_len", o.prefill_len},
                     {"stream_mib", o.stream_mib}, {"gemm_sizes", o.gemm_sizes},  {"weights", "random N(0, 0.02), seed 42"}};

    // A reference is a ceiling: if a measured workload's median rate beats the best sample of its
    // reference (the most this machine was seen to do in this run), the reference was not the best this
    // machine can do, and no target is judged against it.
    std::vector<std::string> beaten;
    auto check = [&](const std::string& what, double rate, const Stat& ref_rate, const char* ref_name) {
        if (rate > ref_rate.max) beaten.push_back(fmt::format("{} at {:.3f} of {}'s best sample", what, rate / ref_rate.max, ref_name));
    };
    for (const ModelResult& m : models) {
        check(m.name + " cached decode", m.decode_tok.median, m.replay_tok, "its replay");
        check(m.name + " cached decode (counting off)", m.decode_tok_nocount.median, m.replay_tok, "its replay");
        check(m.name + " uncached", m.uncached_flops.median, gemm, "the FLOP/s reference");
        check(m.name + " prefill", m.prefill_flops.median, gemm, "the FLOP/s reference");
    }
    for (const PeerResult& p : peers)
        if (p.ran) {
            check(p.shape + " kvlab --checkpoint decode", p.kvlab_tok.median, p.ceiling_tok, "the replay of a huge-page copy");
            check(p.shape + " run.c decode", p.peer_tok.median, p.file_ceiling_tok, "its replay (mapped file)");
        }
    const bool refs_valid = beaten.empty();
    report.inputs["references_valid"] = refs_valid;
    auto judged = [&](bool ok) { return text_cell(!refs_valid ? "n/a" : ok ? "yes" : "no"); };

    Table refs;
    refs.title = fmt::format("references, {} threads (medians of their samples, each taken right before a measurement it "
                             "divides, a decode's replay also right after it; spread = (max - min) / median)", n_threads);
    refs.columns = {{"reference", "reference", false}, {"value", "median"}, {"unit", "unit", false}, {"spread_percent", "spread (%)"}};
    refs.rows.push_back({text_cell(fmt::format("read bandwidth, sum over {} MiB, best of {} patterns in each sample (most often: {})", o.stream_mib,
                                               kNumPatterns, pattern_name(kReadPatterns[most_won(ref.bw_wins)]))),
                         real_cell(bw.median * 1e-9, 2), text_cell("GB/s"), real_cell(spread_percent(bw), 1)});
    for (const ModelResult& m : models) {
        const double bytes_per_s = m.replay_tok.median * static_cast<double>(m.replay_bytes_per_step);
        refs.rows.push_back({text_cell(fmt::format("  decode replay of {}: {} per step, {} of the {} steps, best pattern in each sample (most often: {})",
                                                   m.name, format_bytes(m.replay_bytes_per_step, UnitSystem::iec), m.replay_sample_steps,
                                                   o.steps - 1, pattern_name(m.replay_pattern))),
                             real_cell(bytes_per_s * 1e-9, 2), text_cell("GB/s"), real_cell(spread_percent(m.replay_tok), 1)});
        refs.rows.push_back({text_cell(fmt::format("  = {}'s decode ceiling", m.name)), real_cell(m.replay_tok.median, 1),
                             text_cell("tok/s"), real_cell(spread_percent(m.replay_tok), 1)});
        refs.rows.push_back({text_cell(fmt::format("  (diagnostic) the same reads with the decode's {} waits per step: {:.3f} of the replay",
                                                   m.waits_per_step, m.waits_of_replay.median)),
                             real_cell(m.replay_waits_tok.median, 1), text_cell("tok/s"), real_cell(spread_percent(m.replay_waits_tok), 1)});
    }
    refs.rows.push_back({text_cell("FLOP/s reference (GEMM), best case: " + References::gemm_name(ref.gemm_cases[ref.best_gemm])), real_cell(gemm.median * 1e-9, 2),
                         text_cell("GFLOP/s"), real_cell(spread_percent(gemm), 1)});
    refs.notes.push_back("decode replay: the step's own reads (each layer's wq, wk, wv, its cached keys and values, wo, w1, w3, "
                         "w2; then the classifier) for evenly spaced positions of the decode's, read in that order, no arithmetic and no "
                         "waiting between matrices; each sample reads them with every read pattern in turn and keeps the best: a "
                         "measured ceiling for a decode of these bytes (checked below)");
    refs.notes.push_back("(diagnostic) with the decode's waits: the same replay with a barrier wherever the decode's threads wait "
                         "for each other (after q/k/v, the attention, wo, w1/w3 and w2 of each layer, and the classifier): how much "
                         "of the gap between a decode and its replay waiting alone explains. Not a reference; nothing is judged by it");
    refs.notes.push_back(fmt::format("each reference is a ceiling only if no workload below beats it; {}",
                                     refs_valid ? "none does" : "NOT VALID here, nothing is judged: " + fmt::format("{}", fmt::join(beaten, "; "))));
    report.tables.push_back(std::move(refs));

    Table patterns;
    patterns.title = "read patterns over the bandwidth buffer (at the start: median of 3; later, every sample tries each and keeps the best)";
    patterns.columns = {{"streams_per_thread", "streams/thread"}, {"prefetch", "prefetch", false}, {"bytes_per_s", "GB/s at start"},
                        {"best", "best at start", false}, {"samples_won", "samples won"}};
    for (std::size_t i = 0; i < kNumPatterns; ++i)
        patterns.rows.push_back({int_cell(kReadPatterns[i].streams), text_cell(kReadPatterns[i].prefetch ? "yes" : "no"),
                                 real_cell(ref.pattern_bw[i] * 1e-9, 2), text_cell(i == ref.best_pattern ? "<-" : ""),
                                 int_cell(static_cast<std::int64_t>(ref.bw_wins[i]))});
    report.tables.push_back(std::move(patterns));
    Table gemms;
    gemms.title = "FLOP/s cases tried at the start (median of 3; the best is the FLOP/s reference)";
    gemms.columns = {{"case", "case", false}, {"flops_per_s", "GFLOP/s"}, {"best", "best", false}};
    for (std::size_t i = 0; i < ref.gemm_case_rate.size(); ++i)
        gemms.rows.push_back({text_cell(References::gemm_name(ref.gemm_cases[i])), real_cell(ref.gemm_case_rate[i] * 1e-9, 2),
                              text_cell(i == ref.best_gemm ? "<-" : "")});
    report.tables.push_back(std::move(gemms));

    Table speed;
    speed.title = "kvlab simulate speed (median over repeats)";
    speed.columns = {{"model", "model", false},  {"measure", "measure", false}, {"tokens_per_s", "tok/s"},
                     {"achieved", "achieved"},   {"unit", "unit", false},       {"ratio_to_reference", "of reference"},
                     {"target", "target", false}, {"met", "met", false},        {"spread_percent", "spread (%)"}};
    auto yes_no = [](bool b) { return text_cell(b ? "yes" : "no"); };
    for (const ModelResult& m : models) {
        const double bw_ratio = m.decode_of_replay.median;
        const bool is_110m = m.name.find("110M") != std::string::npos;
        speed.rows.push_back({text_cell(m.name), text_cell(fmt::format("cached decode, {} steps", o.steps - 1)),
                              real_cell(m.decode_tok.median, 1), real_cell(m.decode_bytes.median * 1e-9, 2), text_cell("GB/s"),
                              real_cell(bw_ratio, 3), text_cell(is_110m ? ">= 0.80 of replay" : "-"),
                              is_110m ? judged(bw_ratio >= 0.8) : text_cell("-"),
                              real_cell(spread_percent(m.decode_tok), 1)});
        const double gemm_ratio = m.uncached_of_gemm.median;
        speed.rows.push_back({text_cell(m.name), text_cell(fmt::format("uncached step, {} steps", o.uncached_steps)),
                              real_cell(m.uncached_tok.median, 1), real_cell(m.uncached_flops.median * 1e-9, 2),
                              text_cell("GFLOP/s"), real_cell(gemm_ratio, 3), text_cell(">= 0.50 of FLOP/s ref"),
                              judged(gemm_ratio >= 0.5), real_cell(spread_percent(m.uncached_flops), 1)});
        speed.rows.push_back({text_cell(m.name), text_cell(fmt::format("prefill, {} tokens", o.prefill_len)),
                              real_cell(m.prefill_tok.median, 1), real_cell(m.prefill_flops.median * 1e-9, 2),
                              text_cell("GFLOP/s"), real_cell(m.prefill_of_gemm.median, 3), text_cell("-"),
                              text_cell("-"), real_cell(spread_percent(m.prefill_flops), 1)});
    }
    speed.notes.push_back("cached decode bytes = weights read + KV read + KV written, as counted (docs/cost-model.md); "
                          "FLOPs as counted; wall time of the forward calls");
    speed.notes.push_back("references: a cached decode's is its replay (tok/s), the uncached step's and prefill's the FLOP/s reference (the best of Eigen GEMMs and the FMA peak)");
    speed.notes.push_back("of reference: median over repeats of (this repeat's rate / its reference: for a decode the better of the "
                          "replay samples taken just before and just after it, otherwise the sample taken just before it); tok/s and "
                          "achieved: medians of their own");
    report.tables.push_back(std::move(speed));

    Table counting;
    counting.title = "cost-counting overhead (counting on vs off, back to back in alternating order)";
    counting.columns = {{"model", "model", false},          {"mode", "mode", false},
                        {"tokens_per_s_counting", "on (tok/s)"}, {"tokens_per_s_no_counting", "off (tok/s)"},
                        {"overhead_percent", "overhead (%)"},    {"met", "<= 3%", false},
                        {"spread_percent", "spread (pts)"}};
    for (const ModelResult& m : models)
        for (const bool cached : {true, false}) {
            const double on = cached ? m.decode_tok.median : m.uncached_tok.median;
            const double off = cached ? m.decode_tok_nocount.median : m.uncached_tok_nocount.median;
            const Stat& o_stat = cached ? m.decode_overhead : m.uncached_overhead;
            const double overhead = 100.0 * o_stat.median;  // extra time per token with counting
            counting.rows.push_back({text_cell(m.name), text_cell(cached ? "cached decode" : "uncached"), real_cell(on, 1),
                                     real_cell(off, 1), real_cell(overhead, 2), yes_no(overhead <= 3.0),
                                     real_cell(100.0 * (o_stat.max - o_stat.min), 1)});
        }
    counting.notes.push_back("overhead: median over repeats of (tok/s off / tok/s on - 1) of each repeat's adjacent pair; "
                             "on and off: medians of their own; negative overheads are run-to-run noise");
    report.tables.push_back(std::move(counting));

    Table mem;
    mem.title = "peak resident memory, simulate --mode cached (kernel accounting, as /usr/bin/time -v)";
    mem.columns = {{"model", "model", false}, {"peak_rss_bytes", "peak RSS"}, {"model_bytes", "weights+KV+logits"},
                   {"ratio", "ratio"}, {"ratio_above_floor", "above floor"}, {"met", "<= 1.10", false}};
    for (const RssResult& r : rss) {
        const double ratio = static_cast<double>(r.peak) / static_cast<double>(r.model_bytes);
        const double above = static_cast<double>(r.peak - std::min(r.peak, rss_floor)) / static_cast<double>(r.model_bytes);
        mem.rows.push_back({text_cell(r.name), bytes_cell(r.peak, UnitSystem::iec), bytes_cell(r.model_bytes, UnitSystem::iec),
                            real_cell(ratio, 3), real_cell(above, 3), yes_no(ratio <= 1.1)});
    }
    for (const PeerResult& peer : peers)
        if (peer.ran)
            for (const bool ours : {true, false}) {
                const std::uint64_t peak = ours ? peer.kvlab_rss : peer.peer_rss;
                const double ratio = static_cast<double>(peak) / static_cast<double>(peer.model_bytes);
                const double above = static_cast<double>(peak - std::min(peak, rss_floor)) / static_cast<double>(peer.model_bytes);
                mem.rows.push_back({text_cell(fmt::format("{} checkpoint, {}", peer.shape, ours ? "kvlab --checkpoint" : "run.c")),
                                    bytes_cell(peak, UnitSystem::iec), bytes_cell(peer.model_bytes, UnitSystem::iec),
                                    real_cell(ratio, 3), real_cell(above, 3), ours ? yes_no(ratio <= 1.1) : text_cell("-")});
            }
    mem.notes.push_back(fmt::format("peak RSS: median of {} runs; floor: `kvlab --help` peaks at {} (code and shared "
                                    "libraries); 'above floor' subtracts it",
                                    o.repeats, format_bytes(rss_floor, UnitSystem::iec)));
    report.tables.push_back(std::move(mem));

    for (const PeerResult& peer : peers) {
        if (!peer.ran) {
            report.notes.push_back(peer.skipped);
            continue;
        }
        Table t;
        t.title = fmt::format("decode vs llama2.c run.c, {} checkpoint, {} threads, greedy, same positions", peer.shape, n_threads);
        t.columns = {{"program", "program", false}, {"tokens_per_s", "tok/s"}, {"speedup", "vs run.c"},
                     {"of_ceiling", "of ceiling"}, {"spread_percent", "spread (%)"}};
        // the fastest a program reading these bytes per token from the same memory can decode on this host:
        // their replay, over kvlab's huge-page copy and over the mapped file run.c reads
        const double ceiling = peer.ceiling_tok.median, file_ceiling = peer.file_ceiling_tok.median;
        const double speedup = peer.kvlab_tok.median / peer.peer_tok.median;
        t.rows.push_back({text_cell("kvlab simulate --checkpoint (counting on)"), real_cell(peer.kvlab_tok.median, 1),
                          ratio_cell(speedup), real_cell(peer.kvlab_tok.median / ceiling, 3),
                          real_cell(spread_percent(peer.kvlab_tok), 1)});
        t.rows.push_back({text_cell("llama2.c run.c"), real_cell(peer.peer_tok.median, 1), ratio_cell(1.0),
                          real_cell(peer.peer_tok.median / file_ceiling, 3), real_cell(spread_percent(peer.peer_tok), 1)});
        t.rows.push_back({text_cell("ceiling: replay, huge-page copy (kvlab's reference)"), real_cell(ceiling, 1),
                          ratio_cell(ceiling / peer.peer_tok.median), real_cell(1.0, 3), real_cell(spread_percent(peer.ceiling_tok), 1)});
        t.rows.push_back({text_cell("ceiling: replay, mapped file (run.c's)"), real_cell(file_ceiling, 1),
                          ratio_cell(file_ceiling / peer.peer_tok.median), real_cell(1.0, 3),
                          real_cell(spread_percent(peer.file_ceiling_tok), 1)});
        t.notes.push_back(fmt::format("ceilings: the same positions' reads replayed ({:.2f} MB per token as kvlab counts them, "
                                      "weights + KV; run.c reads the same fp32 bytes), no arithmetic, median of {} rounds (in each, the better of two "
                                      "samples, right before and right after that program's run, each the best of 3 in a child process; a sample reads {} evenly "
                                      "spaced positions with each read pattern and keeps the best; the pattern named won the most kept samples): over the "
                                      "matrices copied into huge pages, 64-byte aligned ({}; kvlab's reference: it reads the file in place, each row in aligned loads) and over the checkpoint "
                                      "file mapped as run.c maps it ({}); 'of ceiling' divides each program by the replay of its own memory",
                                      peer.bytes_per_token * 1e-6, peer.ceiling_tok.n, std::min<std::int64_t>(o.peer_steps - 1, DecodeReplay::kSampleSteps),
                                      pattern_name(peer.ceiling_pattern),
                                      pattern_name(peer.file_ceiling_pattern)));
        t.notes.push_back("kvlab's tok/s times its forward calls; run.c's also its argmax and printf (~10 us per token)");
        t.notes.push_back("kvlab: " + peer.command_kvlab);
        t.notes.push_back("run.c: " + peer.command_peer);
        report.tables.push_back(std::move(t));

        const std::string loads = "both map the checkpoint and read its weights in place, from the page cache";
        Table w = whole_process_table(fmt::format("whole process vs llama2.c run.c, {} checkpoint: start, load, {} steps, exit (pairs "
                                                  "in alternating order, medians)", peer.shape, o.peer_steps),
                                      peer.whole, "run.c", 1.5, judged);
        w.notes.push_back(loads);
        report.tables.push_back(std::move(w));
        Table f = whole_process_table(fmt::format("time to the first token vs llama2.c run.c, {} checkpoint: start, load, one forward, "
                                                  "exit (-n 1; pairs in alternating order, medians)", peer.shape),
                                      peer.first_token, "run.c", 1.0, judged);
        f.notes.push_back(loads);
        report.tables.push_back(std::move(f));
    }
    return report;
}

}  // namespace

int main(int argc, char** argv) {
    BenchOptions o;
    CLI::App app{"kvlab simulate speed benchmark: ratios to read-bandwidth and GEMM references"};
    app.add_option("-m,--models", o.models, "Presets or config.json paths")->delimiter(',')->capture_default_str();
    app.add_option("--threads", o.threads, "Threads for everything (0 = every core)")->capture_default_str();
    app.add_option("-r,--repeats", o.repeats, "Repeats per measure; medians are reported")->check(CLI::PositiveNumber)->capture_default_str();
    app.add_option("-p,--prompt-len", o.prompt_len)->check(CLI::PositiveNumber)->capture_default_str();
    app.add_option("-n,--steps", o.steps, "Cached steps (step 0 is the prefill)")->check(CLI::Range(2, 1 << 20))->capture_default_str();
    app.add_option("--uncached-steps", o.uncached_steps)->check(CLI::PositiveNumber)->capture_default_str();
    app.add_option("--prefill-len", o.prefill_len)->check(CLI::PositiveNumber)->capture_default_str();
    app.add_option("--stream-mib", o.stream_mib, "Read-bandwidth buffer in MiB (>> last-level cache)")->check(CLI::PositiveNumber)->capture_default_str();
    app.add_option("--gemm-n", o.gemm_sizes, "GEMM reference sizes n: (n,n) @ (n,n), the best is kept")
        ->delimiter(',')
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    app.add_option("--peer-models", o.peer_models, "Shapes compared with llama2.c's run.c (KVLAB_PEER_RUNC)")->delimiter(',')->capture_default_str();
    app.add_option("--peer-steps", o.peer_steps, "Steps of the llama2.c comparison")->check(CLI::Range(2, 256))->capture_default_str();
    app.add_option("--json", o.json, "Also write the report as JSON to this file");
    app.add_option("-f,--format", o.format, "table, csv, json or markdown")->capture_default_str();
    std::string replay_child_path, replay_placement = "huge-pages";
    app.add_option("--replay-child", replay_child_path, "(internal) one ceiling sample of this llama2.c checkpoint, in a child process")
        ->group("");
    app.add_option("--replay-placement", replay_placement, "(internal) huge-pages or mapped-file")
        ->check(CLI::IsMember({"huge-pages", "mapped-file"}))->group("");
    CLI11_PARSE(app, argc, argv);
    try {
        const Format format = parse_choice(format_choices, o.format, "--format");
        const int n_threads = fix_threads(o.threads);
        if (!replay_child_path.empty()) {
            replay_child(replay_child_path, replay_placement == "huge-pages" ? WeightPlacement::huge_pages : WeightPlacement::mapped_file,
                         o.peer_steps);
            return 0;
        }
        if (!o.json.empty()) check_output_path(o.json, "--json");  // before minutes of measuring

        // child processes first, while this process is small (a forked child's peak RSS counts the pages
        // it inherits until exec)
        const std::uint64_t rss_floor = run_child({KVLAB_CLI_PATH, "--help"}).peak_rss;
        std::vector<RssResult> rss;
        for (const auto& name : o.models) rss.push_back(bench_rss(name, o, n_threads));
        std::vector<PeerResult> peers = bench_peer(o, n_threads);

        References refs(o.stream_mib, o.gemm_sizes);
        std::vector<ModelResult> models;
        for (const auto& name : o.models) models.push_back(bench_model(name, o, refs));
        const Report report = make_report(o, n_threads, refs, models, rss, rss_floor, peers);
        bench::emit_report(report, format, o.json);
    } catch (const kvlab::Error& e) {
        std::cerr << "kvlab_bench_simulate: error: " << e.what() << "\n";
        return e.exit_code();
    }
    return 0;
}
