# The installed library is usable on its own: `cmake --install` to a prefix, then tests/consumer/ (a
# program that includes only <prefix>/include/kvlab/ and links kvlab::kvlab from find_package(kvlab))
# configured, built and run against it. Called with -DBUILD=<build dir> -DSOURCE=<tests/consumer>
# -DWORK=<scratch> -DCXX=<compiler> -DPRESET=<presets/llama-3-8b.json>.
file(REMOVE_RECURSE "${WORK}")
function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()
step("cmake --install" ${CMAKE_COMMAND} --install "${BUILD}" --prefix "${WORK}/prefix")
foreach(dir IN ITEMS include/kvlab/model lib/cmake/kvlab)
  if(NOT IS_DIRECTORY "${WORK}/prefix/${dir}")
    message(FATAL_ERROR "the install has no ${dir}")
  endif()
endforeach()
if(EXISTS "${WORK}/prefix/include/kvlab/kernels/matmul.hpp" OR EXISTS "${WORK}/prefix/include/kvlab/session")
  message(FATAL_ERROR "a private header was installed")
endif()
step("configure the consumer" ${CMAKE_COMMAND} -S "${SOURCE}" -B "${WORK}/build" -DCMAKE_BUILD_TYPE=Release
     -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_PREFIX_PATH=${WORK}/prefix)
step("build the consumer" ${CMAKE_COMMAND} --build "${WORK}/build")
step("run the consumer" "${WORK}/build/kvlab_consumer" "${PRESET}")
# Llama-3-8B: 32 layers x 8 KV heads x 128 dims x 2 (K and V) x 2 bytes (fp16) = 131072 bytes per token
if(NOT out MATCHES "131072 bytes of KV cache per token in fp16")
  message(FATAL_ERROR "unexpected KV bytes:\n${out}")
endif()
# the reference and the fast path agree to ~1e-6 of the logits: every greedy choice is the same
if(NOT out MATCHES "the same token at 12 of 12 steps")
  message(FATAL_ERROR "fast and reference disagree:\n${out}")
endif()
message(STATUS "${out}")
