# The README's examples as tests, one CTest each (tests/CMakeLists.txt registers them, in README order,
# each depending on the one before: a later example may read a file an earlier one wrote).
#
#   cmake -DREADME=README.md -DINDEX=n -DKVLAB=path/to/kvlab -DROOT=repo -DWORK=dir -P readme.cmake
#
# An example is a `kvlab ...` line of a ```sh block (its `# comment` dropped) or a `$ kvlab ...` line of
# a ```console block. It runs in bash in WORK (which links the repository's models/, presets/ and
# tests/), with kvlab first on PATH, and must exit 0. A console example must print the lines the README
# shows, in order ('...' skips any number of lines; runs of spaces count as one). A sh example must
# print what its entry below expects: the figures the README's comment states. An example without an
# entry fails, so a new README example comes with its expectation.

# readme_examples(VAR readme): the README's example commands, in order
function(readme_examples var readme)
  file(STRINGS "${readme}" lines)
  set(fence "")
  set(out)
  foreach(line IN LISTS lines)
    if(line MATCHES "^```(.*)$")
      if(fence STREQUAL "")
        set(fence "${CMAKE_MATCH_1}")
        if(fence STREQUAL "")
          set(fence "text")
        endif()
      else()
        set(fence "")
      endif()
    elseif(fence STREQUAL "sh" AND line MATCHES "^kvlab ")
      string(REGEX REPLACE " +#.*$" "" line "${line}")
      list(APPEND out "${line}")
    elseif(fence STREQUAL "console" AND line MATCHES "^\\$ (kvlab .*)$")
      list(APPEND out "${CMAKE_MATCH_1}")
    endif()
  endforeach()
  set(${var} "${out}" PARENT_SCOPE)
endfunction()

if(NOT DEFINED INDEX)
  return()  # included by tests/CMakeLists.txt for readme_examples()
endif()

# What the sh examples must print: the figures their README comments state, with the arithmetic.
# expect(COMMAND OUT regex... [SETUP shell command])
cmake_minimum_required(VERSION 3.25)
function(expect cmd)
  cmake_parse_arguments(E "" "SETUP" "OUT" ${ARGN})
  if(cmd STREQUAL example)
    set(want "${E_OUT}" PARENT_SCOPE)
    set(setup "${E_SETUP}" PARENT_SCOPE)
    set(found TRUE PARENT_SCOPE)
  endif()
endfunction()

readme_examples(examples "${README}")
list(GET examples ${INDEX} example)
set(found FALSE)
set(setup "")

# 2 x 80 layers x 64 KV heads x 128 x 2 B = 2621440 B = 2.50 MiB; GQA-8: /8 = 320 KiB; MQA: /64 = 40 KiB
expect("kvlab kvcalc -m llama-2-70b -a native,mha,gqa:8,mqa -d fp16"
       OUT "MHA .* 2.50 MiB +1.00x" "GQA-8 .* 320.00 KiB +8.00x" "MQA .* 40.00 KiB +64.00x")
# vLLM's log for Llama-3.1-8B with this budget: "# GPU blocks: 1952" (16-token blocks: 31232 tokens);
# 31232 / 20000 = 1.56x concurrency
expect("kvlab kvcalc -m llama-3.1-8b -d bf16 --kv-budget 3.8125GiB --context 20000" OUT "1952 +31232 +20000 +1.56x")
# Mistral 7B: 2 x 32 layers x 8 KV heads x 128 x 2 B = 131072 B/token (f16); q8_0 = 34/32 B per value:
# 2 x 32 x 1024 x 34/32 = 69632 B/token
expect("kvlab kvcalc --config presets/mistral-7b-v0.1.json -d f16,q8_0 --context 8192 --format csv"
       OUT "model,attention," "fp16,.*,131072," "q8_0,.*,69632,")
expect("kvlab kvcalc -m llama-3-8b --gpu h100-sxm-80gb --context 8k,32k --batch 1,64 --explain"
       OUT "KV/token = 2 \\(K and V\\) x 32 layers" "Does it fit on NVIDIA H100" "Decode roofline"
           # budget floor(85520809984 B x 0.9) - 16060522496 B of bf16 weights = 60908206489 B; / 1 GiB per 8k fp16 sequence = 56
           "fp16 +8192 +56\n")
