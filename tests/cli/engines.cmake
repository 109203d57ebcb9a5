# kvcalc --engine: each engine reproduces lines that engine printed in public logs, character for
# character (the sources are cited per line). Model shapes come from the published configs
# (presets/, tests/data/engines/*.json), never from the logs being checked.
include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)
set(E ${DATA}/engines)

# kvlab_expect_lines(<args> LINES <line>...): stdout holds every line literally (regex characters escaped).
function(kvlab_expect_lines)
  cmake_parse_arguments(L "" "" "ARGS;LINES" ${ARGN})
  set(res "")
  foreach(line IN LISTS L_LINES)
    string(REGEX REPLACE "([][+.*()^$?|\\\\{}])" "\\\\\\1" re "${line}")
    list(APPEND res "${re}")
  endforeach()
  kvlab_expect(RC 0 ARGS ${L_ARGS} OUT ${res})
endfunction()

# --- llama.cpp (b8668 rules) ---
# gpt-oss-20b at its trained context 131072, f16, default -ub 512, build 8164 on Apple M5: ontouchstart/rabbit-holes
# ggml-gpt-oss-20b-GGUF/ggml-gpt-oss-20b-GGUF-curl.md (commit c3f36b2a). 12 full layers x 131072 cells x 512 x 2 B = 1536 MiB of K;
# 12 sliding layers x PAD(min(131072, 128 + 512), 256) = 768 cells.
kvlab_expect_lines(ARGS kvcalc -m gpt-oss-20b --engine llama.cpp --context 131072 LINES
  "llama_kv_cache_iswa: creating non-SWA KV cache, size = 131072 cells"
  "llama_kv_cache: size = 3072.00 MiB (131072 cells,  12 layers,  1/1 seqs), K (f16): 1536.00 MiB, V (f16): 1536.00 MiB"
  "llama_kv_cache_iswa: creating     SWA KV cache, size = 768 cells"
  "llama_kv_cache: size =   18.00 MiB (   768 cells,  12 layers,  1/1 seqs), K (f16):    9.00 MiB, V (f16):    9.00 MiB")
# gpt-oss-20b, -c 8192 -b 128 (so -ub 128) -ctk q8_0 -ctv q8_0: llama.cpp's docs/backend/hexagon/developer.md (PR #16547, 63d2fc46).
# q8_0 rows: 512 / 32 x 34 = 544 B; SWA cells PAD(min(8192, 128 + 128), 256) = 256.
kvlab_expect_lines(ARGS kvcalc -m gpt-oss-20b --engine llama.cpp -d q8_0 --context 8192 --ubatch 128 LINES
  "llama_kv_cache: size =  102.00 MiB (  8192 cells,  12 layers,  1/1 seqs), K (q8_0):   51.00 MiB, V (q8_0):   51.00 MiB"
  "llama_kv_cache_iswa: creating     SWA KV cache, size = 256 cells"
  "llama_kv_cache: size =    3.19 MiB (   256 cells,  12 layers,  1/1 seqs), K (q8_0):    1.59 MiB, V (q8_0):    1.59 MiB")
# OLMoE-1B-7B-0125-Instruct, -c 8192, q8_0: llama.cpp's docs/backend/hexagon/README.md (63d2fc46). 16 x 8192 x 2048 x 34/32 B = 272 MiB.
kvlab_expect_lines(ARGS kvcalc --config ${E}/olmoe-1b-7b.json --engine llama.cpp -d q8_0 --context 8192 LINES
  "llama_kv_cache: size =  544.00 MiB (  8192 cells,  16 layers,  1/1 seqs), K (q8_0):  272.00 MiB, V (q8_0):  272.00 MiB")
# Qwen2.5-Coder-32B-Instruct, -c 32768 with q8_0 K and V: llama.cpp issue #11200 printed (older wording)
# "KV self size  = 4352.00 MiB, K (q8_0): 2176.00 MiB, V (q8_0): 2176.00 MiB": 64 x 32768 x 1088 B = 2176 MiB.
kvlab_expect_lines(ARGS kvcalc --config ${E}/qwen2.5-coder-32b.json --engine llama.cpp -d q8_0 --context 32768 LINES
  "llama_kv_cache: size = 4352.00 MiB ( 32768 cells,  64 layers,  1/1 seqs), K (q8_0): 2176.00 MiB, V (q8_0): 2176.00 MiB")
# Four sequences in four streams: -c 8192 -np 4 is 2048 cells per stream, the MiB over all streams (llama.cpp prints "4/4 seqs").
kvlab_expect_lines(ARGS kvcalc -m llama-3-8b --engine llama.cpp --context 2048 --batch 4 LINES
  "llama_kv_cache: size = 1024.00 MiB (  2048 cells,  32 layers,  4/4 seqs), K (f16):  512.00 MiB, V (f16):  512.00 MiB")
kvlab_expect(RC 2 ARGS kvcalc -m llama-3-8b --engine llama.cpp -d fp8
             ERR "--dtype fp8_e4m3: llama.cpp has no such cache type; its -ctk/-ctv take f32, f16, bf16, q8_0, q4_0")

# --- vLLM (v0.10.2 rules) ---
# Qwen3-14B, one GPU, max_model_len 32768: LMCache issue #1739 (vLLM v0.10.2 line numbers). 40 layers x 2 x 16 x 8 x 128 x 2 B
# = 2.5 MiB per block; floor(6.51 GiB / 65536 / 40) = 2666 blocks = 42,656 tokens; 2666 / cdiv(32768, 16) = 1.30x.
kvlab_expect_lines(ARGS kvcalc --config ${E}/qwen3-14b.json --engine vllm --kv-budget 6.51GiB --context 32768 LINES
  "Available KV cache memory: 6.51 GiB"
  "GPU KV cache size: 42,656 tokens"
  "Maximum concurrency for 32,768 tokens per request: 1.30x")
# DeepSeek-V2-Lite (MLA: one 576-wide latent per layer), 32768 tokens: vLLM issue #15871.
# 27 x 576 x 2 B x 32768 = 1,019,215,872 B = 0.95 GiB.
kvlab_expect_lines(ARGS kvcalc --config ${E}/deepseek-v2-lite.json --engine vllm --kv-budget 0.93GiB --context 32768 LINES
  "To serve at least one request with the models's max seq len (32768), (0.95 GiB KV cache is needed, which is larger than the available KV cache memory (0.93 GiB).")
