# Regression tests of issue 13 (docs/reliability.md): hostile files and flags get one clear error line
# and the right exit code, never a crash, a command run, a replaced device or link, or a wrong number.
include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)

# 1. A trace's display name is text, never gnuplot script (the title reaches gnuplot as ARG2). Without
#    gnuplot the check is skipped below with the plot tests.
run_kvlab(0 "" simulate --prompt-len 4 --steps 3 --threads 1 --quiet --deterministic --trace "${WORK}/run.csv")
file(READ "${WORK}/run.csv" csv)
string(REGEX REPLACE "# run.display_name=[^\n]*"
       "# run.display_name=\"x\\\\nsystem(\\\\\"touch PWNED\\\\\")\\\\nprint 1 `touch PWNED2` @ARG1\"" evil "${csv}")
file(WRITE "${WORK}/evil.csv" "${evil}")
# read back as one string, printed with its newlines escaped
kvlab_expect(RC 0 ARGS trace summary "${WORK}/evil.csv" OUT "kvlab simulate: x\\\\nsystem\\(\"touch PWNED\"\\)\\\\nprint 1")
find_program(GNUPLOT gnuplot)
if(GNUPLOT)
  run_kvlab(0 "wrote" trace plot "${WORK}/evil.csv" -o "${WORK}/evil.svg")
  foreach(f PWNED PWNED2)
    if(EXISTS "${WORK}/${f}")
      message(FATAL_ERROR "trace plot ran a command from the trace's display name (${f} exists)")
    endif()
  endforeach()
  # gnuplot runs a file name that starts with '<' as a shell command: kvlab must hand it absolute names,
  # whatever -o's directory is called (run from WORK, so the relative names would start with '<')
  file(MAKE_DIRECTORY "${WORK}/<touch PWNED3 x")
  run_kvlab(0 "wrote" trace plot "${WORK}/evil.csv" -o "<touch PWNED3 x/chart.svg")
  if(EXISTS "${WORK}/PWNED3")
    message(FATAL_ERROR "trace plot ran a command from the -o directory's name")
  endif()
  file(READ "${WORK}/evil.svg" svg)
  if(NOT svg MATCHES "system\\(&quot;touch PWNED&quot;\\)|system\\(\"touch PWNED\"\\)")
    message(FATAL_ERROR "the display name is not drawn as text in the chart title")
  endif()
endif()

# 2. Deep nesting: every JSON reader says so instead of exhausting the stack.
string(REPEAT "[" 100000 open)
string(REPEAT "]" 100000 close)
file(WRITE "${WORK}/deep.json" "${open}${close}")
kvlab_expect(RC 2 ARGS kvcalc --config "${WORK}/deep.json" ERR "deep.json: JSON nested more than 64 levels deep")
file(WRITE "${WORK}/deep-trace.json" "{\"traceEvents\": ${open}${close}}")
kvlab_expect(RC 2 ARGS trace summary "${WORK}/deep-trace.json" ERR "nested more than 64 levels deep")
file(WRITE "${WORK}/deep.jsonl" "{\"kvlab_trace\": ${open}${close}}\n")
kvlab_expect(RC 2 ARGS trace summary "${WORK}/deep.jsonl" ERR "nested more than 64 levels deep")
string(REPLACE "# run.mode=" "# run.mode=${open}${close}\n# x=" deep_csv "${csv}")
file(WRITE "${WORK}/deep.csv" "${deep_csv}")
kvlab_expect(RC 2 ARGS trace summary "${WORK}/deep.csv" ERR "deep.csv: line [0-9]+: JSON nested more than 64")

# 3. Sizes that wrap: 2^40 heads x head_dim 2^24 = 2^64 used to wrap to 0 and pass the memory check.
file(WRITE "${WORK}/wrap.json" "{\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":1,
\"num_attention_heads\":1099511627776,\"num_key_value_heads\":1,\"head_dim\":16777216,\"vocab_size\":32,\"max_position_embeddings\":64}")
kvlab_expect(RC 2 ARGS simulate --config "${WORK}/wrap.json" -p 2 -n 2 ERR "num_attention_heads \\(1099511627776\\) x head_dim \\(16777216\\) overflows")
kvlab_expect(RC 2 ARGS kvcalc --config "${WORK}/wrap.json" ERR "overflows 64 bits")
# 2^30 heads x 2^24: the width (2^54) fits, and the sizes come out whole instead of wrapped: wq and wo
# hold 2 x 2^54 x 64 floats x 4 B = 2^63 B = 8 EiB of weights, refused by the memory check
file(WRITE "${WORK}/wrap2.json" "{\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":1,
\"num_attention_heads\":1073741824,\"num_key_value_heads\":1,\"head_dim\":16777216,\"vocab_size\":32,\"max_position_embeddings\":64}")
kvlab_expect(RC 2 ARGS simulate --config "${WORK}/wrap2.json" -p 2 -n 2 --threads 1 ERR "--max-memory: simulating wrap2 needs .* \\(weights 8.00 EiB,")

