# CLI tests of simulate's sampling and stopping (--sampler, --stop, end-of-text, --ignore-eos),
# --sink-positions' refusals and kvcalc --encoder-len (issue 47).
# Run by CTest as: cmake -DKVLAB=<kvlab> -DDATA=<tests/data> -DWORK=<scratch dir> -P sampling.cmake
include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)
file(MAKE_DIRECTORY "${WORK}")

set(llama2c simulate -m tiny-llama --sampler llama2c --temperature 0.8 --top-p 0.9 --mode cached --threads 1)
# run.c (llama2.c 350e04f) `run model.bin -z tokenizer.bin -t 0.8 -p 0.9 -s 42 -i "Once upon a time" -n 40` prints
# this line: -n 40 positions = 5 prompt tokens + 36 sampled - 1
kvlab_expect(RC 0 ARGS ${llama2c} --seed 42 -n 36
             OUT "^Once upon a time, there was a kind girl named Zoe\\. She lived in a small house near the hill\\. Zoe loved her blue d\n")
# a stop string that spans several tokens ("girl", " named", " Z"...) ends the text before it; it is not printed
kvlab_expect(RC 0 ARGS ${llama2c} --seed 42 -n 36 --stop "girl named Z" --stop "never written"
             OUT "^Once upon a time, there was a kind \n" "stopped at step [0-9]+ of 36: the text reached a --stop string"
             NOT_OUT "girl")
# end-of-text: run.c with -s 1 -n 256 stops at BOS after 228 sampled tokens; kvlab's 229th token is that BOS
kvlab_expect(RC 0 ARGS ${llama2c} --seed 1 -n 252
             OUT "storms do not last forever\\.\n" "stopped at step 228 of 252: the model wrote end-of-text \\(token 1")
kvlab_expect(RC 0 ARGS ${llama2c} --seed 1 -n 252 --ignore-eos NOT_OUT "stopped at step")

# refusals: exit 2, one line naming the flag
kvlab_expect(RC 2 ARGS ${llama2c} --seed 42 --top-k 5 ERR "^kvlab: error: --top-k: 5; llama2.c's sampler has no top-k")
kvlab_expect(RC 2 ARGS ${llama2c} --seed 0 ERR "^kvlab: error: --seed: 0; expected a seed >= 1 with --sampler llama2c")
kvlab_expect(RC 2 ARGS simulate --prompt-len 4 --steps 3 --stop x ERR "^kvlab: error: --stop: stop strings are matched in the text, which needs --tokenizer")
kvlab_expect(RC 2 ARGS simulate -m tiny-llama -n 3 --window 16 --sink-positions cache ERR "^kvlab: error: --sink-positions cache: .*expected --sink-tokens")
kvlab_expect(RC 2 ARGS simulate -m tiny-gpt2 -n 3 --window 16 --sink-tokens 4 --sink-positions cache
             ERR "^kvlab: error: --sink-positions cache: tiny-gpt2 adds learned positions")

# kvcalc: encoder-decoder models
kvlab_expect(RC 0 ARGS kvcalc --config "${DATA}/whisper-large-v3.json" -d fp16 --context 448
             OUT "234\\.38 MiB per sequence, written once at prefill" "encoder length 1500 frames from max_source_positions")
kvlab_expect(RC 2 ARGS kvcalc --config "${DATA}/byt5-small.json" -d fp16 --context 100 ERR "give --encoder-len N")
kvlab_expect(RC 0 ARGS kvcalc --config "${DATA}/byt5-small.json" -d fp16 --context 100 --encoder-len 2048
             OUT "= 12582912 B = 12(\\.0+)? MiB per sequence")
kvlab_expect(RC 2 ARGS kvcalc -m llama-2-7b --encoder-len 100 ERR "^kvlab: error: --encoder-len 100: no model listed is an encoder-decoder model")
kvlab_expect(RC 2 ARGS simulate --config "${DATA}/t5-small.json" -n 2 ERR "encoder-decoder models \\(t5\\) are not simulated")

# serve stops as simulate does (docs/serving.md, "Stopping early"): the same three stories as above, one
# request each, seeded per request in the workload file. Request 0 is run.c's -s 1 story: 228 sampled
# tokens, then BOS (end-of-text) as the 229th; request 1 reaches "girl named Z" and stops there (its
# text ", there was a kind girl named Z" is 13 tokens of tiny-llama's tokenizer, as simulate's --stop run
# above stops); request 2 runs its 36 tokens. 252 - 229 + 36 - 13 = 46 tokens short of max_tokens.
set(stories "${CMAKE_CURRENT_LIST_DIR}/../../models/stories.jsonl")
set(serve_llama2c serve --workload "${stories}" --sampler llama2c --temperature 0.8 --top-p 0.9 --kv-layout paged --threads 1 -q)
kvlab_expect(RC 0 ARGS ${serve_llama2c} --check -f csv
             OUT "\n0,0,5,252,229,0,228,[^\n]*,end-of-text\n1,0,5,36,13,0,12,[^\n]*,stop\n2,0,5,36,36,0,35,[^\n]*,length\n"
                 "\nstopped_outputs,2\nstopped_end_of_text,1\nstopped_stop_string,1\nunused_max_tokens,46\n")
# --n 3: each output stops on its own; output 0 keeps the request's seed as given, so it is run.c's -s 1
# story again (229 tokens, end-of-text) while the request runs on for its other outputs; --check replays
# every output on the single-sequence path
kvlab_expect(RC 0 ARGS ${serve_llama2c} --n 3 --check -f csv
             OUT "\n0,0,5,252,229,0,[0-9]+,[^\n]*,end-of-text,3,")
# --ignore-eos runs request 0 to its 252 tokens; a --stop on the command line adds to each request's own:
# request 2's story reaches "Zoe loved her blue" (above) within its 36 tokens, request 1 still stops first
kvlab_expect(RC 0 ARGS ${serve_llama2c} --ignore-eos --stop "blue" -f csv
             OUT "\n0,0,5,252,252,0,251,[^\n]*,length\n1,0,5,36,13,0,12,[^\n]*,stop\n2,0,5,36,3[0-5],0,[^\n]*,stop\n")
# beams run to max_tokens: the stop rules do not apply to them, and the report says so
kvlab_expect(RC 0 ARGS ${serve_llama2c} --beam-width 2 -f csv OUT "\n1,0,5,36,36,0,35,[^\n]*,length,2,")
kvlab_expect(RC 0 ARGS ${serve_llama2c} --beam-width 2 OUT "\nbeam search: every beam ran to max_tokens; end-of-text and stop strings")
# refusals: exit 2, one line naming the flag or the file's line
kvlab_expect(RC 2 ARGS serve --model stories260k --requests 2 --stop x ERR "^kvlab: error: --stop: stop strings are matched in the text, which needs --tokenizer")
file(WRITE "${WORK}/empty-stop.jsonl" "{\"prompt\": \"Once\", \"max_tokens\": 4, \"stop\": [\"\"]}\n")
kvlab_expect(RC 2 ARGS serve --workload "${WORK}/empty-stop.jsonl" ERR "empty-stop.jsonl:1: \"stop\": \"\" is not a non-empty string")
file(WRITE "${WORK}/bad-seed.jsonl" "{\"prompt\": \"Once\", \"max_tokens\": 4, \"seed\": -1}\n")
kvlab_expect(RC 2 ARGS serve --workload "${WORK}/bad-seed.jsonl" ERR "bad-seed.jsonl:1: \"seed\": -1 is not a whole number >= 0")