# Qwen3-Coder-480B at 262144 tokens: vllm-project/recipes PR #12. 62 x 2 x 8 x 128 x 2 B = 253,952 B/token;
# the longest length whose cdiv(L, 16) x 16 x 253952 B fits 48.66 GiB is 205728.
kvlab_expect_lines(ARGS kvcalc --config ${E}/qwen3-coder-480b.json --engine vllm --kv-budget 48.66GiB --context 262144 LINES
  "To serve at least one request with the models's max seq len (262144), (62.00 GiB KV cache is needed, which is larger than the available KV cache memory (48.66 GiB). Based on the available memory, the estimated maximum model length is 205728.")
kvlab_expect(RC 2 ARGS kvcalc -m llama-3-8b --engine vllm -d q8_0 ERR "--dtype q8_0: vLLM's --kv-cache-dtype takes auto")
# vLLM's API server steps 2048 tokens on an A100 even with 80 GB (arg_utils.py, PR #17885), 8192 on an H100; only sliding layers
# feel it. Gemma-3-27B, 20 GiB: page 2 x 16 x 16 x 128 x 2 B = 131072 B, 20 GiB / 131072 / 10 = 16384 blocks; a request needs
# 8192 (1 full group) + 6 sliding groups x (cdiv(1023 + 2048, 16) + 1 = 193) = 9350 blocks: 16384 / 9350 = 1.75x
# (with 8192: 6 x (cdiv(1023 + 8192, 16) + 1 = 577) + 8192 = 11654 blocks, 1.41x).
kvlab_expect_lines(ARGS kvcalc -m gemma-3-27b --engine vllm --gpu a100-sxm-80gb --kv-budget 20GiB --context 131072 LINES
  "--max-num-batched-tokens 2048" "Maximum concurrency for 131,072 tokens per request: 1.75x")
kvlab_expect_lines(ARGS kvcalc -m gemma-3-27b --engine vllm --gpu h100-sxm-80gb --kv-budget 20GiB --context 131072 LINES
  "--max-num-batched-tokens 8192" "Maximum concurrency for 131,072 tokens per request: 1.41x")

# --- SGLang (v0.5.2 rules): K bytes = (#tokens + 1 padding row) x KV heads per GPU x head_dim x layers x 2 B, in 2^30 "GB" ---
# Llama-3.3-70B-Instruct (Llama-3.1-70B's shape), --tp 8: sglang PR #11716. 2795208 x 1 x 128 x 80 x 2 = 57,245,859,840 B.
kvlab_expect_lines(ARGS kvcalc -m llama-3.1-70b --engine sglang --tp 8 --kv-tokens 2795207 --context 131072 LINES
  "KV Cache is allocated. #tokens: 2795207, K size: 53.31 GB, V size: 53.31 GB" "says GB for 2^30 bytes")
# Qwen2.5-VL-7B-Instruct (its language model has Qwen2.5-7B's 28 layers x 4 KV heads x 128): sglang PR #11830.
kvlab_expect_lines(ARGS kvcalc -m qwen2.5-7b --engine sglang --kv-tokens 2243474 --context 32768 LINES
  "KV Cache is allocated. #tokens: 2243474, K size: 59.91 GB, V size: 59.91 GB")
# Qwen3-235B-A22B-FP8 (bf16 KV), --tp 4: 4 KV heads / 4 = 1 per GPU; vllm issue #21348 (the SGLang run in it).
kvlab_expect_lines(ARGS kvcalc -m qwen3-235b-a22b --engine sglang --tp 4 --kv-tokens 367404 --context 40960 LINES
  "KV Cache is allocated. #tokens: 367404, K size: 8.23 GB, V size: 8.23 GB")

# --- TensorRT-LLM (1.2.0rc2 rules): blocks = ceil(max_tokens / tokens_per_block) ---
# Llama-3.1-8B, FP8 KV, max_tokens 860308: TensorRT-LLM issue #6294. ceil(860308 / 32) = 26885 blocks = 860320 tokens
# x 2 x 32 x 8 x 128 x 1 B = 52.51 GiB.
kvlab_expect_lines(ARGS kvcalc -m llama-3.1-8b --engine trtllm -d fp8 --kv-tokens 860308 --context 8192 LINES
  "[TensorRT-LLM][INFO] Number of tokens per block: 32."
  "[TensorRT-LLM][INFO] [MemUsageChange] Allocated 52.51 GiB for max tokens in paged KV cache (860320).")
# Qwen2.5-Coder-0.5B-Instruct, fp16 KV: TensorRT-LLM issue #1188. 395776 x 2 x 24 x 2 x 64 x 2 B = 4.53 GiB.
kvlab_expect_lines(ARGS kvcalc --config ${E}/qwen2.5-coder-0.5b.json --engine trtllm -d fp16 --kv-tokens 395776 --context 4096 LINES
  "[TensorRT-LLM][INFO] [MemUsageChange] Allocated 4.53 GiB for max tokens in paged KV cache (395776).")
# Qwen1.5-7B, fp16, 64 tokens per block, "available: 21.89 GiB" x free_gpu_memory_fraction 0.9 = 19.701 GiB for KV:
# TensorRT-LLM issue #2268. floor(19.701 GiB / 524288 B) = 40347 tokens, ceil(40347 / 64) = 631 blocks. That release (0.13) printed
# "Number of blocks in KV cache primary pool: 631"; 1.2.0rc2 prints the count in its per-window line, with a max sequence length of
# 4096 + 1 (the overlap scheduler's extra token): ceil(4097 / 64) = 65 blocks a sequence.
kvlab_expect_lines(ARGS kvcalc --config ${E}/qwen1.5-7b.json --engine trtllm -d fp16 --kv-budget 19.701GiB --block-size 64 --context 4096 LINES
  "[TensorRT-LLM][INFO] Max KV cache blocks per sequence: 65 [window size=4097], tokens per block=64, primary blocks=631, secondary blocks=0, max sequence length=4097")

# Engine settings need an engine.
kvlab_expect(RC 2 ARGS kvcalc -m llama-3-8b --ubatch 128 ERR "these are engine settings; expected --engine")
kvlab_expect(RC 2 ARGS kvcalc -m llama-3-8b --engine tgi ERR "--engine")
# One budget per rank: the pool follows the smallest. Qwen3-14B at --tp 2 holds 4 KV heads per GPU: page 2 x 16 x 4 x 128 x 2 B
# = 32768 B; floor(6.51 GiB / 32768 / 40) = 5332 blocks = 85,312 tokens.
kvlab_expect_lines(ARGS kvcalc --config ${E}/qwen3-14b.json --engine vllm --tp 2 --kv-budget 7GiB,6.51GiB --context 32768 LINES
  "GPU KV cache size: 85,312 tokens" "2 budgets given, one per rank")