# 4 x 32768 tokens x 512 KiB = 64 GiB for Llama-2-7B, more than its budget on the H100 (the fit table):
# floor(85,520,809,984 B x 0.9) - 6,738,415,616 x 2 B of bf16 weights = 63,491,897,753 B = 59.13 GiB
expect("kvlab kvcalc -m meta-llama/Llama-2-7b-hf,mistral-7b-v0.1 -d fp16 --context 32k --batch 4 --gpu h100 --plot kv.svg"
       OUT "llama-2-7b +MHA \\(native\\) +fp16 +32768 +4 +32768 +16.00 GiB +64.00 GiB")
# gpt-oss-20b in llama.cpp: 12 full layers x 131072 cells x 8 x 64 x 2 B x 2 (K, V) = 3072 MiB; 12 sliding layers hold
# PAD(128 + 512, 256) = 768 cells = 18 MiB (the lines llama.cpp printed for this model, tests/cli/engines.cmake)
# BERT-base's shape, sized as if it were a decoder: 12 layers x 12 heads x 64 x 2 (K, V) x 2 B = 36 KiB per token in fp16
expect("kvlab kvcalc --config tests/data/bert-encoder.json --as-decoder --context 512" OUT "36\\.00 KiB of KV per token in fp16")
expect("kvlab kvcalc -m gpt-oss-20b --engine llama.cpp --context 128k"
       OUT "llama_kv_cache: size = 3072\\.00 MiB \\(131072 cells" "llama_kv_cache: size = +18\\.00 MiB \\( +768 cells")
# Gemma-3-4B-it's text_config omits its heads; Gemma3TextConfig gives 4 KV heads of 256: page 65536 B; 5 full and 29 sliding
# layers in 7 groups of 5; 40 GiB / 65536 / 5 = 131072 blocks; 131072 // 7 x 16 = 299,584 tokens; a request needs
# 8192 + 6 x 577 = 11654 blocks: 11.25x
expect("kvlab kvcalc --config tests/data/gemma-3-4b-it.json --engine vllm --kv-budget 40GiB --context 128k"
       OUT "GPU KV cache size: 299,584 tokens" "Maximum concurrency for 131,072 tokens per request: 11\\.25x")
# models/README.md: held-out perplexity 1.19179 in PyTorch
# issue 48: vLLM -pp 2 -tp 2 on Llama-3-8B logged 1,701,888 tokens (the issue's log line); llama.cpp -c 32768 -np 10 -kvu
# allocated 16384 MiB (2 x 32 layers x 4096 x 2 B x 32768 cells); b5489 printed the unified-cache prefix
expect("kvlab kvcalc -m llama-3-8b --engine vllm --tp 2 --pp 2 --kv-budget 53184MiB --context 8192" OUT "GPU KV cache size: 1,701,888 tokens")
expect("kvlab kvcalc --engine-cmd \"llama-server -m model.gguf -c 32768 -np 10 -kvu\" -m llama-2-7b" OUT "size = 16384\\.00 MiB \\( 32768 cells")
expect("kvlab kvcalc -m deepseek-v3 --engine llama.cpp@b5489 --context 4096" OUT "llama_kv_cache_unified: size =")
# llama.cpp issue #16188 (build 6182, gpt-oss-20b, -c 4096, no -fa): "creating SWA KV cache, size = 640 cells", n_swa 128 +
# n_ubatch 512 = 640, padded to 32 without flash attention (tests/cli/engines.cmake derives the MiB)
expect("kvlab kvcalc -m gpt-oss-20b --engine llama.cpp@b6182 --context 4096" OUT "creating     SWA KV cache, size = 640 cells")
# Whisper-large-v3: 2 x 32 decoder layers x 1500 frames x 1280 x 2 B = 245,760,000 B = 234.38 MiB of cross-attention
expect("kvlab kvcalc --config tests/data/whisper-large-v3.json -d fp16 --context 448" OUT "= 245760000 B = 234\\.38 MiB per sequence")
# llama2.c's run.c (commit 350e04f) -t 0.8 -p 0.9 -s 42 -i "Once upon a time" on models/tiny-llama writes this (issue 47)
expect("kvlab simulate --model tiny-llama --sampler llama2c --temperature 0.8 --top-p 0.9 --seed 42 -n 36" OUT "there was a kind girl named Zoe")
expect("kvlab simulate --model tiny-llama --sampler llama2c --temperature 0.8 --top-p 0.9 --seed 42 -n 36 --stop \" named\"" OUT "there was a kind girl\n")
# PyTorch's held-out mean NLL for tiny-mla is 0.233219 (models/reference.json): perplexity exp(0.2332190) = 1.262658
expect("kvlab simulate --checkpoint models/tiny-mla --tokenizer models/tokenizer.bin --eval models/heldout.txt" OUT " 1\\.2626[56]")
expect("kvlab simulate --attention mla:96 --mla naive -n 64" OUT "steps \\(tokens generated\\) +64 +64")
# the headline's ratios at 131,072 tokens, derived by hand in docs/tutorial.md (section 6) from the cost model's closed form
expect("kvlab simulate -m llama-3.1-8b --attention mha,gqa:8,mqa,mla:512 --cost-at 1k,8k,32k,128k --plot mla.svg"
       OUT "MLA caches 14x less than MHA; absorbed reads 7\\.16x fewer bytes \\(18\\.01 GiB vs 129\\.00 GiB\\) for 4\\.01x the FLOPs")
