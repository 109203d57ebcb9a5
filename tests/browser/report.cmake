# Browser test of `kvlab report`: headless Chromium (Debian's `chromium`) loads a report of each kind,
# written here from fresh runs (simulate and serve on tiny-llama, kvcalc on a preset), and the test checks
# that the page's script ran with no error or console.error (the page writes them into #kvlab-errors and
# sets data-ready when its script finished), that the headline, every chart point (one per trace record)
# and the block map's cells (one per block of the pool) are in the DOM, and that a screenshot is not blank
# (ImageMagick counts its colours). Without chromium or ImageMagick it FAILS, naming the packages
# (scripts/kvlab-dev.sh test installs them); KVLAB_SKIP_BROWSER=1 skips it on purpose, saying so.
# Called with -DKVLAB=<binary> -DWORK=<scratch dir>.
cmake_minimum_required(VERSION 3.25)
include(${CMAKE_CURRENT_LIST_DIR}/../cli/common.cmake)

if("$ENV{KVLAB_SKIP_BROWSER}" STREQUAL "1")
  message("skipped: KVLAB_SKIP_BROWSER=1")
  return()
endif()
find_program(CHROMIUM NAMES chromium chromium-browser)
find_program(CONVERT convert)
if(NOT CHROMIUM OR NOT CONVERT)
  message(FATAL_ERROR "the browser test needs chromium and ImageMagick (Debian: apt install chromium imagemagick; "
                      "scripts/kvlab-dev.sh test installs them); found chromium '${CHROMIUM}', convert '${CONVERT}'. "
                      "Set KVLAB_SKIP_BROWSER=1 to skip it on purpose.")
endif()

