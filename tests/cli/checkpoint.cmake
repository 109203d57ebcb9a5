# CLI tests of real-weight runs: `kvlab simulate --checkpoint/--tokenizer/--prompt/--save-checkpoint`.
# Run by CTest as: cmake -DKVLAB=<kvlab> -DMAKE_FIXTURES=<kvlab_make_fixtures> -DWORK=<dir> -P checkpoint.cmake
# The fixtures (tiny tokenizer, tiny llama2.c and Hugging Face checkpoints, broken ones) are written here.
include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)
execute_process(COMMAND "${MAKE_FIXTURES}" "${WORK}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kvlab_make_fixtures ${WORK}: exit ${rc}")
endif()

set(run simulate --threads 1 --quiet --steps 6)
set(run_loud simulate --threads 1 --steps 6)  # no --quiet: csv/json/markdown runs stream tokens on stderr

# --- text in, text out: "hi" -> [" ", h, i] -> [" ", "hi"] -> [" hi"]: ids 1 (BOS), 287.
# The table format streams the text first (prompt included), then one blank line, the headline (its wall
# time measured, so not compared), and the table.
kvlab_expect(RC 0 ARGS ${run} --checkpoint tiny.bin --tokenizer tok512.bin --prompt hi
             OUT "^hi" "\n\ncached decoding: " "\n\nkvlab simulate: tiny, prompt 2 tokens, 6 steps\n")
string(FIND "${KVLAB_OUT}" "\n\ncached decoding: " at)
string(SUBSTRING "${KVLAB_OUT}" 0 ${at} text_from_prompt)
# the same ids given directly decode to the same text
kvlab_expect(RC 0 ARGS ${run} --checkpoint tiny.bin --tokenizer tok512.bin --prompt-ids 1,287)
string(FIND "${KVLAB_OUT}" "\n\ncached decoding: " at)
string(SUBSTRING "${KVLAB_OUT}" 0 ${at} text_from_ids)
if(NOT text_from_prompt STREQUAL text_from_ids)
  message(FATAL_ERROR "--prompt hi and --prompt-ids 1,287 stream different text:\n${text_from_prompt}\n---\n${text_from_ids}")
endif()
# with --format json the text goes to stderr and stdout is the report alone, the same as without text
kvlab_expect(RC 0 ARGS ${run_loud} --checkpoint tiny.bin --tokenizer tok512.bin --prompt hi --format json ERR "^hi")
string(JSON prompt_len GET "${KVLAB_OUT}" inputs prompt_len)
string(JSON given GET "${KVLAB_OUT}" inputs prompt)
string(JSON n_tables LENGTH "${KVLAB_OUT}" tables)
if(NOT prompt_len EQUAL 2 OR NOT given STREQUAL "hi" OR NOT n_tables EQUAL 1)
  message(FATAL_ERROR "--prompt hi --format json: prompt_len ${prompt_len}, prompt '${given}', ${n_tables} tables")
endif()
kvlab_expect(RC 0 ARGS ${run} --checkpoint tiny.bin --tokenizer tok512.bin --prompt hi --format csv --quiet)
if(NOT KVLAB_ERR STREQUAL "")
  message(FATAL_ERROR "--quiet with --format csv still streamed on stderr: ${KVLAB_ERR}")
endif()

# --- without a tokenizer: ids in, ids out
kvlab_expect(RC 0 ARGS ${run} --checkpoint tiny.bin --prompt-ids 1,287
             OUT "^prompt ids: 1 287\ngenerated ids:( [0-9]+)+\n\ncached decoding: [^\n]*\nfrom [^\n]* fewer FLOPs [^\n]*the cache held [^\n]*\n\nkvlab simulate: ")
string(REGEX MATCH "generated ids:[^\n]*" tiny_ids "${KVLAB_OUT}")
kvlab_expect(RC 0 ARGS ${run_loud} --checkpoint tiny.bin --prompt-ids 1,287 --format json ERR "^prompt ids: 1 287\n${tiny_ids}\n$")

# --- the Hugging Face directory holds the same model with rotate-half q/k rows: same tokens
# The matrices: per layer wq 16x16, wk and wv 8x16, wo 16x16, w1 and w3 24x16, w2 16x24 = 1920 floats, x 2
# layers + the tied embedding 512x16 = 12032 floats = 48128 B = 47 KiB. The llama2.c file's are read in
# place. The fixture's safetensors header is not padded to 8 bytes as huggingface/safetensors pads it: its
# 1977 bytes put the F32 data at byte 8 + 1977 = 1985, 1 past a 4-byte boundary, so every matrix is copied.
kvlab_expect(RC 0 ARGS ${run} --checkpoint tiny.bin --prompt-ids 1,287 OUT "checkpoint matrices: all 47\\.00 KiB read in place")
kvlab_expect(RC 0 ARGS ${run} --checkpoint hf_ok --prompt-ids 1,287 OUT "\n${tiny_ids}\n"
             "checkpoint matrices: none read in place: all 47\\.00 KiB converted")
