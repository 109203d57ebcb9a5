#include "core/file_roles.hpp"

#include <mutex>
#include <optional>
#include <system_error>

#include <sys/stat.h>

#include <fmt/format.h>

#include "kvlab/core/error.hpp"
#include "kvlab/core/text.hpp"

namespace kvlab {

namespace fs = std::filesystem;

namespace {

struct FileId {
    unsigned long long dev = 0, ino = 0;
    bool operator==(const FileId&) const = default;
};

// The device and inode of the file `path` names (symbolic links followed), if it exists.
std::optional<FileId> file_id(const fs::path& path) {
    struct stat info {};
    if (::stat(path.c_str(), &info) != 0) return std::nullopt;
    return FileId{static_cast<unsigned long long>(info.st_dev), static_cast<unsigned long long>(info.st_ino)};
}

// `path` absolute, with every part that exists resolved (symbolic links, `..`): "a" and "./a" and the
// absolute name agree even when the file does not exist yet.
fs::path resolved(const fs::path& path) {
    std::error_code ec;
    const fs::path absolute = fs::absolute(path, ec).lexically_normal();
    if (ec) return path.lexically_normal();
    const fs::path canonical = fs::weakly_canonical(absolute, ec);
    return ec ? absolute : canonical;
}

// The files kvlab reads from a model directory (a Hugging Face folder): its config.json, its shard
// index and its safetensors shards.
bool read_from_model_directory(const fs::path& name) {
    const std::string n = name.string();
    return n == "config.json" || n == "model.safetensors.index.json" ||
           (n.size() > 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0);
}

// One input file as compared: the flag, the path given, and the file it names.
struct InputFile {
    const NamedPath* given;
    fs::path file;  // the file itself (inside the directory, for a directory input)
    FileId id;
};

// "--workload", "--checkpoint 'tiny.bin', the same file under another name", "--checkpoint 'hf', which
// reads 'config.json' there": how an input that `output` would replace was given.
std::string input_named(const InputFile& in, const std::string& output) {
    if (in.file.string() != in.given->path)
        return fmt::format("{} {}, which reads {} there", in.given->flag, quote(in.given->path, 60), quote(in.file.filename().string(), 60));
    if (in.given->path != output) return fmt::format("{} {}, the same file under another name", in.given->flag, quote(in.given->path, 60));
    return in.given->flag;
}

std::vector<InputFile> input_files(const std::vector<NamedPath>& inputs) {
    std::vector<InputFile> files;
    for (const NamedPath& in : inputs) {
        std::error_code ec;
        if (fs::is_directory(in.path, ec)) {
            for (fs::directory_iterator it(in.path, ec), end; !ec && it != end; it.increment(ec))
                if (read_from_model_directory(it->path().filename()))
                    if (const auto id = file_id(it->path())) files.push_back({&in, it->path(), *id});
        } else if (const auto id = file_id(in.path)) {
            files.push_back({&in, in.path, *id});
        }
    }
    return files;
}

struct Remembered {
    fs::path path;
    std::string what;
    FileId id;
};

std::mutex remembered_mutex;
bool tracking = false;  // guarded by remembered_mutex
std::vector<Remembered>& remembered() {
    static std::vector<Remembered> files;
    return files;
}

}  // namespace

void check_file_roles(const std::vector<NamedPath>& inputs, const std::vector<NamedPath>& outputs) {
    const std::vector<InputFile> files = input_files(inputs);
    for (std::size_t i = 0; i < outputs.size(); ++i) {
        const NamedPath& out = outputs[i];
        if (const auto id = file_id(out.path))
            for (const InputFile& in : files)
                if (in.id == *id)
                    throw UsageError(fmt::format("{}: {} is also this command's input ({}); an output never replaces an input: "
                                                 "name another file",
                                                 out.flag, quote(out.path), input_named(in, out.path)));
        for (std::size_t j = 0; j < i; ++j) {
            const auto a = file_id(outputs[j].path), b = file_id(out.path);
            if ((a && b && *a == *b) || resolved(outputs[j].path) == resolved(out.path))
                throw UsageError(fmt::format("{} and {}: both name {}; give two different files", outputs[j].flag, out.flag, quote(out.path)));
        }
    }
}

void track_inputs(bool on) {
    const std::lock_guard lock(remembered_mutex);
    tracking = on;
    remembered().clear();
}

void note_input(const fs::path& path, std::string_view what, unsigned long long dev, unsigned long long ino) {
    const std::lock_guard lock(remembered_mutex);
    if (!tracking) return;
    for (const Remembered& r : remembered())
        if (r.id == FileId{dev, ino}) return;
    remembered().push_back({path, std::string(what.substr(0, what.find(" ("))), {dev, ino}});  // "config file", not its gloss
}

void refuse_if_input(const fs::path& output, std::string_view flag) {
    const auto id = file_id(output);
    if (!id) return;
    const std::lock_guard lock(remembered_mutex);
    for (const Remembered& r : remembered())
        if (r.id == *id && file_id(r.path) == r.id)
            throw UsageError(fmt::format("{}: {} is also this command's input (the {}{}); an output never replaces an input: "
                                         "name another file",
                                         flag, quote(output.string()), r.what,
                                         r.path == output ? "" : fmt::format(", read as {}", quote(r.path.string(), 60))));
}

}  // namespace kvlab
