include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)

# README main job: every Llama-family preset, default dtypes fp16 and fp8.
kvlab_expect(RC 0 ARGS kvcalc OUT "llama-2-7b +MHA \\(native\\).*fp16.*512.00 KiB" "llama-3-8b +GQA-8 \\(native\\).*fp16.*128.00 KiB" "fp8_e4m3"
             NOT_OUT "gpt2" "stories15m" " GB")

# Seeds: Llama-2-70B MHA 2.5 MiB/token, GQA-8 320 KiB (8x), MQA 40 KiB (64x). 2*80*64*128*2 B = 2621440
kvlab_expect(RC 0 ARGS kvcalc -m llama-2-70b -a mha,gqa:8,mqa -d fp16 --context 4096
             OUT "MHA +80 +64 +64 +128 +fp16 .* 2.50 MiB +1.00x" "GQA-8 .* 320.00 KiB +8.00x" "MQA .* 40.00 KiB +64.00x" "1.25 GiB")

# JSON parses back with exact integers: Llama-2-7B fp16 524288 B/token, 2 GiB at 4096.
kvlab_expect(RC 0 ARGS kvcalc -m llama-2-7b -d fp16 --context 4096 --format json)
string(JSON bpt GET "${KVLAB_OUT}" tables 0 rows 0 bytes_per_token)
string(JSON seq GET "${KVLAB_OUT}" tables 1 rows 0 bytes_per_sequence)
string(JSON layers GET "${KVLAB_OUT}" inputs models 0 n_layer)
string(JSON schema GET "${KVLAB_OUT}" schema)
if(NOT schema STREQUAL "kvlab-report/1")
  message(SEND_ERROR "json: schema '${schema}', expected kvlab-report/1")
endif()
if(NOT bpt EQUAL 524288 OR NOT seq STREQUAL "2147483648" OR NOT layers EQUAL 32)
  message(FATAL_ERROR "json: bytes_per_token=${bpt} bytes_per_sequence=${seq} n_layer=${layers}")
endif()

# CSV: a header line and rows with exact bytes, readable by a script.
kvlab_expect(RC 0 ARGS kvcalc -m llama-3-8b -d fp16,fp8 --context 8k --batch 1,8 --format csv
             OUT "model,attention,n_layer,n_head,n_head_kv,d_head,dtype,bytes_k_per_token_layer,bytes_v_per_token_layer,bytes_per_token,reduction_vs_mha"
                 "llama-3-8b,GQA-8 \\(native\\),32,32,8,128,fp16,2048,2048,131072,4"
                 "llama-3-8b,GQA-8 \\(native\\),fp16,8192,8,8192,1073741824,8589934592")

# Markdown table.
kvlab_expect(RC 0 ARGS kvcalc -m llama-2-7b -d fp16 --format markdown OUT "\\| llama-2-7b \\| MHA \\(native\\) \\|" "\\| ---: \\|")

# The model's name: "_name_or_path" (transformers writes it), else the real name of the folder holding
# config.json (also for "config.json", "./config.json" and "." in the current directory), else the stem.
file(MAKE_DIRECTORY "${WORK}/my-model")
configure_file(${DATA}/llamacpp-36l.json "${WORK}/config.json" COPYONLY)
configure_file(${DATA}/llamacpp-36l.json "${WORK}/my-model/config.json" COPYONLY)
configure_file(${DATA}/llamacpp-36l.json "${WORK}/other-name.json" COPYONLY)
file(READ ${DATA}/llamacpp-36l.json cfg_text)
string(JSON cfg_text SET "${cfg_text}" _name_or_path "\"acme/Model-36L\"")
file(WRITE "${WORK}/named.json" "${cfg_text}")
foreach(arg config.json ./config.json .)
  kvlab_expect(RC 0 ARGS kvcalc --config ${arg} -d fp16 --context 1k --format csv OUT "\ncli_kvcalc,GQA-8")
endforeach()
kvlab_expect(RC 0 ARGS kvcalc --config my-model -d fp16 --context 1k --format csv OUT "\nmy-model,GQA-8")
kvlab_expect(RC 0 ARGS kvcalc --config my-model/../my-model/./config.json -d fp16 --context 1k --format csv OUT "\nmy-model,GQA-8")
kvlab_expect(RC 0 ARGS kvcalc --config other-name.json -d fp16 --context 1k --format csv OUT "\nother-name,GQA-8")
kvlab_expect(RC 0 ARGS kvcalc --config named.json -d fp16 --context 1k --format csv OUT "\nacme/Model-36L,GQA-8")

