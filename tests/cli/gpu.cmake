# `kvlab gpu attention`: usage errors come before any device work in every build; then the outcome this
# build and machine must give: without CUDA exit 1 "built without CUDA"; CUDA but no device exit 1
# "no CUDA device present"; CUDA and a device exit 0 with every correctness check passed and timings.
# Called with -DCUDA_ENABLED=ON|OFF besides common.cmake's arguments.
include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)

kvlab_expect(RC 2 ARGS gpu attention --heads 8 --head-dim 100 --batch 1 --context 64
             ERR "^kvlab: error: .*head dim 100 is not supported by the CUDA kernel; expected a multiple of 8 up to 256")
kvlab_expect(RC 2 ARGS gpu attention --model llama-3-8b --attention gqa:5
             ERR "'gqa:5' needs a KV head count that divides the 32 query heads")
kvlab_expect(RC 2 ARGS gpu attention --model llama-3-8b --dtype fp32
             ERR "dtype fp32 is not supported on the GPU path; expected fp16 or bf16")
kvlab_expect(RC 2 ARGS gpu attention --batch 1
             ERR "give --model PRESET, or --heads and --head-dim")
kvlab_expect(RC 2 ARGS gpu attention --model llama-3-8b --kernel tensor
             ERR "^kvlab: error: --kernel 'tensor': expected auto, cuda-cores or tensor-cores\n$")
# The tensor-core kernel's tiles hold q and the output sums in registers, V's columns in blocks of 64.
kvlab_expect(RC 2 ARGS gpu attention --heads 8 --head-dim 96 --kernel auto,tensor-cores
             ERR "^kvlab: error: --kernel tensor-cores: head dim 96 is not supported by the tensor-core kernel; expected 64 or 128")

# Issue 50's flags: every value checked by the flag that sets it, before the device.
kvlab_expect(RC 2 ARGS gpu attention --model llama-3-8b --kv-layout paged --block-size 16,24
             ERR "^kvlab: error: --block-size: block size 24 is not supported; expected a power of two from 16 to 1024 tokens\n$")
kvlab_expect(RC 2 ARGS gpu attention --model llama-3-8b --kv-layout contiguous,ring
             ERR "^kvlab: error: --kv-layout 'ring': expected contiguous or paged\n$")
kvlab_expect(RC 2 ARGS gpu attention --model llama-3-8b --kv-layout paged --block-order random
             ERR "^kvlab: error: --block-order 'random': expected shuffled or in-order\n$")
kvlab_expect(RC 2 ARGS gpu attention --model llama-3-8b --kv-dtype int4
             ERR "^kvlab: error: --kv-dtype 'int4': expected dtype \\(the --dtype\\), fp16, bf16, fp8_e4m3 or fp8\n$")
kvlab_expect(RC 2 ARGS gpu attention --model llama-3-8b --kv-dtype bf16 --dtype fp16
             ERR "^kvlab: error: --kv-dtype bf16: K and V are stored in the --dtype or in fp8_e4m3, and --dtype fp16 is not bf16")

# Paged (blocks of 16 and 128 tokens: T 300 ends in a partial block of each) and fp8 beside contiguous fp16.
set(tiny gpu attention --heads 8 --kv-heads 2 --head-dim 64 --batch 2 --context 300
         --attention native,mha,mqa --kernel cuda-cores,tensor-cores --kv-layout contiguous,paged --block-size 16,128
         --kv-dtype dtype,fp8 --warmup 1 --repeats 3 --format csv)
if(NOT CUDA_ENABLED)
  kvlab_expect(RC 1 ARGS ${tiny}
               ERR "^kvlab: error: this kvlab was built without CUDA \\(configure with -DKVLAB_CUDA=ON on a machine with nvcc\\)\n$")
  kvlab_expect(RC 1 ARGS gpu attention --model llama-3-8b --batch 64 --context 8k ERR "built without CUDA")
  return()
endif()

# The CUDA module is opened by the GPU commands only: other commands never map the CUDA runtime. glibc's
# loader lists every object it opens under LD_DEBUG=files; the GPU command shows the check sees dlopen.
foreach(args IN ITEMS "gpu;attention;--model;llama-3-8b" "simulate;-q;-m;stories15m;-p;2;-n;2;--threads;1" "kvcalc")
  execute_process(COMMAND ${CMAKE_COMMAND} -E env LD_DEBUG=files ${KVLAB} ${args}
                  OUTPUT_QUIET ERROR_VARIABLE loader_log)
  string(FIND "${loader_log}" "libkvlab_cuda.so" at)
  if(args MATCHES "^gpu" AND at EQUAL -1)
    message(FATAL_ERROR "kvlab ${args} did not open libkvlab_cuda.so:\n${loader_log}")
  elseif(NOT args MATCHES "^gpu" AND NOT at EQUAL -1)
    message(FATAL_ERROR "kvlab ${args} opened the CUDA module, which only GPU commands need")
  endif()
endforeach()

