#include "kvlab/trace_plot.hpp"

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

#include "kvlab/atomic_write.hpp"
#include "kvlab/error.hpp"
#include "kvlab/perfetto_trace.hpp"

extern char** environ;

namespace kvlab {

namespace fs = std::filesystem;

namespace {

// gnuplot single-quoted string: only '' needs escaping
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

// Removes the scratch files however plot_trace leaves.
struct ScratchFiles {
    std::vector<fs::path> paths;
    ~ScratchFiles() {
        std::error_code ec;
        for (const auto& p : paths) fs::remove(p, ec);
    }
};

}  // namespace

fs::path find_gnuplot() {
    if (const char* env = std::getenv("KVLAB_GNUPLOT"); env && *env) {
        if (::access(env, X_OK) == 0) return env;
        throw UnavailableError(fmt::format("KVLAB_GNUPLOT='{}' is not an executable; kvlab trace plot needs gnuplot "
                                           "(Debian/Ubuntu: apt install gnuplot-nox)", env));
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
        throw UsageError(fmt::format("-o: '{}' has extension '{}'; expected .svg or .png", output.string(), ext));
    const fs::path dir = output.parent_path().empty() ? fs::path(".") : output.parent_path();
    std::error_code ec;
    if (!fs::is_directory(dir, ec))
        throw UsageError(fmt::format("-o: cannot write '{}': directory '{}' does not exist", output.string(), dir.string()));
    const fs::path gnuplot = find_gnuplot();

    ScratchFiles scratch;
    const fs::path temp = temp_path_for(output);
    const fs::path data = fs::path(temp.string() + ".dat"), script = fs::path(temp.string() + ".gp"),
                   log = fs::path(temp.string() + ".log");
    scratch.paths = {data, script, log, temp};

    // one line per step: step, then per mode flops, bytes, time (ms), KV resident; "?" where a mode is absent
    const bool wall = trace.run.has_wall_time;
    {
        std::ofstream out(data);
        if (!out) throw IoError(fmt::format("-o: cannot write '{}': {}", data.string(), std::strerror(errno)));
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
        if (!out.flush()) throw IoError(fmt::format("-o: writing '{}' failed", data.string()));
    }

    const bool has_c = trace.run.mode != SimMode::uncached, has_u = trace.run.mode != SimMode::cached;
    const std::string d = gp_quote(data.string());
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
    gp << "set output " << gp_quote(temp.string()) << "\n"
       << "set datafile missing '?'\n"
       << "set style line 1 lc rgb '#1b6ca8' lw 2 pt 7 ps 0.4\n"
       << "set style line 2 lc rgb '#d1495b' lw 2 pt 5 ps 0.4\n"
       << "set style line 3 lc rgb '#2e933c' lw 2 pt 9 ps 0.4\n"
       << "set grid\nset key top left\nset xlabel 'step (0 = prefill)'\n"
       << "set format y '%.1s%c'\n";
    const std::string title = fmt::format("kvlab trace: {}, prompt {} tokens, {} steps{}", trace.run.display_name,
                                          trace.run.n_prompt, trace.run.n_steps_done,
                                          scale == PlotScale::log ? " (log y)" : "");
    gp << "set multiplot layout 2,2 title " << gp_quote(title) << " font ',14'\n";
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
        std::ofstream out(script);
        out << gp.str();
        if (!out.flush()) throw IoError(fmt::format("-o: writing '{}' failed", script.string()));
    }

    // gnuplot SCRIPT, its messages to a log file that becomes the error message on failure
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const std::string gp_path = gnuplot.string(), script_path = script.string();
    std::vector<char*> argv = {const_cast<char*>(gp_path.c_str()), const_cast<char*>(script_path.c_str()), nullptr};
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, gp_path.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) throw IoError(fmt::format("cannot run '{}': {}", gp_path, std::strerror(rc)));
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) throw IoError(fmt::format("waiting for '{}': {}", gp_path, std::strerror(errno)));
    std::ifstream log_in(log);
    std::string message, line;
    while (std::getline(log_in, line))
        if (!line.empty() && line.find_first_not_of(" ^") != std::string::npos) message = line;  // gnuplot's last line says what
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !fs::exists(temp) || fs::file_size(temp, ec) == 0)
        throw IoError(fmt::format("gnuplot failed drawing '{}': {}", output.string(), message.empty() ? "no message" : message));
    replace_with_temp(temp, output, "-o");
}

}  // namespace kvlab
