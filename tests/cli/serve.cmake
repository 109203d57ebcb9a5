# CLI tests of `kvlab serve` on the built binary: the report, pool sizing by hand, workload files,
# traces (and `kvlab trace` reading them), --check, and one-line errors with exit 2.
include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)

set(small serve --requests 6 --prompt-len 4..12 --output-len 4..12 --threads 1 --quiet)

# both layouts side by side; every block back in the pool at the end
kvlab_expect(RC 0 ARGS ${small}
             OUT "metric +paged +contiguous" "requests finished +6 / 6 +6 / 6" "KV rows still held at the end +0 +0"
                 "vLLM paper \\(Kwon et al., SOSP 2023, Fig. 2\\)")
# tiny-llama: 2 (K, V) x 4 layers x 2 KV heads x 32 x 4 B = 2048 B per token row. --kv-blocks 8 x 16 = 128 rows = 256 KiB;
# --kv-budget 100KiB = 102400 / 2048 = 50 rows, whole blocks of 16: 48 rows (96 KiB)
kvlab_expect(RC 0 ARGS ${small} --kv-layout paged --kv-blocks 8 OUT "KV pool \\(token rows\\) +128\n" "KV pool \\(bytes\\) +256.00 KiB\n")
kvlab_expect(RC 0 ARGS ${small} --kv-layout paged --kv-budget 100KiB OUT "KV pool \\(token rows\\) +48\n" "KV pool \\(bytes\\) +96.00 KiB\n")
# reservations by hand: 4 requests of 10 prompt ids and 7 tokens use 10 + 7 - 1 = 16 positions each. In 48 rows
# (--kv-budget 100KiB), --reserve request takes 16 rows each: 3 run at once; --reserve max-len with --max-model-len 24
# takes 24: 2 at once; paged, one 16-row block each: 3
file(WRITE "${WORK}/four.jsonl" "")
foreach(i RANGE 3)
  file(APPEND "${WORK}/four.jsonl" "{\"prompt_ids\": [1, 2, 3, 4, 5, 6, 7, 8, 9, ${i}], \"max_tokens\": 7}\n")
endforeach()
kvlab_expect(RC 0 ARGS serve --workload four.jsonl --kv-budget 100KiB --reserve request -q --threads 1
             OUT "sequences per step, max +3 +3\n" "KV utilization, mean \\(tokens / allocated\\) +[0-9.]+% +[0-9.]+%")
kvlab_expect(RC 0 ARGS serve --workload four.jsonl --kv-budget 100KiB --reserve max-len --max-model-len 24 --kv-layout contiguous -q --threads 1
             OUT "sequences per step, max +2\n")
# --check: every generated token equals the solo run's (6 requests of 4..12 tokens)
kvlab_expect(RC 0 ARGS ${small} --check --model tiny-gpt2 OUT "--check: tokens equal to solo runs +[0-9]+ / [0-9]+ +[0-9]+ / [0-9]+\n")
string(REGEX MATCH "tokens equal to solo runs +([0-9]+) / ([0-9]+) +([0-9]+) / ([0-9]+)" _ "${KVLAB_OUT}")
if(NOT CMAKE_MATCH_1 EQUAL CMAKE_MATCH_2 OR NOT CMAKE_MATCH_3 EQUAL CMAKE_MATCH_4 OR CMAKE_MATCH_2 LESS 24)
  message(SEND_ERROR "serve --check: ${CMAKE_MATCH_1}/${CMAKE_MATCH_2} and ${CMAKE_MATCH_3}/${CMAKE_MATCH_4} tokens equal (6 requests of at least 4 tokens)")
endif()
# a shared prefix with the prefix cache: 6 requests share 32 tokens = 2 blocks; those arriving after the first is computed hit them
kvlab_expect(RC 0 ARGS ${small} --shared-prefix 32 --prefix-cache --arrival-rate 0.2 --kv-layout paged
             OUT "tokens found in the prefix cache +[1-9][0-9]*\n")
kvlab_expect(RC 0 ARGS ${small} --format json OUT "\"metric\": \"mean_utilization_percent\"" "\"requests \\(paged\\)\"")

