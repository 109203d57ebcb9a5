#include "kvlab/atomic_write.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <system_error>
#include <unistd.h>

#include <fmt/format.h>

#include "kvlab/error.hpp"

namespace kvlab {

namespace fs = std::filesystem;

fs::path temp_path_for(const fs::path& path) {
    return path.parent_path() / fmt::format(".{}.tmp-{}", path.filename().string(), ::getpid());
}

void replace_with_temp(const fs::path& temp, const fs::path& path, std::string_view flag) {
    std::error_code ec;
    fs::rename(temp, path, ec);
    if (ec) {
        const std::string reason = ec.message();
        fs::remove(temp, ec);
        throw IoError(fmt::format("{}: cannot rename '{}' to '{}': {}", flag, temp.string(), path.string(), reason));
    }
}

void write_atomically(const fs::path& path, std::string_view flag, const std::function<void(std::ostream&)>& write) {
    const fs::path temp = temp_path_for(path);
    std::error_code ec;
    {
        std::ofstream out(temp, std::ios::binary);
        if (!out) throw IoError(fmt::format("{}: cannot write '{}': {}", flag, temp.string(), std::strerror(errno)));
        try {
            write(out);
        } catch (...) {
            out.close();
            fs::remove(temp, ec);
            throw;
        }
        out.flush();
        if (!out) {
            const std::string reason = std::strerror(errno);
            out.close();
            fs::remove(temp, ec);
            throw IoError(fmt::format("{}: writing '{}' failed: {}", flag, temp.string(), reason));
        }
    }
    replace_with_temp(temp, path, flag);
}

}  // namespace kvlab