# a budget smaller than one token slot: SGLang's init_memory_pool refuses to start (model_runner.py, v0.5.2)
kvlab_expect_lines(ARGS kvcalc -m llama-3-8b --engine sglang --kv-budget 1KiB LINES
  "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.")

# An MLA model under vLLM's default block size gets a note: vllm/platforms/cuda.py forces 64 (FlashMLA,
# Hopper) or 128 (CUTLASS MLA, Blackwell); none once --block-size is a multiple of 64
kvlab_expect(RC 0 ARGS kvcalc -m deepseek-v3 --engine vllm --kv-budget 20GiB --context 32k
             OUT "deepseek-v3: MLA with --block-size 16; vLLM on CUDA forces 64 with FlashMLA")
kvlab_expect(RC 0 ARGS kvcalc -m deepseek-v3 --engine vllm --kv-budget 20GiB --context 32k --block-size 64 NOT_OUT "forces 64 with FlashMLA")

# --- Releases (--engine NAME@VERSION): each line as that release printed it ---
# llama.cpp PR #14363 ("llama : add high-throughput mode", merged July 2025 as 225e7a14 = build 5913: issue #14724's
# "version: 5913 (225e7a14)"; b5912 is the last build without it, issue #14847), the "unified cache"
# run of llama-batched-bench on Qwen2.5-0.5B (-c 133120 -npl 32, unified: one stream): Qwen2.5-Coder-0.5B's shape (24 layers,
# 2 KV heads x 64). 133120 cells x 24 x 128 x 2 B = 780 MiB of K; the seqs column "32/ 1" is b5913's %2u/%2u.
kvlab_expect_lines(ARGS kvcalc --config ${E}/qwen2.5-coder-0.5b.json --engine llama.cpp@b5913 --context 4160 --batch 32 --kv-unified LINES
  "llama_kv_cache_unified: size = 1560.00 MiB (133120 cells,  24 layers, 32/ 1 seqs), K (f16):  780.00 MiB, V (f16):  780.00 MiB")
# The same cache at the pinned build: prefix llama_kv_cache (b6250) and "32/1 seqs" (b6081).
kvlab_expect_lines(ARGS kvcalc --config ${E}/qwen2.5-coder-0.5b.json --engine llama.cpp --context 4160 --batch 32 --kv-unified LINES
  "llama_kv_cache: size = 1560.00 MiB (133120 cells,  24 layers, 32/1 seqs)")
# The prefix is the cache constructor's __func__: PR #15467 ("kv-cache : drop the \"unified\" prefix", merged 2025-08-21)
# renamed llama_kv_cache_unified to llama_kv_cache; tag-bracketed b6218..b6250 (llama.rn's vendored copies), kvlab applies it from b6250.
# Before: llama.cpp issue #16188's gpt-oss-20b log ("build: 6182 (1fe00296f)", llama-cli at its default -c 4096, -fa off), which
# b6218 answers (b6182 is 36 builds from it, 101 from b6081). 12 full layers x 4096 cells x 512 (8 KV heads x 64) x 2 B = 48 MiB
# of K. Its SWA cache: the 12 sliding layers keep n_swa 128 + n_ubatch 512 = 640 cells, padded by get_padding to 32 without
# flash attention (off by default before b6327): PAD(640, 32) = 640; 12 x 640 x 512 x 2 B = 7.5 MiB of K, 15 MiB in all.
kvlab_expect_lines(ARGS kvcalc -m gpt-oss-20b --engine llama.cpp@b6182 --context 4096 LINES
  "llama_kv_cache_unified_iswa: creating non-SWA KV cache, size = 4096 cells"
  "llama_kv_cache_unified: size =   96.00 MiB (  4096 cells,  12 layers,  1/1 seqs), K (f16):   48.00 MiB, V (f16):   48.00 MiB"
  "llama_kv_cache_unified_iswa: creating     SWA KV cache, size = 640 cells"
  "llama_kv_cache_unified: size =   15.00 MiB (   640 cells,  12 layers,  1/1 seqs), K (f16):    7.50 MiB, V (f16):    7.50 MiB")
# the same command with -fa (a bare flag at b6182): get_padding 256, PAD(640, 256) = 768 cells
kvlab_expect_lines(ARGS kvcalc --engine-cmd "llama-cli -m gpt-oss-20b -c 4096 -fa" --engine llama.cpp@b6182 LINES
  "llama_kv_cache_unified_iswa: creating     SWA KV cache, size = 768 cells" "-fa given")
# After: ROCm/ROCm issue #5534's llama-server log (llama.cpp b6786, Devstral-Small-2507 at --ctx-size 4096). Devstral Small 2507
# is fine-tuned from Mistral Small 3.1, whose text model has Mistral-Small-24B's attention (preset mistral-small-24b: 40 layers,
# 8 KV heads x 128): 40 x 4096 x 1024 x 2 B = 320 MiB of K.
kvlab_expect_lines(ARGS kvcalc -m mistral-small-24b --engine llama.cpp@b6786 --context 4096 LINES
  "llama_kv_cache: size =  640.00 MiB (  4096 cells,  40 layers,  1/1 seqs), K (f16):  320.00 MiB, V (f16):  320.00 MiB")
# DeepSeek's MLA at a May 2025 build: b5489 is no release kvlab knows, the nearest (b5460) answers: "%2u seqs" and a V of
# kv_lora_rank 512 per layer (b5137-b7831): 61 x 4096 x 512 x 2 B = 244 MiB; K 61 x 4096 x 576 x 2 B = 274.5 MiB.
kvlab_expect_lines(ARGS kvcalc -m deepseek-v3 --engine llama.cpp@b5489 --context 4096 LINES
  "llama_kv_cache_unified: size =  518.50 MiB (  4096 cells,  61 layers,  1 seqs), K (f16):  274.50 MiB, V (f16):  244.00 MiB"
  "kvlab knows no release b5489; the nearest it knows, llama.cpp b5460, answers")