# llama.cpp golden: 36 layers x 8 KV heads x 128, -c 8192: 1152.00 MiB f16, 612.00 MiB q8_0.
# 1152 MiB = 1207959552 B (prints as 1.12 GiB); 612 MiB = 641728512 B.
kvlab_expect(RC 0 ARGS kvcalc --config ${DATA}/llamacpp-36l.json -d f16,q8_0 --context 8192 --format csv
             OUT "fp16,8192,1,8192,1207959552,1207959552" "q8_0,8192,1,8192,641728512,641728512")
kvlab_expect(RC 0 ARGS kvcalc --config ${DATA}/llamacpp-36l.json -d q8_0 --context 8192 OUT "612.00 MiB")

# vLLM golden: Llama-3.1-8B, 3.8125 GiB budget, block 16 -> 1952 blocks; 1.56x at 20000 tokens.
kvlab_expect(RC 0 ARGS kvcalc -m llama-3.1-8b -d bf16 --kv-budget 3.8125GiB --context 20000 OUT "1952 +31232 +20000 +1.56x")

# --explain prints the formula with numbers.
kvlab_expect(RC 0 ARGS kvcalc -m llama-2-7b -d fp16 --context 4096 --explain
             OUT "KV/token = 2 \\(K and V\\) x 32 layers x \\(32 KV heads x 128 head dim =\\) 4096 x 2 B \\(fp16\\) = 524288 B = 512.00 KiB")

# SI units print GB, IEC never does.
kvlab_expect(RC 0 ARGS kvcalc -m llama-2-7b -d fp16 --context 4096 --units si OUT "2.15 GB" "524.29 KB")

# Sliding window cap vs ignore, context warning, paging, TP, GPU fit.
kvlab_expect(RC 0 ARGS kvcalc -m mistral-7b-v0.1 -d fp16 --context 32k OUT "32768 +1 +4096 +512.00 MiB +512.00 MiB +4.00 GiB")
kvlab_expect(RC 0 ARGS kvcalc -m llama-2-7b -d fp16 --context 8k ERR "warning: context 8192 exceeds llama-2-7b's max_position_embeddings 4096"
             NOT_OUT "warning")
kvlab_expect(RC 0 ARGS kvcalc -m llama-2-70b -d fp16 --context 4096 --tp 16 OUT "kv heads/GPU" "4096 +1 +4096 +1.25 GiB +1.25 GiB +1 +160.00 MiB")
kvlab_expect(RC 0 ARGS kvcalc -m llama-3-8b -d fp16 --gpu h100-sxm-80gb --context 8k --batch 64 OUT "Does it fit on NVIDIA H100" "Largest batch at each context" "Longest context at each batch" "Decode roofline")

# Errors: one line, exit 2, naming the flag/file and value.
kvlab_expect(RC 2 ARGS kvcalc -m llama-2-7 ERR "unknown preset 'llama-2-7'; did you mean: llama-2-7b")
kvlab_expect(RC 2 ARGS kvcalc --config ${DATA}/bad/heads-not-divisible.json ERR "heads-not-divisible.json: num_attention_heads \\(32\\) is not a multiple of num_key_value_heads \\(5\\)")
kvlab_expect(RC 2 ARGS kvcalc --config ${DATA}/bad/malformed.json ERR "malformed.json: not valid JSON at line 1, column 47")
kvlab_expect(RC 2 ARGS kvcalc --config ${DATA}/bad/zero-layers.json ERR "num_hidden_layers = 0; expected a positive integer")
kvlab_expect(RC 2 ARGS kvcalc -m llama-2-7b --batch 1e15 --context 4096 ERR "overflows")
kvlab_expect(RC 2 ARGS kvcalc -m llama-2-7b --dtype fp7 ERR "--dtype: unknown dtype 'fp7'")
kvlab_expect(RC 2 ARGS kvcalc -m llama-2-7b --batch 0 ERR "--batch: '0' is zero")
kvlab_expect(RC 2 ARGS kvcalc -m llama-2-7b --format xml ERR "--format: 'xml' not in {table,csv,json,markdown}")
kvlab_expect(RC 2 ARGS kvcalc -m llama-2-7b --no-such-flag ERR "no-such-flag")
# closed sets and exclusive options are CLI11's checks (IsMember, excludes); the message names both sides
kvlab_expect(RC 2 ARGS kvcalc -m llama-2-7b --units mib ERR "--units: 'mib' not in {iec,si}")
kvlab_expect(RC 2 ARGS kvcalc -m mistral-7b-v0.1 --window-mode clip ERR "--window-mode: 'clip' not in {cap,ignore}")
# presets and configs in one table, presets first, configs in the order given
kvlab_expect(RC 0 ARGS kvcalc -m llama-2-7b --config ${DATA}/llamacpp-36l.json --config ${DATA}/falcon-7b.json -d fp16 --context 1k --format csv
             OUT "\nllama-2-7b,MHA \\(native\\),32,32,32,128,fp16,8192,8192,524288,1\\.0\nllamacpp-36l,GQA-8 \\(native\\),36,32,8,128,fp16,2048,2048,147456,4\\.0\nfalcon-7b,MQA")
