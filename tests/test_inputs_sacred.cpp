// Issue 46 at the library level (docs/reliability.md): an output never replaces an input, however the
// two are named; every value from outside is shown escaped and cut; temporary names fit beside any
// legal output name. The CLI halves are tests/cli/hostile.cmake and tests/cli/hostile_values.sh.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "core/atomic_write.hpp"
#include "kvlab/core/error.hpp"
#include "core/file_roles.hpp"
#include "core/json_input.hpp"
#include "kvlab/core/mapped_file.hpp"
#include "kvlab/core/text.hpp"
#include "test_files.hpp"

using namespace kvlab;
namespace fs = std::filesystem;
using kvlab::test::TempDir;

namespace {

void touch(const fs::path& p, const std::string& text = "x") { std::ofstream(p) << text; }

// The UsageError message check_file_roles throws, or "" when it accepts.
std::string refusal(const std::vector<NamedPath>& in, const std::vector<NamedPath>& out) {
    try {
        check_file_roles(in, out);
        return "";
    } catch (const UsageError& e) {
        return e.what();
    }
}

// True when `text` holds a byte a terminal could act on: C0 controls, DEL, or a C1 control (U+0080..U+009F
// written in UTF-8 as C2 80..C2 9F).
bool has_control_byte(const std::string& text) {
    for (std::size_t i = 0; i < text.size(); ++i) {
        const auto c = static_cast<unsigned char>(text[i]);
        if (c < 0x20 || c == 0x7F) return true;
        if (c == 0xC2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) < 0xA0) return true;
    }
    return false;
}

}  // namespace

TEST_CASE("check_file_roles refuses an output that is an input under any name") {
    const TempDir dir("kvlab-roles");
    touch(dir / "w.jsonl");
    const std::string w = (dir / "w.jsonl").string();
    // the same spelling
    CHECK(refusal({{"--workload", w}}, {{"--trace", w}}).find("--trace: ") == 0);
    CHECK(refusal({{"--workload", w}}, {{"--trace", w}}) ==
          fmt::format("--trace: {} is also this command's input (--workload); an output never replaces an input: name another file", quote(w)));
    // ./ and .. in the path
    CHECK_FALSE(refusal({{"--workload", w}}, {{"--trace", (dir.path() / "." / "w.jsonl").string()}}).empty());
    fs::create_directories(dir / "sub");
    CHECK_FALSE(refusal({{"--workload", w}}, {{"--trace", (dir.path() / "sub" / ".." / "w.jsonl").string()}}).empty());
    // a hard link: another name, the same inode
    fs::create_hard_link(dir / "w.jsonl", dir / "hard.jsonl");
    const std::string hard = refusal({{"--workload", w}}, {{"--trace", (dir / "hard.jsonl").string()}});
    CHECK(hard.find(fmt::format("(--workload {}, the same file under another name)", quote(w, 60))) != std::string::npos);
    // an input given through a symbolic link
    fs::create_symlink(dir / "w.jsonl", dir / "link.jsonl");
    CHECK_FALSE(refusal({{"--workload", (dir / "link.jsonl").string()}}, {{"--trace", w}}).empty());
    // a different file is fine, and so is an input that does not exist (a preset name is not a path)
    CHECK(refusal({{"--workload", w}}, {{"--trace", (dir / "other.jsonl").string()}}).empty());
    CHECK(refusal({{"-m", "stories260k"}}, {{"--trace", (dir / "stories260k").string()}}).empty());
}

TEST_CASE("check_file_roles: a model directory stands for the files read from it") {
    const TempDir dir("kvlab-roles-dir");
    fs::create_directories(dir / "hf");
    touch(dir / "hf" / "config.json", "{}");
    touch(dir / "hf" / "model-00001-of-00002.safetensors");
    touch(dir / "hf" / "notes.csv");
    const std::string hf = (dir / "hf").string();
    CHECK(refusal({{"--checkpoint", hf}}, {{"--trace", (dir / "hf" / "config.json").string()}}).find(fmt::format("(--checkpoint {}, which reads", quote(hf, 60))) != std::string::npos);
    CHECK_FALSE(refusal({{"--checkpoint", hf}}, {{"--save-checkpoint", (dir / "hf" / "model-00001-of-00002.safetensors").string()}}).empty());
    // a file the reader never opens, and a new one, may be written there
    CHECK(refusal({{"--checkpoint", hf}}, {{"--trace", (dir / "hf" / "notes.csv").string()}}).empty());
    CHECK(refusal({{"--checkpoint", hf}}, {{"--trace", (dir / "hf" / "run.json").string()}}).empty());
}

