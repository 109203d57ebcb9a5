// Writing a file so that a reader never sees it half-written: a temporary file in the same directory
// (.NAME.tmp-PID), renamed over the target once complete. Non-goals: fsync durability.
#pragma once
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <string_view>

namespace kvlab {

std::filesystem::path temp_path_for(const std::filesystem::path& path);

// Moves a finished `temp` over `path`; removes `temp` and throws IoError naming `flag` on failure.
void replace_with_temp(const std::filesystem::path& temp, const std::filesystem::path& path, std::string_view flag);

// Opens the temporary file, lets `write` fill it, then renames it over `path`. Throws IoError naming
// `flag` when the file cannot be written; on any error no file is left behind.
void write_atomically(const std::filesystem::path& path, std::string_view flag,
                      const std::function<void(std::ostream&)>& write);

}  // namespace kvlab