# a JSONL workload: text (the preset ships its tokenizer) and ids, with arrivals
file(WRITE "${WORK}/ok.jsonl" "{\"prompt\": \"Once upon a time\", \"max_tokens\": 8}\n\n{\"prompt_ids\": [1, 403, 9], \"max_tokens\": 5, \"arrival_step\": 3}\n")
kvlab_expect(RC 0 ARGS serve --workload ok.jsonl --threads 1 -q OUT "requests finished +2 / 2 +2 / 2" "tokens generated +13 +13")
file(WRITE "${WORK}/bad.jsonl" "{\"prompt_ids\": [1, 2], \"max_tokens\": 4}\n{\"prompt_ids\": [1, 2], \"max_token\": 4}\n")
kvlab_expect(RC 2 ARGS serve --workload bad.jsonl ERR "^kvlab: error: bad.jsonl:2: unknown key 'max_token'; expected prompt or prompt_ids, max_tokens, and optionally arrival_step, stop, ignore_eos, seed, n\n$")
file(WRITE "${WORK}/bad2.jsonl" "{\"prompt_ids\": [1, 2], \"max_tokens\": 0}\n")
kvlab_expect(RC 2 ARGS serve --workload bad2.jsonl ERR "bad2.jsonl:1: \"max_tokens\" must be a whole number >= 1")
file(WRITE "${WORK}/bad3.jsonl" "{\"prompt_ids\": [1, 99999], \"max_tokens\": 3}\n")
kvlab_expect(RC 2 ARGS serve --workload bad3.jsonl ERR "bad3.jsonl:1: prompt id 99999 is not a token id in \\[0, 512\\)")
file(WRITE "${WORK}/bad4.jsonl" "not json\n")
kvlab_expect(RC 2 ARGS serve --workload bad4.jsonl ERR "bad4.jsonl:1")
kvlab_expect(RC 2 ARGS serve -m stories260k --workload ok.jsonl ERR "ok.jsonl:1: \"prompt\" is text, which needs --tokenizer")
kvlab_expect(RC 2 ARGS serve --workload ok.jsonl --requests 3 ERR "--requests excludes --workload")

# impossible budgets and bad flags: one line, exit 2
kvlab_expect(RC 2 ARGS serve --kv-budget 10KiB ERR "^kvlab: error: --kv-budget: 10KiB holds no block of 16 tokens \\(2.00 KiB per token")
kvlab_expect(RC 2 ARGS serve --kv-blocks 4 --kv-layout contiguous ERR "--kv-budget/--kv-blocks: the pool holds 64 token rows; request 0 alone needs 256 \\(contiguous layout, --reserve max-len\\)")
kvlab_expect(RC 2 ARGS serve --kv-blocks 4 --kv-layout paged ERR "request [0-9]+ alone needs [0-9]+ \\(paged layout\\), so it could never run")
kvlab_expect(RC 2 ARGS serve --prompt-len 5..3 ERR "--prompt-len: '5..3' is not a length range")
kvlab_expect(RC 2 ARGS serve --output-len 0 ERR "--output-len: '0' is not a length range")
kvlab_expect(RC 2 ARGS serve --prompt-len 200..200 --output-len 100 ERR "request 0 needs 200 prompt \\+ 100 generated - 1 = 299 positions; --max-model-len is 256")
# counts past 64 bits are compared, never added: one line, exit 2 (not a crash)
file(WRITE "${WORK}/huge.jsonl" "{\"prompt_ids\": [1, 2], \"max_tokens\": 9223372036854775807}\n{\"prompt_ids\": [1], \"max_tokens\": 2, \"arrival_step\": 9223372036854775807}\n")
kvlab_expect(RC 2 ARGS serve --workload huge.jsonl --kv-layout contiguous --reserve request ERR "request 0 needs 2 prompt \\+ 9223372036854775807 generated - 1 = over 2\\^63 positions")
file(WRITE "${WORK}/late.jsonl" "{\"prompt_ids\": [1], \"max_tokens\": 2, \"arrival_step\": 9223372036854775807}\n")
kvlab_expect(RC 2 ARGS serve --workload late.jsonl ERR "request 0 arrives at step 9223372036854775807; expected 0..2\\^40")
kvlab_expect(RC 2 ARGS serve --arrival-rate 1e-300 --requests 3 ERR "--arrival-rate: 1e-300 requests per step puts request 1 past step 2\\^40")
kvlab_expect(RC 2 ARGS serve --prompt-len 1..9000000000000000000 ERR "the longest request exceeds the 256 positions of tiny-llama")
kvlab_expect(RC 2 ARGS serve --max-model-len -5 ERR "--max-model-len: -5; expected 1..256")
kvlab_expect(RC 2 ARGS serve --max-model-len 300 ERR "--max-model-len: 300; expected 1..256")
kvlab_expect(RC 2 ARGS serve --prefix-cache --kv-layout contiguous ERR "--prefix-cache: blocks are shared in the paged layout")
kvlab_expect(RC 2 ARGS serve --kv-layout ring ERR "--kv-layout: 'ring' not in \\{paged,contiguous,both\\}")
kvlab_expect(RC 2 ARGS serve --block-size 0 ERR "--block-size: 0; expected 1..1024")
kvlab_expect(RC 2 ARGS serve --max-seqs 0 ERR "--max-seqs: 0; expected at least 1")
kvlab_expect(RC 2 ARGS serve --arrival-rate -1 ERR "--arrival-rate: -1")
kvlab_expect(RC 2 ARGS serve --trace "${WORK}/t.txt" ERR "--trace:.*expected .csv, .jsonl or .json")
# Llama-3-8B: 32 layers x 8 KV heads x 128 x 2 x 4 B = 256 KiB per token row; 4 x 8192 rows = 8 GiB of pool
kvlab_expect(RC 2 ARGS serve -m llama-3-8b --max-memory 16GiB ERR "--max-memory: the weights of Llama-3 8B, the 8.00 GiB KV pool and the batch's buffers need [0-9.]+ GiB, more than the 16.00 GiB allowed")

