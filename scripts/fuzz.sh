#!/usr/bin/env bash
# Runs kvlab's libFuzzer targets (tests/fuzz) for longer than the CTests do, one after another.
#   scripts/fuzz.sh [SECONDS_PER_RUN] [NAME...]    default 600 s, every run (config llama2c tokenizer
#   safetensors shard_index trace_csv trace_jsonl trace_perfetto gguf serve_csv serve_jsonl)
# Builds the debug-asan preset first (clang, ASan + UBSan + libFuzzer). The corpus each run grows is
# kept in build/debug-asan/tests/fuzz/corpus/<name>, findings (crashing inputs) in .../findings/; each
# run's libFuzzer log goes to .../logs/<name>.log and its last lines to the terminal.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
shift || true
names=("$@")
[ ${#names[@]} -eq 0 ] && names=(config llama2c tokenizer safetensors shard_index trace_csv trace_jsonl trace_perfetto gguf serve_csv serve_jsonl)

cmake --preset debug-asan > /dev/null
cmake --build --preset debug-asan -j"$(nproc 2>/dev/null || echo 2)"
fuzz=build/debug-asan/tests/fuzz
mkdir -p "$fuzz/logs"
ctest --preset debug-asan -R '^fuzz_seeds$' > /dev/null  # writes the seed corpora

# as the CTests run them (tests/fuzz/CMakeLists.txt): a smaller ASan quarantine keeps RSS well under the
# 1 GiB limit that catches allocations sized from a header's claim
export ASAN_OPTIONS=detect_leaks=1:quarantine_size_mb=64 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for name in "${names[@]}"; do
    # the CTest's command line, with the time limit raised
    cmd=$(ctest --preset debug-asan -R "^fuzz_${name}\$" -N -V | grep -F 'tests/fuzz/fuzz_' | sed -n 's/^[0-9]*: Test command: //p')
    [ -n "$cmd" ] || { echo "fuzz.sh: no fuzz test named fuzz_${name}" >&2; exit 2; }
    cmd=$(sed -E "s/-max_total_time=[0-9]+/-max_total_time=$seconds/" <<< "$cmd")
    echo "== fuzz_${name}: ${seconds} s"
    if ! eval "$cmd" > "$fuzz/logs/${name}.log" 2>&1; then
        echo "fuzz.sh: fuzz_${name} found a problem: see $fuzz/logs/${name}.log and $fuzz/findings/" >&2
        tail -n 30 "$fuzz/logs/${name}.log" >&2
        exit 1
    fi
    grep -E "^stat::(number_of_executed_units|new_units_added)|^Done" "$fuzz/logs/${name}.log" || true
done
