# CLI test of the trained models (models/, issue 14): the presets run their checkpoints and tokenizer,
# write the text their PyTorch reference wrote (models/reference.json, greedy_text), and --eval gives the
# reference's held-out perplexity.
include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)

# greedy text, cached and uncached in lockstep; the expected words are PyTorch's (reference.json)
# (README's example.) Tokens through the model: cached 5 prompt + 47 decode = 52; uncached re-runs the
# whole sequence each step, 5 + 6 + ... + 52 = (5 + 52) x 48 / 2 = 1368.
# Its matrices are all read in place from the llama2.c file: per layer wq 192x192, wk and wv 64x192, wo
# 192x192, w1 and w3 320x192, w2 192x320 = 282624 floats, x 4 layers + the tied embedding 512x192 =
# 1228800 floats = 4915200 B = 4.6875 MiB.
kvlab_expect(RC 0 ARGS simulate --model tiny-llama --prompt "Once upon a time" -n 48
             OUT "^Once upon a time, in a small village, there lived a little boy named Tom\\. He lived with his"
                 "tokens through the model +52 +1368 " "both modes produced the same logits"
                 "checkpoint matrices: all 4\\.69 MiB read in place")
# issue 51: a trained model with a tokenizer and no prompt option decodes a sentence, not random ids
# (PyTorch's greedy continuation of it, reference.json); --prompt-len keeps random ids
kvlab_expect(RC 0 ARGS simulate --model tiny-llama -n 8 --threads 1 -q
             OUT "^Once upon a time, in a small villa" "prompt 5 tokens, 8 steps")
kvlab_expect(RC 0 ARGS simulate --model tiny-llama -p 6 -n 2 --threads 1 -q
             OUT "prompt 6 tokens, 2 steps" NOT_OUT "^Once upon a time")
# printed text is valid UTF-8: byte-fallback tokens <0xC5> (id 0xC5 + 3 = 200) twice spell no character;
# they print U+FFFD (EF BF BD) for each, never the raw bytes C5 C5 that run.c's terminal would show as
# mojibake
kvlab_expect(RC 0 ARGS simulate --model tiny-llama --prompt-ids 1,200,200 -n 2 --threads 1 -q)
string(HEX "${KVLAB_OUT}" hex)
if(NOT hex MATCHES "^efbfbdefbfbd" OR hex MATCHES "c5c5")
  message(SEND_ERROR "--prompt-ids 1,200,200: expected U+FFFD twice for the lone C5 bytes, got ${hex}")
endif()
# the modelled time on the default GPU sits beside the wall time in the headline; --gpu names another
kvlab_expect(RC 0 ARGS simulate --model tiny-llama -n 8 --threads 1 -q --gpu a100
             OUT "cached decoding: [0-9.]+x (faster|slower) here \\(wall, one run[^)]*\\).*modelled on NVIDIA A100 SXM4 80GB"
                 "modelled time on a100-sxm-80gb \\(ms\\)" "one run on a host with load average")
kvlab_expect(RC 2 ARGS simulate --model tiny-llama -n 8 --gpu h1000 ERR "--gpu: unknown GPU 'h1000'; did you mean: .*h100-sxm-80gb")
# --repeat: the wall figures over N runs, the counted ones once
kvlab_expect(RC 0 ARGS simulate --model tiny-llama -n 4 --threads 1 -q --repeat 3
             OUT "median of 3 runs: [0-9.]+-[0-9.]+x" "wall time \\(ms\\), median \\(min-max\\) of 3 runs" "the median of 3 runs")
kvlab_expect(RC 2 ARGS simulate --model tiny-llama -n 4 --repeat 0 ERR "--repeat: 0; expected 1 or more runs")
# --logits: (steps, vocab) float32 rows after a preamble of 10 + 61 + 1 = 72 bytes padded to 128 (64-byte
# alignment): 128 + 3 x 512 x 4 = 6272 bytes; never over an input, the preset's tokenizer included (a copy here)
kvlab_expect(RC 0 ARGS simulate --model tiny-llama -n 3 --threads 1 -q --logits "${WORK}/logits.npy"
             OUT "logits: 3 rows .* of 512 float32 values")
