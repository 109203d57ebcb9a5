#!/usr/bin/env bash
# Issue 46: one way to show a value from outside. Walks every option of every subcommand (read from
# their --help, so a new option is walked without editing this file) and a table of hostile file
# contents, each with values holding terminal escape sequences, C1 controls, invalid UTF-8 and 100 KB of
# text, and checks what kvlab writes to stderr: no raw control byte (only the newline that ends a line),
# no line over 2100 bytes (messages are cut at 2000, docs/reliability.md), an exit code of 0, 1 or 2.
# Usage: hostile_values.sh KVLAB WORKDIR
set -u
KVLAB=$(realpath "$1")
WORK=$2
rm -rf "$WORK" && mkdir -p "$WORK" && cd "$WORK" || exit 1
failures=0   # checks that failed
failed_runs=0
runs=0

ESC=$'\e]0;owned\a\e[2J'$'\xc2\x9b''31m'$'\xff\xfe'$'\x7f'  # OSC title + BEL, clear screen, CSI as C1, bad UTF-8, DEL
BIG=$'\e[5m'$(head -c 100000 /dev/zero | tr '\0' 'x')
VALUES=("$ESC" "$BIG")

# check LABEL ARGS...: run kvlab with ARGS, judge its stderr and exit code
check() {
    local label=$1
    shift
    runs=$((runs + 1))
    local before=$failures
    timeout 120 "$KVLAB" "$@" > /dev/null 2> err.txt < /dev/null
    local rc=$?
    if [ "$rc" -gt 2 ]; then
        echo "FAIL [$label]: exit $rc: $(head -c 300 err.txt | od -c | head -3)" >&2
        failures=$((failures + 1))
        failed_runs=$((failed_runs + 1))
        return
    fi
    # any C0 control but newline, DEL, or a C1 control in UTF-8 (C2 80..C2 9F)
    if LC_ALL=C grep -q -P '[\x00-\x09\x0b-\x1f\x7f]|\xc2[\x80-\x9f]' err.txt; then
        echo "FAIL [$label]: raw control byte on stderr: $(LC_ALL=C grep -a -P '[\x00-\x09\x0b-\x1f\x7f]|\xc2[\x80-\x9f]' err.txt | head -c 200 | od -c | head -4)" >&2
        failures=$((failures + 1))
    fi
    local longest
    longest=$(LC_ALL=C awk '{ if (length($0) > m) m = length($0) } END { print m + 0 }' err.txt)
    if [ "$longest" -gt 2100 ]; then
        echo "FAIL [$label]: a stderr line of $longest bytes: $(head -c 200 err.txt)" >&2
        failures=$((failures + 1))
    fi
    [ "$failures" -gt "$before" ] && failed_runs=$((failed_runs + 1))
    return 0
}

# the long options of one subcommand, from its --help ("  -m,--model TEXT ...", "  --check ...")
options_of() {
    "$KVLAB" "$@" --help | LC_ALL=C grep -o -E '^ +(-[A-Za-z],)?--[a-z][a-z0-9-]*' | LC_ALL=C grep -o -E -- '--[a-z][a-z0-9-]*' | sort -u
}

# a small valid trace for the trace subcommands' other options
"$KVLAB" simulate -m stories260k -p 2 -n 2 -q --trace ok.csv > /dev/null 2>&1 || { echo "FAIL: could not write a trace" >&2; exit 1; }

walk() {  # walk "SUBCOMMAND WORDS" BASE ARGS...: each option of the subcommand with each hostile value
    local words=$1
    shift
    local -a sub
    read -r -a sub <<< "$words"
    local opt value
    for opt in $(options_of "${sub[@]}"); do
        [ "$opt" = "--help" ] || [ "$opt" = "--version" ] && continue
        # leave out a base argument the option under test replaces
        local -a base=()
        local skip=0 a
        for a in "$@"; do
            if [ $skip -eq 1 ]; then skip=0; continue; fi
            if [ "$a" = "$opt" ]; then skip=1; continue; fi
            base+=("$a")
        done
        for value in "${VALUES[@]}"; do
            check "$words $opt" "${sub[@]}" "${base[@]}" "$opt" "$value"
            check "$words $opt=" "${sub[@]}" "${base[@]}" "$opt=$value"
        done
    done
    # the value as a positional argument (a file name, a subcommand name)
    for value in "${VALUES[@]}"; do check "$words positional" "${sub[@]}" "$@" "$value"; done
}

