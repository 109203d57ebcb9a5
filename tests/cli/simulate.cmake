# CLI tests of `kvlab simulate` on the built binary: output, exit codes, traces.
# Run by CTest as: cmake -DKVLAB=<kvlab> -DWORK=<scratch dir> -P simulate.cmake
include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)

set(small simulate --prompt-len 8 --steps 12 --threads 1 --quiet)

# the side-by-side table, its ratio column and the growth note
run_kvlab(0 "uncached / cached.*FLOPs.*step 1 -> step 11.*logits: max" ${small})
# one mode only: no ratio column
run_kvlab(0 "cached" ${small} --mode cached)
if(last_out MATCHES "uncached / cached")
  message(FATAL_ERROR "--mode cached printed a ratio column:\n${last_out}")
endif()
# gpt2 family, GQA llama with --layers, JSON output
run_kvlab(0 "\"uncached_over_cached\"" ${small} --model gpt2 --layers 1 --format json)
run_kvlab(0 "2 of 12 layers" simulate --model stories110m --layers 2 --prompt-len 4 --steps 3 --threads 1 -q)
run_kvlab(0 "uncached / cached" ${small} --model stories260k)  # GQA: 8 query heads, 4 KV heads
run_kvlab(0 "cached" simulate --steps 12 --threads 1 -q --prompt-ids 1,2,3 --temperature 0.8 --top-k 5 --top-p 0.9)

# errors: exit 2, one line naming the flag
run_kvlab(2 "kvlab: error: --steps: the prompt's 200 tokens \\+ 100 steps - 1 = 299 positions exceed the context of stories15m \\(256 positions\\); at most 57 steps" simulate --prompt-len 200 --steps 100)
# The last generated token is never fed back: 5 + 252 - 1 = 256 positions fit stories15m's 256 (as run.c's
# -n 256 with a 5-token prompt); 253 steps do not, and the message names --steps, not --prompt-len.
kvlab_expect(RC 0 ARGS simulate --prompt-ids 1,2,3,4,5 --steps 252 --mode cached --threads 1 -q
             OUT "steps \\(tokens generated\\) +252" "KV cache allocated: 3.38 MiB for 256 positions")  # 256 x 13824 B = 3.375 MiB
kvlab_expect(RC 2 ARGS simulate --prompt-ids 1,2,3,4,5 --steps 253 --mode cached
             ERR "^kvlab: error: --steps: the prompt's 5 tokens \\+ 253 steps - 1 = 257 positions exceed the context of stories15m \\(256 positions\\); at most 252 steps\n$")
run_kvlab(2 "--steps: 0; expected at least 1" simulate --steps 0)
run_kvlab(2 "--prompt-len: -4; expected at least 1" simulate --prompt-len -4)
run_kvlab(2 "--trace: cannot write.*does not exist" ${small} --trace "${WORK}/no/such/dir/t.csv")
run_kvlab(2 "--trace:.*expected .csv, .jsonl or .json" ${small} --trace "${WORK}/t.txt")
run_kvlab(2 "mixture-of-experts.*not simulated" simulate --model mixtral-8x7b)
run_kvlab(2 "--max-memory:.*try --layers [0-9]+" simulate --model llama-3-8b --max-memory 8GiB)
run_kvlab(2 "--mode: 'fast' not in {cached,uncached,both}" simulate --mode fast)
run_kvlab(2 "--layers: 7; expected 1..6" simulate --layers 7)
run_kvlab(2 "--prompt-len excludes --prompt-ids: give one or the other" simulate --prompt-len 3 --prompt-ids 1,2)
run_kvlab(2 "--prompt-ids: token id 99999 is outside the vocabulary" simulate --prompt-ids 1,99999)
run_kvlab(2 "--model excludes --config: give one or the other" simulate --model gpt2 --config "${WORK}")

