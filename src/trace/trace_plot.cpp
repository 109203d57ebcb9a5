#include "trace/trace_plot.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include "core/atomic_write.hpp"
#include "core/error.hpp"
#include "trace/perfetto_trace.hpp"
#include "core/text.hpp"

extern char** environ;

namespace kvlab {

namespace fs = std::filesystem;

namespace {

// gnuplot single-quoted string for kvlab's own constant text (a newline would end the command: never
// use it for text from a file or the command line)
std::string gp_quote(const std::string& s) {
    std::string out = "'";
    for (const char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
    return out + "'";
}

const StepRecord* find_record(const StepTrace& t, StepMode mode, std::int64_t step) {
    for (const auto& r : t.records)
        if (r.mode == mode && r.step == step) return &r;
    return nullptr;
}

std::int64_t modelled_step_ns(const StepRecord& r) {
    std::int64_t ns = 0;
    for (const auto& op : r.cost.ops) ns += modelled_op_ns(op);
    return ns;
}

// Whether a finished chart file is whole: gnuplot can exit 0 after a failed write (a full disk), leaving a
// truncated file. An SVG ends with its closing tag, a PNG with its IEND chunk (PNG spec, 5.6).
bool chart_complete(const fs::path& path, bool svg) {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    const std::streamoff size = in ? static_cast<std::streamoff>(in.tellg()) : 0;
    if (size < 12) return false;
    const std::streamoff tail_size = std::min<std::streamoff>(size, 64);
    std::string tail(static_cast<std::size_t>(tail_size), '\0');
    in.seekg(size - tail_size);
    if (!in.read(tail.data(), tail_size)) return false;
    if (svg) {
        const auto end = tail.find_last_not_of(" \t\r\n");
        return end != std::string::npos && end >= 5 && tail.compare(end - 5, 6, "</svg>") == 0;
    }
    static const char iend[12] = {0, 0, 0, 0, 'I', 'E', 'N', 'D', '\xAE', '\x42', '\x60', '\x82'};
    return tail.compare(tail.size() - 12, 12, std::string(iend, 12)) == 0;
}

}  // namespace

fs::path find_gnuplot() {
    if (const char* env = std::getenv("KVLAB_GNUPLOT"); env && *env) {
        if (::access(env, X_OK) == 0) return env;
        throw UnavailableError(fmt::format("KVLAB_GNUPLOT={} is not an executable; kvlab trace plot needs gnuplot "
                                           "(Debian/Ubuntu: apt install gnuplot-nox)", quote(env)));
    }
    const char* path = std::getenv("PATH");
    std::stringstream dirs(path ? path : "");
    std::string dir;
    while (std::getline(dirs, dir, ':')) {
        const fs::path candidate = fs::path(dir.empty() ? "." : dir) / "gnuplot";
        if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    throw UnavailableError("gnuplot not found on PATH; kvlab trace plot draws with gnuplot: install the gnuplot-nox "
                           "package (Debian/Ubuntu: apt install gnuplot-nox), or set KVLAB_GNUPLOT to its path");
}

void plot_trace(const StepTrace& trace, const fs::path& output, PlotScale scale) {
    const std::string ext = output.extension().string();
    if (ext != ".svg" && ext != ".png")
        throw UsageError(fmt::format("-o: {} has extension {}; expected .svg or .png", quote(output.string()), quote(ext, 20)));
    check_output_path(output, "-o");
    const fs::path gnuplot = find_gnuplot();

    // gnuplot reads the data and script files and writes the chart to its stdout and its messages to
    // stderr, all files created here: no name from the trace or the command line enters the script
    TempFile chart(output, "-o"), data(output, "-o", ".dat"), script(output, "-o", ".gp"), log(output, "-o", ".log");

    // one line per step: step, then per mode flops, bytes, time (ms), KV resident; "?" where a mode is absent
    const bool wall = trace.run.has_wall_time;
    {
        std::ofstream out(data.path());
        if (!out) throw IoError(fmt::format("-o: cannot write the data for {}: {}", quote(output.string()), std::strerror(errno)));
        out << "# step flops_c flops_u bytes_c bytes_u ms_c ms_u kv_c\n";
        for (std::int64_t s = 0; s < trace.run.n_steps_done; ++s) {
            const StepRecord* c = find_record(trace, StepMode::cached, s);
            const StepRecord* u = find_record(trace, StepMode::uncached, s);
            auto col = [](const StepRecord* r, auto value) { return r ? fmt::format("{}", value(*r)) : std::string("?"); };
            auto flops = [](const StepRecord& r) { return r.cost.total().flops; };
            auto bytes = [](const StepRecord& r) { return r.cost.total().bytes_total(); };
            auto ms = [&](const StepRecord& r) { return static_cast<double>(wall ? r.wall_ns : modelled_step_ns(r)) * 1e-6; };
            auto kv = [](const StepRecord& r) { return r.kv_bytes_resident; };
            out << s << ' ' << col(c, flops) << ' ' << col(u, flops) << ' ' << col(c, bytes) << ' ' << col(u, bytes) << ' '
                << col(c, ms) << ' ' << col(u, ms) << ' ' << col(c, kv) << '\n';
        }
        if (!out.flush()) throw IoError(fmt::format("-o: writing the data for {} failed", quote(output.string())));
    }

    const bool has_c = trace.run.mode != SimMode::uncached, has_u = trace.run.mode != SimMode::cached;
    const std::string d = "ARG1";  // the data file's name, passed on gnuplot's command line (gnuplot -c)
    auto series = [&](int col_c, int col_u) {
        std::vector<std::string> parts;
        if (has_c) parts.push_back(fmt::format("{} using 1:{} with linespoints ls 1 title 'cached'", d, col_c));
        if (has_u) parts.push_back(fmt::format("{} using 1:{} with linespoints ls 2 title 'uncached'", d, col_u));
        std::string s;
        for (std::size_t i = 0; i < parts.size(); ++i) s += (i ? ", " : "") + parts[i];
        return s;
    };
    std::ostringstream gp;
    if (ext == ".svg") gp << "set terminal svg size 1200,860 dynamic enhanced font 'Helvetica,12' background '#ffffff'\n";
    else gp << "set terminal pngcairo size 1200,860 enhanced font 'Helvetica,10' background '#ffffff'\n";
    gp << "set output\n"  // stdout: the chart file kvlab opened
       << "set datafile missing '?'\n"
       << "set style line 1 lc rgb '#1b6ca8' lw 2 pt 7 ps 0.4\n"
       << "set style line 2 lc rgb '#d1495b' lw 2 pt 5 ps 0.4\n"
       << "set style line 3 lc rgb '#2e933c' lw 2 pt 9 ps 0.4\n"
       << "set grid\nset key top left\nset xlabel 'step (0 = prefill)'\n"
       << "set format y '%.1s%c'\n";
    // The title holds the trace's display name, text from the file: it reaches gnuplot as ARG2, a string
    // value never read as script (a name with a newline and system("...") in it is only printed), and is
    // drawn noenhanced so ^ _ { } @ print as themselves.
    const std::string title = fmt::format("kvlab trace: {}, prompt {} tokens, {} steps{}", trace.run.display_name,
                                          trace.run.n_prompt, trace.run.n_steps_done,
                                          scale == PlotScale::log ? " (log y)" : "");
    gp << "set multiplot layout 2,2 title ARG2 font ',14' noenhanced\n";
    const char* log_y = scale == PlotScale::log ? "set logscale y\n" : "unset logscale y\n";
    gp << log_y << "set title 'FLOPs per step'\nset ylabel 'FLOP'\nplot " << series(2, 3) << "\n";
    gp << log_y << "set title 'bytes moved per step (weights + activations + KV)'\nset ylabel 'bytes'\nplot "
       << series(4, 5) << "\n";
    gp << log_y << "set format y '%g'\n"
       << "set title " << gp_quote(wall ? "wall time per step (measured)" : "modelled time per step (roofline; --deterministic trace)")
       << "\nset ylabel 'ms'\nplot " << series(6, 7) << "\n";
    gp << "set format y '%.1s%c'\n";
    if (has_c)
        gp << log_y << "set title 'KV-cache bytes resident (cached mode)'\nset ylabel 'bytes'\nplot " << d
           << " using 1:8 with lines ls 3 title 'KV cache'\n";
    else
        gp << "unset logscale y\nset title 'KV-cache bytes resident: no cached mode in this trace'\nset yrange [0:1]\n"
              "plot 0 with lines ls 3 title 'no KV cache'\n";
    gp << "unset multiplot\nset output\n";
    {
        std::ofstream out(script.path());
        out << gp.str();
        if (!out.flush()) throw IoError(fmt::format("-o: writing the gnuplot script for {} failed", quote(output.string())));
    }

    // gnuplot -c SCRIPT DATA TITLE: the chart on stdout, messages to a log that becomes the error message
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, chart.path().c_str(), O_WRONLY | O_TRUNC, 0);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, log.path().c_str(), O_WRONLY | O_TRUNC, 0);
    // absolute names: gnuplot reads a file name starting with '<' as a shell command to run (popen), so a
    // relative name from a directory such as '<touch x;y' would run it; an absolute one starts with '/'
    const std::string gp_path = gnuplot.string(), script_path = fs::absolute(script.path()).string(),
                      data_path = fs::absolute(data.path()).string();
    std::vector<char*> argv = {const_cast<char*>(gp_path.c_str()), const_cast<char*>("-c"), const_cast<char*>(script_path.c_str()),
                               const_cast<char*>(data_path.c_str()), const_cast<char*>(title.c_str()), nullptr};
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, gp_path.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) throw IoError(fmt::format("-o: cannot run {} to draw {}: {}", quote(gp_path), quote(output.string()), std::strerror(rc)));
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) throw IoError(fmt::format("waiting for '{}': {}", gp_path, std::strerror(errno)));
    std::ifstream log_in(log.path());
    std::string message, line;
    while (std::getline(log_in, line))
        if (!line.empty() && line.find_first_not_of(" ^") != std::string::npos) message = line;  // gnuplot's last line says what
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        throw IoError(fmt::format("-o: gnuplot failed drawing {}: {}", quote(output.string()),
                                  message.empty() ? "no message" : quote(message, 200)));
    if (!chart_complete(chart.path(), ext == ".svg"))
        throw IoError(fmt::format("-o: gnuplot's chart for {} is incomplete (a full disk?){}; the old file, if any, is kept",
                                  quote(output.string()), message.empty() ? "" : ": " + quote(message, 200)));
    chart.commit();
}

}  // namespace kvlab
