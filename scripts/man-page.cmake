# Writes kvlab.1 from kvlab's own --help: help2man formats `kvlab --help` (name, synopsis, options)
# and this script adds one section with each subcommand's --help, so the man page cannot drift from
# the program. Run by the build (src/CMakeLists.txt) when help2man is installed:
#   cmake -DKVLAB=<kvlab> -DHELP2MAN=<help2man> -DOUT=<kvlab.1> -P scripts/man-page.cmake
# subcommands_of(VAR words...): the subcommands `kvlab <words> --help` lists under "Subcommands:"
function(subcommands_of var)
  execute_process(COMMAND ${KVLAB} ${ARGN} --help OUTPUT_VARIABLE help RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "kvlab ${ARGN} --help exited ${rc}")
  endif()
  set(names "")
  string(FIND "${help}" "\nSubcommands:\n" at)
  if(at GREATER -1)
    string(SUBSTRING "${help}" ${at} -1 list)
    string(REGEX MATCHALL "\n  [a-z][a-z0-9-]*" entries "${list}")
    foreach(entry IN LISTS entries)
      string(STRIP "${entry}" name)
      list(APPEND names "${name}")
    endforeach()
  endif()
  set(${var} "${names}" PARENT_SCOPE)
endfunction()

# every subcommand the program lists, and the subcommands of those (trace summary, gpu attention, ...)
set(commands "")
subcommands_of(top)
foreach(cmd IN LISTS top)
  subcommands_of(subs ${cmd})
  if(subs)
    foreach(sub IN LISTS subs)
      list(APPEND commands "${cmd} ${sub}")
    endforeach()
  else()
    list(APPEND commands "${cmd}")
  endif()
endforeach()
set(include "[DESCRIPTION]\nkvlab shows, with real numbers, why LLM inference caches keys and values and what that cache\ncosts: KV-cache sizes for real models (kvcalc), a CPU transformer that decodes with and without the\ncache counting FLOPs and bytes per step (simulate), many requests through one KV pool (serve), and\nreaders and charts for its traces (trace).\n\n[SUBCOMMANDS]\n")
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
       "\n[SEE ALSO]\nThe docs/ folder of the source tree: cli.md, cli-simulate.md, cli-trace.md, serving.md, kv-memory.md, cost-model.md, architecture.md.\n")
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
