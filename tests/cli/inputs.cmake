# Regression tests of issue 46 (docs/reliability.md): no output replaces an input, per command and per
# input kind, however the two are named; temporary names that fit beside a 255-byte output name; and the
# smaller cases (GGUF per-layer arrays, unknown layer_types, --max-memory above RAM, q4_0 rows).
include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)
execute_process(COMMAND "${MAKE_FIXTURES}" "${WORK}/fx" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kvlab_make_fixtures failed: ${rc}")
endif()

# refused(FILE FLAG_RE ARGS...): exit 2 naming both flags, and FILE's bytes exactly as before
function(refused file flags_re)
  file(SHA256 "${file}" before)
  kvlab_expect(RC 2 ARGS ${ARGN} ERR "${flags_re}")
  file(SHA256 "${file}" after)
  if(NOT before STREQUAL after)
    message(SEND_ERROR "kvlab ${ARGN}: ${file} changed")
  endif()
  file(GLOB left "${WORK}/.*.tmp-*" "${WORK}/fx/.*.tmp-*")
  if(left)
    message(SEND_ERROR "kvlab ${ARGN}: left temporaries ${left}")
  endif()
endfunction()

set(small -p 2 -n 2 --threads 1 --quiet)
run_kvlab(0 "" simulate --model stories260k ${small} --trace "${WORK}/tr.csv")
run_kvlab(0 "" serve --model stories260k --requests 2 --prompt-len 2..3 --output-len 1..2 --threads 1 --quiet --trace "${WORK}/serve.csv")
file(WRITE "${WORK}/w.jsonl" "{\"prompt_ids\": [1, 2, 3], \"max_tokens\": 2}\n")
file(WRITE "${WORK}/e.jsonl" "Once upon a time there was a cat.\n")
file(COPY "${DATA}/llamacpp-36l.json" DESTINATION "${WORK}")
file(RENAME "${WORK}/llamacpp-36l.json" "${WORK}/cfg.json")
file(COPY "${WORK}/fx/tiny.bin" "${WORK}/fx/tok512.bin" DESTINATION "${WORK}")

# serve: the workload becomes a trace; the config becomes a trace
refused("${WORK}/w.jsonl" "--trace: '.*' is also this command's input \\(--workload\\); an output never replaces an input"
        serve --model stories260k --workload "${WORK}/w.jsonl" --trace "${WORK}/w.jsonl" --quiet)
refused("${WORK}/cfg.json" "--trace: .* is also this command's input \\(--config\\)" serve -c "${WORK}/cfg.json" --requests 2 --trace "${WORK}/cfg.json" --quiet)
# serve: the tokenizer and a Hugging Face folder's files, as --checkpoint
file(COPY_FILE "${WORK}/tok512.bin" "${WORK}/tk-serve.jsonl")
refused("${WORK}/tk-serve.jsonl" "--trace: .* is also this command's input \\(--tokenizer\\)"
        serve --checkpoint "${WORK}/tiny.bin" --tokenizer "${WORK}/tk-serve.jsonl" --requests 2 --prompt-len 2..3 --output-len 1..2 --trace "${WORK}/tk-serve.jsonl" --quiet)
refused("${WORK}/fx/hf_ok/config.json" "--trace: .* is also this command's input \\(--checkpoint '.*, which reads 'config.json' there\\)"
        serve --checkpoint "${WORK}/fx/hf_ok" --requests 2 --prompt-len 2..3 --output-len 1..2 --trace "${WORK}/fx/hf_ok/config.json" --quiet)
# simulate: config, eval text, checkpoint, tokenizer; named as given, with ./, and through a hard link or a symbolic link
refused("${WORK}/cfg.json" "--trace: .* is also this command's input \\(--config\\)" simulate -c "${WORK}/cfg.json" ${small} --trace "${WORK}/cfg.json")
refused("${WORK}/e.jsonl" "--save-checkpoint: .* is also this command's input \\(--eval\\)"
        simulate --checkpoint "${WORK}/tiny.bin" --tokenizer "${WORK}/tok512.bin" --eval "${WORK}/e.jsonl" --save-checkpoint "${WORK}/e.jsonl")
refused("${WORK}/tiny.bin" "--save-checkpoint: .* is also this command's input \\(--checkpoint '.*, the same file under another name\\)"
        simulate --checkpoint "${WORK}/tiny.bin" ${small} --save-checkpoint "${WORK}/./tiny.bin")
file(RENAME "${WORK}/tok512.bin" "${WORK}/tk.csv")
refused("${WORK}/tk.csv" "--trace: .* is also this command's input \\(--tokenizer\\)"
        simulate --checkpoint "${WORK}/tiny.bin" --tokenizer "${WORK}/tk.csv" --prompt-ids 1,2 -n 2 --quiet --trace "${WORK}/tk.csv")
file(CREATE_LINK "${WORK}/tiny.bin" "${WORK}/hard.bin")  # a hard link: another name, the same inode
refused("${WORK}/tiny.bin" "--save-checkpoint: .* is also this command's input \\(--checkpoint '.*, the same file under another name\\)"
        simulate --checkpoint "${WORK}/tiny.bin" ${small} --save-checkpoint "${WORK}/hard.bin")
file(CREATE_LINK "${WORK}/tiny.bin" "${WORK}/soft.bin" SYMBOLIC)
refused("${WORK}/tiny.bin" "--save-checkpoint: .* is also this command's input \\(--checkpoint '.*, the same file under another name\\)"
        simulate --checkpoint "${WORK}/soft.bin" ${small} --save-checkpoint "${WORK}/tiny.bin")
# a Hugging Face folder stands for the files read from it
refused("${WORK}/fx/hf_ok/config.json" "--trace: .* is also this command's input \\(--checkpoint '.*, which reads 'config.json' there\\)"
        simulate --checkpoint "${WORK}/fx/hf_ok" ${small} --trace "${WORK}/fx/hf_ok/config.json")
refused("${WORK}/fx/hf_ok/model.safetensors" "--save-checkpoint: .* is also this command's input \\(--config '.*, which reads 'model.safetensors' there"
        simulate --config "${WORK}/fx/hf_ok" ${small} --save-checkpoint "${WORK}/fx/hf_ok/model.safetensors")
# trace plot: a trace named .svg, charted onto itself; trace plot of a serve trace
file(COPY_FILE "${WORK}/tr.csv" "${WORK}/tr.svg")
refused("${WORK}/tr.svg" "--output: .* is also this command's input \\(the files argument\\)" trace plot "${WORK}/tr.svg" -o "${WORK}/tr.svg")
file(COPY_FILE "${WORK}/serve.csv" "${WORK}/serve.svg")
refused("${WORK}/serve.svg" "--output: .* is also this command's input \\(the files argument\\)" trace plot "${WORK}/serve.svg" -o "${WORK}/serve.svg")
# kvcalc: a GGUF or a config named .svg, charted onto itself
file(COPY_FILE "${WORK}/fx/llama3-8b.gguf" "${WORK}/model.svg")
refused("${WORK}/model.svg" "--plot: .* is also this command's input \\(--gguf\\)" kvcalc --gguf "${WORK}/model.svg" --plot "${WORK}/model.svg")
file(COPY_FILE "${WORK}/cfg.json" "${WORK}/cfg.png")
refused("${WORK}/cfg.png" "--plot: .* is also this command's input \\(--config\\)" kvcalc -c "${WORK}/cfg.png" --plot "${WORK}/cfg.png")
refused("${WORK}/cfg.png" "--plot: .* is also this command's input \\(--model" kvcalc -m "llama-2-7b,${WORK}/cfg.png" --plot "${WORK}/cfg.png")
# a file read that no flag names: a preset's config (a copy of the presets folder, KVLAB_PRESETS_DIR pointing at it)
file(COPY "${DATA}/../../presets/" DESTINATION "${WORK}/presets")
file(SHA256 "${WORK}/presets/stories260k.json" before)
execute_process(COMMAND ${CMAKE_COMMAND} -E env "KVLAB_PRESETS_DIR=${WORK}/presets" "${KVLAB}" simulate --model stories260k ${small}
                        --trace "${WORK}/presets/stories260k.json"
                RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
file(SHA256 "${WORK}/presets/stories260k.json" after)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--trace: .* is also this command's input \\(the config file\\)" OR NOT before STREQUAL after)
  message(SEND_ERROR "a preset's config as --trace: exit ${rc}, ${err}")
endif()
# two outputs, one file
refused("${WORK}/tr.csv" "--save-checkpoint and --trace: both name" simulate --model stories260k ${small} --trace "${WORK}/tr.csv"
        --save-checkpoint "${WORK}/./tr.csv")
# what is not an input is still written
kvlab_expect(RC 0 ARGS serve --model stories260k --workload "${WORK}/w.jsonl" --trace "${WORK}/w-trace.jsonl" --quiet)

# Temporary names: any legal output name works, up to NAME_MAX (255 bytes), whatever the PID's digits
string(REPEAT "n" 251 long)
kvlab_expect(RC 0 ARGS simulate --model stories260k ${small} --trace "${WORK}/${long}.csv")
if(NOT EXISTS "${WORK}/${long}.csv")
  message(SEND_ERROR "the 255-byte trace name was not written")
endif()
string(REPEAT "p" 251 long_plot)
find_program(GNUPLOT gnuplot)
if(GNUPLOT)
  kvlab_expect(RC 0 ARGS trace plot "${WORK}/tr.csv" -o "${WORK}/${long_plot}.svg")
endif()

# GGUF per-layer arrays (llama.cpp's get_key_or_arr): one entry per layer or a scalar; a 1-entry array for
# 32 layers is refused. The 32-entry one gives Llama-3-8B's GQA-8: 2 x 32 x 8 x 128 x 2 B = 128 KiB a token.
kvlab_expect(RC 2 ARGS kvcalc --gguf "${WORK}/fx/kv-array-1.gguf"
             ERR "'llama.attention.head_count_kv' has 1 entry; expected one per layer \\(32\\), or a single value")
kvlab_expect(RC 0 ARGS kvcalc --gguf "${WORK}/fx/kv-array-32.gguf" -d fp16 --context 8k OUT "GQA-8 \\(native\\) .* 128.00 KiB")

# layer_types other than full_attention and sliding_attention: refused, naming the entry
file(WRITE "${WORK}/types.json" "{\"model_type\":\"qwen3\",\"hidden_size\":64,\"num_attention_heads\":4,\"num_key_value_heads\":2,
  \"num_hidden_layers\":2,\"intermediate_size\":128,\"vocab_size\":32,\"sliding_window\":16,\"use_sliding_window\":true,\"layer_types\":[\"sliding_attention\",\"linear_attention\"]}")
kvlab_expect(RC 2 ARGS kvcalc -c "${WORK}/types.json"
             ERR "layer_types\\[1\\] = 'linear_attention'; kvlab sizes full_attention and sliding_attention layers only")

# with no window too (Qwen3-Next's linear_attention layers cache no K and V: counting them as full attention is wrong)
file(WRITE "${WORK}/types2.json" "{\"model_type\":\"qwen3_next\",\"hidden_size\":64,\"num_attention_heads\":4,\"num_key_value_heads\":2,
  \"num_hidden_layers\":2,\"intermediate_size\":128,\"vocab_size\":32,\"layer_types\":[\"linear_attention\",\"full_attention\"]}")
kvlab_expect(RC 2 ARGS kvcalc -c "${WORK}/types2.json" ERR "layer_types\\[0\\] = 'linear_attention'")

# --max-memory above the machine's RAM: refused up front unless --force-memory
kvlab_expect(RC 2 ARGS serve --model stories260k --requests 2 --kv-budget 1TiB --max-memory 1000TiB --quiet
             ERR "--max-memory: '1000TiB' \\(1000.00 TiB\\) is more than this machine's .* of physical memory")
kvlab_expect(RC 2 ARGS simulate --model stories260k ${small} --max-memory 1000TiB ERR "add --force-memory")
kvlab_expect(RC 0 ARGS simulate --model stories260k ${small} --max-memory 1000TiB --force-memory)

# q8_0 / q4_0 rows must be whole blocks of 32 (ggml rows hold whole blocks): kvcalc and simulate agree.
# 4 heads of 8, 1 KV head: a row of 8 values.
file(WRITE "${WORK}/hd8.json" "{\"model_type\":\"llama\",\"hidden_size\":32,\"num_attention_heads\":4,\"num_key_value_heads\":1,
  \"num_hidden_layers\":2,\"intermediate_size\":64,\"vocab_size\":32,\"max_position_embeddings\":64}")
kvlab_expect(RC 2 ARGS kvcalc -c "${WORK}/hd8.json" -d q4_0 ERR "q4_0 cache of .*: a K/V row of 8 values \\(1 KV heads x 8\\) does not split into blocks of 32")
kvlab_expect(RC 2 ARGS simulate -c "${WORK}/hd8.json" ${small} --kv-dtype q4_0 ERR "--kv-dtype q4_0: a K/V row of 8 values .*does not split into blocks of 32")
kvlab_expect(RC 0 ARGS kvcalc -c "${WORK}/hd8.json" -d fp16 --context 64)