# traces: deterministic runs are byte-identical; JSONL parses; the CSV header documents units
run_kvlab(0 "" ${small} --deterministic --trace "${WORK}/a.csv")
run_kvlab(0 "" ${small} --deterministic --trace "${WORK}/b.csv")
file(READ "${WORK}/a.csv" a)
file(READ "${WORK}/b.csv" b)
if(NOT a STREQUAL b)
  message(FATAL_ERROR "--deterministic traces differ between two runs")
endif()
if(NOT a MATCHES "# units: .*\nmode,step,phase,position,n_tokens,n_keys,flops,")
  message(FATAL_ERROR "CSV trace header missing units or columns:\n${a}")
endif()
if(a MATCHES "\nmode,[^\n]*wall_ns")
  message(FATAL_ERROR "--deterministic trace has wall-time columns")
endif()
# --repeat's wall times and the host's load are measured: a --deterministic trace holds neither (issue 51)
run_kvlab(0 "median of 2 runs" ${small} --deterministic --repeat 2 --trace "${WORK}/r1.csv")
run_kvlab(0 "" ${small} --deterministic --repeat 2 --trace "${WORK}/r2.csv")
file(READ "${WORK}/r1.csv" r1)
file(READ "${WORK}/r2.csv" r2)
if(NOT r1 STREQUAL r2 OR r1 MATCHES "repeat_wall_ns|host_load")
  message(FATAL_ERROR "--deterministic --repeat 2 traces differ or hold wall times")
endif()
run_kvlab(0 "" ${small} --repeat 2 --trace "${WORK}/r3.csv")
file(READ "${WORK}/r3.csv" r3)
if(NOT r3 MATCHES "# run.repeat_wall_ns={\"cached\":\[[0-9]+,[0-9]+\],\"uncached\":\[[0-9]+,[0-9]+\]}" OR NOT r3 MATCHES "# run.host_load=")
  message(FATAL_ERROR "a --repeat 2 trace has no repeat_wall_ns of two runs per mode:\n${r3}")
endif()
run_kvlab(0 "" ${small} --trace "${WORK}/t.jsonl")
file(STRINGS "${WORK}/t.jsonl" lines)
list(LENGTH lines n_lines)
if(NOT n_lines EQUAL 25)  # header + 12 steps x 2 modes
  message(FATAL_ERROR "JSONL trace has ${n_lines} lines, expected 25")
endif()
list(GET lines 24 last)
string(JSON mode GET "${last}" mode)
string(JSON n_tokens GET "${last}" n_tokens)
string(JSON wall GET "${last}" wall_ns)
if(NOT mode STREQUAL "uncached" OR NOT n_tokens EQUAL 19)  # prompt 8 + 11 generated tokens
  message(FATAL_ERROR "last JSONL record: mode ${mode}, n_tokens ${n_tokens}")
endif()

# An activation the forward pass does not compute is refused, not run as another model: GPT-2's exact
# erf GELU ("gelu") differs from the tanh GELU kvlab computes
file(READ "${CMAKE_CURRENT_LIST_DIR}/../../presets/tiny-gpt2.json" gpt2_cfg)
string(REPLACE "\"gelu_new\"" "\"gelu\"" erf_cfg "${gpt2_cfg}")
file(WRITE "${WORK}/erf-gelu.json" "${erf_cfg}")
kvlab_expect(RC 2 ARGS simulate --config "${WORK}/erf-gelu.json" -p 2 -n 2
             ERR "activation 'gelu' is not simulated; kvlab computes the tanh GELU")

# On a terminal the progress line shows the rate so far and the time left at it (script(1) gives
# kvlab a terminal; stdout goes to a file so only stderr's progress reaches it).
find_program(SCRIPT script)
if(SCRIPT)
  execute_process(COMMAND ${SCRIPT} -qec "'${KVLAB}' simulate -m stories260k -n 40 --threads 1 -f csv > '${WORK}/progress.csv'" /dev/null
                  OUTPUT_VARIABLE out RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "simulate: step [0-9]+/40, [0-9.]+ steps/s, ETA [0-9]+ s")
    message(SEND_ERROR "progress line on a terminal: exit ${rc}, output:\n${out}")
  endif()
