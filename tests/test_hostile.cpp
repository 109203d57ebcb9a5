// Regression tests of issue 13 at the library level (docs/reliability.md): quoting of input in messages,
// depth-capped JSON in every reader, checked widths, the linear-time tokenizer, output files that are
// never half-written or left behind, and the signal handlers. The CLI halves are tests/cli/hostile.cmake
// and tests/cli/interrupt.sh.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#include "fixture_writers.hpp"
#include "core/atomic_write.hpp"
#include "kvlab/core/error.hpp"
#include "formats/hf_checkpoint.hpp"
#include "core/interrupt.hpp"
#include "core/json_input.hpp"
#include "kvlab/weights/random_weights.hpp"
#include "formats/safetensors.hpp"
#include "kvlab/core/text.hpp"
#include "kvlab/formats/tokenizer.hpp"
#include "kvlab/model/transformer.hpp"
#include "test_files.hpp"

using namespace kvlab;
namespace fs = std::filesystem;
using kvlab::test::TempDir;

namespace {

std::string nested(int depth) { return std::string(static_cast<std::size_t>(depth), '[') + std::string(static_cast<std::size_t>(depth), ']'); }

std::string message_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const std::exception& e) {
        return e.what();
    }
    return "(no exception)";
}

}  // namespace

TEST_CASE("quote() escapes control bytes and invalid UTF-8 and cuts long values") {
    CHECK(quote("a\nb") == "'a\\nb'");
    CHECK(quote("tab\there, 'q'") == "'tab\\there, \\'q\\''");
    CHECK(quote("\x1b[31m") == "'\\x1B[31m'");        // a terminal escape is shown, not sent
    CHECK(quote("caf\xC3\xA9") == "'caf\xC3\xA9'");   // valid UTF-8 stays
    CHECK(quote("\xFF\xC3") == "'\\xFF\\xC3'");       // invalid (and cut) sequences as bytes
    CHECK(quote(std::string(1000, 'x'), 10) == "'xxxxxxxxxx' (cut; 1000 bytes in all)");
    CHECK(to_valid_utf8("a\xFF" "b") == "a\xEF\xBF\xBD" "b");
    CHECK(is_valid_utf8("caf\xC3\xA9"));
    CHECK_FALSE(is_valid_utf8("\xC0\xAF"));  // overlong '/'
}

TEST_CASE("parse_json caps nesting at 64 levels and names line and column of a syntax error") {
    CHECK(parse_json(nested(max_json_depth), "f").is_array());
    CHECK(message_of([] { parse_json(nested(max_json_depth + 1), "f.json"); }) ==
          "f.json: JSON nested more than 64 levels deep; expected a flat document (a config, header or trace nests at most a few levels)");
    CHECK_THROWS_AS(parse_json(nested(100000), "f"), FormatError);  // 100k levels: no stack exhaustion
    // "{\n  \"a\": tru\n}": the literal "tru" ends at the newline after it, byte 12; line 2 starts at
    // byte 2, so that is line 2, column 12 - 2 + 1 = 11
    const std::string msg = message_of([] { parse_json("{\n  \"a\": tru\n}", "g.json"); });
    CHECK(msg.rfind("g.json: not valid JSON at line 2, column 11: ", 0) == 0);
    CHECK(message_of([] { parse_json("{\"a\": [1, 2", "h.json"); }).find("the text ends early") != std::string::npos);
    try {
        parse_json("[1, 2", "t");
        FAIL("expected a syntax error");
    } catch (const JsonSyntaxError& e) {
        CHECK(e.at_end);
        CHECK(e.exit_code() == 2);
    }
    // printing text that is not UTF-8 replaces it instead of throwing type_error.316
    CHECK(json_dump(nlohmann::json("a\xFF")) == "\"a\xEF\xBF\xBD\"");
}

TEST_CASE("safetensors headers and shard indexes refuse deep nesting") {
    TempDir dir("kvlab-hostile");
    std::string st;
    const std::string header = "{\"x\": " + nested(5000) + "}";
    fixtures::put<std::uint64_t>(st, header.size());
    fixtures::write_file(dir / "deep.safetensors", st + header);
    CHECK(message_of([&] { SafetensorsFile f(dir / "deep.safetensors"); }).find("nested more than 64 levels") != std::string::npos);

    fixtures::write_sharded_hf(dir / "hf", random_weights(fixtures::tiny_config(), 7, 0.5f));
    fixtures::write_file(dir / "hf" / "model.safetensors.index.json", "{\"weight_map\": " + nested(5000) + "}");
    CHECK(message_of([&] { load_hf_checkpoint(dir / "hf"); }).find("index.json: JSON nested more than 64") != std::string::npos);
}

TEST_CASE("Widths formed from config values are overflow-checked") {
    ModelConfig c;
    c.n_head = std::int64_t{1} << 40, c.n_head_kv = 1, c.d_head = std::int64_t{1} << 24;  // 2^64 wraps to 0 unchecked
    CHECK_THROWS_AS(c.d_q(), OverflowError);
    CHECK(c.d_kv() == (std::int64_t{1} << 24));
    c.n_head = std::int64_t{1} << 20;  // 2^44 fits; 2^44 x 2 x 2^40 positions of K/V activations does not
    c.d_model = 64, c.d_ff = 128, c.n_vocab = 32, c.n_layer = 1, c.family = Family::llama;
    CHECK_THROWS_AS(Transformer::activation_bytes(c, {std::int64_t{1} << 40, std::int64_t{1} << 40, true}), OverflowError);
}