kvlab_expect(RC 2 ARGS kvcalc -m llama-2-7b --gpu h100-sxm-80gb --gpu-mem 24GB ERR "--gpu excludes --gpu-mem: give one or the other")
kvlab_expect(RC 2 ARGS kvcalc -m llama-2-70b --tp 4,16 ERR "--tp: '4,16' is not a count")
kvlab_expect(RC 0 ARGS kvcalc -m llama-2-70b -d fp16 --context 4096 --tp 16 OUT "every head is replicated on 2 GPUs")
kvlab_expect(RC 0 ARGS kvcalc -m llama-2-7b -d fp16 --context 1000 --batch 8 --block-size 16 OUT "1000 +8 +1000 +504.00 MiB +3.94 GiB +63 +32.00 MiB")
# MLA: vs MHA compares with H x (nope + rope) keys and H x v_head_dim values: 61 x 128 x (192 + 128) x 2 B / 70272 B = 71.11x
kvlab_expect(RC 0 ARGS kvcalc --config ${DATA}/deepseek-mla.json -d bf16 --context 4096 OUT "MLA \\(native\\) +61 +128 +1 +576 +bf16 +1.12 KiB +0 B +68.62 KiB +71.11x")
kvlab_expect(RC 2 ARGS kvcalc --config ${DATA}/deepseek-mla.json -a mha ERR "uses MLA")
# floor(24e9 B x 0.95) = 22800000000 exactly; Llama-2-7B weights 6738415616 x 2 B = 13476831232; budget 9323168768;
# floor(9323168768 / 524288 B per token) = 17782 tokens; one sequence of 4096 tokens x 512 KiB = 2 GiB fits
kvlab_expect(RC 0 ARGS kvcalc -m llama-2-7b --gpu-mem 24GB --mem-util 0.95 -d fp16 --context 4096 --format csv
             OUT ",13476831232,9323168768,17782,4096,1,2147483648,yes\n" )
# Llama-3-70B on an L4: 141,107,412,992 B of bf16 weights, 20.24 GiB usable: does not fit, TP >= 8 would
kvlab_expect(RC 0 ARGS kvcalc -m llama-3-70b --gpu l4 -d fp16 --context 8k
             OUT "llama-3-70b +GQA-8 \\(native\\) +fp16 +70.55 B +131.42 GiB +- +- +8192 +1 +2.50 GiB +no: weights" "does not fit on l4-24gb: its bf16 weights need 131.42 GiB per GPU at TP 1, more than the 20.24 GiB usable \\(90% of 22.49 GiB\\); needs TP >= 8"
             NOT_OUT "Decode roofline" "Largest batch")

# The README's examples, verbatim.
kvlab_expect(RC 0 ARGS kvcalc -m llama-2-7b,llama-3-8b -d fp16 --context 4096 OUT "llama-3-8b +GQA-8 \\(native\\) +fp16 +4096 +1 +4096 +512.00 MiB +512.00 MiB")
kvlab_expect(RC 0 ARGS kvcalc -m llama-2-70b -a native,mha,gqa:8,mqa -d fp16 OUT "MQA .* 40.00 KiB +64.00x")
kvlab_expect(RC 0 ARGS kvcalc -m llama-3-8b --gpu h100-sxm-80gb --context 8k,32k --batch 1,64 --explain OUT "Decode roofline" "max tokens = floor")