# chromium_load(<page> <dom variable> <screenshot file>): the DOM after the page's scripts ran, and a screenshot.
function(chromium_load page dom_var shot)
  # --disable-dev-shm-usage: containers often give /dev/shm 64 MiB, too little for a renderer
  set(flags --headless --disable-gpu --disable-dev-shm-usage --no-first-run --user-data-dir=${WORK}/profile --window-size=1280,1600)
  execute_process(COMMAND id -u OUTPUT_VARIABLE uid OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(uid STREQUAL "0")
    list(APPEND flags --no-sandbox)  # Chromium's sandbox refuses to run as root
  endif()
  # one load does both (about 5 s each on 2 cores)
  execute_process(COMMAND ${CHROMIUM} ${flags} --dump-dom --screenshot=${shot} file://${page} RESULT_VARIABLE rc OUTPUT_VARIABLE dom
                  ERROR_QUIET TIMEOUT 60)
  if(NOT rc EQUAL 0 OR dom STREQUAL "")
    message(FATAL_ERROR "chromium --dump-dom ${page}: exit ${rc}, no DOM")
  endif()
  execute_process(COMMAND ${CONVERT} ${shot} -format "%k" info: RESULT_VARIABLE crc OUTPUT_VARIABLE colours)
  if(NOT rc EQUAL 0 OR NOT crc EQUAL 0 OR colours LESS 50)
    message(SEND_ERROR "${page}: the screenshot ${shot} has ${colours} colours (chromium exit ${rc}); expected a page, not a blank")
  endif()
  set(${dom_var} "${dom}" PARENT_SCOPE)
endfunction()

# count_of(<out> <text> <literal>): how many times the literal occurs in the text.
function(count_of out text literal)
  string(REGEX REPLACE "([][+.*()^$?|\\{}])" "\\\\\\1" re "${literal}")
  string(REGEX MATCHALL "${re}" found "${text}")
  list(LENGTH found n)
  set(${out} ${n} PARENT_SCOPE)
endfunction()

# expect_page(<name> <dom>): the script ran to its end, and nothing was logged as an error.
function(expect_page name dom)
  if(NOT dom MATCHES "data-ready=\"1\"")
    message(SEND_ERROR "${name}: the page's script did not finish (no data-ready)")
  endif()
  if(NOT dom MATCHES "<pre id=\"kvlab-errors\"></pre>")
    string(REGEX MATCH "<pre id=\"kvlab-errors\">[^<]*" errors "${dom}")
    message(SEND_ERROR "${name}: script errors or console.error: ${errors}")
  endif()
endfunction()

# expect_count(<name> <dom> <literal> <expected>)
function(expect_count name dom literal expected)
  count_of(n "${dom}" "${literal}")
  if(NOT n EQUAL expected)
    message(SEND_ERROR "${name}: ${n} occurrences of '${literal}', expected ${expected}")
  endif()
endfunction()

# expect_headline(<name> <dom> <json report>): each line of the JSON's "headline" is a headline of the page.
function(expect_headline name dom report)
  string(JSON n ERROR_VARIABLE none LENGTH "${report}" headline)
  if(none)
    return()
  endif()
  math(EXPR last "${n} - 1")
  foreach(i RANGE ${last})
    string(JSON line GET "${report}" headline ${i})
    string(REPLACE "&" "&amp;" line "${line}")
    string(FIND "${dom}" "<p class=\"headline\">${line}</p>" at)
    if(at EQUAL -1)
      message(SEND_ERROR "${name}: the headline '${line}' is not at the top of the page")
    endif()
  endforeach()
endfunction()

# records(<out> <jsonl trace>): the trace's records, a line each after the header.
function(records out file)
  file(STRINGS "${file}" lines)
  list(LENGTH lines n)
  math(EXPR n "${n} - 1")
  set(${out} ${n} PARENT_SCOPE)
endfunction()

# simulate: a point per record in the per-step charts, the cached-vs-uncached headline, the per-op table
kvlab_expect(RC 0 ARGS simulate -m tiny-llama --prompt-len 8 --steps 24 --threads 1 --quiet --trace ${WORK}/sim.jsonl)
kvlab_expect(RC 0 ARGS report ${WORK}/sim.jsonl -o ${WORK}/sim.html OUT "wrote ")
kvlab_expect(RC 0 ARGS trace summary ${WORK}/sim.jsonl --format json)
set(sim_summary "${KVLAB_OUT}")
chromium_load(${WORK}/sim.html dom ${WORK}/sim.png)
expect_page(simulate "${dom}")
records(n_sim ${WORK}/sim.jsonl)  # 24 steps x 2 modes
expect_count(simulate "${dom}" "data-c=\"sim-flops\"" ${n_sim})
expect_count(simulate "${dom}" "data-c=\"sim-bytes\"" ${n_sim})
expect_count(simulate "${dom}" "data-c=\"sim-step-time\"" ${n_sim})
expect_count(simulate "${dom}" "data-c=\"sim-speedup\"" 24)
expect_count(simulate "${dom}" "data-c=\"sim-gpu-time\"" ${n_sim})  # the modelled time so far, every record
expect_headline(simulate "${dom}" "${sim_summary}")
foreach(text "<td>q_proj</td>" "Formulas with this run's numbers" "KV read at step 23 = 2 (K and V)")
  string(FIND "${dom}" "${text}" at)
  if(at EQUAL -1)
    message(SEND_ERROR "simulate: '${text}' is not in the page")
  endif()
endforeach()

# serve: a point per record, a block-map cell per block of each layout's pool, shared prefix blocks marked
kvlab_expect(RC 0 ARGS serve -m tiny-llama --requests 12 --shared-prefix 32 --prefix-cache --threads 1 --trace ${WORK}/serve.jsonl)
kvlab_expect(RC 0 ARGS report ${WORK}/serve.jsonl -o ${WORK}/serve.html)
chromium_load(${WORK}/serve.html dom ${WORK}/serve.png)
expect_page(serve "${dom}")
records(n_serve ${WORK}/serve.jsonl)
expect_count(serve "${dom}" "data-c=\"serve-tokens\"" ${n_serve})
expect_count(serve "${dom}" "data-c=\"serve-util\"" ${n_serve})
expect_count(serve "${dom}" "data-c=\"serve-gpu-time\"" ${n_serve})
file(STRINGS ${WORK}/serve.jsonl header LIMIT_COUNT 1)
string(JSON pool_rows GET "${header}" inputs pool_rows)
math(EXPR cells "2 * ${pool_rows} / 16")  # paged blocks of 16 and contiguous cells of 16 rows, each pool ${pool_rows} rows
expect_count(serve "${dom}" "<div class=\"cell" ${cells})
if(NOT dom MATCHES "<div class=\"cell shared\"")
  message(SEND_ERROR "serve: no shared prefix block marked in the block map of a run with a 32-token shared prefix")
endif()
if(NOT dom MATCHES "class=\"caption\">step [0-9]+: [0-9]+ cells held by [0-9]+ requests")
  message(SEND_ERROR "serve: the block map's caption is missing")
endif()

# kvcalc: a point per (model, dtype) series per context plus the origin, the GPU budget line, the --explain formulas
kvlab_expect(RC 0 ARGS kvcalc -m llama-3-8b -d fp16,fp8 --context 8k,32k --gpu h100 --explain --format json)
file(WRITE ${WORK}/kv.json "${KVLAB_OUT}")
kvlab_expect(RC 0 ARGS report ${WORK}/kv.json -o ${WORK}/kv.html)
chromium_load(${WORK}/kv.html dom ${WORK}/kv.png)
expect_page(kvcalc "${dom}")
expect_count(kvcalc "${dom}" "data-c=\"kv-context\"" 6)  # 2 dtypes x (0, 8k, 32k)
expect_headline(kvcalc "${dom}" "${KVLAB_OUT}")
if(NOT dom MATCHES "class=\"budget\"" OR NOT dom MATCHES "KV/token = 2 \\(K and V\\) x 32 layers")
  message(SEND_ERROR "kvcalc: the GPU's KV budget line or the --explain formulas are missing")
endif()
