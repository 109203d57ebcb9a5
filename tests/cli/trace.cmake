# CLI tests of `kvlab trace` on traces generated here: summary round trip, steps, compare, errors.
# Run by CTest as: cmake -DKVLAB=<kvlab> -DWORK=<scratch dir> -P trace.cmake
include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)

set(small simulate --prompt-len 8 --steps 12 --threads 1 --quiet)

# round trip: simulate --format json and trace summary --format json print the same report, for
# every trace format (measured wall time included: it is stored in the trace)
foreach(ext csv jsonl json)
  run_kvlab(0 "" ${small} --trace "${WORK}/run.${ext}" --format json)
  set(printed "${last_out}")
  run_kvlab(0 "" trace summary "${WORK}/run.${ext}" --format json)
  if(NOT printed STREQUAL last_out)
    message(FATAL_ERROR "trace summary of run.${ext} differs from what simulate printed:\n${printed}\n---\n${last_out}")
  endif()
endforeach()
# the table, markdown and csv forms of the same summary
run_kvlab(0 "uncached / cached.*FLOPs.*step 1 -> step 11" trace summary "${WORK}/run.json")
run_kvlab(0 "\\| +\\| cached \\| uncached \\|" trace summary "${WORK}/run.csv" --format markdown)
run_kvlab(0 "metric,cached,uncached" trace summary "${WORK}/run.jsonl" --format csv)

# deterministic: equal apart from the wall-time rows, which the trace does not have
run_kvlab(0 "" ${small} --deterministic --trace "${WORK}/det.json" --format json)
set(printed "${last_out}")
run_kvlab(0 "no wall time" trace summary "${WORK}/det.json" --format json)
string(JSON n_printed LENGTH "${printed}" tables 0 rows)
string(JSON n_read LENGTH "${last_out}" tables 0 rows)
math(EXPR n_expected "${n_printed} - 5")  # wall_ms, ms_per_token, tokens_per_s, gflop_per_s, gb_per_s
if(NOT n_read EQUAL n_expected)
  message(FATAL_ERROR "deterministic summary has ${n_read} rows, expected ${n_expected}")
endif()
math(EXPR last_row "${n_read} - 1")
foreach(i RANGE ${last_row})
  string(JSON a GET "${printed}" tables 0 rows ${i})
  string(JSON b GET "${last_out}" tables 0 rows ${i})
  if(NOT a STREQUAL b)
    message(FATAL_ERROR "deterministic summary row ${i} differs:\n${a}\n${b}")
  endif()
endforeach()
# the Perfetto file of a deterministic run says its time is modelled
file(READ "${WORK}/det.json" det)
string(JSON time GET "${det}" otherData time)
if(NOT time STREQUAL "modelled")
  message(FATAL_ERROR "otherData.time is '${time}', expected modelled")
endif()

# steps, with and without ops, in each format
run_kvlab(0 "step.*mode.*FLOPs.*KV resident.*wall" trace steps "${WORK}/run.csv")
run_kvlab(0 "per op.*q_proj.*lm_head" trace steps "${WORK}/run.json" --every 5 --ops)
run_kvlab(0 "modelled" trace steps "${WORK}/det.json" --ops --format markdown)
run_kvlab(0 "" trace steps "${WORK}/run.jsonl" --every 4 --format json)
string(JSON n_rows LENGTH "${last_out}" tables 0 rows)
if(NOT n_rows EQUAL 8)  # steps 0, 4, 8, 11 x two modes
  message(FATAL_ERROR "trace steps --every 4 printed ${n_rows} rows, expected 8")
endif()