# SGLang (model_runner.py, docs/kv-memory.md "Drafts"): 422,944 tokens from the budget + 48 x (5 x 4 + 8) + 100 = 1,444 headroom
expect("kvlab kvcalc -m llama-3.1-8b --engine sglang --kv-budget 51.629GiB --context 8192 --draft tests/data/engines/eagle-llama3.1-8b.json"
       OUT " 424388 " "the draft worker's own pool of the same #tokens")
# SGLang's docs build of 2025-09-03 (tests/cli/engines.cmake): --max-total-tokens caps both pools at 20,480 tokens; K = 20,481 rows x
# 32 KV heads x 128 x 32 layers x 2 B = 5.00 GiB for Llama-2-7B, x 1 layer = 0.16 GiB for its EAGLE head
expect("kvlab kvcalc --engine sglang@0.5.2 --engine-cmd \"python3 -m sglang.launch_server --model meta-llama/Llama-2-7b-chat-hf --speculative-algorithm EAGLE --speculative-draft-model-path lmsys/sglang-EAGLE-llama2-chat-7B --max-total-tokens 20480\" -m llama-2-7b -d fp16 --draft tests/data/engines/eagle-llama2-chat-7b.json --kv-budget 53GiB"
       OUT "KV Cache is allocated. #tokens: 20480, K size: 5.00 GB, V size: 5.00 GB" "KV Cache is allocated. #tokens: 20480, K size: 0.16 GB, V size: 0.16 GB")
# vLLM's SpeculativeConfig checks the EAGLE head against -pp 2 and stops (engine_vllm.cpp refuse_vllm_pp_draft)
expect("kvlab kvcalc -m llama-3.1-8b --engine vllm --kv-budget 51.629GiB --context 8192 --draft tests/data/engines/eagle-llama3.1-8b.json --pp 2"
       OUT "\nvLLM v0.10.2 on llama-3.1-8b \\(bf16\\): does not start: NotImplementedError: Pipeline parallelism is not supported for this model")
expect("kvlab simulate --model tiny-llama -n 64 --repeat 5" OUT "median of 5 runs" "modelled on NVIDIA H100 SXM 80GB")
# 41 steps: one row of logits per generated token (the .npy's header is checked in tests/cli/simulate.cmake)
expect("kvlab simulate --model tiny-llama -n 41 --logits logits.npy" OUT "steps \\(tokens generated\\) +41 +41")
expect("kvlab simulate --model tiny-llama --eval models/heldout.txt" OUT "perplexity" " 1\\.1917[89]")
# the same text through caches stored narrower: fp32 is PyTorch's 1.1917x; every format scores the 254 predictions
expect("kvlab simulate --model tiny-llama --eval models/heldout.txt --kv-dtype fp16,fp8_e4m3,q4_0"
       OUT "fp32 full cache \\(reference\\) +255 +1 +254 .* 1\\.1917[89][0-9]" "fp16 +255 +1 +254" "fp8_e4m3 \\(tensor\\) +255 +1 +254" "q4_0 +255 +1 +254")
# weights read per decode step: 4 x 1,228,800 + 7,680 B = 4.69 MiB (fp32), 2 x 1,228,800 + 7,680 = 2.35 MiB (bf16),
# 1,228,800 / 32 x 34 + 7,680 = 1.25 MiB (q8_0); tests/cli/models.cmake derives the counts
expect("kvlab simulate --model tiny-llama --prompt \"Once upon a time\" -n 32 --weight-dtype fp32,bf16,q8_0"
       OUT "fp32 +fp32 .* 4\\.69 MiB .* reference" "fp32 +bf16 .* 2\\.35 MiB " "fp32 +q8_0 .* 1\\.25 MiB ")
