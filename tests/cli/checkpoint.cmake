# CLI tests of real-weight runs: `kvlab simulate --checkpoint/--tokenizer/--prompt/--save-checkpoint`.
# Run by CTest as: cmake -DKVLAB=<kvlab> -DMAKE_FIXTURES=<kvlab_make_fixtures> -DWORK=<dir> -P checkpoint.cmake
# The fixtures (tiny tokenizer, tiny llama2.c and Hugging Face checkpoints, broken ones) are written here.
include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)
execute_process(COMMAND "${MAKE_FIXTURES}" "${WORK}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kvlab_make_fixtures ${WORK}: exit ${rc}")
endif()

set(run simulate --threads 1 --quiet --steps 6)

# generated ids of a JSON report (the "tokens" table) as a ;-list
function(generated_ids json out_var)
  string(JSON n LENGTH "${json}" tables 1 rows 0 generated_ids)
  math(EXPR last "${n} - 1")
  set(ids "")
  foreach(i RANGE ${last})
    string(JSON id GET "${json}" tables 1 rows 0 generated_ids ${i})
    list(APPEND ids ${id})
  endforeach()
  set(${out_var} "${ids}" PARENT_SCOPE)
endfunction()

# --- text in, text out: "hi" -> [" ", h, i] -> [" ", "hi"] -> [" hi"]: ids 1 (BOS), 287
kvlab_expect(RC 0 ARGS ${run} --checkpoint tiny.bin --tokenizer tok512.bin --prompt hi --format json)
string(JSON p0 GET "${KVLAB_OUT}" tables 1 rows 0 prompt_ids 0)
string(JSON p1 GET "${KVLAB_OUT}" tables 1 rows 0 prompt_ids 1)
string(JSON prompt_text GET "${KVLAB_OUT}" tables 1 rows 0 prompt_text)
string(JSON given GET "${KVLAB_OUT}" inputs prompt)
if(NOT p0 EQUAL 1 OR NOT p1 EQUAL 287 OR NOT prompt_text STREQUAL "hi" OR NOT given STREQUAL "hi")
  message(FATAL_ERROR "--prompt hi: prompt ids ${p0},${p1}, text '${prompt_text}', input '${given}'; expected 1,287 and 'hi'")
endif()
generated_ids("${KVLAB_OUT}" text_run_ids)
# the table format streams the text first (prompt included), then one blank line, then the table
kvlab_expect(RC 0 ARGS ${run} --checkpoint tiny.bin --tokenizer tok512.bin --prompt hi
             OUT "^hi" "\n\nkvlab simulate: tiny, prompt 2 tokens, 6 steps\n")
# without a tokenizer: the same model on ids gives the same tokens, printed as ids
kvlab_expect(RC 0 ARGS ${run} --checkpoint tiny.bin --prompt-ids 1,287 --format json)
generated_ids("${KVLAB_OUT}" id_run_ids)
if(NOT id_run_ids STREQUAL text_run_ids)
  message(FATAL_ERROR "text prompt and the same ids generate different tokens: ${text_run_ids} vs ${id_run_ids}")
endif()
string(REPLACE ";" " " id_line "${id_run_ids}")
kvlab_expect(RC 0 ARGS ${run} --checkpoint tiny.bin --prompt-ids 1,287
             OUT "^prompt ids: 1 287\ngenerated ids: ${id_line}\n\nkvlab simulate: ")

# --- the Hugging Face directory holds the same model with rotate-half q/k rows: same tokens
kvlab_expect(RC 0 ARGS ${run} --checkpoint hf_ok --prompt-ids 1,287 --format json)
generated_ids("${KVLAB_OUT}" hf_ids)
if(NOT hf_ids STREQUAL id_run_ids)
  message(FATAL_ERROR "HF and llama2.c copies of one model generate different tokens: ${hf_ids} vs ${id_run_ids}")
endif()
# --layers trims a loaded model too
kvlab_expect(RC 0 ARGS ${run} --checkpoint tiny.bin --layers 1 OUT "tiny \\(1 of 2 layers\\)")

# --- a random-weight preset saved as llama2.c v0 runs identically from the file
kvlab_expect(RC 0 ARGS ${run} --model stories260k --prompt-ids 1,2,3 --save-checkpoint s260k.bin --format json)
generated_ids("${KVLAB_OUT}" preset_ids)
string(JSON note GET "${KVLAB_OUT}" notes 0)
if(NOT note MATCHES "saved the model run as llama2.c v0: s260k.bin")
  message(FATAL_ERROR "no save note: ${note}")
endif()
kvlab_expect(RC 0 ARGS ${run} --checkpoint s260k.bin --prompt-ids 1,2,3 --format json)
generated_ids("${KVLAB_OUT}" saved_ids)
if(NOT saved_ids STREQUAL preset_ids)
  message(FATAL_ERROR "stories260k in memory and from its saved file generate different tokens: ${preset_ids} vs ${saved_ids}")
endif()

# --- usage errors: exit 2, one line
kvlab_expect(RC 2 ARGS ${run} --checkpoint tiny.bin --model stories15m ERR "--checkpoint and --model/--config")
kvlab_expect(RC 2 ARGS ${run} --prompt hi ERR "--prompt: text needs --tokenizer")
kvlab_expect(RC 2 ARGS ${run} --checkpoint tiny.bin --tokenizer tok512.bin --prompt hi --prompt-ids 1 ERR "--prompt and --prompt-len/--prompt-ids")
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
kvlab_expect(RC 0 ARGS simulate --model stories260k -n 16 --save-checkpoint s260k.bin OUT "saved the model run as llama2.c v0: s260k.bin")
string(REGEX MATCH "generated ids:[^\n]*" readme_preset "${KVLAB_OUT}")
kvlab_expect(RC 0 ARGS simulate --checkpoint s260k.bin -n 16)
string(REGEX MATCH "generated ids:[^\n]*" readme_file "${KVLAB_OUT}")
if(readme_preset STREQUAL "" OR NOT readme_preset STREQUAL readme_file)
  message(FATAL_ERROR "README save/load: '${readme_preset}' vs '${readme_file}'")
endif()