execute_process(COMMAND ${KVLAB} ${tiny} RESULT_VARIABLE probe_rc OUTPUT_QUIET ERROR_VARIABLE probe_err)
if(probe_err MATCHES "no CUDA device present")
  kvlab_expect(RC 1 ARGS ${tiny} ERR "^kvlab: error: no CUDA device present \\(cudaGetDeviceCount: [^\n]+\\)\n$")
  kvlab_expect(RC 1 ARGS gpu attention --model llama-3-8b --batch 64 --context 8k ERR "no CUDA device present")
  message(STATUS "no CUDA device on this machine: checked the message; the kernels' run is owed")
  return()
endif()

# The tensor-core kernel needs compute capability 8.0+ and a module compiled for it; where it cannot run,
# --kernel tensor-cores is a usage error naming why, and the CUDA cores are checked alone.
execute_process(COMMAND ${KVLAB} gpu attention --heads 16 --kv-heads 1 --head-dim 64 --batch 1 --context 16
                        --kernel tensor-cores --warmup 0 --repeats 1 --format csv
                RESULT_VARIABLE tc_rc OUTPUT_QUIET ERROR_VARIABLE tc_err)
if(NOT tc_rc EQUAL 0)
  if(NOT tc_err MATCHES "^kvlab: error: --kernel tensor-cores: (the device's compute capability is [0-9.]+|this CUDA module was compiled)")
    message(FATAL_ERROR "--kernel tensor-cores failed (rc ${tc_rc}) without saying the device or module cannot run it:\n${tc_err}")
  endif()
  message(STATUS "tensor cores cannot run here (${tc_err}): checking the CUDA cores alone")
  list(TRANSFORM tiny REPLACE "^cuda-cores,tensor-cores$" "cuda-cores")
endif()
kvlab_expect(RC 0 ARGS ${tiny})
# Per kernel and variant, 2 KV dtypes x 3 layouts: contiguous fp16 4 check cases x 2 paths, the other 5
# the cached path only (4 each): 8 + 20 = 28, every one passed; 6 timing rows, the kernel column naming the
# one asked for (both run at head dim 64 on compute capability 8.0+).
set(kv "(fp16|fp8_e4m3),(contiguous|paged 16|paged 128)")
string(REGEX MATCHALL "\n(native|mha|mqa),[0-9]+,(cuda-cores|tensor-cores),fp16,${kv},(cached|uncached),[^\n]*,yes" passed
       "${KVLAB_OUT}")
string(REGEX MATCHALL "\n(native|mha|mqa),[0-9]+,cuda-cores,fp16,${kv},2,300,[0-9]+,[0-9.]+" timed_cc "${KVLAB_OUT}")
string(REGEX MATCHALL "\n(native|mha|mqa),[0-9]+,tensor-cores,fp16,${kv},2,300,[0-9]+,[0-9.]+" timed_tc "${KVLAB_OUT}")
# The ratio columns, the last two: "vs contiguous" on paged rows, "vs 16-bit KV" on fp8 rows, empty (the "-"
# cells) elsewhere.
string(REGEX MATCHALL "[^\n]+" lines "${KVLAB_OUT}")
set(kinds "fp16,contiguous,2,300,[^\n]*,,$" "fp16,paged (16|128),2,300,[^\n]*,[0-9.]+,$"
          "fp8_e4m3,contiguous,2,300,[^\n]*,,[0-9.]+$" "fp8_e4m3,paged (16|128),2,300,[^\n]*,[0-9.]+,[0-9.]+$")
set(kind_counts "")
foreach(kind IN LISTS kinds)
  set(n 0)
  foreach(line IN LISTS lines)
    if(line MATCHES "^(native|mha|mqa),[0-9]+,(cuda-cores|tensor-cores),fp16,${kind}")
      math(EXPR n "${n} + 1")
    endif()
  endforeach()
  list(APPEND kind_counts ${n})
endforeach()
list(LENGTH passed n_passed)
list(LENGTH timed_cc n_cc)
list(LENGTH timed_tc n_tc)
set(n_kernels 2)
if(NOT tc_rc EQUAL 0)
  set(n_kernels 1)
endif()
math(EXPR want_passed "${n_kernels} * 84")
math(EXPR want_tc "(${n_kernels} - 1) * 18")
# per kernel: 3 contiguous fp16 rows, 6 paged fp16, 3 contiguous fp8, 6 paged fp8
math(EXPR want_kinds_3 "${n_kernels} * 3")
math(EXPR want_kinds_6 "${n_kernels} * 6")
set(want_kinds ${want_kinds_3} ${want_kinds_6} ${want_kinds_3} ${want_kinds_6})
if(NOT n_passed EQUAL want_passed OR NOT n_cc EQUAL 18 OR NOT n_tc EQUAL want_tc OR NOT kind_counts STREQUAL want_kinds)
  message(FATAL_ERROR "expected ${want_passed} passed checks, 18 timing rows per kernel and rows with ratios "
                      "${want_kinds}, found ${n_passed}, ${n_cc}, ${n_tc} and ${kind_counts}\n${KVLAB_OUT}")
endif()
