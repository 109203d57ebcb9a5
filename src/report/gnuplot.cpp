#include "report/gnuplot.hpp"

#include <cerrno>
#include <cmath>
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
#include "kvlab/core/error.hpp"
#include "kvlab/core/text.hpp"

extern char** environ;

namespace kvlab {

namespace fs = std::filesystem;

namespace {

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

// a newline would end the command: never for text from a file or the command line
std::string gp_quote(const std::string& s) {
    std::string out = "'";
    for (const char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
    return out + "'";
}

fs::path find_gnuplot() {
    if (const char* env = std::getenv("KVLAB_GNUPLOT"); env && *env) {
        if (::access(env, X_OK) == 0) return env;
        throw UnavailableError(fmt::format("KVLAB_GNUPLOT={} is not an executable; kvlab draws charts with gnuplot "
                                           "(Debian/Ubuntu: apt install gnuplot-nox)", quote(env)));
    }
    const char* path = std::getenv("PATH");
    std::stringstream dirs(path ? path : "");
    std::string dir;
    while (std::getline(dirs, dir, ':')) {
        const fs::path candidate = fs::path(dir.empty() ? "." : dir) / "gnuplot";
        if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    throw UnavailableError("gnuplot not found on PATH; kvlab draws charts with gnuplot: install the gnuplot-nox "
                           "package (Debian/Ubuntu: apt install gnuplot-nox), or set KVLAB_GNUPLOT to its path");
}

std::string gnuplot_terminal(const fs::path& output, int width, int height, const char* flag) {
    const std::string ext = output.extension().string();
    if (ext == ".svg") return fmt::format("set terminal svg size {},{} dynamic enhanced font 'Helvetica,12' background '#ffffff'\n", width, height);
    if (ext == ".png") return fmt::format("set terminal pngcairo size {},{} enhanced font 'Helvetica,10' background '#ffffff'\n", width, height);
    throw UsageError(fmt::format("{}: {} has extension {}; expected .svg or .png", flag, quote(output.string()), quote(ext, 20)));
}

void draw_with_gnuplot(const fs::path& output, const std::string& data_text, const std::string& script_text,
                       const std::vector<std::string>& args, const char* flag) {
    const std::string ext = output.extension().string();
    gnuplot_terminal(output, 1, 1, flag);  // the extension check
    check_output_path(output, flag);
    const fs::path gnuplot = find_gnuplot();
    // gnuplot reads the data and script files and writes the chart to its stdout and its messages to
    // stderr, all files created here
    TempFile chart(output, flag), data(output, flag, ".dat"), script(output, flag, ".gp"), log(output, flag, ".log");
    for (const auto& [file, text] : {std::pair{&data, &data_text}, std::pair{&script, &script_text}}) {
        std::ofstream out(file->path());
        out << *text;
        if (!out.flush()) throw IoError(fmt::format("{}: writing the gnuplot input for {} failed: {}", flag, quote(output.string()), std::strerror(errno)));
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
                               const_cast<char*>(data_path.c_str())};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));  // ARG2..: text, never script
    argv.push_back(nullptr);
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, gp_path.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) throw IoError(fmt::format("{}: cannot run {} to draw {}: {}", flag, quote(gp_path), quote(output.string()), std::strerror(rc)));
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) throw IoError(fmt::format("waiting for '{}': {}", gp_path, std::strerror(errno)));
    std::ifstream log_in(log.path());
    std::string message, line;
    while (std::getline(log_in, line))
        if (!line.empty() && line.find_first_not_of(" ^") != std::string::npos) message = line;  // gnuplot's last line says what
    // it names the script by its temporary path, gone once this returns: name it for what it is
    for (const std::string& path : {"\"" + script_path + "\"", script_path})
        if (const auto at = message.find(path); at != std::string::npos) message.replace(at, path.size(), "the chart script");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        throw IoError(fmt::format("{}: gnuplot failed drawing {}: {}", flag, quote(output.string()),
                                  message.empty() ? "no message" : quote(message, 200)));
    if (!chart_complete(chart.path(), ext == ".svg"))
        throw IoError(fmt::format("{}: gnuplot's chart for {} is incomplete (a full disk?){}; the old file, if any, is kept",
                                  flag, quote(output.string()), message.empty() ? "" : ": " + quote(message, 200)));
    chart.commit();
}

ByteAxis byte_axis(double max) {
    static const char* names[] = {"bytes", "KiB (2^{10} B)", "MiB (2^{20} B)", "GiB (2^{30} B)", "TiB (2^{40} B)"};
    int k = 0;
    while (k < 4 && max >= std::ldexp(1.0, 10 * (k + 1))) ++k;
    return {std::ldexp(1.0, 10 * k), names[k]};
}

}  // namespace kvlab
