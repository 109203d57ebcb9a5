// What every kvlab fuzz target checks besides the sanitizers: a reader given any bytes either accepts
// them or throws a kvlab::Error (exit code 2 for input) whose message is one short line without raw
// control bytes. Any other exception (a library's type_error, bad_alloc, filesystem_error) escapes to
// the user as an unexplained failure and is a finding: the target aborts so libFuzzer keeps the input.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <unistd.h>

#include "kvlab/core/error.hpp"

namespace kvlab::fuzz {

// A scratch directory of this process, for readers that take a path.
inline const std::filesystem::path& scratch_dir() {
    static const std::filesystem::path dir = [] {
        auto d = std::filesystem::temp_directory_path() / ("kvlab-fuzz-" + std::to_string(::getpid()));
        std::filesystem::create_directories(d);
        std::atexit([] {
            std::error_code ec;
            std::filesystem::remove_all(std::filesystem::temp_directory_path() / ("kvlab-fuzz-" + std::to_string(::getpid())), ec);
        });
        return d;
    }();
    return dir;
}

inline std::filesystem::path write_scratch(const std::string& name, std::string_view bytes) {
    const auto path = scratch_dir() / name;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) std::abort();
    return path;
}

[[noreturn]] inline void finding(const char* what, const char* message) {
    std::fprintf(stderr, "kvlab fuzz finding: %s: %.400s\n", what, message);
    std::abort();
}

// Runs `read`; input errors are expected, anything else is a finding.
template <typename Fn>
void expect_kvlab_errors_only(Fn read) {
    try {
        read();
    } catch (const kvlab::Error& e) {
        const std::string_view m = e.what();
        if (m.size() > 2000) finding("error message longer than 2000 bytes", e.what());
        for (std::size_t i = 0; i < m.size(); ++i) {  // C0 controls, DEL, and C1 controls in UTF-8 (C2 80..C2 9F)
            const auto c = static_cast<unsigned char>(m[i]);
            if (c < 0x20 || c == 0x7F || (c == 0xC2 && i + 1 < m.size() && static_cast<unsigned char>(m[i + 1]) < 0xA0))
                finding("raw control byte in an error message", e.what());
        }
    } catch (const std::exception& e) {
        finding("an exception that is not a kvlab::Error", e.what());
    }
}

}  // namespace kvlab::fuzz