# traces: deterministic CSV byte-identical; JSONL one line per step plus the header; Perfetto a track per request
kvlab_expect(RC 0 ARGS ${small} --deterministic --trace a.csv)
kvlab_expect(RC 0 ARGS ${small} --deterministic --trace b.csv)
file(READ "${WORK}/a.csv" a)
file(READ "${WORK}/b.csv" b)
if(NOT a STREQUAL b)
  message(SEND_ERROR "serve --deterministic traces differ between two runs")
endif()
if(NOT a MATCHES "^# kvlab serve trace, format 1" OR NOT a MATCHES "\nlayout,pool_rows,step,seqs,tokens," OR a MATCHES "forward_ns")
  message(SEND_ERROR "serve CSV trace: header, columns, or wall time in a --deterministic trace:\n${a}")
endif()
kvlab_expect(RC 0 ARGS ${small} --kv-layout paged --trace t.jsonl OUT "steps \\(forward calls\\) +([0-9]+)\n")
string(REGEX MATCH "steps \\(forward calls\\) +([0-9]+)" _ "${KVLAB_OUT}")
set(n_steps ${CMAKE_MATCH_1})
file(STRINGS "${WORK}/t.jsonl" lines)
list(LENGTH lines n_lines)
math(EXPR want "${n_steps} + 1")
if(NOT n_lines EQUAL want)
  message(SEND_ERROR "serve JSONL trace: ${n_lines} lines, expected ${want} (header + ${n_steps} steps)")
endif()
kvlab_expect(RC 0 ARGS ${small} --trace t.json)
file(READ "${WORK}/t.json" p)
foreach(want "\"name\":\"request 5 \\(" "\"name\":\"prefill\"" "\"name\":\"decode\"" "\"name\":\"finished\"" "\"name\":\"KV rows\""
             "\"name\":\"paged KV pool\"" "\"name\":\"contiguous KV pool\"")
  if(NOT p MATCHES "${want}")
    message(SEND_ERROR "serve Perfetto trace lacks ${want}")
  endif()
endforeach()
# kvlab trace reads serve traces back: the per-step table; steps/compare say what reads them
kvlab_expect(RC 0 ARGS trace summary a.csv OUT "serve trace of tiny-llama \\(6 requests\\)" "KV utilization, mean" "sequences per step, max"
             "no wall time: the trace was written with --deterministic" NOT_OUT "time in steps" "\nthroughput \\(generated" "scheduler bookkeeping")
