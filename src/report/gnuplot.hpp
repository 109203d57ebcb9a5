// Charts drawn by gnuplot (Debian package gnuplot-nox), for `trace plot` and `kvcalc --plot`: finding
// it, and running one script over one data file into an .svg or .png written atomically. Nothing from a
// file or the command line ever enters a script: such text reaches gnuplot as string arguments (ARGn).
// Non-goal: drawing SVG or PNG ourselves.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace kvlab {

// Where gnuplot is: $KVLAB_GNUPLOT if set, else the first `gnuplot` on PATH. Throws UnavailableError
// naming the gnuplot-nox package when there is none.
std::filesystem::path find_gnuplot();

// A gnuplot single-quoted string of kvlab's own constant text (never text from a file or the user).
std::string gp_quote(const std::string& s);

// A chart axis of bytes: the binary unit its largest value `max` reads in (bytes, KiB, .. TiB), the
// scale to divide by and the label ("MiB (2^{20} B)"), so ticks are round numbers of that unit.
struct ByteAxis {
    double scale;
    std::string label;
};
ByteAxis byte_axis(double max);

// The `set terminal` line for `output` (.svg or .png) at width x height pixels. Throws UsageError for
// another extension, naming `flag`.
std::string gnuplot_terminal(const std::filesystem::path& output, int width, int height, const char* flag = "-o");

// Draws `output`: `data` and `script` go to temporary files beside it, gnuplot runs `-c script data
// args...` (ARG1 is the data file, ARG2.. the args) with the chart on its stdout, and the chart replaces
// `output` only when gnuplot exited 0 and the file is whole. Checks `output` first (UsageError), throws
// UnavailableError without gnuplot, IoError when it fails (its last message line included).
void draw_with_gnuplot(const std::filesystem::path& output, const std::string& data, const std::string& script,
                       const std::vector<std::string>& args, const char* flag = "-o");

}  // namespace kvlab
