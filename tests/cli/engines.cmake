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