endif()

# --attention: the same shape with other KV heads on random weights. stories15m: 6 layers, 6 heads of 48;
# 4 + 4 - 1 = 7 positions of fp32 K and V: MHA 2 x 6 x 6 x 48 x 4 B x 7 = 96768 B = 94.50 KiB; GQA-2 (1/3) 31.50 KiB;
# MQA (1/6) 15.75 KiB.
kvlab_expect(RC 0 ARGS simulate -m stories15m -p 4 -n 4 --threads 1 -q --attention mha OUT "MHA what-if" "KV cache allocated: 94.50 KiB for 7 positions \\(fp32, K and V, all layers")
kvlab_expect(RC 0 ARGS simulate -m stories15m -p 4 -n 4 --threads 1 -q --attention gqa:2 OUT "GQA-2 what-if" "KV cache allocated: 31.50 KiB for 7 positions")
kvlab_expect(RC 0 ARGS simulate -m stories15m -p 4 -n 4 --threads 1 -q --attention mqa OUT "MQA what-if" "KV cache allocated: 15.75 KiB for 7 positions")
kvlab_expect(RC 2 ARGS simulate -m stories15m --attention gqa:4 ERR "--attention: 'gqa:4' needs a KV head count that divides the 6 query heads: gqa:1, gqa:2, gqa:3, gqa:6")
kvlab_expect(RC 2 ARGS simulate -m tiny-llama --attention mha ERR "--attention mha: tiny-llama runs trained weights .* a what-if layout needs random weights")
# --cost-at: the closed form, no weights built, so a trained model's shape takes what-ifs; tiny-llama's MHA
# caches 2 x 6 heads x 32 = 384 values per token per layer, mla:16 a latent of 16 + a RoPE key of 16 = 32: 12x
kvlab_expect(RC 0 ARGS simulate -m tiny-llama --attention mha,mla:16 --cost-at 64,256 OUT "MLA caches 12x less than MHA;"
             "    256  MLA r=16 absorbed ")
kvlab_expect(RC 2 ARGS simulate -m llama-3.1-8b --cost-at 1k,200k ERR "--cost-at: 204800 tokens; expected 1..131072")
kvlab_expect(RC 2 ARGS simulate -m llama-3.1-8b --cost-at 1k --kv-dtype fp16,q8_0 ERR "--cost-at compares attention layouts at one cache format")
kvlab_expect(RC 2 ARGS simulate --attention mha --plot x.svg ERR "--plot requires --cost-at")
kvlab_expect(RC 2 ARGS simulate --cost-at 64 --trace x.csv ERR "--trace excludes --cost-at")

# simulate takes a Hugging Face id too; a path that does not exist is still named as a missing file
kvlab_expect(RC 0 ARGS simulate -m meta-llama/Llama-3.2-1B --layers 1 -p 2 -n 2 --threads 1 -q OUT "Llama-3.2 1B")
kvlab_expect(RC 2 ARGS simulate -m ./missing/config.json ERR "'./missing/config.json': cannot open the config file")

# --kv-dtype: a narrow cache runs cached only, beside an fp32 cache; bad values are one line, exit 2
kvlab_expect(RC 0 ARGS simulate -m stories15m -p 4 -n 4 --threads 1 -q --kv-dtype fp8_e4m3 --kv-scale token-head
             OUT "KV cache fp8_e4m3 \\(token-head scale\\) against the fp32 full cache" "same argmax")
