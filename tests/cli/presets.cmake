include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)

kvlab_expect(RC 0 ARGS presets OUT "llama-2-70b +llama +80 +64 +8 +128 +GQA-8 +4096 +68.98B" "stories15m +llama2.c +6 +6 +6 +48 +MHA +256 +15.19M")
kvlab_expect(RC 0 ARGS presets --format json)
string(JSON n LENGTH "${KVLAB_OUT}" tables 0 rows)
if(n LESS 18)
  message(FATAL_ERROR "presets json lists ${n} presets; expected at least 18")
endif()
