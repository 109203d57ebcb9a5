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

set(tiny gpu attention --heads 8 --kv-heads 2 --head-dim 64 --batch 2 --context 300
         --attention native,mha,mqa --kernel cuda-cores,tensor-cores --warmup 1 --repeats 3 --format csv)
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
# 2 kernels x 3 variants x 4 check cases x 2 paths, every one passed; one timing row per kernel and
# variant, the kernel column naming the one asked for (both run at head dim 64 on compute capability 8.0+).
string(REGEX MATCHALL "\n(native|mha|mqa),[0-9]+,(cuda-cores|tensor-cores),fp16,(cached|uncached),[^\n]*,yes" passed
       "${KVLAB_OUT}")
string(REGEX MATCHALL "\n(native|mha|mqa),[0-9]+,cuda-cores,fp16,2,300,[0-9]+,[0-9.]+" timed_cc "${KVLAB_OUT}")
string(REGEX MATCHALL "\n(native|mha|mqa),[0-9]+,tensor-cores,fp16,2,300,[0-9]+,[0-9.]+" timed_tc "${KVLAB_OUT}")
list(LENGTH passed n_passed)
list(LENGTH timed_cc n_cc)
list(LENGTH timed_tc n_tc)
set(n_kernels 2)
if(NOT tc_rc EQUAL 0)
  set(n_kernels 1)
endif()
math(EXPR want_passed "${n_kernels} * 24")
math(EXPR want_tc "(${n_kernels} - 1) * 3")
if(NOT n_passed EQUAL want_passed OR NOT n_cc EQUAL 3 OR NOT n_tc EQUAL want_tc)
  message(FATAL_ERROR "expected ${want_passed} passed checks and 3 timing rows per kernel, found ${n_passed}, ${n_cc} and "
                      "${n_tc}\n${KVLAB_OUT}")
endif()