# --layers trims a loaded model too
kvlab_expect(RC 0 ARGS ${run} --checkpoint tiny.bin --layers 1 OUT "tiny \\(1 of 2 layers\\)")

# --- a random-weight preset saved as llama2.c v0 runs identically from the file
kvlab_expect(RC 0 ARGS ${run} --model stories260k --prompt-ids 1,2,3 --save-checkpoint s260k.bin
             OUT "saved the model run as llama2.c v0: s260k.bin")
string(REGEX MATCH "generated ids:[^\n]*" preset_ids "${KVLAB_OUT}")
kvlab_expect(RC 0 ARGS ${run} --checkpoint s260k.bin --prompt-ids 1,2,3 OUT "\n${preset_ids}\n")

# --- usage errors: exit 2, one line
kvlab_expect(RC 2 ARGS ${run} --checkpoint tiny.bin --model stories15m ERR "--model excludes --checkpoint: give one or the other")
kvlab_expect(RC 2 ARGS ${run} --prompt hi ERR "--prompt: text needs --tokenizer")
kvlab_expect(RC 2 ARGS ${run} --checkpoint tiny.bin --tokenizer tok512.bin --prompt hi --prompt-ids 1 ERR "--prompt excludes --prompt-ids: give one or the other")
kvlab_expect(RC 2 ARGS ${run} --model llama-3-8b --layers 1 --save-checkpoint x.bin ERR "x.bin: cannot save as llama2.c v0: rope_theta is 500000")
kvlab_expect(RC 2 ARGS ${run} --model gpt2 --layers 1 --save-checkpoint x.bin ERR "cannot save as llama2.c v0: only the llama family")
kvlab_expect(RC 2 ARGS ${run} --model stories260k --save-checkpoint no/such/dir/x.bin ERR "--save-checkpoint: .*does not exist")
if(EXISTS "${WORK}/x.bin")
  message(FATAL_ERROR "a refused --save-checkpoint left x.bin behind")
endif()

# --- broken files: exit 2, one line naming the file
kvlab_expect(RC 2 ARGS ${run} --checkpoint absent.bin ERR "absent.bin: checkpoint not found")
kvlab_expect(RC 2 ARGS ${run} --checkpoint truncated.bin ERR "truncated.bin: llama2.c v0 header .* implies [0-9]+ bytes, but the file has [0-9]+ bytes")
kvlab_expect(RC 2 ARGS ${run} --checkpoint v1_version7.bin ERR "v1_version7.bin: llama2.c \"ak42\" checkpoint version 7")
kvlab_expect(RC 2 ARGS ${run} --checkpoint text.bin ERR "text.bin: llama2.c v0 header")
kvlab_expect(RC 2 ARGS ${run} --checkpoint hf_missing ERR "tensor 'model.norm.weight' is missing")
kvlab_expect(RC 2 ARGS ${run} --checkpoint hf_shape ERR "tensor 'model.layers.0.self_attn.k_proj.weight' has shape \\[16, 8\\]; expected \\[8, 16\\]")
kvlab_expect(RC 2 ARGS ${run} --checkpoint hf_dtype ERR "unknown dtype 'F7'")
kvlab_expect(RC 2 ARGS ${run} --checkpoint hf_ok_then_truncated ERR "hf_ok_then_truncated/model.safetensors")
kvlab_expect(RC 2 ARGS ${run} --checkpoint tiny.bin --tokenizer tok512_truncated.bin --prompt hi ERR "tok512_truncated.bin: truncated at offset")
kvlab_expect(RC 2 ARGS ${run} --tokenizer tok512.bin --prompt hi ERR "tok512.bin: truncated at offset")  # stories15m: 32000 tokens

# --- the README lines, as written: the same tokens from the preset and from its saved file
kvlab_expect(RC 0 ARGS simulate --model stories260k -n 16 --prompt-ids 1,2,3 --save-checkpoint s260k.bin OUT "saved the model run as llama2.c v0: s260k.bin")
string(REGEX MATCH "generated ids:[^\n]*" readme_preset "${KVLAB_OUT}")
kvlab_expect(RC 0 ARGS simulate --checkpoint s260k.bin -n 16 --prompt-ids 1,2,3)
string(REGEX MATCH "generated ids:[^\n]*" readme_file "${KVLAB_OUT}")
if(readme_preset STREQUAL "" OR NOT readme_preset STREQUAL readme_file)
  message(FATAL_ERROR "README save/load: '${readme_preset}' vs '${readme_file}'")
endif()

# random weights on a random prompt: the tokens mean nothing, the output is the headline and the table
kvlab_expect(RC 0 ARGS ${run} --model stories260k OUT "^cached decoding: [^\n]*\nfrom [^\n]* fewer FLOPs [^\n]*the cache held [^\n]*\n\nkvlab simulate: " NOT_OUT "generated ids")
kvlab_expect(RC 0 ARGS ${run_loud} --model stories260k --format json)
if(NOT KVLAB_ERR STREQUAL "")
  message(FATAL_ERROR "random run streamed on stderr: ${KVLAB_ERR}")
endif()
