# CLI test of `kvlab trace plot`: charts from gnuplot (gnuplot-nox), and the message when it is missing.
# Skipped (CTest SKIP_REGULAR_EXPRESSION "skipped: gnuplot") where gnuplot is not installed.
include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)

run_kvlab(0 "" simulate --prompt-len 8 --steps 12 --threads 1 --quiet --trace "${WORK}/run.jsonl")
# without gnuplot: one line naming the package, exit 1 (checked whether or not gnuplot is installed)
execute_process(COMMAND ${CMAKE_COMMAND} -E env KVLAB_GNUPLOT=/nonexistent/gnuplot
                        "${KVLAB}" trace plot "${WORK}/run.jsonl" -o "${WORK}/x.svg"
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 1 OR NOT err MATCHES "gnuplot-nox")
  message(FATAL_ERROR "missing gnuplot: exit ${rc}, stderr ${err}")
endif()
run_kvlab(2 "expected .svg or .png" trace plot "${WORK}/run.jsonl" -o "${WORK}/chart.pdf")
# a gnuplot that fails names its script by a temporary path, gone by the time the user reads it: the
# message calls it the chart script; no chart is left behind
file(WRITE "${WORK}/failing-gnuplot" "#!/bin/sh\necho \"\\\"$2\\\" line 3: all points y value undefined!\" >&2\nexit 1\n")
file(CHMOD "${WORK}/failing-gnuplot" PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE)
execute_process(COMMAND ${CMAKE_COMMAND} -E env KVLAB_GNUPLOT=${WORK}/failing-gnuplot
                        "${KVLAB}" trace plot "${WORK}/run.jsonl" -o "${WORK}/failed.svg"
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 1 OR NOT err MATCHES "gnuplot failed drawing .*: 'the chart script line 3: all points" OR err MATCHES "\\.tmp"
   OR EXISTS "${WORK}/failed.svg")
  message(FATAL_ERROR "failing gnuplot: exit ${rc}, stderr ${err}")
endif()

find_program(GNUPLOT gnuplot)
if(NOT GNUPLOT)
  message("skipped: gnuplot is not installed (Debian/Ubuntu: apt install gnuplot-nox)")
  return()
endif()
run_kvlab(0 "wrote .*chart.svg" trace plot "${WORK}/run.jsonl" -o "${WORK}/chart.svg")
file(READ "${WORK}/chart.svg" svg LIMIT 2000)
if(NOT svg MATCHES "<svg")
  message(FATAL_ERROR "chart.svg is not an SVG file")
endif()
# issue 51: the lesson's panels: time so far per mode, and the running speed-up in wall and modelled GPU time
file(READ "${WORK}/chart.svg" svg)
foreach(panel "wall time so far" "speed-up so far: uncached time / cached time" "modelled GPU")
  if(NOT svg MATCHES "${panel}")
    message(SEND_ERROR "chart.svg has no '${panel}'")
  endif()
endforeach()
run_kvlab(0 "wrote" trace plot "${WORK}/run.jsonl" -o "${WORK}/chart.png" --linear)
file(READ "${WORK}/chart.png" png LIMIT 4 HEX)
if(NOT png STREQUAL "89504e47")
  message(FATAL_ERROR "chart.png does not start with the PNG signature: ${png}")
endif()
# An uncached-only run keeps no cache: its KV panel is a zero line, on a log axis too (gnuplot refused
# the empty panel: "all points y value undefined")
run_kvlab(0 "" simulate --prompt-len 8 --steps 6 --threads 1 --quiet --mode uncached --trace "${WORK}/uncached.jsonl")
foreach(scale --linear --log)
  run_kvlab(0 "wrote .*uncached.svg" trace plot "${WORK}/uncached.jsonl" -o "${WORK}/uncached.svg" ${scale})
  file(READ "${WORK}/uncached.svg" svg)
  if(NOT svg MATCHES "the uncached mode keeps no cache")
    message(SEND_ERROR "uncached.svg (${scale}) has no KV panel saying the uncached mode keeps no cache")
  endif()
endforeach()
# The MHA vs GQA vs MQA lesson on one shape (simulate --attention, random weights), overlaid on one chart:
# every series carries its file's name.
foreach(att mha gqa:2 mqa)
  string(REPLACE ":" "" name "${att}")
  run_kvlab(0 "" simulate --prompt-len 8 --steps 12 --threads 1 --quiet --attention ${att} --trace "${WORK}/${name}.jsonl")
endforeach()
run_kvlab(0 "wrote .*attention.svg" trace plot "${WORK}/mha.jsonl" "${WORK}/gqa2.jsonl" "${WORK}/mqa.jsonl" -o "${WORK}/attention.svg")
file(READ "${WORK}/attention.svg" svg)
foreach(series "mha cached" "mha uncached" "gqa2 cached" "mqa uncached" "FLOPs so far")
  if(NOT svg MATCHES "${series}")
    message(SEND_ERROR "attention.svg has no '${series}'")
  endif()
endforeach()
run_kvlab(2 "files: At Most 6 required but received 7" trace plot "${WORK}/mha.jsonl" "${WORK}/mha.jsonl" "${WORK}/mha.jsonl" "${WORK}/mha.jsonl"
          "${WORK}/mha.jsonl" "${WORK}/mha.jsonl" "${WORK}/mha.jsonl" -o "${WORK}/seven.svg")

file(GLOB leftovers "${WORK}/.*")
if(leftovers)
  message(FATAL_ERROR "temporary files left behind: ${leftovers}")
endif()