kvlab_expect(RC 2 ARGS simulate -p 4 -n 4 --kv-dtype fp7 ERR "--kv-dtype: unknown dtype 'fp7'")
kvlab_expect(RC 2 ARGS simulate -p 4 -n 4 --kv-dtype int4 ERR "--kv-dtype int4: the cache stores")
kvlab_expect(RC 2 ARGS simulate -p 4 -n 4 --kv-dtype fp16 --mode both ERR "--mode both: --kv-dtype fp16 is measured on the cached mode, beside the fp32 model")
kvlab_expect(RC 2 ARGS simulate -p 4 -n 4 --kv-dtype fp16 --kv-scale token-head ERR "--kv-scale: scales apply to fp8_e4m3, fp8_e5m2 and int8")
kvlab_expect(RC 2 ARGS simulate -p 4 -n 4 --kv-dtype fp16,fp16 ERR "--kv-dtype: fp16 is listed twice")
kvlab_expect(RC 2 ARGS simulate -p 4 -n 4 --kv-dtype fp16,q8_0 --trace "${WORK}/t.csv" ERR "--trace: one run per trace")

# --window / --sink-tokens: a ring of W rows per layer, the first S positions kept in it; the same bytes kvcalc
# gives for the same flags: stories15m 6 layers x 2 x 288 x 4 B x 16 rows = 221184 B = 216 KiB
kvlab_expect(RC 0 ARGS simulate -m stories15m -p 4 -n 60 --window 16 --sink-tokens 4 -q --threads 1
             OUT "KV cache allocated: 216\\.00 KiB for 63 positions, a windowed layer holding 16 of them \\(4 sinks and the last 12\\)" "KV cache fp32, window 16 \\+ 4 sinks against the fp32 full cache")
kvlab_expect(RC 0 ARGS kvcalc -m stories15m -d fp32 --context 63 --window 16 --sink-tokens 4
             OUT "stories15m +MHA \\(native\\) +fp32 +63 +1 +16 +216\\.00 KiB" "the first 4 positions kept as sinks")
kvlab_expect(RC 2 ARGS simulate -m stories15m -p 4 -n 4 --sink-tokens 4 ERR "--sink-tokens 4: stories15m has no sliding window for the sinks to stay in; give --window W")
kvlab_expect(RC 2 ARGS simulate -m stories15m -p 4 -n 4 --window 8 --sink-tokens 8 ERR "--sink-tokens 8: expected fewer than stories15m's window of 8 positions")
kvlab_expect(RC 2 ARGS simulate -m stories15m -p 4 -n 4 --window 8 --mode both ERR "--mode both: --window is measured on the cached mode")
kvlab_expect(RC 2 ARGS kvcalc -m stories15m --window 8 --sink-tokens 9 ERR "--sink-tokens 9: expected fewer than stories15m's window of 8 positions")

# --weight-dtype: the formats the kernels widen, q8_0 only where rows split into blocks of 32, cached mode, one list at a time
file(WRITE "${WORK}/d48.json" "{\"model_type\":\"llama\",\"hidden_size\":48,\"intermediate_size\":64,\"num_hidden_layers\":1,\"num_attention_heads\":2,\"num_key_value_heads\":2,\"vocab_size\":32,\"max_position_embeddings\":64}")
kvlab_expect(RC 2 ARGS simulate --config "${WORK}/d48.json" -p 2 -n 2 --weight-dtype q8_0 ERR "--weight-dtype q8_0: .*hidden_size is 48, not a multiple of 32")
kvlab_expect(RC 2 ARGS simulate -p 2 -n 2 --weight-dtype q4_0 ERR "--weight-dtype q4_0: expected fp32, bf16, fp16 or q8_0")
kvlab_expect(RC 2 ARGS simulate -p 2 -n 2 --weight-dtype bf16 --mode both ERR "--mode both: --weight-dtype bf16 is measured on the cached mode")
kvlab_expect(RC 2 ARGS simulate -p 2 -n 2 --weight-dtype bf16,q8_0 --kv-dtype fp16,q8_0 ERR "one of them may list several")
kvlab_expect(RC 2 ARGS simulate -p 2 -n 2 --weight-dtype bf16,bf16 ERR "--weight-dtype: bf16 is listed twice")