# Hugging Face ids resolve to the preset read from that id's config.json (any case); an id no preset has
# gets one line: no network access, download the config.json.
kvlab_expect(RC 0 ARGS kvcalc -m meta-llama/Meta-Llama-3-8B -d fp16 --context 4k OUT "llama-3-8b +GQA-8 \\(native\\) .* 128.00 KiB")
kvlab_expect(RC 0 ARGS kvcalc -m llama-2-7b,META-LLAMA/LLAMA-2-7B-HF -d fp16 --context 1k --format csv OUT "\nllama-2-7b,MHA")
kvlab_expect(RC 2 ARGS kvcalc -m Qwen/Qwen3-4B
             ERR "--model: no preset has the Hugging Face id 'Qwen/Qwen3-4B', and kvlab does not download \\(no network access\\): download its config.json and give it with --config FILE")

# Configs as published: tiiuae/falcon-7b has multi_query and no FFN size field. KV: 32 layers x 2 (K, V) x
# 1 KV head x 64 (4544 / 71) x 2 B = 8192 B/token in bf16. Weights with Falcon's own rules: embedding
# 65024 x 4544 (tied) + 32 x (q,k,v 4544 x (4544 + 2 x 64) + dense 4544^2 + MLP 2 x 4544 x 18176 + one
# LayerNorm 2 x 4544) + ln_f 2 x 4544 = 6,921,720,704 parameters, x 2 B = 13,843,441,408 B.
kvlab_expect(RC 0 ARGS kvcalc --config ${DATA}/falcon-7b.json -d bf16 --context 2k
             OUT "falcon-7b +MQA \\(native\\) +32 +71 +1 +64 +bf16 +128 B +128 B +8.00 KiB +71.00x"
                 "defaults applied: FalconConfig defaults \\(transformers v4.57.1 models/falcon/configuration_falcon.py\\): max_position_embeddings 2048"
                 "; FFN width 18176 = 4 x hidden size 4544 \\(Falcon default\\)")
kvlab_expect(RC 0 ARGS kvcalc --config ${DATA}/falcon-7b.json -d bf16 --context 2k --gpu h100 --format csv OUT "falcon-7b,MQA \\(native\\),bf16,6921720704,13843441408,[0-9]+,[0-9]+,2048,1,16777216,yes\n")
# A config without the FFN size and of a model type with no class table (no model_type at all): KV sizes
# still come out; what needs the weights says why it cannot.
file(READ ${DATA}/llamacpp-36l.json noffn)
string(JSON noffn REMOVE "${noffn}" intermediate_size)
string(JSON noffn REMOVE "${noffn}" model_type)
file(WRITE "${WORK}/no-ffn.json" "${noffn}")
kvlab_expect(RC 0 ARGS kvcalc --config "${WORK}/no-ffn.json" -d fp16 --context 8192 OUT "1.12 GiB" "defaults applied: no intermediate_size: the weights are unknown")
kvlab_expect(RC 2 ARGS kvcalc --config "${WORK}/no-ffn.json" -d fp16 --gpu h100 ERR "no-ffn: the config has no intermediate_size, so its weights \\(parameter count\\) are unknown")
kvlab_expect(RC 2 ARGS simulate --config "${WORK}/no-ffn.json" ERR "no-ffn: the config has no intermediate_size; the simulator needs the MLP width")
# The same config as model_type llama: LlamaConfig's intermediate_size 11008 applies, as transformers loads it, and is said.
string(JSON llama_noffn SET "${noffn}" model_type "\"llama\"")
file(WRITE "${WORK}/llama-no-ffn.json" "${llama_noffn}")
kvlab_expect(RC 0 ARGS kvcalc --config "${WORK}/llama-no-ffn.json" -d fp16 --context 8192
             OUT "LlamaConfig defaults \\(transformers v4.57.1 models/llama/configuration_llama.py\\): intermediate_size 11008")

# --plot: KV memory against context, one line per model/layout/dtype/batch, the GPU's KV budget dashed.
# Checked before drawing: the extension, and at most 12 lines (3 models x 3 dtypes x 2 batches = 18).
kvlab_expect(RC 2 ARGS kvcalc -m llama-2-7b --plot "${WORK}/kv.pdf" ERR "--plot: '.*kv.pdf' has extension '.pdf'; expected .svg or .png")
kvlab_expect(RC 2 ARGS kvcalc -m llama-2-7b,llama-3-8b,mistral-7b-v0.1 -d fp16,fp8,int4 --batch 1,2 --plot "${WORK}/kv.svg"
             ERR "--plot: 18 lines \\(models x attention layouts x dtypes x batches\\); at most 12 on one chart")