# 16 requests share a 64-token prefix (4 blocks of 16); arriving 0.5 per step, all but the first find it cached:
# 15 x 64 = 960 tokens. The last request is preempted twice and on each return finds its 80 computed tokens' 5 full
# blocks (the 64 shared and 16 of its own): 2 x 80 = 160 more, 1120 in all (docs/serving.md walks through it). The
# scheduler depends only on lengths, so the counts are exact on any host
expect("kvlab serve --model tiny-llama --requests 16 --shared-prefix 64 --prompt-len 8..64 --output-len 16..64 --arrival-rate 0.5 --prefix-cache --kv-layout paged"
       OUT "requests finished +16 / 16" "tokens found in the prefix cache +1120\n")
expect("kvlab serve --model tiny-gpt2 --requests 8 --check --trace serve.csv"
       OUT "--check: tokens equal to solo runs +([0-9]+) / ([0-9]+) +([0-9]+) / ([0-9]+)\n" "KV rows still held at the end +0 +0")
expect("kvlab trace plot serve.csv -o serve.svg" OUT "serve.svg")
# 8 requests every 50 steps arrive at steps 0, 50, 100, 150 (i / 8 x 50); TTFT counted in steps, exact
expect("kvlab serve --model tiny-llama --requests 32 --arrival bursty:8/50" OUT "TTFT \\(steps\\) median +12 +139")
# issue 47, counted (docs/serving.md works them by hand): 4 beams over a 206-token prompt; 16 requests in 512 KiB
expect("kvlab serve --model tiny-llama --requests 1 --shared-prefix 200 --prompt-len 6 --output-len 16 --beam-width 4 --kv-layout paged --check" OUT "at most 19 KV blocks at once, vs 56 if each output had its own copy")
expect("kvlab serve --model tiny-llama --requests 16 --kv-budget 512KiB --kv-layout paged --preempt swap --check" OUT "swap: 11 of 11 preemptions swapped out 2\\.11 MiB and back in 2\\.11 MiB")
expect("kvlab serve --model tiny-llama --requests 16 --kv-budget 512KiB --kv-layout paged --kv-dtype q8_0" OUT "960 token rows .* vs 256 at fp32 .*up to 10 requests at once vs 3" "max \\|delta logit\\| 0\\.1")
# run.c (llama2.c 350e04f) -t 0.8 -p 0.9 -s 1 stops at BOS after 228 sampled tokens: the 229th is end-of-text;
# the -s 42 story reaches "girl named Z" at its 13th token (tests/cli/sampling.cmake)
expect("kvlab serve --workload models/stories.jsonl --sampler llama2c --temperature 0.8 --top-p 0.9 --kv-layout paged"
       OUT "2 of 3 outputs stopped before max_tokens \\(1 at end-of-text, 1 at a stop string\\)" "tokens generated +278\n")
expect("kvlab simulate -m tiny-llama -n 64 --trace sim.jsonl && kvlab report sim.jsonl -o sim.html"
       OUT "steps \\(tokens generated\\) +64 +64" "wrote sim.html")
expect("kvlab serve -m tiny-llama --requests 16 --shared-prefix 32 --prefix-cache --trace serve.jsonl && kvlab report serve.jsonl -o serve.html"
       OUT "16 / 16" "wrote serve.html")
# the JSON goes to kv.json (tests/browser/report.cmake checks such a page's chart, budget line and numbers)
expect("kvlab kvcalc -m llama-3.1-70b -d fp16,fp8 --context 8k,32k,64k --batch 8 --gpu 2xh100 --explain --format json > kv.json && kvlab report kv.json -o kv.html"
       OUT "wrote kv.html" SETUP "true")
expect("kvlab simulate" OUT "TinyStories 15M" "steps \\(tokens generated\\) +128 +128")
expect("kvlab simulate --model gpt2 --layers 1 -n 12" OUT "GPT-2" "steps \\(tokens generated\\) +12 +12")
expect("kvlab simulate --trace run.csv --deterministic" OUT "steps \\(tokens generated\\) +128 +128")
expect("kvlab simulate --model stories260k -n 16 --prompt-ids 1,2,3 --save-checkpoint s260k.bin"
       OUT "steps \\(tokens generated\\) +16 +16")
