// Inputs are sacred: no file a command writes may replace a file it reads. Two guards, one rule:
// before any work, a command's output paths are compared with its input paths (check_file_roles); and
// every file kvlab opens for reading is remembered (note_input), so an output that names a file read
// along the way (a preset's config, a model's shipped checkpoint) is refused when its path is checked
// and again just before a temporary is renamed over it. Non-goal: files changed by other processes.
#pragma once
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace kvlab {

// A path a command was given and the flag that gave it ("--trace", "-o", "file").
struct NamedPath {
    std::string flag;
    std::string path;
};

// Throws UsageError (exit 2), naming both flags, when an output is one of the inputs or two outputs are
// one file. The same file is recognised however it is named: `a`, `./a`, an absolute path, a symbolic
// link to it or a hard link (device and inode, for files that exist); outputs that do not exist yet
// are compared by their resolved absolute path. An input that is a directory (a Hugging Face model
// folder) stands for the files kvlab reads from it: config.json, *.safetensors and
// model.safetensors.index.json directly inside it. Inputs that do not exist are skipped (their reader
// reports them; a preset name is not a path).
void check_file_roles(const std::vector<NamedPath>& inputs, const std::vector<NamedPath>& outputs);

// Turns the remembering of files read on (the kvlab executable: one process, one command) or off (the
// default, for a library user or a test that writes a file it read earlier); either way the list starts empty.
void track_inputs(bool on);

// While tracking is on, remembers that this process reads the regular file `path` (device `dev`, inode
// `ino`), described as `what` ("config file"). Called by the input readers (core/mapped_file.cpp);
// thread-safe.
void note_input(const std::filesystem::path& path, std::string_view what, unsigned long long dev, unsigned long long ino);

// Throws UsageError naming `flag` when `output` exists and is a file this process has read (any name
// of it) and that is still there under the name it was read by (so an inode freed by a deleted input and
// reused is not mistaken for it). Called by check_output_path and again by TempFile::commit.
void refuse_if_input(const std::filesystem::path& output, std::string_view flag);

}  // namespace kvlab