find_program(GNUPLOT gnuplot)
if(GNUPLOT)
  kvlab_expect(RC 0 ARGS kvcalc -m llama-2-7b,mistral-7b-v0.1 -d fp16 --context 32k --batch 4 --gpu h100 --plot "${WORK}/kv.svg"
               OUT "Does it fit on NVIDIA H100")
  file(READ "${WORK}/kv.svg" svg)
  # the fit limit marked: Llama-2-7B's 512 KiB per token x batch 4 = 2 MiB per token of context; its budget, H100's
  # floor(85,520,809,984 B driver-reported x 0.9) = 76,968,728,985 B less 13,476,831,232 B of bf16 weights = 63,491,897,753 B
  # (59.13 GiB), holds floor(63,491,897,753 / 2,097,152) = 30,275 tokens; Mistral-7B's 4096-token window never reaches it
  foreach(text "llama-2-7b MHA fp16 x4" "mistral-7b-v0.1 GQA-8 fp16 x4" "llama-2-7b: KV budget 59.13 GiB per GPU on h100-sxm-80gb"
               "fits up to 30,275 tokens" "GiB \\(2</tspan>")
    if(NOT svg MATCHES "${text}")
      message(SEND_ERROR "kv.svg has no '${text}'")
    endif()
  endforeach()
endif()
# A Hugging Face id of a preset resolves to it: Qwen/Qwen3-8B is presets/qwen3-8b.json (36 layers x 8 KV heads x 128 x 2 x 2 B = 147456 B/token).
kvlab_expect(RC 0 ARGS kvcalc -m Qwen/Qwen3-8B -d bf16 --context 1k --format csv OUT "\nqwen3-8b,GQA-8 \\(native\\),36,32,8,128,bf16,2048,2048,147456,")

# Issue 51: CSV has no place for notes, but a warning still reaches the user, on stderr. Llama-3.1-70B at
# fp8: 80 layers x 8 KV heads x 128 dims x 2 (K, V) x 1 byte = 160 KiB per token; x 32768 tokens x batch 8
# = 40 GiB, 20 GiB per GPU at --tp 2, more than an H100's budget after the weights.
kvlab_expect(RC 0 ARGS kvcalc -m llama-3.1-70b -d fp8 --context 32k --batch 8 --gpu h100 --tp 2 --format csv
             OUT "^# KV cache per token\nmodel," ERR "warning: llama-3.1-70b .*batch 8 at context 32768 needs 20.00 GiB of KV per GPU")

# Issue 51: the headline answers the question first, with the figures that prove it. The issue's example:
# Llama-3.1-70B, fp8 KV on two H100s. KV: 80 layers x 8 KV heads x 128 x 2 (K, V) x 1 B = 160 KiB per token,
# 80 KiB per GPU at TP 2 (4 heads each); batch 8 x 32768 tokens x 80 KiB = 20 GiB per GPU. Weights:
# 70,553,706,496 parameters x 2 B (bf16) / 2 = 70,553,706,496 B (65.71 GiB) per GPU; usable floor(85,520,809,984 B
# x 0.9) = 76,968,728,985 B, so 6,415,022,489 B (5.97 GiB) is left for KV. What fits: floor(6,415,022,489 /
# (32768 x 81920)) = batch 2 at 32k; floor(6,415,022,489 / (8 x 81920)) = 9,788 tokens at batch 8.
kvlab_expect(RC 0 ARGS kvcalc -m llama-3.1-70b -d fp8 --context 32k --batch 8 --gpu h100 --tp 2
             OUT "^does not fit: batch 8 at 32,768 tokens needs 20.00 GiB of KV per GPU. 5.97 GiB is free after the weights \\(65.71 GiB of weights per GPU at TP 2\\)\nfits: batch 2 at 32,768 tokens, or 9,788 tokens at batch 8\n\nKV cache per token\n"
                 "Does it fit on .*\n.* fits *\n.*\nllama-3.1-70b +GQA-8 \\(native\\) +fp8_e4m3 +70.55 B +65.71 GiB +5.97 GiB +78308 +32768 +8 +20.00 GiB +no: KV\n"
             NOT_OUT "weights fit  " " yes *\n")