# vLLM PR #13596 (Feb 2025) shows both forms for one run (its model not named): 127626 blocks of 16 = 2,042,016 tokens, and
# 2,042,016 / 2048 = 997.08x. Any model whose budget holds 127626 blocks prints them: Llama-3-8B's block is 32 layers x 65536 B
# = 2 MiB, so 255252 MiB. Before (v0.7.3, V1's first form) and after (v0.8.0):
kvlab_expect_lines(ARGS kvcalc -m llama-3-8b --engine vllm@0.7.3 --kv-budget 255252MiB --context 2048 LINES
  "# GPU blocks: 127626" "Maximum concurrency for 2048 tokens per request: 997.08x")
kvlab_expect(RC 0 ARGS kvcalc -m llama-3-8b --engine vllm@0.7.3 --kv-budget 255252MiB --context 2048 NOT_OUT "Available KV cache memory")
kvlab_expect_lines(ARGS kvcalc -m llama-3-8b --engine vllm@0.8.0 --kv-budget 255252MiB --context 2048 LINES
  "GPU KV cache size: 2,042,016 tokens" "Maximum concurrency for 2,048 tokens per request: 997.08x")
# vLLM PR #17122's v0.8.4 log (Llama-3.1-8B-Instruct on an L40S, 32768 tokens) has no budget line; 158,656 tokens = 9916 blocks of
# 2 MiB (19832 MiB, the budget that log implies); 9916 / 2048 = 4.84x. v0.8.4 is not known: v0.8.0 answers.
kvlab_expect_lines(ARGS kvcalc -m llama-3.1-8b --engine vllm@0.8.4 --kv-budget 19832MiB --context 32768 LINES
  "GPU KV cache size: 158,656 tokens" "Maximum concurrency for 32,768 tokens per request: 4.84x")
# vLLM issue #25350 (Sept 2025, v0.10.2 era), --kv-cache-dtype fp8: a 48-layer model with 4 KV heads of 128 (the log's
# 10.55 GiB / 230,528 tokens = 48 KiB a token; the thread's 29 GiB of weights fit Qwen3-30B-A3B-FP8, whose attention is
# Qwen3-Coder-30B-A3B's). Page 2 x 16 x 4 x 128 x 1 B = 16384 B x 48 layers = 786432 B a block: 14408 blocks = 230,528
# tokens need a budget in [10.5527, 10.5534) GiB; 14408 / cdiv(100000, 16) = 14408 / 6250 = 2.31x.
kvlab_expect_lines(ARGS kvcalc --config ${E}/qwen3-coder-30b-a3b.json --engine vllm -d fp8 --kv-budget 10.5528GiB --context 100000 LINES
  "Available KV cache memory: 10.55 GiB" "GPU KV cache size: 230,528 tokens" "Maximum concurrency for 100,000 tokens per request: 2.31x")
# A real v0.10.0 log ("Initializing a V1 LLM engine (v0.10.0)"): Jransom33/Chatterbox-turbo-vllm README.md (1ed9a58f), the
# T3 Turbo model (GPT-2 medium's shape, bf16) at max_model_len 1200 on an RTX 4090; the budget line is gpu_worker.py:255's, printed
# before the two pool lines. Page 2 x 16 x 16 x 64 x 2 B = 65536 B x 24 layers = 1572864 B a block: 127,472 tokens = 7967 blocks need
# a budget in [11.67022, 11.67168) GiB (the log's 11.67 rounds it); 7967 / cdiv(1200, 16) = 7967 / 75 = 106.23x.
kvlab_expect_lines(ARGS kvcalc --config ${E}/chatterbox-t3-turbo.json --engine vllm@0.10.0 --kv-budget 11.6705GiB --context 1200 LINES
  "Available KV cache memory: 11.67 GiB" "GPU KV cache size: 127,472 tokens" "Maximum concurrency for 1,200 tokens per request: 106.23x")
# Same thread, --max-model-len 221000: cdiv(221000, 16) = 13813 blocks x 786432 B = 10.12 GiB needed; 5.59 GiB holds 7630 blocks
# (a budget in [5.5884, 5.5891) GiB) = 122080 tokens.
kvlab_expect_lines(ARGS kvcalc --config ${E}/qwen3-coder-30b-a3b.json --engine vllm -d fp8 --kv-budget 5.5885GiB --context 221000 LINES
  "ValueError: To serve at least one request with the models's max seq len (221000), (10.12 GiB KV cache is needed, which is larger than the available KV cache memory (5.59 GiB). Based on the available memory, the estimated maximum model length is 122080.")
# vLLM issue #34076 (v0.15.2rc1, -pp 2, Qwen3-Coder-30B-A3B-Instruct-FP8, bf16 KV, max len 262144): v0.15.2 checks one request
# against all 48 layers and the smaller stage's budget, in format_gib's form: 262144 x 48 x 2048 B = 24.0 GiB; the longest length
# whose cdiv(L, 16) x 16 x 98304 B fits 3.18 GiB (3.1802 GiB: 2171 blocks) is 34736.
kvlab_expect_lines(ARGS kvcalc --config ${E}/qwen3-coder-30b-a3b.json --engine vllm@0.15.2 --pp 2 --kv-budget 3.1802GiB,20GiB --context 262144 LINES
  "ValueError: To serve at least one request with the models's max seq len (262144), (24.0 GiB KV cache is needed, which is larger than the available KV cache memory (3.18 GiB). Based on the available memory, the estimated maximum model length is 34736."
  "Available KV cache memory: 20.0 GiB")
# TensorRT-LLM 0.13 (issue #2268, Qwen1.5-7B, 64 tokens a block, 19.701 GiB for KV): the pool line that release printed.
kvlab_expect_lines(ARGS kvcalc --config ${E}/qwen1.5-7b.json --engine trtllm@0.13.0 -d fp16 --kv-budget 19.701GiB --block-size 64 --context 4096 LINES
  "[TensorRT-LLM][INFO] Number of blocks in KV cache primary pool: 631")
kvlab_expect(RC 2 ARGS kvcalc -m llama-3-8b --engine vllm@latest ERR "--engine 'vllm@latest': 'latest' is not a vllm version; expected x.y.z")
kvlab_expect(RC 2 ARGS kvcalc -m llama-3-8b --engine tgi@1.0 ERR "--engine: 'tgi' not in")

# --- Pipeline parallel (--pp): kvlab issue 48's cases ---
# Llama-3-8B, -tp 2 -pp 2: each stage holds 16 layers (get_pp_indices) of 4 KV heads: a block 16 x 32768 B = 512 KiB; a budget of
# 53184 MiB holds 106,368 blocks = 1,701,888 tokens (charged all 32 layers: 53,184 blocks, 850,944 tokens).
kvlab_expect_lines(ARGS kvcalc -m llama-3-8b --engine vllm --tp 2 --pp 2 --kv-budget 53184MiB --context 8192 LINES
  "GPU KV cache size: 1,701,888 tokens" "-pp 2 gives the stages 16, 16 layers")