# 4. Non-regular targets are refused before any work; a symlink is not replaced.
kvlab_expect(RC 2 ARGS simulate --model stories260k -p 2 -n 2 --save-checkpoint /dev/null
             ERR "--save-checkpoint: '/dev/null' is a device or special file")
file(WRITE "${WORK}/target.csv" "keep me\n")
file(CREATE_LINK "${WORK}/target.csv" "${WORK}/link.csv" SYMBOLIC)
kvlab_expect(RC 2 ARGS simulate -p 2 -n 2 --trace "${WORK}/link.csv" ERR "'.*link.csv' is a symbolic link")
file(READ "${WORK}/target.csv" kept)
if(NOT IS_SYMLINK "${WORK}/link.csv" OR NOT kept STREQUAL "keep me\n")
  message(FATAL_ERROR "--trace replaced a symbolic link or its target")
endif()
kvlab_expect(RC 2 ARGS simulate --model stories260k -p 2 -n 2 --save-checkpoint "${WORK}/no-such-dir/x.bin"
             ERR "directory '.*no-such-dir' does not exist")

# 7. A prompt that cannot fit is refused before it is encoded (30 KB used to take 35 s, then fail).
execute_process(COMMAND "${MAKE_FIXTURES}" "${WORK}/fx" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kvlab_make_fixtures failed: ${rc}")
endif()
string(REPEAT "ab " 10000 long_prompt)
kvlab_expect(RC 2 ARGS simulate --checkpoint "${WORK}/fx/tiny.bin" --tokenizer "${WORK}/fx/tok512.bin" --prompt "${long_prompt}" -n 2
             ERR "--prompt: 30000 bytes of text encode to at least [0-9]+ tokens .* the context of tiny is 64 positions")

# 8. Unbounded reads: a device, a FIFO or a directory is not a trace or config file.
kvlab_expect(RC 2 ARGS trace summary /dev/zero ERR "'/dev/zero': is a device or special file; expected a regular trace file")
kvlab_expect(RC 2 ARGS trace summary "${WORK}" ERR "is a directory; expected a regular trace file")
# a binary file (a checkpoint, the program itself) is named as such before it is read whole
kvlab_expect(RC 2 ARGS trace summary "${KVLAB}" ERR "binary data \\(a NUL byte at offset [0-9]+\\); expected a text trace")
kvlab_expect(RC 2 ARGS simulate --trace "${WORK}" ERR "--trace: '.*' is a directory; expected a file name ending in .csv, .jsonl or .json")
# a config.json given as --checkpoint is called a JSON file, not read as a llama2.c header
kvlab_expect(RC 2 ARGS simulate --checkpoint ${DATA}/llamacpp-36l.json ERR "--checkpoint: '.*llamacpp-36l.json' is a JSON file \\(a config.json\\?\\), not a checkpoint; give a config with --config")
kvlab_expect(RC 2 ARGS kvcalc --config /dev/zero ERR "'/dev/zero': is a device or special file; expected a regular config file")

# 9. Numbers: plain decimal in range, or refused (no wrap, no clamp, no hex, no empty value).
kvlab_expect(RC 2 ARGS simulate -p 9223372036854775807 -n 9223372036854775807
             ERR "9223372036854775807 tokens \\+ 9223372036854775807 steps - 1 = 18446744073709551613 positions exceed")
kvlab_expect(RC 2 ARGS simulate -n 18446744073709551616 ERR "--steps: '18446744073709551616' is out of range")
kvlab_expect(RC 2 ARGS simulate --seed 18446744073709551616 ERR "--seed: '18446744073709551616' is out of range; expected 0..2\\^64-1")
kvlab_expect(RC 2 ARGS simulate --seed -1 ERR "--seed: '-1' is not a non-negative decimal integer")
kvlab_expect(RC 2 ARGS simulate -n 0x10 ERR "--steps: '0x10' is not a decimal integer")
kvlab_expect(RC 2 ARGS simulate --temperature nan ERR "--temperature: 'nan' is not a finite decimal number")
# a count below its floor: one short line, not CLI11's 400-byte range
kvlab_expect(RC 2 ARGS gpu attention --heads 0 --head-dim 64 ERR "--heads: 0; expected an integer >= 1")
# a 64-bit decimal too large for the option's own type (--threads is an int)
kvlab_expect(RC 2 ARGS simulate --threads 3000000000 ERR "--threads: '3000000000' is out of range for this option")
# 0 given for an option whose default 0 means "not given" is refused like -1, not read as the default
kvlab_expect(RC 2 ARGS kvcalc -m llama-3-8b --window 0 ERR "--window: 0; expected a positive number of positions")
kvlab_expect(RC 2 ARGS simulate --model stories260k -n 2 --window 0 ERR "--window: 0; expected a positive number of positions")
kvlab_expect(RC 2 ARGS serve --model stories260k --requests 2 --kv-blocks 0 ERR "--kv-blocks: 0; expected at least 1")
# 1 / T is applied in float: a T whose inverse is no finite float (1e-39 < 1 / 3.4e38) made every
# probability NaN and picked the last token every step
kvlab_expect(RC 2 ARGS simulate --model stories260k -n 2 --prompt-ids 1 --temperature 1e-39 ERR "--temperature: 1e-39; expected 0 \\(greedy\\) or at least 2.94e-39")
kvlab_expect(RC 0 ARGS simulate --model stories260k -n 2 --prompt-ids 1 -q --temperature 3e-39)
kvlab_expect(RC 2 ARGS kvcalc --kv-budget -1 ERR "--kv-budget: '-1' is negative; expected a positive size")
# 010 is ten (decimal), not eight (C's octal): 2 prompt + 10 steps
kvlab_expect(RC 0 ARGS simulate -p 2 -n 010 --mode cached --quiet -f csv OUT "\nsteps,10\n")
file(READ "${WORK}/run.csv" csv)
string(REGEX REPLACE "format 2 " "format 4294967298 " wide "${csv}")
file(WRITE "${WORK}/wide.csv" "${wide}")
kvlab_expect(RC 2 ARGS trace summary "${WORK}/wide.csv" ERR "trace format '4294967298'; expected 2")

# 10. Library errors are caught where the file and field are known; messages cut and escaped.
file(WRITE "${WORK}/name.json" "{\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":1,
\"num_attention_heads\":4,\"vocab_size\":32,\"max_position_embeddings\":64,\"_kvlab\":{\"display_name\":5}}")
kvlab_expect(RC 2 ARGS kvcalc --config "${WORK}/name.json" ERR "name.json \\(_kvlab\\): display_name = 5; expected a string")
# a sliding_window that no layer uses (layer_types all full): --block-size --explain used to look up a
# windowed layer past the end (internal error, exit 1)
file(WRITE "${WORK}/nowin.json" "{\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":2,
\"num_attention_heads\":4,\"vocab_size\":100,\"max_position_embeddings\":8192,\"sliding_window\":1000,\"layer_types\":[\"full_attention\",\"full_attention\"]}")
kvlab_expect(RC 0 ARGS kvcalc --config "${WORK}/nowin.json" -d fp16 --block-size 16 --context 4096 --explain
             OUT "KV/sequence at T=4096 = 4096 tokens x 512 B/token")
# a name with an escape sequence and a newline: shown escaped in table cells (and markdown rows), not
# sent raw to the terminal
file(WRITE "${WORK}/ctl.json" "{\"_name_or_path\":\"evil\\u001b[31mred\\nline\",\"model_type\":\"llama\",\"hidden_size\":64,
\"intermediate_size\":128,\"num_hidden_layers\":1,\"num_attention_heads\":4,\"vocab_size\":100,\"max_position_embeddings\":128}")
string(ASCII 27 esc)
foreach(fmt table markdown)
  kvlab_expect(RC 0 ARGS kvcalc --config "${WORK}/ctl.json" -d fp16 --context 128 -f ${fmt} OUT "evil.x1B\\[31mred.nline +MHA|evil.x1B\\[31mred.nline \\| MHA")
  if(KVLAB_OUT MATCHES "${esc}")
    message(SEND_ERROR "kvcalc -f ${fmt} printed a raw escape byte from a config's name")
  endif()
endforeach()
# the run summary's counts are bounded: 2^63 - 1 prompt tokens printed "for -9223372036854775807
# positions", 2^64 - 1 steps came back as -1
string(REGEX REPLACE "# run.prompt_tokens=[0-9]+" "# run.prompt_tokens=9223372036854775807" huge_csv "${csv}")
file(WRITE "${WORK}/huge_prompt.csv" "${huge_csv}")
kvlab_expect(RC 2 ARGS trace summary "${WORK}/huge_prompt.csv" ERR "'prompt_tokens' is 9223372036854775807; expected a count from 0 to 2\\^40")
string(REGEX REPLACE "# run.steps_done=[0-9]+" "# run.steps_done=18446744073709551615" huge_csv "${csv}")
file(WRITE "${WORK}/huge_steps.csv" "${huge_csv}")
kvlab_expect(RC 2 ARGS trace summary "${WORK}/huge_steps.csv" ERR "'steps_done' is 18446744073709551615; expected a count")
string(ASCII 255 254 bad_utf8)
string(REPLACE "# run.mode=" "# note=${bad_utf8}\n# run.mode=" bad_csv "${csv}")
file(WRITE "${WORK}/utf8.csv" "${bad_csv}")
kvlab_expect(RC 2 ARGS trace summary "${WORK}/utf8.csv" ERR "utf8.csv: line [0-9]+: '# note=\\\\xFF\\\\xFE' is not valid UTF-8 text")
string(REPEAT "x" 100000 long_name)
kvlab_expect(RC 2 ARGS trace summary "${WORK}/${long_name}.csv" ERR "\\(cut; 1[0-9]+ bytes in all\\)")
string(LENGTH "${KVLAB_ERR}" n)
if(n GREATER 1000)
  message(FATAL_ERROR "an error message echoes ${n} bytes of a path")
endif()

# 11. Consistency: missing input files exit 2 whatever reads them; one file is not both outputs.
kvlab_expect(RC 2 ARGS trace summary "${WORK}/missing.csv" ERR "cannot open the trace file")
kvlab_expect(RC 2 ARGS simulate --checkpoint "${WORK}/fx/tiny.bin" --tokenizer "${WORK}/missing.bin" -n 2 --prompt-ids 1
             ERR "missing.bin': cannot open the tokenizer")
kvlab_expect(RC 2 ARGS kvcalc --config "${WORK}/missing.json" ERR "cannot open the config file")
kvlab_expect(RC 2 ARGS simulate --model stories260k -p 2 -n 2 --trace "${WORK}/same.json" --save-checkpoint "${WORK}/./same.json"
             ERR "--save-checkpoint and --trace: both name")
# the same file named two ways while it does not exist yet: relative and ./, relative and absolute
file(REMOVE "${WORK}/same2.csv")
kvlab_expect(RC 2 ARGS simulate --model stories260k -p 2 -n 2 --trace ./same2.csv --save-checkpoint same2.csv
             ERR "--save-checkpoint and --trace: both name")
kvlab_expect(RC 2 ARGS simulate --model stories260k -p 2 -n 2 --trace same2.csv --save-checkpoint "${WORK}/same2.csv"
             ERR "--save-checkpoint and --trace: both name")
if(EXISTS "${WORK}/same2.csv")
  message(SEND_ERROR "a refused run left same2.csv behind")
endif()

# 12. GGUF headers (kvcalc --gguf): the metadata read as llama.cpp writes it, every length checked first.
# Llama-3-8B: 2 x 32 layers x 8 KV heads x 128 (4096 / 32) x 2 B = 131072 B/token; x 8192 = 1 GiB.
kvlab_expect(RC 0 ARGS kvcalc --gguf "${WORK}/fx/llama3-8b.gguf" -d fp16 --context 8k
             OUT "llama3-8b +GQA-8 \\(native\\) +32 +32 +8 +128 +fp16 .* 128.00 KiB" "llama3-8b +GQA-8 \\(native\\) +fp16 +8192 +1 +8192 +1.00 GiB")
# beside a preset of the same shape, in one table, with the same figures
kvlab_expect(RC 0 ARGS kvcalc -m llama-3-8b --gguf "${WORK}/fx/llama3-8b.gguf" -d fp16 --context 8k --format csv
             OUT "\nllama-3-8b,GQA-8 \\(native\\),32,32,8,128,fp16,2048,2048,131072,4\\.0\nllama3-8b,GQA-8 \\(native\\),32,32,8,128,fp16,2048,2048,131072,4\\.0")
# Gemma-2's windows (every other layer from the first, as llama.cpp and transformers do): 42 layers x 2 x 8 x 256 x 2 B
# = 344064 B/token; at 8192: 21 x 4096 + 21 x 8192 tokens x 8192 B = 2113929216 B = 1.97 GiB
kvlab_expect(RC 0 ARGS kvcalc --gguf "${WORK}/fx/gemma2.gguf" -d fp16 --context 8k
             OUT "336.00 KiB" "gemma2 +GQA-8 \\(native\\) +fp16 +8192 +1 +8192 +1.97 GiB" "sliding window 4096 on even layers")
# Mixture-of-experts GGUFs count their experts at expert_feed_forward_length: the published totals (general.parameter_count)
# gpt-oss-20b 20,914,757,184 and Qwen3-30B-A3B 30,532,122,624, not 6144-wide experts (233 B). gpt-oss windows every other
# layer from the first, as llama.cpp's set_swa_pattern(2): at 32768 tokens (12 x 32768 + 12 x 128) x 8 x 64 x 2 x 2 B
# = 808,452,096 B.
kvlab_expect(RC 0 ARGS kvcalc --gguf "${WORK}/fx/gpt-oss-20b.gguf" -d bf16 --context 32768 --gpu h200 --format csv
             OUT "\ngpt-oss-20b,GQA-8 \\(native\\),bf16,20914757184," "\ngpt-oss-20b,GQA-8 \\(native\\),bf16,32768,1,32768,808452096,")
kvlab_expect(RC 0 ARGS kvcalc --gguf "${WORK}/fx/qwen3moe.gguf" -d bf16 --context 4096 --gpu h200 --format csv
             OUT "\nqwen3moe,GQA-4 \\(native\\),bf16,30532122624,")
kvlab_expect(RC 0 ARGS kvcalc --gguf "${WORK}/fx/qwen3moe-no-ff.gguf" -d bf16 --context 4096 --gpu h200 --format csv
             OUT "\nqwen3moe-no-ff,GQA-4 \\(native\\),bf16,30532122624,")
# A GGUF with tensors: the fit takes the bytes the file stores (Q4_K 4,915,200 B + 1000 B, each tensor's data padded to 32:
# 4,916,224 B), not parameters x bf16; tensor infos that point past the data, or have 5 dimensions, are refused.
kvlab_expect(RC 0 ARGS kvcalc --gguf "${WORK}/fx/llama-tensors.gguf" -d fp16 --context 4096 --gpu h200 --format csv
             OUT "\nllama-tensors,GQA-2 \\(native\\),fp16,[0-9]+,4916224,[0-9]+,[0-9]+,4096,1,[0-9]+,yes\n")
kvlab_expect(RC 0 ARGS kvcalc --gguf "${WORK}/fx/llama-tensors.gguf" -d fp16 --context 4096 --gpu h200
             OUT "weights as the GGUF stores them: its 2 tensors' data, 4916224 B")
kvlab_expect(RC 2 ARGS kvcalc --gguf "${WORK}/fx/gguf_tensor_offset.gguf" ERR "GGUF header at byte [0-9]+: a tensor at data offset 1099511627776, past the 4916224 bytes of tensor data")
kvlab_expect(RC 2 ARGS kvcalc --gguf "${WORK}/fx/gguf_tensor_dims.gguf" ERR "a tensor of 5 dimensions; expected at most 4")
# DeepSeek-V2-Lite's MLA in llama.cpp: a GGUF with the MLA split caches the 576-wide latent as K only
# (27 x 4096 x 576 x 2 B = 121.50 MiB); one converted before the split caches every head's K (16 x 192) and V (16 x 128):
# 27 x 4096 x 3072 x 2 B = 648 MiB of K, 27 x 4096 x 2048 x 2 B = 432 MiB of V.
kvlab_expect(RC 0 ARGS kvcalc --gguf "${WORK}/fx/deepseek2-mla.gguf" --engine llama.cpp --context 4096
             OUT "llama_kv_cache: size =  121\\.50 MiB \\(  4096 cells,  27 layers,  1/1 seqs\\), K \\(f16\\):  121\\.50 MiB, V \\(f16\\):    0\\.00 MiB")
kvlab_expect(RC 0 ARGS kvcalc --gguf "${WORK}/fx/deepseek2-legacy.gguf" --engine llama.cpp --context 4096
             OUT "llama_kv_cache: size = 1080\\.00 MiB \\(  4096 cells,  27 layers,  1/1 seqs\\), K \\(f16\\):  648\\.00 MiB, V \\(f16\\):  432\\.00 MiB"
                 "no MLA split")
# MiniCPM3-4B in llama.cpp: 40 heads of K at 96 (key_length) and of V at 2560 / 40 = 64 (no value_length):
# 62 x 4096 x 3840 x 2 B = 1860 MiB of K, 62 x 4096 x 2560 x 2 B = 1240 MiB of V (vLLM pads V to 96: 1860 MiB)
kvlab_expect(RC 0 ARGS kvcalc --gguf "${WORK}/fx/minicpm3.gguf" --engine llama.cpp --context 4096
             OUT "llama_kv_cache: size = 3100\\.00 MiB \\(  4096 cells,  62 layers,  1/1 seqs\\), K \\(f16\\): 1860\\.00 MiB, V \\(f16\\): 1240\\.00 MiB"
                 "V at its own 64, where vLLM pads V to 96")
kvlab_expect(RC 2 ARGS kvcalc --gguf "${WORK}/fx/gguf_truncated.gguf" ERR "gguf_truncated.gguf': GGUF header at byte [0-9]+: .* needs [0-9]+ bytes, [0-9]+ are left in the file")
kvlab_expect(RC 2 ARGS kvcalc --gguf "${WORK}/fx/gguf_huge_count.gguf" ERR "GGUF header at byte 24: the metadata needs [0-9]+ bytes, [0-9]+ are left in the file")
kvlab_expect(RC 2 ARGS kvcalc --gguf "${WORK}/fx/gguf_v1.gguf" ERR "version 1; kvlab reads GGUF versions 2 and 3")
kvlab_expect(RC 2 ARGS kvcalc --gguf ${DATA}/falcon-7b.json ERR "no 'GGUF' magic at the start; expected a llama.cpp GGUF file")
# a layer count no model has (a fuzzed GGUF had 4294967045) is refused before any per-layer walk
file(WRITE "${WORK}/layers.json" "{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":4294967045,\"num_attention_heads\":4,\"vocab_size\":32}")
kvlab_expect(RC 2 ARGS kvcalc --config "${WORK}/layers.json" ERR "num_hidden_layers = 4294967045; kvlab sizes at most 65536 layers")

# 13. A checkpoint directory as --config: the GPU fit takes the weights' bytes from the safetensors
# headers (no tensor read). The fixture stores 12112 parameters in F32: 12112 x 4 B = 48448 B, where the
# default bf16 estimate would say 24224 B.
kvlab_expect(RC 0 ARGS kvcalc --config "${WORK}/fx/hf_ok" -d fp16 --context 64 --gpu-mem 1GiB --format csv OUT ",fp16,12112,48448,[0-9]+,[0-9]+,64,1,[0-9]+,yes\n")
kvlab_expect(RC 0 ARGS kvcalc --config "${WORK}/fx/hf_ok" -d fp16 --context 64 --gpu-mem 1GiB
             OUT "weights 48448 B as stored \\(F32 48448 B; from the headers of .*model.safetensors\\)")
kvlab_expect(RC 0 ARGS kvcalc --config "${WORK}/fx/hf_ok" -a mha -d fp16 --context 64 --gpu-mem 1GiB --format csv OUT ",fp16,[0-9]+,[0-9]+,[0-9]+,[0-9]+,64,1,[0-9]+,yes\n")
kvlab_expect(RC 2 ARGS kvcalc --config "${WORK}/fx/hf_dtype" --gpu-mem 1GiB ERR "hf_dtype/model.safetensors")
# A multimodal checkpoint: its 1300 stored bytes are the fit's weights, but a decode step reads only the text model's
# 1000 (the 200 + 100 B of tensors under vision_tower. and multi_modal_projector. are the vision side)
kvlab_expect(RC 0 ARGS kvcalc --config "${WORK}/fx/hf_gemma3_vision" -d fp16 --context 64 --gpu h100 --format csv
             OUT ",fp16,[0-9]+,1300,[0-9]+,[0-9]+,64,1,[0-9]+,yes\n" ",fp16,64,1,1000,")
kvlab_expect(RC 0 ARGS kvcalc --config "${WORK}/fx/hf_gemma3_vision" -d fp16 --context 64 --gpu h100
             OUT "300 B of them the vision tower's, which a decode step does not read")