TEST_CASE("check_file_roles refuses two outputs naming one file, even before it exists") {
    const TempDir dir("kvlab-roles-out");
    const std::string a = (dir / "same.csv").string();
    CHECK(refusal({}, {{"--save-checkpoint", a}, {"--trace", (dir.path() / "." / "same.csv").string()}}) ==
          fmt::format("--save-checkpoint and --trace: both name {}; give two different files", quote((dir.path() / "." / "same.csv").string())));
    CHECK(refusal({}, {{"--save-checkpoint", a}, {"--trace", (dir / "other.csv").string()}}).empty());
    CHECK_FALSE(fs::exists(a));
}

TEST_CASE("A file read through the input readers is refused as an output by its path check and by the rename") {
    const TempDir dir("kvlab-roles-read");
    touch(dir / "gpus.json", "{}");
    fs::create_hard_link(dir / "gpus.json", dir / "alias.json");
    track_inputs(true);  // as the kvlab executable does; off again at the end
    (void)read_input_file(dir / "gpus.json", "GPU table", 1 << 20);
    CHECK_THROWS_WITH_AS(check_output_path(dir / "alias.json", "--trace"),
                         doctest::Contains("is also this command's input (the GPU table, read as"), UsageError);
    // a temporary created before the file was read is still refused at the rename, and removed
    touch(dir / "late.bin", "weights");
    {
        TempFile temp(dir / "late.bin", "--save-checkpoint");
        (void)MappedFile(dir / "late.bin", "llama2.c checkpoint");
        CHECK_THROWS_WITH_AS(temp.commit(), doctest::Contains("--save-checkpoint: "), UsageError);
    }
    std::ifstream in(dir / "late.bin");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(text == "weights");
    std::size_t left = 0;
    for (const auto& e : fs::directory_iterator(dir.path())) left += e.path().filename().string().find(".tmp-") != std::string::npos;
    CHECK(left == 0);
    // a file read and then deleted frees its inode, which a new file may get: not mistaken for the input
    fs::remove(dir / "gpus.json");
    fs::remove(dir / "alias.json");
    touch(dir / "new.json");
    CHECK_NOTHROW(check_output_path(dir / "new.json", "--trace"));
    // with tracking off (a library user), nothing is remembered
    track_inputs(false);
    (void)read_input_file(dir / "late.bin", "file", 1 << 20);
    CHECK_NOTHROW(check_output_path(dir / "late.bin", "--trace"));
}

TEST_CASE("Temporary names stay short, so an output name of 255 bytes can be written") {
    const TempDir dir("kvlab-long-name");
    // NAME_MAX is 255 on Linux file systems: the longest legal name
    const std::string name = std::string(251, 'n') + ".csv";
    REQUIRE(name.size() == 255);
    write_atomically(dir / name, "--trace", [](std::ostream& out) { out << "step\n"; });
    CHECK(fs::file_size(dir / name) == 5);
    check_output_path(dir / name, "--trace");  // the probe's temporary fits too
}

TEST_CASE("one_line, quote and json_excerpt never pass a control byte and bound their length") {
    const std::string esc = "\x1b]0;title\x07\x1b[2J";
    const std::string c1 = "\xC2\x9B" "31m";  // U+009B, CSI as one character
    const std::string big(100000, 'y');
    for (const std::string& text : {esc, c1, std::string("\xFF\xFE"), esc + big, std::string("a\x7F" "b")}) {
        CHECK_FALSE(has_control_byte(quote(text)));
        CHECK_FALSE(has_control_byte(one_line(text)));
        CHECK_FALSE(has_control_byte(json_excerpt(nlohmann::json(to_valid_utf8(text)))));
        CHECK(quote(text).size() <= 4 * 80 + 40);       // 80 bytes, each at most 4 when escaped, plus the note
        CHECK(one_line(text).size() <= 2000 + 40);
        CHECK(json_excerpt(nlohmann::json(to_valid_utf8(text))).size() <= 4 * 80 + 40);
    }
    CHECK(quote(c1) == "'\\xC2\\x9B31m'");
    CHECK(quote("é") == "'é'");  // printable UTF-8 stays as it is
    CHECK(one_line(big).find("(cut; 100000 bytes in all)") != std::string::npos);
    CHECK(json_excerpt(nlohmann::json(big)).find("(100002 bytes)") != std::string::npos);  // the dump's quotes counted
}