# DeepSeek-V2-Lite (27 MLA layers, 1152 B a token a layer), -tp 2 -pp 2, one budget per stage: stage 0 has 14 layers
# (get_pp_indices gives the remainder to the second-to-last stage) and 12.1335 GiB: floor(13,028,246,421 / (14 x 16 x 1152)) =
# 50,487 blocks = 807,792 tokens; stage 1 (13 layers, 11.33 GiB) holds 50,770, so stage 0 decides. All 27 layers on the smaller
# budget would give 24,445 blocks = 391,120 tokens.
kvlab_expect_lines(ARGS kvcalc --config ${E}/deepseek-v2-lite.json --engine vllm --tp 2 --pp 2 --kv-budget 12.1335GiB,11.33GiB --context 32768 LINES
  "GPU KV cache size: 807,792 tokens" "-pp 2 gives the stages 14, 13 layers")
kvlab_expect(RC 2 ARGS kvcalc -m llama-3-8b --engine vllm --pp 2 --kv-budget 1GiB,2GiB,3GiB ERR "--kv-budget: 3 budgets for --pp 2 --tp 1")
# --pp without --engine describes the deployment: 2 x H100 is TP 2, x PP 2 = 4 GPUs. Stage 0 (16 layers + embeddings):
# 16 x 218,112,128 + 525,336,576 = 4,015,130,624 params x 2 B / TP 2 = 4,015,130,624 B = 3.74 GiB per GPU (TP 2 alone: 7.48 GiB);
# its KV per token per GPU: 16 layers x 2 x 4 heads x 128 x 2 B = 32 KiB, so 8192 x 16 sequences hold 4.00 GiB per GPU.
kvlab_expect_lines(ARGS kvcalc -m llama-3-8b --gpu 2xh100 --pp 2 --context 8192 --batch 16 LINES
  "(3.74 GiB of weights per GPU at TP 2 × PP 2)" "TP 2 × PP 2 = 4 GPUs, the fullest stage)?" "--pp 2 splits its 32 layers 16, 16")
kvlab_expect(RC 0 ARGS kvcalc -m llama-3-8b --gpu 2xh100 --pp 2 --context 8192 --batch 16 NOT_OUT "7\\.48 GiB of weights")
kvlab_expect(RC 2 ARGS kvcalc -m llama-3-8b --pp 33 ERR "--pp 33: the model has 32 layers; expected 1 to 32 pipeline stages")
# llama.cpp over 2 devices (-sm layer, equal -ts): 32 layers, the output layer one more: layer il on device 0 while il / 33 < 0.5,
# so 17 and 15 layers; -c 4096, f16: 17 x 4096 x 1024 x 2 B x 2 = 272 MiB on CUDA0, 240 MiB on CUDA1.
kvlab_expect_lines(ARGS kvcalc -m llama-3-8b --engine llama.cpp --pp 2 --context 4096 LINES
  "llama_kv_cache:      CUDA0 KV buffer size =   272.00 MiB" "llama_kv_cache:      CUDA1 KV buffer size =   240.00 MiB")

# --- Speculative drafts (--draft) ---
# Llama-3.1-8B + its EAGLE head (one layer of the same shape): vLLM puts the head's layer in the same pool: 33 layers x 65536 B a
# block. 51.629 GiB = 55,436,216,631 B: 26,434 blocks (422,944 tokens) without the head, 25,633 (410,128) with it: 3.0 % fewer.
kvlab_expect_lines(ARGS kvcalc -m llama-3.1-8b --engine vllm --kv-budget 51.629GiB --context 8192 --draft ${E}/eagle-llama3.1-8b.json LINES
  "GPU KV cache size: 410,128 tokens")
# TensorRT-LLM adds the draft's bytes per token (PR #3497): 33 x 2 x 8 x 128 x 2 B = 135168 B; 55,436,216,631 / 135168 = 410,128
# tokens, ceil to blocks of 32: 12,817 blocks = 410,144.
kvlab_expect_lines(ARGS kvcalc -m llama-3.1-8b --engine trtllm --kv-budget 51.629GiB --context 8192 --draft ${E}/eagle-llama3.1-8b.json LINES
  "Allocated 51.63 GiB for max tokens in paged KV cache (410144).")
# SGLang v0.5.2 (model_runner.py init_memory_pool): the target's #tokens = 422,944 from the budget (131,072 B a token) + the
# speculative headroom 48 x (5 x 4 + 8) + 100 = 1,444 (SGLang's defaults for Llama) = 424,388; the draft worker's own pool has the
# same #tokens: (424,388 + 1) x 8 x 128 x 1 layer x 2 B = 869,148,672 B = 0.81 GiB of K. With the command's own flags (R 32, 3 steps,
# topk 1, so 4 draft tokens): 422,944 + 32 x 7 + 100 = 423,268.
kvlab_expect_lines(ARGS kvcalc -m llama-3.1-8b --engine sglang --kv-budget 51.629GiB --context 8192 --draft ${E}/eagle-llama3.1-8b.json LINES
  "KV Cache is allocated. #tokens: 424388, K size: 25.90 GB, V size: 25.90 GB" "KV Cache is allocated. #tokens: 424388, K size: 0.81 GB, V size: 0.81 GB")
kvlab_expect_lines(ARGS kvcalc --engine-cmd "python3 -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct --speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 --max-running-requests 32 --context-length 8192"
                        -m llama-3.1-8b --draft ${E}/eagle-llama3.1-8b.json --kv-budget 51.629GiB LINES
  "KV Cache is allocated. #tokens: 423268, K size: 25.83 GB")
# llama-server -md: a draft context per slot of -c / -np cells: Llama-3.2-1B (16 layers, 8 KV heads x 64) at -c 8192 -np 2:
# 4096 cells x 16 x 512 x 2 B x 2 = 128 MiB a slot.
kvlab_expect_lines(ARGS kvcalc -m llama-3.1-8b --engine llama.cpp --context 4096 --batch 2 --draft llama-3.2-1b LINES
  "llama_kv_cache: size =  128.00 MiB (  4096 cells,  16 layers,  1/1 seqs), K (f16):   64.00 MiB, V (f16):   64.00 MiB")
