# Runs `kvlab gpu attention` on a tiny grid and checks the outcome this build and machine must give:
# without CUDA: exit 1, "built without CUDA"; CUDA but no device: exit 1, "no CUDA device present";
# CUDA and a device: exit 0 with every correctness check passed and a timing row per variant.
# Usage: cmake -DKVLAB=<kvlab binary> -DCUDA_ENABLED=ON|OFF -P cli_gpu_attention.cmake
execute_process(
  COMMAND ${KVLAB} gpu attention --heads 8 --kv-heads 2 --head-dim 64 --batch 2 --context 300
          --attention native,mha,mqa --warmup 1 --repeats 3 --format csv
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "exit ${rc}\nstdout:\n${out}\nstderr:\n${err}")
if(NOT CUDA_ENABLED)
  if(NOT rc EQUAL 1 OR NOT err MATCHES "kvlab: error: this kvlab was built without CUDA \\(configure with -DKVLAB_CUDA=ON")
    message(FATAL_ERROR "expected exit 1 and 'built without CUDA' from a build without CUDA")
  endif()
elseif(err MATCHES "no CUDA device present")
  if(NOT rc EQUAL 1 OR NOT err MATCHES "^kvlab: error: no CUDA device present \\(cudaGetDeviceCount: ")
    message(FATAL_ERROR "expected exit 1 and one 'kvlab: error: no CUDA device present' line without a device")
  endif()
  message(STATUS "no CUDA device on this machine: checked the message; the timing run is owed")
else()
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "expected exit 0 on a machine with a CUDA device")
  endif()
  # 3 variants x 4 check cases x 2 paths, every one passed; one timing row per variant.
  string(REGEX MATCHALL "\n(native|mha|mqa),[0-9]+,fp16,(cached|uncached),[^\n]*,yes" passed "${out}")
  string(REGEX MATCHALL "\n(native|mha|mqa),[0-9]+,fp16,2,300,[0-9]+,[0-9.]+" timed "${out}")
  list(LENGTH passed n_passed)
  list(LENGTH timed n_timed)
  if(NOT n_passed EQUAL 24 OR NOT n_timed EQUAL 3)
    message(FATAL_ERROR "expected 24 passed checks and 3 timing rows, found ${n_passed} and ${n_timed}")
  endif()
endif()
