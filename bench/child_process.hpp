// Child processes for the benches that compare kvlab with a peer program (llama2.c's run.c and runq.c):
// one run with its wall time, CPU time and peak resident set from the kernel, and the whole-process
// comparison of two commands in alternating pairs.
#pragma once
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <omp.h>

#include "bench_references.hpp"
#include "kvlab/core/error.hpp"
#include "kvlab/core/printer.hpp"

namespace kvlab::bench {

// A child process's exit, its stderr and its peak resident set (bytes), from the kernel's accounting of
// the child (wait4), the figure /usr/bin/time -v prints. A forked child starts with the parent's resident
// pages, and the kernel counts them in the child's peak: run children while the bench is still small.
struct ChildRun {
    std::string err;
    std::uint64_t peak_rss = 0;
    double wall_s = 0;  // fork to exit
    double cpu_s = 0;   // user + system time of the child and its threads
    double sys_s = 0;   // of which system time (the kernel's: page faults, zeroing fresh pages, file reads)
};

inline ChildRun run_child(const std::vector<std::string>& args, const std::vector<std::string>& env_extra = {}) {
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    // the environment, built before fork (the child only calls async-signal-safe functions)
    std::vector<char*> envp;
    auto overridden = [&](std::string_view entry) {
        for (const auto& kv : env_extra)
            if (entry.substr(0, entry.find('=') + 1) == std::string_view(kv).substr(0, kv.find('=') + 1)) return true;
        return false;
    };
    for (char** e = environ; *e; ++e)
        if (!overridden(*e)) envp.push_back(*e);
    for (const auto& kv : env_extra) envp.push_back(const_cast<char*>(kv.c_str()));
    envp.push_back(nullptr);
    int err_pipe[2];
    if (::pipe2(err_pipe, O_CLOEXEC) != 0) throw IoError(fmt::format("cannot create a pipe to run {}", args[0]));
    const auto t0 = clock_type::now();
    const pid_t pid = ::fork();
    if (pid < 0) {
        ::close(err_pipe[0]);
        ::close(err_pipe[1]);
        throw IoError(fmt::format("cannot fork to run {}", args[0]));
    }
    if (pid == 0) {  // the child: stdout to /dev/null, stderr to the pipe (dup2 clears close-on-exec)
        const int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
        if (devnull < 0 || ::dup2(devnull, STDOUT_FILENO) < 0 || ::dup2(err_pipe[1], STDERR_FILENO) < 0) ::_exit(126);
        ::execve(argv[0], argv.data(), envp.data());
        ::_exit(127);
    }
    ::close(err_pipe[1]);
    ChildRun run;
    char buf[512];
    for (;;) {
        const ssize_t n_read = ::read(err_pipe[0], buf, sizeof buf);
        if (n_read > 0) run.err.append(buf, static_cast<std::size_t>(n_read));
        else if (n_read == 0 || errno != EINTR) break;
    }
    ::close(err_pipe[0]);
    int status = 0;
    rusage usage{};
    pid_t waited = -1;
    do waited = ::wait4(pid, &status, 0, &usage);
    while (waited < 0 && errno == EINTR);
    if (waited != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::string command;
        for (const auto& a : args) command += (command.empty() ? "" : " ") + a;
        throw IoError(fmt::format("'{}' failed (status {}): {}", command, status, run.err.substr(0, 300)));
    }
    run.wall_s = seconds_since(t0);
    run.peak_rss = static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;  // ru_maxrss is in KiB on Linux
    auto secs = [](const timeval& tv) { return static_cast<double>(tv.tv_sec) + 1e-6 * static_cast<double>(tv.tv_usec); };
    run.sys_s = secs(usage.ru_stime);
    run.cpu_s = secs(usage.ru_utime) + run.sys_s;
    return run;
}

// A llama2.c peer program (run.c, runq.c) named by an environment variable, and the tokenizer it reads
// (KVLAB_PEER_TOKENIZER, by default tokenizer.bin beside the binary). `skipped` says why there is none.
struct PeerProgram {
    std::filesystem::path binary, tokenizer;
    std::string skipped;  // empty when both exist
};

inline PeerProgram find_peer(const char* env_name, const char* what) {
    PeerProgram p;
    const char* bin = std::getenv(env_name);
    if (!bin || !*bin) {
        p.skipped = fmt::format("set {} to a {} binary (built -Ofast -march=native -fopenmp; KVLAB_PEER_TOKENIZER, default "
                                "tokenizer.bin beside it) to compare",
                                env_name, what);
        return p;
    }
    p.binary = bin;
    const char* tok = std::getenv("KVLAB_PEER_TOKENIZER");
    p.tokenizer = tok && *tok ? std::filesystem::path(tok) : p.binary.parent_path() / "tokenizer.bin";
    if (!std::filesystem::exists(p.binary) || !std::filesystem::exists(p.tokenizer))
        p.skipped = fmt::format("{} or {} does not exist ({}, KVLAB_PEER_TOKENIZER)", p.binary.string(), p.tokenizer.string(), env_name);
    return p;
}

// A llama2.c program's decode speed as it prints it on stderr ("achieved tok/s: X", its forwards after
// the first). Throws IoError naming the command when the line is missing.
inline double peer_tokens_per_s(const ChildRun& run, const std::string& command) {
    const auto at = run.err.find("achieved tok/s:");
    if (at == std::string::npos)
        throw IoError(fmt::format("'{}' printed no 'achieved tok/s': {}", command, run.err.substr(0, 200)));
    return std::strtod(run.err.c_str() + at + 15, nullptr);
}

// Whole-process wall time of the same generation by kvlab and a peer (start, load, decode, exit), run in
// `repeats` pairs whose order alternates, both with `threads` threads (the peer through `peer_env`). A
// peer that does not use the threads it is given (CPU time / wall time well below them: built without
// OpenMP) is marked skipped rather than compared; so is a thread count the machine does not have. A run
// too short for that test (one token: loading is most of it, and run.c loads on one thread) passes
// check_peer_threads = false, its caller having checked the peer on a long generation.
struct WholeProcess {
    int threads = 0;
    std::string skipped;            // why not compared, when not empty
    Stat kvlab_s, peer_s, speedup;  // wall seconds; speedup per pair = peer wall / kvlab wall
    double kvlab_cores = 0, peer_cores = 0;  // CPU time / wall time (medians)
    // system time (medians): where a program's wall time goes to the kernel, faulting in fresh memory above
    // all (on a virtual machine the host may have to back each new huge page first; docs/performance.md)
    double kvlab_sys_s = 0, peer_sys_s = 0;
};

inline WholeProcess compare_whole_process(int threads, int repeats, const std::vector<std::string>& kvlab_args,
                                          const std::vector<std::string>& peer_args, const std::vector<std::string>& peer_env,
                                          const std::string& peer_name, bool check_peer_threads = true) {
    WholeProcess w;
    w.threads = threads;
    if (threads > omp_get_num_procs()) {
        w.skipped = fmt::format("this machine has {} core(s)", omp_get_num_procs());
        return w;
    }
    std::vector<double> ks, ps, ratio, kc, pc, ksys, psys;
    for (int r = 0; r < repeats; ++r) {
        ChildRun k, c;
        if (r % 2 == 0) {
            k = run_child(kvlab_args);
            c = run_child(peer_args, peer_env);
        } else {
            c = run_child(peer_args, peer_env);
            k = run_child(kvlab_args);
        }
        ks.push_back(k.wall_s);
        ps.push_back(c.wall_s);
        ratio.push_back(c.wall_s / k.wall_s);
        kc.push_back(k.cpu_s / k.wall_s);
        pc.push_back(c.cpu_s / c.wall_s);
        ksys.push_back(k.sys_s);
        psys.push_back(c.sys_s);
    }
    w.kvlab_s = stat_of(ks);
    w.peer_s = stat_of(ps);
    w.speedup = stat_of(ratio);
    w.kvlab_cores = stat_of(kc).median;
    w.peer_cores = stat_of(pc).median;
    w.kvlab_sys_s = stat_of(ksys).median;
    w.peer_sys_s = stat_of(psys).median;
    if (check_peer_threads && threads > 1 && w.peer_cores < 0.75 * threads)
        w.skipped = fmt::format("{} used {:.2f} cores of {} (CPU time / wall time): built without -fopenmp?", peer_name, w.peer_cores, threads);
    return w;
}

// (max - min) / median of repeats, in percent: how far a figure moved between them.
inline double spread_percent(const Stat& s) { return s.median > 0 ? 100.0 * (s.max - s.min) / s.median : 0.0; }

// compare_whole_process's results as a table, a row per thread count: both programs' medians, the ratio
// (peer / kvlab), each one's CPU use and system time, and each one's fastest and slowest run. With a
// target (> 0) the ratio is judged against it by `judged(bool)` (which knows whether the bench's
// references held); without, a column says whether the pair was compared. The caller adds a note on
// what each program does at load.
template <typename Judge>
Table whole_process_table(std::string title, const std::vector<WholeProcess>& rows, const std::string& peer, double target, Judge judged) {
    Table w;
    w.title = std::move(title);
    const bool judging = target > 0;
    w.columns = {{"threads", "threads"}, {"kvlab_s", "kvlab (s)"}, {"peer_s", peer + " (s)"}, {"speedup", peer + " / kvlab"},
                 {"kvlab_cores", "kvlab cores"}, {"peer_cores", peer + " cores"}, {"kvlab_sys_s", "kvlab sys (s)"},
                 {"peer_sys_s", peer + " sys (s)"}};
    if (judging) w.columns.insert(w.columns.end(), {{"target", "target", false}, {"met", "met", false}});
    else w.columns.push_back({"compared", "compared", false});
    w.columns.insert(w.columns.end(), {{"spread_percent", "spread (%)"}, {"kvlab_min_s", "kvlab min (s)"}, {"kvlab_max_s", "kvlab max (s)"},
                                       {"peer_min_s", peer + " min (s)"}, {"peer_max_s", peer + " max (s)"}});
    const std::string target_text = fmt::format(">= {:.2f}x", target);
    for (const WholeProcess& x : rows) {
        const bool ran = x.kvlab_s.n > 0, compared = x.skipped.empty();
        const Cell skipped = text_cell("skipped: " + x.skipped);
        std::vector<Cell> row = {int_cell(x.threads)};
        auto real_or_dash = [&](double v, int decimals) { return ran ? real_cell(v, decimals) : text_cell("-"); };
        row.insert(row.end(), {real_or_dash(x.kvlab_s.median, 3), real_or_dash(x.peer_s.median, 3),
                               ran ? ratio_cell(x.speedup.median) : text_cell("-"), real_or_dash(x.kvlab_cores, 2),
                               real_or_dash(x.peer_cores, 2), real_or_dash(x.kvlab_sys_s, 3), real_or_dash(x.peer_sys_s, 3)});
        if (judging) row.insert(row.end(), {text_cell(target_text), compared ? judged(x.speedup.median >= target) : skipped});
        else row.push_back(compared ? text_cell("yes") : skipped);
        row.insert(row.end(), {real_or_dash(spread_percent(x.speedup), 1), real_or_dash(x.kvlab_s.min, 3), real_or_dash(x.kvlab_s.max, 3),
                               real_or_dash(x.peer_s.min, 3), real_or_dash(x.peer_s.max, 3)});
        w.rows.push_back(std::move(row));
    }
    w.notes.push_back(fmt::format("wall time from fork to exit of each process; cores = its CPU time (user + system) / wall time; a "
                                  "thread count {} does not use (cores well below it over a long generation) is not compared; sys: "
                                  "its system time (median), mostly page faults", peer));
    w.notes.push_back("min, max: each program's fastest and slowest run; a wide range for one program and not the other "
                      "means its runs fell into groups that the median hides (docs/performance.md)");
    return w;
}

}  // namespace kvlab::bench