kvlab_expect(RC 0 ARGS trace summary t.jsonl OUT "metric +paged\n" "time in steps \\(s\\) +[0-9]" NOT_OUT "no wall time")
kvlab_expect(RC 2 ARGS trace steps a.csv ERR "trace steps: a.csv is a kvlab serve trace")
kvlab_expect(RC 2 ARGS trace summary t.json ERR "a Perfetto serve timeline")
file(READ "${WORK}/a.csv" a)
# trace_edit(FILE REGEX REPLACEMENT kvlab_expect-arguments...): a.csv edited, written as FILE, `trace summary FILE`
function(trace_edit file regex replacement)
  string(REGEX REPLACE "${regex}" "${replacement}" edited "${a}")
  file(WRITE "${WORK}/${file}" "${edited}")
  kvlab_expect(${ARGN} ARGS trace summary ${file})
endfunction()
trace_edit(edited.csv "\npaged,1024," "\npaged,1024x,"
           RC 2 ERR "^kvlab: error: edited.csv:[0-9]+: pool_rows is '1024x'; expected an integer\n$")
# a later record of the same layout with another pool
trace_edit(edited2.csv "(\npaged,1024,[^\n]*\n)paged,1024," "\\1paged,2048,"
           RC 2 ERR "^kvlab: error: edited2.csv:[0-9]+: pool_rows 2048 in a paged layout whose pool has 1024; one pool per layout\n$")
# saved with CRLF line ends: read as written (the last column name kept its CR: "185 columns, expected 185")
trace_edit(crlf.csv "\n" "\r\n" RC 0 OUT "serve trace of tiny-llama \\(6 requests\\)")
# without one token's bytes the byte figures cannot be made: the file named, the value shown
trace_edit(edited3.csv "\n# token_bytes=[0-9]+\n" "\n# token_bytes=0\n"
           RC 2 ERR "^kvlab: error: edited3.csv:1: input token_bytes is 0; expected one token's K and V bytes")

# TPOT is (finish - first token) / (generated - 1): undefined when no request generated two tokens, so
# "-" (empty in CSV, null in JSON), not 0; one request is "1 request"
file(WRITE "${WORK}/one.jsonl" "{\"prompt_ids\": [1, 2, 3, 4], \"max_tokens\": 1}\n")
kvlab_expect(RC 0 ARGS serve --workload "${WORK}/one.jsonl" OUT "kvlab serve: 1 request on" "TPOT \\(ms\\) median +- +-")
kvlab_expect(RC 0 ARGS serve --workload "${WORK}/one.jsonl" -f json OUT "\"tpot_ms\": null")

# The headline, before the table: paged vs contiguous with the figures that prove it, each the table's own
# (KV utilization, sequences at once, steps, modelled GPU ms on the default GPU, h100), then the CPU's wall
# time (measured: only its presence is checked). 8 blocks of 16 rows x 2 KiB = 256 KiB.
set(headline_re "^paged kept ([0-9.]+)% of allocated KV holding tokens vs ([0-9.]+)% contiguous, and ran up to ([0-9]+) requests at once vs ([0-9]+) in the same 256.00 KiB pool. ([0-9]+) steps vs ([0-9]+) \\(counted, exact\\)\nmodelled on NVIDIA H100 SXM 80GB: paged ([0-9.]+) ms vs contiguous ([0-9.]+) ms \\([0-9.]+x (faster|slower): ")
kvlab_expect(RC 0 ARGS ${small} --kv-blocks 8 --reserve request OUT "${headline_re}" "\nCPU wall time \\(measured, one run\\): paged [0-9.]+ s vs contiguous [0-9.]+ s[^\n]*\n\nkvlab serve: 6 requests")
string(REGEX MATCH "${headline_re}" _ "${KVLAB_OUT}")
set(h_out "${KVLAB_OUT}")
foreach(row "KV utilization, mean \\(tokens / allocated\\) +${CMAKE_MATCH_1}% +${CMAKE_MATCH_2}%\n" "sequences per step, max +${CMAKE_MATCH_3} +${CMAKE_MATCH_4}\n"
            "steps \\(forward calls\\) +${CMAKE_MATCH_5} +${CMAKE_MATCH_6}\n" "modelled GPU time \\(ms\\) +${CMAKE_MATCH_7} +${CMAKE_MATCH_8}\n"
            "pool reserved, mean \\(vLLM's 'KV cache usage'\\) +[0-9.]+% +[0-9.]+%\n" "counted figures \\(steps, tokens, FLOPs, bytes, blocks, and the modelled GPU time computed from them\\) are exact[^\n]*on this host \\([0-9]+ cores?")
  if(NOT h_out MATCHES "${row}")
    message(SEND_ERROR "serve: the table does not match the headline's figures: no row '${row}'\n${h_out}")
  endif()