file(SIZE "${WORK}/logits.npy" npy_size)
file(READ "${WORK}/logits.npy" npy_head OFFSET 10 LIMIT 118)  # after magic, version and length (bytes 0 and 1 among them)
if(NOT npy_size EQUAL 6272 OR NOT npy_head MATCHES "^{'descr': '<f4', 'fortran_order': False, 'shape': \\(3, 512\\), } +\n$")
  message(SEND_ERROR "logits.npy: ${npy_size} bytes, header ${npy_head}")
endif()
file(COPY_FILE "${MODELS}/tokenizer.bin" "${WORK}/tokenizer.bin")
kvlab_expect(RC 2 ARGS simulate --model tiny-llama -n 3 --tokenizer "${WORK}/tokenizer.bin" --logits "${WORK}/tokenizer.bin"
             ERR "tokenizer.bin")
file(SHA256 "${WORK}/tokenizer.bin" copy_sum)
file(SHA256 "${MODELS}/tokenizer.bin" model_sum)
if(NOT copy_sum STREQUAL model_sum)
  message(SEND_ERROR "--logits over the tokenizer changed it")
endif()

# GPT-2's safetensors: only wte (512x128) and wpe (256x128) are stored as kvlab holds them, 98304 floats =
# 384 KiB in place; each layer's q, k, v, o (4 x 128x128), c_fc and c_proj (2 x 512x128) = 196608 floats,
# x 5 layers = 983040 floats = 3.75 MiB transposed or sliced into memory of their own; 4.125 MiB in all.
kvlab_expect(RC 0 ARGS simulate --model tiny-gpt2 --prompt "Once upon a time" -n 24 --threads 1
             OUT "^Once upon a time, in a small village, there lived a kind girl named Zoe\\."
                 "checkpoint matrices: 384\\.00 KiB of 4\\.12 MiB read in place.*the other 3\\.75 MiB converted")

# held-out perplexity: PyTorch says 1.19179 (tiny-llama) and 1.21955 (tiny-gpt2) over 254 tokens
kvlab_expect(RC 0 ARGS simulate --model tiny-llama --eval ${MODELS}/heldout.txt
             OUT "255 +1 +254 +44\\.566[0-9] +0\\.17545[0-9] +1\\.1917[89][0-9]")
kvlab_expect(RC 0 ARGS simulate --model tiny-gpt2 --eval ${MODELS}/heldout.txt -f json
             OUT "\"perplexity\": 1\\.2195[45]" "\"scored\": 254")

# --eval needs a tokenizer, and decodes nothing
kvlab_expect(RC 2 ARGS simulate --model stories260k --eval ${MODELS}/heldout.txt ERR "--eval: the text needs --tokenizer")
kvlab_expect(RC 2 ARGS simulate --model tiny-llama --eval ${MODELS}/heldout.txt --trace "${WORK}/t.csv"
             ERR "--eval excludes --trace: give one or the other")
kvlab_expect(RC 2 ARGS simulate --model tiny-llama --eval ${MODELS}/heldout.txt --prompt-len 4 ERR "--prompt-len excludes --eval: give one or the other")
kvlab_expect(RC 2 ARGS simulate --model tiny-llama --eval "${WORK}/missing.txt" ERR "cannot open the eval text file")

# --kv-dtype: the held-out text through caches stored narrower. The fp32 row is PyTorch's 1.1917x; fp16 rounds
# each K and V value by at most 2^-11 of itself and moves the perplexity by well under 0.01 %.
kvlab_expect(RC 0 ARGS simulate --model tiny-llama --eval ${MODELS}/heldout.txt --kv-dtype fp16,q4_0
             OUT "fp32 full cache \\(reference\\) +255 +1 +254 +44\\.566[0-9] +0\\.17545[0-9] +1\\.1917[89][0-9] +2\\.00 KiB"
                 "fp16 +255 +1 +254 .* 1\\.00 KiB +[+-]0\\.00[0-9]+% .* 100\\.0%" "q4_0 +255 +1 +254 .* 288 B")
