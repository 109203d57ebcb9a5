# Writes the bash completion script kvlab prints (`kvlab completion bash`), for `cmake --install`.
#   cmake -DKVLAB=<kvlab> -DPRESETS=<presets dir> -DOUT=<file> -P scripts/completion.cmake
set(ENV{KVLAB_PRESETS_DIR} "${PRESETS}")
execute_process(COMMAND ${KVLAB} completion bash OUTPUT_FILE "${OUT}.tmp" RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kvlab completion bash exited ${rc}: ${err}")
endif()
file(RENAME "${OUT}.tmp" "${OUT}")