endforeach()
# one layout: its own headline
kvlab_expect(RC 0 ARGS ${small} --kv-layout contiguous
             OUT "^contiguous: [0-9.]+% of allocated KV held tokens. up to [0-9]+ requests at once in a 2.00 MiB pool, [0-9]+ steps \\(counted, exact\\)\nmodelled on NVIDIA H100 SXM 80GB: [0-9.]+ ms \\([0-9]+ generated tok/s\\)\nCPU wall time \\(measured, one run\\): [0-9.]+ s\n")
# --gpu names the modelled GPU, recorded in the inputs; an unknown one is refused
kvlab_expect(RC 0 ARGS ${small} --gpu a100-sxm-80gb OUT "\nmodelled on NVIDIA A100 SXM4 80GB: paged ")
kvlab_expect(RC 0 ARGS ${small} -f json OUT "\"gpu\": \"h100-sxm-80gb\"" "\"headline\": \\[\n +\"paged kept ")
kvlab_expect(RC 2 ARGS serve --gpu foo ERR "^kvlab: error: --gpu: unknown GPU 'foo'")
# kvlab trace summary of a serve trace shows serve's headline: the same counted lines (no wall time in a --deterministic trace)
kvlab_expect(RC 0 ARGS ${small} --kv-blocks 8 --reserve request --deterministic --trace h.csv OUT "${headline_re}")
string(REGEX MATCH "^[^\n]*\n[^\n]*\n" serve_head "${KVLAB_OUT}")
kvlab_expect(RC 0 ARGS trace summary h.csv NOT_OUT "CPU wall time")
string(FIND "${KVLAB_OUT}" "${serve_head}\nkvlab trace summary: serve trace" at)
if(NOT at EQUAL 0)
  message(SEND_ERROR "trace summary's headline differs from serve's:\n${serve_head}\n---\n${KVLAB_OUT}")
endif()
kvlab_expect(RC 0 ARGS trace summary t.jsonl OUT "^paged: [0-9.]+% of allocated KV held tokens.[^\n]*\nmodelled on NVIDIA H100 SXM 80GB: [0-9.]+ ms[^\n]*\nCPU wall time \\(measured, one run\\)")

# --arrival bursty:SIZE/EVERY: 6 requests, 2 every 10 steps arrive at steps 0, 0, 10, 10, 20, 20 (request i at (i / 2) x 10)
kvlab_expect(RC 0 ARGS ${small} --arrival bursty:2/10 --kv-layout paged -f csv
             OUT "\n# requests \\(paged\\)\nrequest,arrival_step,[^\n]*\n0,0,[^\n]*\n1,0,[^\n]*\n2,10,[^\n]*\n3,10,[^\n]*\n4,20,[^\n]*\n5,20,")
kvlab_expect(RC 0 ARGS ${small} --arrival bursty:2/10 -f json OUT "\"arrival\": \"bursty:2/10\"")
kvlab_expect(RC 2 ARGS serve --arrival bursty:0/10
             ERR "^kvlab: error: --arrival: 'bursty:0/10' is not an arrival pattern. expected bursty:SIZE/EVERY, whole numbers >= 1 \\(e.g. bursty:8/50")
kvlab_expect(RC 2 ARGS serve --arrival 8/50 ERR "^kvlab: error: --arrival: '8/50' is not an arrival pattern")
kvlab_expect(RC 2 ARGS serve --arrival bursty:2/10 --arrival-rate 0.5 ERR "excludes")
kvlab_expect(RC 2 ARGS serve --workload ok.jsonl --arrival bursty:2/10 ERR "excludes")