# DeepSeek-V3's MTP layer as the draft (mtp:1): one more 576-wide latent layer in vLLM's pool: 62 layers, not 61.
kvlab_expect_lines(ARGS kvcalc -m deepseek-v3 --engine vllm --block-size 64 --kv-budget 62GiB --context 32768 --draft mtp:1 LINES
  "its 1 layer take blocks")

# --- The engine's own command line (--engine-cmd) ---
# kvlab_same_answer(CMD <engine command> [EXTRA <args>] FLAGS <kvcalc flags>): the two runs print the same report, but for
# the lines --engine-cmd adds (its notes).
function(kvlab_same_answer)
  cmake_parse_arguments(S "" "CMD" "EXTRA;FLAGS" ${ARGN})
  execute_process(COMMAND ${KVLAB} kvcalc --engine-cmd "${S_CMD}" ${S_EXTRA} RESULT_VARIABLE rc1 OUTPUT_VARIABLE a ERROR_VARIABLE ea WORKING_DIRECTORY "${WORK}")
  execute_process(COMMAND ${KVLAB} kvcalc ${S_FLAGS} RESULT_VARIABLE rc2 OUTPUT_VARIABLE b ERROR_VARIABLE eb WORKING_DIRECTORY "${WORK}")
  string(REGEX REPLACE "--engine-cmd:[^\n]*\n" "" a "${a}")
  if(NOT rc1 EQUAL 0 OR NOT rc2 EQUAL 0 OR NOT a STREQUAL b)
    message(SEND_ERROR "--engine-cmd \"${S_CMD}\" and kvcalc ${S_FLAGS} differ (exit ${rc1}, ${rc2})\n--- engine-cmd:\n${a}${ea}\n--- flags:\n${b}${eb}")
  endif()
endfunction()
# vLLM's docs (serving/parallelism_scaling): "vllm serve gpt2 --tensor-parallel-size 4 --pipeline-parallel-size 2"
kvlab_same_answer(CMD "vllm serve gpt2 --tensor-parallel-size 4 --pipeline-parallel-size 2" EXTRA --kv-budget 10GiB
                  FLAGS -m gpt2 --engine vllm --tp 4 --pp 2 --kv-budget 10GiB)
kvlab_same_answer(CMD "vllm serve Qwen/Qwen2.5-7B-Instruct --max-model-len 32768 --kv-cache-dtype fp8 -tp 2 --block-size 32 --port 8000 --enable-prefix-caching"
                  EXTRA --kv-budget 20GiB FLAGS -m qwen2.5-7b --engine vllm --context 32768 -d fp8 --tp 2 --block-size 32 --kv-budget 20GiB)
# llama.cpp's tools/server/README.md: "./llama-server -m models/7B/ggml-model.gguf -c 2048" (the GGUF is not here: -m gives the shape).
# No -np: llama-server's auto mode is 4 slots in one unified cache of -c cells (n_parallel = 4, kv_unified = true), as a RISC-V
# build's log shows ("n_parallel is set to auto, ...", "n_slots = 4", every slot "n_ctx = 2048" for -c 2048): --context 512 x 4.
kvlab_same_answer(CMD "./llama-server -m models/7B/ggml-model.gguf -c 2048" EXTRA -m llama-2-7b FLAGS -m llama-2-7b --engine llama.cpp --context 512 --batch 4 --kv-unified)
# Llama-3.2-1B there: 16 layers x 8 KV heads x 64 x 2 B = 16 KiB of K a cell; 2048 cells: 32 MiB of K, 64 MiB with V.
kvlab_expect_lines(ARGS kvcalc --engine-cmd "llama-server -m x.gguf -c 2048" -m llama-3.2-1b LINES
  "llama_kv_cache: size =   64.00 MiB (  2048 cells,  16 layers,  4/1 seqs)")
kvlab_same_answer(CMD "llama-cli -m models/7B/ggml-model.gguf -c 2048" EXTRA -m llama-2-7b FLAGS -m llama-2-7b --engine llama.cpp --context 2048)
kvlab_same_answer(CMD "llama-server -m x.gguf -c 16384 -np 4 -ctk q8_0 -ctv q8_0 -ub 256 -fa on -ngl 99" EXTRA -m gemma-2-9b
                  FLAGS -m gemma-2-9b --engine llama.cpp --context 4096 --batch 4 -d q8_0 --ubatch 256)
# SGLang's docs: "python3 -m sglang.launch_server --model-path meta-llama/Meta-Llama-3-8B-Instruct --port 30000", with --tp and a cap
kvlab_same_answer(CMD "python3 -m sglang.launch_server --model-path meta-llama/Meta-Llama-3-8B-Instruct --port 30000 --tp 2 --max-total-tokens 100000"
                  EXTRA -m llama-3-8b FLAGS -m llama-3-8b --engine sglang --tp 2 --kv-tokens 100000)
# trtllm-serve MODEL with its underscore flags
kvlab_same_answer(CMD "trtllm-serve meta-llama/Llama-3.1-8B --backend pytorch --max_seq_len 8192 --max_batch_size 16 --tp_size 2"
                  EXTRA --kv-budget 20GiB FLAGS -m llama-3.1-8b --engine trtllm --context 8192 --batch 16 --tp 2 --kv-budget 20GiB)
# The mapping trap of issue 48: -c 32768 -np 10 -kvu is 32768 cells, 16384 MiB for Llama-2-7B (--context 3277 --batch 10 pads
# 32770 to 33024 cells, 16512 MiB).
kvlab_expect_lines(ARGS kvcalc --engine-cmd "llama-server -m llama-2-7b.gguf -c 32768 -np 10 -kvu --port 8080" -m llama-2-7b LINES
  "llama_kv_cache: size = 16384.00 MiB ( 32768 cells,  32 layers, 10/1 seqs), K (f16): 8192.00 MiB, V (f16): 8192.00 MiB"
  "flags that do not change the KV cache, ignored: --port")