TEST_CASE("Encoding is linear-time and matches the quadratic merge on a long text") {
    TempDir dir("kvlab-hostile");
    fixtures::write_file(dir / "tok.bin", fixtures::tokenizer_512());
    const Tokenizer tok = Tokenizer::load(dir / "tok.bin", 512);
    // "hi hi ... hi" (20000 times) -> " hi hi ... hi": each "h","i" merges to "hi" (-1, better than any
    // " h"), then " "+"hi" to " hi" (287, -2): 20000 tokens of 287 after BOS. The quadratic loop took
    // minutes at this size; the heap takes milliseconds.
    std::string text;
    for (int i = 0; i < 20000; ++i) text += i ? " hi" : "hi";
    const auto ids = tok.encode(text);
    REQUIRE(ids.size() == 20001);
    CHECK(ids[0] == 1);
    CHECK(std::count(ids.begin() + 1, ids.end(), 287) == 20000);
    CHECK(tok.max_piece_bytes() == 6);                 // "<0x00>" and "\n</s>\n"
    CHECK(tok.min_tokens(text.size(), true) == 10001);  // ceil((59999 + 1) / 6) + BOS
    CHECK(static_cast<std::int64_t>(ids.size()) >= tok.min_tokens(text.size(), true));
}

TEST_CASE("A tokenizer score that is NaN is refused") {
    std::vector<std::string> pieces = {"a", "b"};
    CHECK_THROWS_AS(Tokenizer(pieces, {0.0f, std::nanf("")}, "t.bin"), FormatError);
}

TEST_CASE("write_atomically: the old file survives a failed write, and no temporary is left") {
    TempDir dir("kvlab-hostile");
    const fs::path out = dir / "out.csv";
    fixtures::write_file(out, "old");
    CHECK_THROWS_AS(write_atomically(out, "--trace", [](std::ostream&) { throw IoError("writer failed"); }), IoError);
    const std::string msg = message_of([&] {
        write_atomically(out, "--trace", [](std::ostream& o) { o.setstate(std::ios::badbit); });  // as on a full disk
    });
    CHECK(msg.find("--trace: writing '" + out.string() + "' failed") == 0);  // names the user's file, not the temporary
    CHECK(kvlab::test::slurp(out) == "old");
    std::size_t n_files = 0;
    for (const auto& e : fs::directory_iterator(dir.path())) n_files += e.path().filename() == "out.csv" ? 0 : 1;
    CHECK(n_files == 0);
    write_atomically(out, "--trace", [](std::ostream& o) { o << "new"; });
    CHECK(kvlab::test::slurp(out) == "new");
}

TEST_CASE("write_atomically keeps every byte in order across its 2 MiB pieces") {
    TempDir dir("kvlab-hostile");
    const fs::path out = dir / "big.bin";
    // single characters, short writes and one write longer than a piece, ending off a piece's boundary:
    // 1 + 1000 + 3 MiB + 1 MiB + 5 bytes = 4195310 bytes, the pieces cut at 2 MiB and 4 MiB
    std::string expected;
    auto pattern = [](std::size_t n, char seed) {
        std::string s(n, '\0');
        for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + static_cast<char>(i % 251));
        return s;
    };
    const std::string small = pattern(1000, 'a'), long_write = pattern(3 << 20, 'b'), mid = pattern(1 << 20, 'c');
    expected = "x" + small + long_write + mid + "tail!";
    write_atomically(out, "--save-checkpoint", [&](std::ostream& o) {
        o.put('x');
        o.write(small.data(), static_cast<std::streamsize>(small.size()));
        o.write(long_write.data(), static_cast<std::streamsize>(long_write.size()));
        o.write(mid.data(), static_cast<std::streamsize>(mid.size()));
        o << "tail!";
    });
    CHECK(fs::file_size(out) == 4195310);
    CHECK(kvlab::test::slurp(out) == expected);
}

TEST_CASE("check_output_path refuses what a rename would destroy") {
    TempDir dir("kvlab-hostile");
    CHECK(message_of([] { check_output_path("/dev/null", "-o"); }) == "-o: '/dev/null' is a device or special file; expected a regular file");
    fixtures::write_file(dir / "target", "x");
    fs::create_symlink(dir / "target", dir / "link");
    CHECK(message_of([&] { check_output_path(dir / "link", "--trace"); }).find("is a symbolic link") != std::string::npos);
    CHECK(message_of([&] { check_output_path(dir.path(), "--trace"); }).find("is a directory") != std::string::npos);
    CHECK_NOTHROW(check_output_path(dir / "target", "--trace"));
    CHECK_NOTHROW(check_output_path(dir / "new.csv", "--trace"));
}

TEST_CASE("A fatal signal removes registered temporary files; with StopOnInterrupt the first SIGINT only sets the flag") {
    TempDir dir("kvlab-hostile");
    const fs::path target = dir / "chart.svg";
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {  // the child: a temporary exists, then Ctrl-C
        install_interrupt_handlers();
        std::atomic<bool> stop{false};
        {
            const StopOnInterrupt stoppable(stop);
            std::raise(SIGINT);
            if (!stop.load()) ::_exit(3);  // the first SIGINT must only set the flag
        }
        TempFile temp(target, "-o");
        std::raise(SIGINT);  // not stoppable now: the handler removes the temporary, then dies of SIGINT
        ::_exit(4);
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK(WIFSIGNALED(status));
    if (WIFSIGNALED(status)) CHECK(WTERMSIG(status) == SIGINT);
    if (WIFEXITED(status)) CHECK(WEXITSTATUS(status) == 0);  // 3: flag not set; 4: survived the signal
    CHECK(fs::is_empty(dir.path()));  // the temporary the child made is gone
}