# --plot (and kvlab trace plot of a serve trace): the panels, the time panel in buckets past 100 steps
kvlab_expect(RC 2 ARGS ${small} --plot s.pdf ERR "^kvlab: error: --plot: 's.pdf' has extension '.pdf'. expected .svg or .png\n$")
find_program(GNUPLOT gnuplot)
if(GNUPLOT)
  kvlab_expect(RC 0 ARGS ${small} --plot s.svg OUT "chart written to s.svg")
  file(READ "${WORK}/s.svg" svg)
  foreach(want "KV utilization: tokens / allocated" "requests running \\(solid\\) and waiting" "CPU time per step \\(measured, one run\\)"
               "modelled time on NVIDIA H100 SXM 80GB, cumulative")
    if(NOT svg MATCHES "${want}")
      message(SEND_ERROR "serve --plot: the chart lacks '${want}'")
    endif()
  endforeach()
  if(svg MATCHES "outputs' KV blocks")
    message(SEND_ERROR "serve --plot with one output per request: an outputs' blocks panel")
  endif()
  # several outputs per request: two more panels, their blocks against unshared copies, and copy-on-write copies
  kvlab_expect(RC 0 ARGS serve --requests 2 --prompt-len 20 --output-len 4 --n 2 --temperature 1 --kv-layout paged --threads 1 -q --plot n2.svg
               OUT "chart written to n2.svg")
  file(READ "${WORK}/n2.svg" svg)
  foreach(want "outputs' KV blocks: held, a shared block once" "copy-on-write block copies, cumulative")
    if(NOT svg MATCHES "${want}")
      message(SEND_ERROR "serve --plot --n 2: the chart lacks '${want}'")
    endif()
  endforeach()
  kvlab_expect(RC 0 ARGS trace plot h.csv -o h.svg)
  file(READ "${WORK}/h.svg" svg)
  if(NOT svg MATCHES "modelled GPU time per step \\(no wall time in a --deterministic trace")
    message(SEND_ERROR "trace plot of a --deterministic serve trace: no modelled time per step panel")
  endif()
  # 40 requests of 4 prompt tokens and 8 to generate, one at a time (--max-seqs 1): 8 steps each (the prefill, which chooses
  # the first token, and 7 decodes) = 320 steps. At most about 100 buckets, a round size (1, 2, 5, 10, ...): 320 / 100 -> 5
  kvlab_expect(RC 0 ARGS serve --requests 40 --prompt-len 4 --output-len 8 --max-seqs 1 --kv-layout paged --threads 1 -q --plot b.svg
               OUT "steps \\(forward calls\\) +320\n")
  file(READ "${WORK}/b.svg" svg)
  if(NOT svg MATCHES "mean over each 5 steps")
    message(SEND_ERROR "serve --plot at 320 steps: the time panel is not in buckets of 5 steps")
  endif()
endif()

# a serve trace's "gpu" input names the modelled time's GPU: one that is not a preset is refused, the file named
trace_edit(badgpu.csv "\n# gpu=\"h100-sxm-80gb\"\n" "\n# gpu=\"nope\"\n"
           RC 2 ERR "^kvlab: error: badgpu.csv: the trace's input \"gpu\" is 'nope', not a GPU preset \\(kvlab presets --gpus lists them\\)\n$")

# several outputs per request (paged): sampled with the sampling flags, --check covering every output;
# beam search's figures through a trace and back (kvlab trace summary)
kvlab_expect(RC 0 ARGS ${small} --kv-layout paged --n 3 --temperature 0.8 --top-k 20 --top-p 0.9 --check
             OUT "outputs' KV blocks held, peak \\(shared once\\) +[1-9]" "--check: tokens equal to solo runs +[0-9]+ / [0-9]+\n")
string(REGEX MATCH "tokens equal to solo runs +([0-9]+) / ([0-9]+)" _ "${KVLAB_OUT}")
if(NOT CMAKE_MATCH_1 EQUAL CMAKE_MATCH_2 OR CMAKE_MATCH_2 LESS 72)  # 6 requests x 3 outputs x at least 4 tokens
  message(SEND_ERROR "serve --n 3 --check: ${CMAKE_MATCH_1}/${CMAKE_MATCH_2} tokens equal")
endif()
kvlab_expect(RC 0 ARGS ${small} --kv-layout paged --beam-width 2 --deterministic --trace beams.jsonl
             OUT "paged's outputs held at most [0-9]+ KV blocks at once, vs [0-9]+ if each output had its own copy")
kvlab_expect(RC 0 ARGS trace summary beams.jsonl OUT "outputs' KV blocks if unshared, peak +[1-9]" "copy-on-write block copies +[0-9]+")
kvlab_expect(RC 2 ARGS ${small} --kv-layout paged --n 2 --beam-width 2 ERR "--n excludes --beam-width")
kvlab_expect(RC 2 ARGS ${small} --kv-layout paged --temperature -1 ERR "^kvlab: error: --temperature: -1; expected a finite number >= 0")
