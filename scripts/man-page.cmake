# Writes kvlab.1 from kvlab's own --help: help2man formats `kvlab --help` (name, synopsis, options)
# and this script adds one section with each subcommand's --help, so the man page cannot drift from
# the program. Run by the build (src/CMakeLists.txt) when help2man is installed:
#   cmake -DKVLAB=<kvlab> -DHELP2MAN=<help2man> -DOUT=<kvlab.1> -P scripts/man-page.cmake
set(commands "kvcalc" "presets" "simulate" "trace summary" "trace steps" "trace compare" "trace plot" "gpu attention" "completion")
set(include "[DESCRIPTION]\nkvlab shows, with real numbers, why LLM inference caches keys and values and what that cache\ncosts: KV-cache sizes for real models (kvcalc), a CPU transformer that decodes with and without the\ncache counting FLOPs and bytes per step (simulate), and readers and charts for its traces (trace).\n\n[SUBCOMMANDS]\n")
foreach(cmd IN LISTS commands)
  separate_arguments(words UNIX_COMMAND "${cmd}")
  execute_process(COMMAND ${KVLAB} ${words} --help OUTPUT_VARIABLE help RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "kvlab ${cmd} --help exited ${rc}")
  endif()
  string(REPLACE "\\" "\\e" help "${help}")            # roff: a backslash is \e
  string(REGEX REPLACE "(^|\n)([.'])" "\\1\\\\&\\2" help "${help}")  # a leading . or ' is not a request
  string(APPEND include ".SS \"kvlab ${cmd}\"\n.nf\n${help}.fi\n")
endforeach()
string(APPEND include "\n[FILES]\n.TP\n.I <prefix>/share/kvlab/presets\nmodel and GPU presets (KVLAB_PRESETS_DIR overrides)\n"
       "\n[SEE ALSO]\nThe docs/ folder of the source tree: cli.md, cli-simulate.md, cli-trace.md, kv-memory.md, cost-model.md.\n")
get_filename_component(dir "${OUT}" DIRECTORY)
file(WRITE "${dir}/kvlab.h2m" "${include}")
execute_process(COMMAND ${HELP2MAN} --no-info --no-discard-stderr --section 1
                        --name "why LLM inference caches keys and values, and what that cache costs"
                        --include "${dir}/kvlab.h2m" --output "${OUT}.tmp" ${KVLAB}
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "help2man failed (${rc}): ${err}")
endif()
file(RENAME "${OUT}.tmp" "${OUT}")
