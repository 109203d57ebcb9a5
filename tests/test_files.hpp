// File helpers shared by the test binaries (and the fixture generator): a scratch directory removed at
// scope exit, whole-file reads, and the llama2.c -> Hugging Face row order of q/k projections.
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>

#include <unistd.h>

#include <fmt/format.h>

#include "kvlab/weights/weights.hpp"

namespace kvlab::test {

// A fresh directory under the system temp dir, named `<prefix>-<pid>-<n>`, removed with its contents.
class TempDir {
public:
    explicit TempDir(const std::string& prefix) {
        static int counter = 0;
        path_ = std::filesystem::temp_directory_path() / fmt::format("{}-{}-{}", prefix, ::getpid(), counter++);
        std::filesystem::remove_all(path_);
        std::filesystem::create_directories(path_);
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    std::filesystem::path operator/(const std::string& name) const { return path_ / name; }
    const std::filesystem::path& path() const { return path_; }

private:
    std::filesystem::path path_;
};

inline std::string slurp(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

// Neighbour-paired rows (llama2.c) -> the rotate-half order HF Llama stores: within each head of D
// rows, halves row j*D/2 + i holds neighbour row 2i + j (what HF's conversion script does).
inline MatrixRM neighbours_to_halves(const MatrixRM& w, std::int64_t d_head) {
    MatrixRM out(w.rows(), w.cols());
    const std::int64_t half = d_head / 2;
    for (std::int64_t head = 0; head < w.rows() / d_head; ++head)
        for (std::int64_t i = 0; i < half; ++i)
            for (std::int64_t j = 0; j < 2; ++j) out.row(head * d_head + j * half + i) = w.row(head * d_head + 2 * i + j);
    return out;
}

}  // namespace kvlab::test
