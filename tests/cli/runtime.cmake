# The C++ runtime a kvlab process loads. With KVLAB_STATIC_RUNTIME (GCC) libstdc++, libgcc and fmt are
# inside the binary: the shared copies would keep ~1.8 MiB resident in every command, which simulate's
# memory target counts (docs/performance.md, "Resident memory"). glibc's loader lists every object it
# opens under LD_DEBUG=files. Called with -DSTATIC_RUNTIME=ON|OFF besides common.cmake's arguments.
include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)

execute_process(COMMAND ${CMAKE_COMMAND} -E env LD_DEBUG=files ${KVLAB} simulate -q -m stories15m -p 2 -n 2 --threads 1
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE loader_log)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kvlab simulate failed (exit ${rc}):\n${loader_log}")
endif()
# the loader's own lines name every object it maps: "file=libc.so.6 [0];  needed by ..."; the C library
# is loaded by every build (the OpenMP runtime is not: libgomp with g++, libomp with clang)
if(NOT loader_log MATCHES "file=libc\\.so")
  message(FATAL_ERROR "LD_DEBUG=files shows no libc: the check cannot see what the loader opens\n${loader_log}")
endif()
foreach(lib IN ITEMS libstdc++ libfmt libgcc_s)
  string(FIND "${loader_log}" "file=${lib}" at)
  if(STATIC_RUNTIME AND NOT at EQUAL -1)
    message(FATAL_ERROR "kvlab loaded ${lib} though KVLAB_STATIC_RUNTIME links the runtime in:\n${loader_log}")
  endif()
endforeach()