# compare: MHA (stories15m, 6 KV heads) vs a GQA variant with 2 KV heads: KV bytes a third
file(READ "${DATA}/../../presets/stories15m.json" cfg)
string(JSON cfg SET "${cfg}" num_key_value_heads 2)
file(WRITE "${WORK}/gqa/config.json" "${cfg}")
run_kvlab(0 "" ${small} --deterministic --trace "${WORK}/mha.csv" -f json)
run_kvlab(0 "" ${small} --deterministic --config "${WORK}/gqa" --trace "${WORK}/gqa.jsonl" -f json)
# the headline first: 2 KV heads of 6 keep and read 2/6 = 0.33x the KV bytes (same layers, head size and steps);
# with --deterministic traces no wall time is claimed
run_kvlab(0 "^B keeps 0\\.33x the KV cache of A \\([^)]*\\) and reads 0\\.33x its KV bytes .*counted, exact\\)\n[^\n]*FLOPs and [^\n]*bytes moved, B over A, cached\n\n"
          trace compare "${WORK}/mha.csv" "${WORK}/gqa.jsonl")
run_kvlab(0 "kv_bytes_resident.*0\\.33x.*per step" trace compare "${WORK}/mha.csv" "${WORK}/gqa.jsonl")
run_kvlab(0 "" trace compare "${WORK}/mha.csv" "${WORK}/gqa.jsonl" --format json --every 11)
string(JSON n_rows LENGTH "${last_out}" tables 1 rows)
if(NOT n_rows EQUAL 4)  # steps 0 and 11, two modes
  message(FATAL_ERROR "trace compare --every 11 printed ${n_rows} per-step rows, expected 4")
endif()

# errors: exit 2, one line naming the file and line
file(WRITE "${WORK}/empty.csv" "")
run_kvlab(2 "kvlab: error: .*empty.csv: line 1: empty file" trace summary "${WORK}/empty.csv")
file(READ "${WORK}/run.jsonl" jsonl)
string(LENGTH "${jsonl}" n)
math(EXPR n "${n} - 30")
string(SUBSTRING "${jsonl}" 0 ${n} cut)
file(WRITE "${WORK}/cut.jsonl" "${cut}")
run_kvlab(2 "cut.jsonl: line 25: not a JSON object \\(the file is truncated\\)" trace steps "${WORK}/cut.jsonl")
file(READ "${WORK}/run.csv" csv)
string(REPLACE "n_keys" "keys" bad "${csv}")
file(WRITE "${WORK}/columns.csv" "${bad}")
run_kvlab(2 "columns.csv: line [0-9]+: unknown column 'keys'" trace summary "${WORK}/columns.csv")
file(WRITE "${WORK}/mixed.jsonl" "${jsonl}${csv}")
run_kvlab(2 "mixed.jsonl: line 26: not a JSON object" trace summary "${WORK}/mixed.jsonl")
run_kvlab(2 "missing.csv': cannot open the trace file" trace summary "${WORK}/missing.csv")
run_kvlab(2 "--every: 0; expected 1 or more" trace steps "${WORK}/run.csv" --every 0)
run_kvlab(2 "--format" trace summary "${WORK}/run.csv" --format yaml)
run_kvlab(2 "" trace)

# a cache policy in a trace: the run records kv_dtype in its inputs and its quality against fp32 in the
# run summary; trace compare shows the byte and quality deltas (fp32's own distance is 0)
kvlab_expect(RC 0 ARGS simulate -m stories15m -p 4 -n 8 -q --threads 1 --mode cached --trace "${WORK}/fp32.csv")
kvlab_expect(RC 0 ARGS simulate -m stories15m -p 4 -n 8 -q --threads 1 --kv-dtype fp8_e4m3 --kv-scale token-head --trace "${WORK}/fp8.jsonl")
kvlab_expect(RC 0 ARGS trace compare "${WORK}/fp32.csv" "${WORK}/fp8.jsonl"
             OUT "cached +kv_mean_kl +0 " "cached +kv_max_abs_dlogit" "inputs that differ: kv_dtype \"fp32\" vs \"fp8_e4m3\"; kv_scale \"tensor\" vs \"token-head\""
                 "cached +bytes_kv_read .* 0\\.2[0-9]x")
kvlab_expect(RC 0 ARGS trace summary "${WORK}/fp8.jsonl" OUT "KV cache fp8_e4m3 \\(token-head scale\\) against the fp32 full cache")