expect("kvlab simulate --checkpoint s260k.bin -n 16 --prompt-ids 1,2,3" OUT "steps \\(tokens generated\\) +16 +16")
expect("kvlab simulate --trace run.json" OUT "steps \\(tokens generated\\) +128 +128")
expect("kvlab trace summary run.json" OUT "steps \\(tokens generated\\) +128 +128")
expect("kvlab trace steps run.json --every 32 --ops" OUT "per op" " 127 +cached +lm_head")
expect("kvlab trace compare mha.csv gqa.csv" OUT "KV"
       SETUP "mkdir -p gqa && sed 's/\"num_key_value_heads\": 6/\"num_key_value_heads\": 2/' presets/stories15m.json > gqa/config.json && kvlab simulate -q -n 16 --deterministic --trace mha.csv > /dev/null && kvlab simulate -q -n 16 --deterministic --config gqa --trace gqa.csv > /dev/null")
expect("kvlab trace plot run.json -o chart.svg" OUT "chart.svg")

get_filename_component(bin_dir "${KVLAB}" DIRECTORY)
set(ENV{PATH} "${bin_dir}:$ENV{PATH}")
set(ENV{KVLAB_PRESETS_DIR} "${ROOT}/presets")
file(MAKE_DIRECTORY "${WORK}")
foreach(dir models presets tests)
  if(NOT EXISTS "${WORK}/${dir}")
    file(CREATE_LINK "${ROOT}/${dir}" "${WORK}/${dir}" SYMBOLIC)
  endif()
endforeach()

if(NOT setup STREQUAL "")
  execute_process(COMMAND bash -c "${setup}" WORKING_DIRECTORY "${WORK}" RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "README example '${example}': its setup failed (exit ${rc}): ${setup}\n${err}")
  endif()
endif()
execute_process(COMMAND bash -c "${example}" WORKING_DIRECTORY "${WORK}" RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "README example '${example}' exited ${rc}:\n${err}")
endif()

# A console example: the README's lines after the command, up to the block's end
file(STRINGS "${README}" lines)
set(in_block FALSE)
set(shown)
foreach(line IN LISTS lines)
  if(line STREQUAL "$ ${example}")
    set(in_block TRUE)
  elseif(in_block AND line MATCHES "^```")
    break()
  elseif(in_block)
    list(APPEND shown "${line}")
  endif()
endforeach()

# Measured figures a console example shows as an illustration: simulate's wall-time speed-up and serve's CPU
# wall-time headline line vary from run to run, so both sides compare them masked ('#').
function(mask_measured var text)
  string(REGEX REPLACE "cached decoding: [0-9]+(\\.[0-9]+)?x (faster|slower) here \\([^)]*\\)" "cached decoding: # here" text "${text}")
  string(REGEX REPLACE "CPU wall time \\(measured[^\n]*" "CPU wall time #" text "${text}")
  set(${var} "${text}" PARENT_SCOPE)
endfunction()

if(in_block)
  string(REGEX REPLACE "[ \t]+" " " flat "${out}")
  mask_measured(flat "${flat}")
  set(at 0)
  foreach(line IN LISTS shown)
    if(line STREQUAL "..." OR line STREQUAL "")
      continue()
    endif()
    string(REGEX REPLACE "[ \t]+" " " line "${line}")
    string(STRIP "${line}" line)
    mask_measured(line "${line}")
    string(SUBSTRING "${flat}" ${at} -1 rest)
    string(FIND "${rest}" "${line}" pos)
    if(pos EQUAL -1)
      message(FATAL_ERROR "README example '${example}' no longer prints, in order, the README's line\n  ${line}\n"
                          "It printed:\n${out}")
    endif()
    string(LENGTH "${line}" len)
    math(EXPR at "${at} + ${pos} + ${len}")
  endforeach()
elseif(NOT found)
  message(FATAL_ERROR "README example '${example}' has no expectation in tests/readme.cmake: add an expect() entry "
                      "with the figures its comment states")
endif()
foreach(re IN LISTS want)
  if(NOT "${out}" MATCHES "${re}")
    message(FATAL_ERROR "README example '${example}': the output has no match for '${re}':\n${out}")
  endif()
endforeach()
message(STATUS "README example '${example}': as the README says")
