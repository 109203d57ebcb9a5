# `cmake --install` to a prefix, then the tree moved elsewhere: the installed kvlab finds its presets
# beside itself (<prefix>/share/kvlab/presets), not in the source tree or the prefix it was built for;
# the man page (when help2man is installed) and the bash completion are installed with it.
# Called with -DBUILD=<build dir> -DWORK=<scratch> -DMAN=<ON|OFF>.
file(REMOVE_RECURSE "${WORK}")
execute_process(COMMAND ${CMAKE_COMMAND} --install "${BUILD}" --prefix "${WORK}/first" RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed: ${rc}")
endif()
file(RENAME "${WORK}/first" "${WORK}/moved")
set(kvlab "${WORK}/moved/bin/kvlab")

function(run_env expect_rc out_re err_re)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL expect_rc OR NOT out MATCHES "${out_re}" OR NOT err MATCHES "${err_re}")
    message(SEND_ERROR "${ARGN}: exit ${rc} (expected ${expect_rc})\nstdout:\n${out}\nstderr:\n${err}")
  endif()
endfunction()

run_env(0 "Model presets \\(${WORK}/moved/share/kvlab/presets\\)" "^$" --unset=KVLAB_PRESETS_DIR ${kvlab} presets)
run_env(0 "GPU presets \\(${WORK}/moved/share/kvlab/presets/gpus.json\\)" "^$" --unset=KVLAB_PRESETS_DIR ${kvlab} presets --gpus)
# the trained models ship beside the presets: a tiny-llama run finds its checkpoint and tokenizer
run_env(0 "Once upon a time" "" --unset=KVLAB_PRESETS_DIR ${kvlab} simulate -m tiny-llama --prompt "Once upon a time" -n 4 -q --threads 1)

# an empty or missing presets folder is an error (exit 2), not an empty table
file(MAKE_DIRECTORY "${WORK}/empty")
run_env(2 "^$" "kvlab: error: '${WORK}/empty': no model presets \\(.json files\\) in the presets folder" KVLAB_PRESETS_DIR=${WORK}/empty ${kvlab} presets)
run_env(2 "^$" "KVLAB_PRESETS_DIR: '${WORK}/missing' is not a directory" KVLAB_PRESETS_DIR=${WORK}/missing ${kvlab} kvcalc)

if(NOT EXISTS "${WORK}/moved/share/bash-completion/completions/kvlab")
  message(SEND_ERROR "no bash completion installed")
endif()
file(READ "${WORK}/moved/share/bash-completion/completions/kvlab" completion)
if(NOT completion MATCHES "complete -o filenames -o bashdefault -F _kvlab kvlab" OR NOT completion MATCHES "\"kvlab kvcalc --units\"\\) COMPREPLY=\\(\\$\\(compgen -W \"iec si\"")
  message(SEND_ERROR "the installed completion does not complete kvcalc --units")
endif()
if(MAN)
  if(NOT EXISTS "${WORK}/moved/share/man/man1/kvlab.1")
    message(SEND_ERROR "no man page installed")
  endif()
  file(READ "${WORK}/moved/share/man/man1/kvlab.1" man)
  foreach(section "kvlab kvcalc" "kvlab simulate" "kvlab trace plot")
    if(NOT man MATCHES "\\.SS \"${section}\"")
      message(SEND_ERROR "the man page has no section for ${section}")
    endif()
  endforeach()
endif()

# the completion script, run by bash: words a user would type, and what it offers
find_program(BASH bash)
if(BASH)
  execute_process(COMMAND ${BASH} ${CMAKE_CURRENT_LIST_DIR}/completion_probe.sh
                          "${WORK}/moved/share/bash-completion/completions/kvlab" OUTPUT_VARIABLE out RESULT_VARIABLE rc)
  foreach(expect "\\[kvlab tr\\] trace\n" "\\[kvlab kvcalc --un\\] --units\n" "\\[kvlab kvcalc --units \\] iec si\n"
                 "\\[kvlab trace s\\] summary steps\n" "\\[kvlab simulate --mode b\\] both\n" "\\[kvlab kvcalc --gpu h2\\] h200-sxm-141gb\n")
    if(NOT out MATCHES "${expect}")
      message(SEND_ERROR "bash completion: expected '${expect}' in\n${out}")
    endif()
  endforeach()
endif()