# The same as JSON: the headline array, and the fit row's verdict beside it.
kvlab_expect(RC 0 ARGS kvcalc -m llama-3.1-70b -d fp8 --context 32k --batch 8 --gpu h100 --tp 2 --format json)
string(JSON h0 ERROR_VARIABLE jerr GET "${KVLAB_OUT}" headline 0)
string(JSON fit ERROR_VARIABLE jerr GET "${KVLAB_OUT}" tables 2 rows 0 fits)
string(JSON kv_gpu ERROR_VARIABLE jerr GET "${KVLAB_OUT}" tables 2 rows 0 bytes_kv_per_gpu)
if(NOT h0 MATCHES "^does not fit: batch 8 at 32,768 tokens needs 20.00 GiB" OR NOT fit STREQUAL "no: KV" OR NOT kv_gpu EQUAL 21474836480)
  message(SEND_ERROR "json: headline '${h0}', fits '${fit}', bytes_kv_per_gpu ${kv_gpu}; expected 'does not fit: ...', 'no: KV', 20 GiB")
endif()
# When it fits: the headroom, the largest batch, the decode roofline. Llama-3-8B fp16, 128 KiB/token x 8192 x 8
# = 8 GiB; budget 76,968,728,985 - 8,030,261,248 x 2 B = 60,908,206,489 B (56.73 GiB): 48.73 GiB to spare,
# floor(60,908,206,489 / 1 GiB per sequence) = 56 sequences; (16,060,522,496 + 8 GiB) B / 3.35e12 B/s = 7.358 ms.
kvlab_expect(RC 0 ARGS kvcalc -m llama-3-8b -d fp16 --context 8k --batch 8 --gpu h100
             OUT "^fits: batch 8 at 8,192 tokens needs 8.00 GiB of KV per GPU of the 56.73 GiB free after the weights \\(14.96 GiB of weights\\): 48.73 GiB to spare\nroom for up to batch 56 at 8,192 tokens. decode at best 7.358 ms/step"
                 "8192 +8 +8.00 GiB +yes *\n")
# Weights that alone do not fit: the TP that would (Llama-3-70B bf16 141,107,412,992 B; an L4's usable 20.24 GiB; TP 8, above).
kvlab_expect(RC 0 ARGS kvcalc -m llama-3-70b --gpu l4 -d fp16 --context 8k
             OUT "^does not fit: the weights alone need 131.42 GiB per GPU at TP 1, more than the 20.24 GiB usable. --tp 8 fits them\n\n")
# Without a GPU: the KV per token and per batch (32 layers x 8 x 128 x 2 x 2 B = 128 KiB; x 4096 = 512 MiB).
kvlab_expect(RC 0 ARGS kvcalc -m llama-3-8b -d fp16 --context 4096
             OUT "^llama-3-8b keeps 128.00 KiB of KV per token \\(fp16, GQA-8\\). 4,096 tokens × batch 1 = 512.00 MiB\n\nKV cache per token")
# Several models, up to 3: a line each (Llama-2-7B MHA 512 KiB/token x 32768 x 4 = 64 GiB > its 59.13 GiB budget).
kvlab_expect(RC 0 ARGS kvcalc -m llama-2-7b,mistral-7b-v0.1 -d fp16 --context 32k --batch 4 --gpu h100
             OUT "^llama-2-7b fp16: does not fit: batch 4 at 32,768 tokens needs 64.00 GiB of KV per GPU. 59.13 GiB is free after the weights \\(12.55 GiB of weights\\)\nmistral-7b-v0.1 fp16: fits: batch 4 at 32,768 tokens needs 2.00 GiB")
# More than 3 cases: the count, the worst that does not fit, the first that does. Batch 16 at 32k per token of
# KV: Llama-2-7B 512 KiB (fp16) / 256 KiB (fp8) -> 256 / 128 GiB; Llama-3-8B 128 / 64 KiB -> 64 / 32 GiB; Qwen3-8B
# 144 / 72 KiB -> 72 / 36 GiB; Mistral-7B holds its 4096-token window -> 8 / 4 GiB. Budgets 54-59 GiB: the fp16
# Llama-2, Llama-3 and Qwen3 and the fp8 Llama-2 do not fit: 4 of 8.
kvlab_expect(RC 0 ARGS kvcalc -m llama-2-7b,llama-3-8b,mistral-7b-v0.1,qwen3-8b -d fp16,fp8 --context 32k --batch 16 --gpu h100
             OUT "^on h100-sxm-80gb, 4 of the 8 cases asked \\(model × dtype × context × batch\\) do not fit\nllama-2-7b fp16: does not fit: batch 16 at 32,768 tokens needs 256.00 GiB of KV per GPU. 59.13 GiB is free after the weights \\(12.55 GiB of weights\\)\nllama-3-8b fp8_e4m3: fits: batch 16 at 32,768 tokens needs 32.00 GiB of KV per GPU of the 56.73 GiB free after the weights \\(14.96 GiB of weights\\): 24.73 GiB to spare\n\n")