walk "kvcalc" --model llama-2-7b
walk "simulate" --model stories260k --prompt-len 2 --steps 1 --quiet
walk "serve" --model stories260k --requests 2 --prompt-len 2..3 --output-len 1..2 --quiet
walk "trace summary" ok.csv
walk "trace steps" ok.csv
walk "trace compare" ok.csv ok.csv
walk "trace plot" ok.csv --output ok.svg
walk "gpu attention" --heads 4 --head-dim 64 --context 64 --batch 1
walk "presets"
walk "completion"
for value in "${VALUES[@]}"; do check "subcommand" "$value"; check "trace subcommand" trace "$value"; done

# Readers: the same values inside files. printf writes the bytes; BIGV is 100 KB for a JSON string.
BIGV=$(head -c 100000 /dev/zero | tr '\0' 'y')
ESCJ='\u001b]0;owned\u0007\u001b[2J\u009b31m'  # the controls as JSON escapes: they decode to raw bytes
for v in "$ESCJ" "$BIGV"; do
    # config.json: a string where a number belongs, a name, an unknown layer type, a huge array element
    printf '{"model_type":"llama","hidden_size":"%s","num_attention_heads":8,"num_hidden_layers":2,"intermediate_size":64,"vocab_size":32}' "$v" > c1.json
    printf '{"model_type":"%s","hidden_size":64,"num_attention_heads":8,"num_hidden_layers":2,"intermediate_size":64,"vocab_size":32,"sliding_window":4,"layer_types":["%s","full_attention"]}' "$v" "$v" > c2.json
    printf '{"model_type":"llama","hidden_size":64,"num_attention_heads":8,"num_hidden_layers":2,"intermediate_size":64,"vocab_size":32,"_name_or_path":"%s","num_key_value_heads":["%s"]}' "$v" "$v" > c3.json
    for c in c1.json c2.json c3.json; do
        check "kvcalc -c $c" kvcalc -c "$c"
        check "simulate -c $c" simulate -c "$c" -p 2 -n 1 -q
    done
    # serve workloads: a prompt id that is a string, a field of the wrong type
    printf '{"prompt_ids":[1,"%s"],"max_tokens":2}\n' "$v" > w1.jsonl
    printf '{"prompt_ids":[1,2],"max_tokens":"%s"}\n' "$v" > w2.jsonl
    printf '{"prompt":"%s","max_tokens":2}\n' "$v" > w3.jsonl
    for w in w1.jsonl w2.jsonl w3.jsonl; do check "serve --workload $w" serve -m stories260k --workload "$w" -q; done
done
# serve traces: a layout cell and a format version holding escapes or 100 KB, in CSV and JSON Lines
"$KVLAB" serve -m stories260k --requests 2 --prompt-len 2..3 --output-len 1..2 -q --trace s.csv > /dev/null 2>&1
"$KVLAB" serve -m stories260k --requests 2 --prompt-len 2..3 --output-len 1..2 -q --trace s.jsonl > /dev/null 2>&1
for v in "$ESC" "$BIG"; do
    LC_ALL=C sed "s/,paged,/,$(printf '%s' "$v" | sed 's/[\/&]/\\&/g'),/" s.csv > s_layout.csv
    LC_ALL=C sed "s/\"layout\":\"paged\"/\"layout\":\"$(printf '%s' "$v" | sed 's/[\/&]/\\&/g')\"/" s.jsonl > s_layout.jsonl
    for f in s_layout.csv s_layout.jsonl; do check "trace summary $f" trace summary "$f"; check "trace plot $f" trace plot "$f" -o s.svg; done
done
for v in "$ESCJ" "$BIGV"; do
    LC_ALL=C sed "1s/\"kvlab_serve_trace\":[0-9]*/\"kvlab_serve_trace\":\"$v\"/" s.jsonl > s_version.jsonl
    check "trace summary s_version.jsonl" trace summary s_version.jsonl
    LC_ALL=C sed "1s/\"kvlab_serve_trace\":[0-9]*/\"kvlab_serve_trace\":[\"$v\"]/" s.jsonl > s_version2.jsonl
    check "trace summary s_version2.jsonl" trace summary s_version2.jsonl
done
# step traces: a cell and a header value
for v in "$ESC" "$BIG"; do
    LC_ALL=C awk -v v="$v" 'BEGIN { FS = OFS = "," } /^[0-9]/ && !done { $2 = v; done = 1 } { print }' ok.csv > t_cell.csv
    check "trace summary t_cell.csv" trace summary t_cell.csv
    check "trace compare t_cell.csv" trace compare ok.csv t_cell.csv
done

echo "hostile_values: $runs runs, $failures failed checks"
echo "$((runs - failed_runs)) passed, $failed_runs failed"
[ "$failures" -eq 0 ]