kvlab_expect(RC 2 ARGS kvcalc --engine-cmd "vllm serve gpt2 --frobnicate 3" ERR "--engine-cmd: '--frobnicate' is no vllm flag kvlab knows")
kvlab_expect(RC 2 ARGS kvcalc --engine-cmd "llama-server -m x.gguf --max-model-len 4096" ERR "'--max-model-len' is no llama.cpp flag")
kvlab_expect(RC 2 ARGS kvcalc --engine-cmd "tgi-launcher --model x" ERR "--engine-cmd: 'tgi-launcher' is no engine command kvlab reads")
kvlab_expect(RC 2 ARGS kvcalc --engine-cmd "vllm serve unknown/model" ERR "the model 'unknown/model' is no preset")
# A vLLM command with an EAGLE --speculative-config (vLLM's docs/features/spec_decode.md form); the head's id is not a preset, so
# --draft gives its shape: the same 410,128 tokens as --engine vllm --draft above.
kvlab_expect_lines(ARGS kvcalc --engine-cmd "vllm serve meta-llama/Llama-3.1-8B --max-model-len 8192 --speculative-config '{\"method\": \"eagle\", \"model\": \"yuhuili/EAGLE-LLaMA3.1-Instruct-8B\", \"num_speculative_tokens\": 5}'"
                   --draft ${E}/eagle-llama3.1-8b.json --kv-budget 51.629GiB LINES "GPU KV cache size: 410,128 tokens")

# SGLang v0.5.2 refuses --pp-size > 1 with speculative decoding (server_args.py check_server_args asserts speculative_algorithm is
# None when pp_size > 1): the assert's line, no pool and no token count, and the note that says why.
kvlab_expect(RC 0 ARGS kvcalc -m llama-3.1-8b --engine sglang --kv-budget 51.629GiB --context 8192 --draft ${E}/eagle-llama3.1-8b.json --pp 2
             OUT "llama-3\\.1-8b  AssertionError: Pipeline parallelism is not compatible with overlap schedule, speculative decoding, mixed chunked prefill\\."
                 "SGLang v0\\.5\\.2 refuses --pp-size 2 with speculative decoding" "sglang PR #30775"
                 "--pp-size 2  512\\.00 MiB  +-  +-  +-\n"
             NOT_OUT "KV Cache is allocated")
kvlab_expect(RC 0 ARGS kvcalc --engine-cmd "python3 -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct --pp-size 2 --speculative-algorithm EAGLE --speculative-draft-model-path yuhuili/EAGLE-LLaMA3.1-Instruct-8B --context-length 8192"
             -m llama-3.1-8b --draft ${E}/eagle-llama3.1-8b.json --kv-budget 51.629GiB
             OUT "AssertionError: Pipeline parallelism is not compatible with overlap schedule, speculative decoding, mixed chunked prefill\\."
             NOT_OUT "KV Cache is allocated")
# NGRAM keeps no draft KV but is a speculative algorithm all the same: the same refusal
kvlab_expect(RC 0 ARGS kvcalc --engine-cmd "python3 -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct --pp-size 2 --speculative-algorithm NGRAM"
             -m llama-3.1-8b --kv-budget 20GiB OUT "AssertionError: Pipeline parallelism is not compatible" NOT_OUT "KV Cache is allocated")

# Real SGLang draft pools: SGLang's docs page advanced_features/speculative_decoding.html as built on 2025-09-03 from sglang's main
# (the v0.5.2 line) on one H100, sgl-project/sgl-project.github.io commit c4f34f9e (read in its mirror Stars1233/sgl-project.github.io):
# each notebook cell's server log prints the target's pool, then the draft worker's. The docs' launcher adds max_total_tokens=20480
# and max_running_requests=128 (the logged server_args), so the cap decides #tokens exactly; the budget holds far more: rest_memory =
# the free memory after the weights ("Load weight end. ... avail mem") - the free memory at start ("Load weight begin. avail mem",
# profile_max_num_token's total_gpu_memory) x (1 - mem_fraction_static). The draft line carries the target's #tokens, its sizes the
# draft's own shape (tests/data/engines/, from published configs). Were the headroom added after the cap (init_memory_pool adds it
# before), #tokens would read 20480 + 128 x (steps x topk + draft tokens) + 100.
# Llama-2-7b-chat (Llama-2-7B's shape, MHA), fp16, EAGLE head lmsys/sglang-EAGLE-llama2-chat-7B, steps 3, topk 4, 16 draft tokens,
# mem_fraction_static 0.849: rest = 65.93 - 0.151 x 78.58 = 54.06 GiB (53 GiB given), where the cap needs 20480 x 524288 B = 10 GiB
# (24164 tokens without the cap). Target K: (20480 + 1) x 32 heads x 128 x 32 layers x 2 B = 5,368,971,264 B = 5.00 GiB; draft K:
# 20481 x 32 x 128 x 1 layer x 2 B = 167,780,352 B = 0.16 GiB.
kvlab_expect_lines(ARGS kvcalc --engine sglang@0.5.2 --engine-cmd "python3 -m sglang.launch_server --model meta-llama/Llama-2-7b-chat-hf  --speculative-algorithm EAGLE --speculative-draft-model-path lmsys/sglang-EAGLE-llama2-chat-7B --speculative-num-steps 3 --speculative-eagle-topk 4 --speculative-num-draft-tokens 16 --cuda-graph-max-bs 8 --max-total-tokens 20480 --max-running-requests 128"
                        -m llama-2-7b -d fp16 --draft ${E}/eagle-llama2-chat-7b.json --kv-budget 53GiB LINES
  "KV Cache is allocated. #tokens: 20480, K size: 5.00 GB, V size: 5.00 GB"
  "KV Cache is allocated. #tokens: 20480, K size: 0.16 GB, V size: 0.16 GB")
# Llama-3.1-8B-Instruct, fp16, EAGLE-3 draft jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B, steps 5, topk 8, 32 draft tokens, with
# the docs' own "--mem-fraction 0.6" (argparse's prefix of --mem-fraction-static): rest = 45.51 - 0.4 x 78.58 = 14.08 GiB (13 GiB
# given) against the cap's 20480 x 131072 B = 2.5 GiB (29796 tokens without the cap). Target K: 20481 x 8 x 128 x 32 x 2 B =
# 1,342,242,816 B = 1.25 GiB; draft K: 20481 x 8 x 128 x 1 x 2 B = 41,945,088 B = 0.04 GiB.
kvlab_expect_lines(ARGS kvcalc --engine sglang@0.5.2 --engine-cmd "python3 -m sglang.launch_server --model meta-llama/Llama-3.1-8B-Instruct  --speculative-algorithm EAGLE3 --speculative-draft-model-path jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B --speculative-num-steps 5 --speculative-eagle-topk 8 --speculative-num-draft-tokens 32 --mem-fraction 0.6 --cuda-graph-max-bs 2 --dtype float16 --max-total-tokens 20480 --max-running-requests 128"
                        -m llama-3.1-8b -d fp16 --draft ${E}/eagle3-llama3.1-8b.json --kv-budget 13GiB LINES
  "KV Cache is allocated. #tokens: 20480, K size: 1.25 GB, V size: 1.25 GB"
  "KV Cache is allocated. #tokens: 20480, K size: 0.04 GB, V size: 0.04 GB")