# The case it names is the worst, not the first that fails: Llama-3-8B fp16 fails first (64 GiB against its
# 56.73 GiB budget, 1.13x) but Llama-2-7B fp16 needs 256 GiB against 59.13 GiB (4.33x).
kvlab_expect(RC 0 ARGS kvcalc -m llama-3-8b,llama-2-7b,mistral-7b-v0.1,qwen3-8b -d fp16,fp8 --context 32k --batch 16 --gpu h100
             OUT "^on h100-sxm-80gb, 4 of the 8 cases asked \\(model × dtype × context × batch\\) do not fit\nllama-2-7b fp16: does not fit: batch 16 at 32,768 tokens needs 256.00 GiB")
# ... and when all of them fit, it says so, not "0 do not fit": batch 1 at 32k is at most 4 GiB of KV for these
# (Llama-3-8B 128 KiB x 32768 in fp16; Mistral-7B its 4096-token window), well inside 54-59 GiB: all 4 fit.
kvlab_expect(RC 0 ARGS kvcalc -m llama-3-8b,mistral-7b-v0.1 -d fp16,fp8 --context 32k --gpu h100
             OUT "^on h100-sxm-80gb, all 4 cases asked \\(model × dtype × context × batch\\) fit\nllama-3-8b fp16: fits: batch 1 at 32,768 tokens needs 4.00 GiB")
# --kv-budget: blocks and concurrency (vLLM's 1952 blocks and 1.56x, above).
kvlab_expect(RC 0 ARGS kvcalc -m llama-3.1-8b -d bf16 --kv-budget 3.8125GiB --context 20000
             OUT "^3.81 GiB of KV per GPU holds 1,952 blocks of 16 tokens \\(31,232 tokens\\): max concurrency 1.56x at 20,000 tokens per request\n\n")
# A size without a unit is refused, both spellings suggested (40 bytes or 40 GiB? kvlab does not guess).
kvlab_expect(RC 2 ARGS kvcalc -m llama-3-8b --kv-budget 40 ERR "--kv-budget: '40' has no unit.*40GiB.*40GB")

# Issue 51: warnings go to stderr in every format (table, markdown, JSON; CSV above); JSON keeps them in its notes too.
foreach(fmt table markdown json)
  kvlab_expect(RC 0 ARGS kvcalc -m llama-3.1-70b -d fp8 --context 32k --batch 8 --gpu h100 --tp 2 --format ${fmt}
               ERR "^warning: llama-3.1-70b GQA-8 \\(native\\) fp8_e4m3: batch 8 at context 32768 needs 20.00 GiB of KV per GPU")
  if(fmt STREQUAL "json")
    string(JSON n_notes ERROR_VARIABLE jerr LENGTH "${KVLAB_OUT}" notes)
    math(EXPR last "${n_notes} - 1")
    string(JSON warn ERROR_VARIABLE jerr GET "${KVLAB_OUT}" notes ${last})
    if(NOT warn MATCHES "^warning: llama-3.1-70b")
      message(SEND_ERROR "json: the warning is not in notes: '${warn}'")
    endif()
  elseif(KVLAB_OUT MATCHES "warning")
    message(SEND_ERROR "--format ${fmt}: a warning on stdout:\n${KVLAB_OUT}")
  endif()
endforeach()

# Issue 51: two GPUs are --tp 2, said in a note, whichever way they are written; counts that disagree are refused.
foreach(args "--gpu;2xh100" "--gpu;2x H100" "--gpus;2;--gpu;h100" "--gpus;2;--gpu;h100;--tp;2")
  kvlab_expect(RC 0 ARGS kvcalc -m llama-3.1-70b -d fp8 --context 32k --batch 8 ${args}
               OUT "65.71 GiB of weights per GPU at TP 2" "2 GPUs, sized as tensor parallelism over them, the same as .*--tp 2")
