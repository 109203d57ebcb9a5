# CLI tests of `kvlab serve --preempt swap` and `--kv-dtype`: the report's swap and narrow-pool figures,
# the swap columns of a trace and `kvlab trace summary` reading them, and one-line errors with exit 2.
include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)

set(tight serve --requests 8 --prompt-len 16..48 --output-len 16..48 --kv-budget 256KiB --kv-layout paged --threads 1 --quiet)

# swap: every preemption swapped out and back (a host tier the pool's size); --check: tokens equal to solo runs
kvlab_expect(RC 0 ARGS ${tight} --preempt swap --check
             OUT "\nswap: [0-9]+ of [0-9]+ preemptions? swapped out" "on the host link at 31.508 GB/s modelled"
                 "recompute vs swap for one sequence of tiny-llama" "tokens discarded by preemption +0\n"
                 "swaps refused \\(host full\\): recomputed +0\n")
string(REGEX MATCH "preemptions swapped out / in +([0-9]+) / ([0-9]+)" _ "${KVLAB_OUT}")
if(NOT CMAKE_MATCH_1 OR NOT CMAKE_MATCH_1 STREQUAL CMAKE_MATCH_2 OR CMAKE_MATCH_1 EQUAL 0)
  message(SEND_ERROR "serve --preempt swap: swapped out ${CMAKE_MATCH_1}, in ${CMAKE_MATCH_2}; expected the same, at least 1")
endif()
string(REGEX MATCH "check: tokens equal to solo runs +([0-9]+) / ([0-9]+)" _ "${KVLAB_OUT}")
if(NOT CMAKE_MATCH_1 STREQUAL CMAKE_MATCH_2)
  message(SEND_ERROR "serve --preempt swap --check: ${CMAKE_MATCH_1} of ${CMAKE_MATCH_2} tokens equal to the solo runs")
endif()
# a host tier of 1 KiB holds no sequence of 1+ tokens' 2 KiB: every swap refused, recomputed instead
kvlab_expect(RC 0 ARGS ${tight} --preempt swap --host-kv-budget 1KiB OUT "preemptions swapped out / in +0 / 0\n")
# the trace carries the swap columns, and trace summary the swap rows
kvlab_expect(RC 0 ARGS ${tight} --preempt swap --trace ${WORK}/swap.csv)
kvlab_expect(RC 0 ARGS trace summary ${WORK}/swap.csv OUT "KV swapped out to host" "modelled swap time \\(ms, host link\\)")
# q8_0: 544 B per token row (2048 x 34 / 128); 256 KiB = 262144 / 544 = 481.9 rows, whole blocks of 16: 480
kvlab_expect(RC 0 ARGS ${tight} --kv-dtype q8_0
             OUT "metric +paged q8_0 +paged fp32" "KV pool \\(token rows\\) +480 +128\n" "\nq8_0 pool: 480 token rows"
                 "quality vs fp32 K and V on the same tokens: max \\|delta logit\\|")

kvlab_expect(RC 2 ARGS serve --host-kv-budget 1MiB ERR "^kvlab: error: --host-kv-budget: the host tier is swap preemption's; expected --preempt swap with it\n$")
kvlab_expect(RC 2 ARGS serve --preempt swap --host-bandwidth 25GB ERR "^kvlab: error: --host-bandwidth: '25GB' is not a bandwidth; expected a size per second")
kvlab_expect(RC 2 ARGS serve --preempt swap --host-bandwidth 25/s ERR "--host-bandwidth: '25' has no unit")
kvlab_expect(RC 2 ARGS serve --kv-dtype int4 ERR "--kv-dtype int4: the cache stores")
kvlab_expect(RC 2 ARGS serve --kv-dtype fp16,q8_0 ERR "--kv-dtype: 'fp16,q8_0' lists several formats")
kvlab_expect(RC 2 ARGS serve --kv-dtype fp16 --kv-scale token-head ERR "--kv-scale: scales apply to fp8_e4m3, fp8_e5m2 and int8 pools")