# MiMo-7B-RL with its own MTP layer (EAGLE without a draft path: the model's MTP layer, --draft mtp:1), bf16, steps 1, topk 1, 2 draft
# tokens, --mem-fraction 0.5 (the GPU shared with the earlier cells' servers): rest = 32.25 - 0.5 x 46.55 = 8.98 GiB (8 GiB given)
# against the cap's 20480 x 147456 B = 2.81 GiB (20964 tokens without the cap). Target K: 20481 x 8 x 128 x 36 layers x 2 B =
# 1,510,023,168 B = 1.41 GiB; the MTP layer's K: 20481 x 8 x 128 x 1 x 2 B = 0.04 GiB.
kvlab_expect_lines(ARGS kvcalc --engine sglang@0.5.2 --engine-cmd "python3 -m sglang.launch_server --model-path XiaomiMiMo/MiMo-7B-RL --host 0.0.0.0 --trust-remote-code --speculative-algorithm EAGLE --speculative-num-steps 1 --speculative-eagle-topk 1 --speculative-num-draft-tokens 2 --mem-fraction 0.5 --max-total-tokens 20480 --max-running-requests 128"
                        --config ${E}/mimo-7b-rl.json --kv-budget 8GiB LINES
  "KV Cache is allocated. #tokens: 20480, K size: 1.41 GB, V size: 1.41 GB"
  "KV Cache is allocated. #tokens: 20480, K size: 0.04 GB, V size: 0.04 GB")

# vLLM refuses -pp > 1 with a speculative draft in every release kvlab knows: SpeculativeConfig._verify_args checks the draft against
# the target's pipeline_parallel_size and an EAGLE head does not support pipeline parallel (ModelConfig.verify_with_parallel_config's
# NotImplementedError), before any pool: the line, no block or token count, and the note naming the docs' "vllm<=0.15.0".
kvlab_expect(RC 0 ARGS kvcalc -m llama-3.1-8b --engine vllm --kv-budget 51.629GiB --context 8192 --draft ${E}/eagle-llama3.1-8b.json --pp 2
             OUT "llama-3\\.1-8b  NotImplementedError: Pipeline parallelism is not supported for this model\\. Supported models implement the `SupportsPP` interface\\."
                 "vLLM v0\\.10\\.2 refuses -pp 2 with the draft eagle-llama3\\.1-8b" "vllm PR #50514"
                 "--kv-cache-dtype auto -pp 2  512\\.00 MiB  +-  +-  +-\n"
             NOT_OUT "GPU KV cache size")
kvlab_expect(RC 0 ARGS kvcalc --engine vllm@0.7.3 --engine-cmd "vllm serve meta-llama/Llama-3.1-8B --max-model-len 8192 -pp 2 --speculative-config '{\"method\": \"eagle\", \"model\": \"yuhuili/EAGLE-LLaMA3.1-Instruct-8B\", \"num_speculative_tokens\": 5}'"
             --draft ${E}/eagle-llama3.1-8b.json --kv-budget 51.629GiB
             OUT "NotImplementedError: Pipeline parallelism is not supported for this model\\." "vLLM v0\\.7\\.3 refuses -pp 2"
             NOT_OUT "# GPU blocks")
kvlab_expect(RC 0 ARGS kvcalc --engine-cmd "vllm serve meta-llama/Llama-3.1-8B --max-model-len 8192 --pipeline-parallel-size 2 --speculative-config '{\"method\": \"eagle\", \"model\": \"yuhuili/EAGLE-LLaMA3.1-Instruct-8B\", \"num_speculative_tokens\": 5}'"
             --draft ${E}/eagle-llama3.1-8b.json --kv-budget 51.629GiB
             OUT "llama-3\\.1-8b  NotImplementedError: Pipeline parallelism is not supported for this model\\." NOT_OUT "GPU KV cache size")
# TensorRT-LLM 1.2.0rc2 with pp_size 2 and a draft: still sized (the draft's layer on the last rank), and the note says that its
# PyTorch executor refuses a separate drafter under pipeline parallel (py_executor.py; NVIDIA/TensorRT-LLM issue #9009).
kvlab_expect(RC 0 ARGS kvcalc -m llama-3.1-8b --engine trtllm --kv-budget 51.629GiB --context 8192 --draft ${E}/eagle-llama3.1-8b.json --pp 2
             OUT "--pp with a draft: TensorRT-LLM 1\\.2\\.0rc2 refuses a separate drafter" "Drafting is not supported for selected executor loop")

# vLLM v0.10.x (V1 only) refuses a separate draft model: SpeculativeConfig.__post_init__ detects no EAGLE ("eagle-"/"eagle3" not in
# the name), medusa, mlp_speculator or MTP, sets "draft_model" and raises; an explicit "method": "draft_model" is refused too.
# --draft llama-3.2-1b (16 layers, no EAGLE name) is a draft model; v0.15.2 (after vllm PR #24322) sizes it in the target's pool.
kvlab_expect(RC 0 ARGS kvcalc -m llama-3.1-8b --engine vllm --kv-budget 51.629GiB --context 8192 --draft llama-3.2-1b
             OUT "llama-3\\.1-8b  NotImplementedError: Speculative decoding with draft model is not supported yet\\." "vLLM v0\\.10\\.2 refuses the separate draft model llama-3\\.2-1b"
             NOT_OUT "GPU KV cache size")
kvlab_expect(RC 0 ARGS kvcalc --engine-cmd "vllm serve meta-llama/Llama-3.1-8B --max-model-len 8192 --speculative-config '{\"method\": \"draft_model\", \"model\": \"meta-llama/Llama-3.2-1B\", \"num_speculative_tokens\": 5}'"
             --draft llama-3.2-1b --kv-budget 51.629GiB
             OUT "NotImplementedError: Speculative decoding with draft model is not supported yet\\." NOT_OUT "GPU KV cache size")
kvlab_expect_lines(ARGS kvcalc --engine vllm@0.15.2 --engine-cmd "vllm serve meta-llama/Llama-3.1-8B --max-model-len 8192 --speculative-config '{\"model\": \"meta-llama/Llama-3.2-1B\", \"num_speculative_tokens\": 5}'"
                   --draft llama-3.2-1b --kv-budget 51.629GiB LINES "GPU KV cache size: 281,952 tokens")