# a 32-position window with 4 sinks against the full cache, on the same text
kvlab_expect(RC 0 ARGS simulate --model tiny-llama --eval ${MODELS}/heldout.txt --window 32 --sink-tokens 4
             OUT "fp32 full cache \\(reference\\) +255 .* 1\\.1917[89][0-9]" "fp32, window 32 \\+ 4 sinks +255 +1 +254 ")
# side by side on the greedy decode: tiny-llama's 4 layers x 2 KV heads x 32 = 256 values of K and of V per token:
# fp32 2 KiB, fp16 1 KiB, q8_0 2 x 4 x (64 / 32 x 34 B) = 544 B
kvlab_expect(RC 0 ARGS simulate --model tiny-llama --prompt "Once upon a time" -n 16 -q --threads 1 --kv-dtype fp32,fp16,q8_0
             OUT "^Once upon a time" "fp32 +fp32 +2\\.00 KiB .* reference" "fp16 +fp32 +1\\.00 KiB" "q8_0 +fp32 +544 B .*100\\.0%")
# narrow weights on the same decode: tiny-llama's matmuls hold 4 layers x (2 x 192x192 (q, o) + 2 x 64x192 (k, v) + 3 x 320x192
# (gate, up, down)) + the classifier 512x192 = 1,228,800 weights; a decode step also reads 7,680 B of fp32 (9 norms of 192 and one
# embedding row): fp32 4 x 1,228,800 + 7,680 = 4,922,880 B = 4.69 MiB, bf16 2 x 1,228,800 + 7,680 = 2,465,280 B = 2.35 MiB,
# q8_0 1,228,800 / 32 x 34 B + 7,680 = 1,313,280 B = 1.25 MiB
kvlab_expect(RC 0 ARGS simulate --model tiny-llama --prompt "Once upon a time" -n 16 -q --threads 1 --weight-dtype fp32,bf16,q8_0
             OUT "^Once upon a time" "Weight storage on tiny-llama" "fp32 +fp32 .* 4\\.69 MiB .* reference" "fp32 +bf16 .* 2\\.35 MiB .*100\\.0%"
                 "fp32 +q8_0 .* 1\\.25 MiB ")
# --no-quality: the same list run alone (the bytes as above, by hand), no quality columns filled, a note saying so;
# --eval measures nothing else, so it refuses the flag
kvlab_expect(RC 0 ARGS simulate --model tiny-llama --prompt "Once upon a time" -n 16 -q --threads 1 --weight-dtype fp32,q8_0 --no-quality
             OUT "^Once upon a time" "fp32 +fp32 .* 4\\.69 MiB +[0-9.]+ +1\\.00x +- " "fp32 +q8_0 .* 1\\.25 MiB .* not measured"
                 "--no-quality: each format ran alone")
kvlab_expect(RC 2 ARGS simulate --model tiny-llama --eval ${MODELS}/heldout.txt --no-quality ERR "--eval excludes --no-quality")
# narrow weights alone: the checkpoint's fp32 matrices are read in place, only to be rounded (no fp32 copy in
# memory), and the decode still writes PyTorch's greedy text (the fp32 reference's words, as above)
kvlab_expect(RC 0 ARGS simulate --model tiny-llama --prompt "Once upon a time" -n 48 -q --threads 1 --weight-dtype q8_0 --no-quality
             OUT "^Once upon a time, in a small village, there lived a little boy named Tom\\. He lived with his")
# and their perplexity beside the fp32 model's (1.1918, the PyTorch value above)
kvlab_expect(RC 0 ARGS simulate --model tiny-llama --eval ${MODELS}/heldout.txt --weight-dtype bf16
             OUT "fp32 weights, fp32 full cache \\(reference\\) +255 +1 +254 .* 1\\.1917[89][0-9]" "fp32, bf16 weights +255 +1 +254 ")