endforeach()
kvlab_expect(RC 2 ARGS kvcalc -m llama-3.1-70b --gpus 2 --tp 4 ERR "--gpus 2 and --tp 4 disagree: .* 2 GPUs is --tp 2")
kvlab_expect(RC 2 ARGS kvcalc -m llama-3.1-70b --gpu 2xh100 --gpus 4 ERR "--gpus 4 and --gpu 2xh100 count different GPUs")
# A name that holds a known GPU's name suggests that GPU first (edit distance alone put l4 first for 2xh100).
kvlab_expect(RC 2 ARGS kvcalc -m llama-3-8b --gpu nvidia-h100 ERR "unknown GPU 'nvidia-h100'. did you mean: h100-sxm-80gb,")
kvlab_expect(RC 0 ARGS kvcalc -m llama-3-8b --gpu H100 --context 4k OUT "Does it fit on NVIDIA H100")

# Issue 51: a model_type kvlab has no rules for is sized as Llama-style, and the note says so; an encoder-only
# type (BERT: no KV cache in decoding) is refused unless --as-decoder, or the config itself says is_decoder.
set(shape "\"hidden_size\": 768, \"num_hidden_layers\": 12, \"num_attention_heads\": 12, \"intermediate_size\": 3072, \"vocab_size\": 30522, \"max_position_embeddings\": 512")
file(WRITE "${WORK}/foo.json" "{\"model_type\": \"foo\", ${shape}}")
file(WRITE "${WORK}/bert.json" "{\"model_type\": \"bert\", ${shape}}")
file(WRITE "${WORK}/bert-decoder.json" "{\"model_type\": \"bert\", \"is_decoder\": true, ${shape}}")
# 12 layers x 12 heads x 64 x 2 (K, V) x 2 B = 36 KiB per token
kvlab_expect(RC 0 ARGS kvcalc --config foo.json -d fp16 --context 512
             OUT "36.00 KiB" "foo: model_type 'foo' is not one kvlab has rules for: sized as a Llama-style decoder from the config's fields")
kvlab_expect(RC 2 ARGS kvcalc --config bert.json -d fp16
             ERR "bert.json: model_type 'bert' is an encoder-only model, which keeps no KV cache in decoding .*--as-decoder")
kvlab_expect(RC 0 ARGS kvcalc --config bert.json -d fp16 --context 512 --as-decoder
             OUT "36.00 KiB" "bert: model_type 'bert' is an encoder-only model, which keeps no KV cache in decoding. --as-decoder: sized as a Llama-style decoder")
kvlab_expect(RC 0 ARGS kvcalc --config bert-decoder.json -d fp16 --context 512 OUT "36.00 KiB" "used as a decoder \\(is_decoder true\\)")

# With --engine the headline adds the engine's answer for the first case. vLLM v0.10.2, Llama-3.1-8B (32 layers x 8 KV heads x
# 128 x 2 (K, V) x 2 B = 131,072 B a token, blocks of 16 = 2 MiB): 51.629 GiB = 55,436,216,631 B // 2,097,152 = 26,434 blocks =
# 422,944 tokens = 51.63 GiB (26,434 x 2 MiB); 422,944 / 8,192 = 51.63 requests at once.
kvlab_expect(RC 0 ARGS kvcalc -m llama-3.1-8b --engine vllm --kv-budget 51.629GiB --context 8192
             OUT "^llama-3.1-8b keeps 128.00 KiB of KV per token \\(bf16, GQA-8\\)[^\n]*\nvLLM v0.10.2 on llama-3.1-8b \\(bf16\\): 51.63 GiB of KV per GPU holds 422,944 tokens: max concurrency 51.63x at 8,192 tokens per request\n\n")
# An H100 SXM's budget is estimated (79.65 GiB x 0.9 - 14.96 GiB of weights), so the line says it is an upper bound; with -pp 2 and
# an EAGLE draft vLLM stops before any pool, and the headline says so with its error line.
kvlab_expect(RC 0 ARGS kvcalc -m llama-3-8b --gpu h100-sxm-80gb --engine sglang --context 8k OUT "\nSGLang v0.5.2 on llama-3-8b \\(bf16\\): [^\n]* \\(the budget estimated from the GPU: an upper bound\\)\n\n")
kvlab_expect(RC 0 ARGS kvcalc -m llama-3.1-8b --engine vllm --kv-budget 51.629GiB --context 8192 --draft ${DATA}/engines/eagle-llama3.1-8b.json --pp 2
             OUT "^[^\n]*\nvLLM v0.10.2 on llama-3.1-8b \\(bf16\\): does not start: NotImplementedError: Pipeline parallelism is not supported")
