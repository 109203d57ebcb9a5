# CLI test of `kvlab report`: each kind of input makes a page; bad input is one stderr line, exit 2; a serve
# trace without the block map (CSV, or written by an older kvlab) says the map needs a newer trace.
include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)

run_kvlab(0 "" simulate --prompt-len 8 --steps 6 --threads 1 --quiet --trace "${WORK}/run.csv")
kvlab_expect(RC 0 ARGS report "${WORK}/run.csv" -o "${WORK}/run.html" OUT "wrote .*run.html")
file(READ "${WORK}/run.html" page)
if(NOT page MATCHES "^<!DOCTYPE html>" OR page MATCHES "(src|href)=\"(https?:)?//")
  message(SEND_ERROR "the page is not a self-contained HTML document")
endif()

run_kvlab(0 "" serve -m tiny-llama --requests 4 --threads 1 --trace "${WORK}/serve.csv")
kvlab_expect(RC 0 ARGS report "${WORK}/serve.csv" -o "${WORK}/serve.html")
file(READ "${WORK}/serve.html" page)
if(NOT page MATCHES "id=\"no-block-map\"[^<]*needs a newer trace")
  message(SEND_ERROR "a CSV serve trace's page does not say the block map needs a newer (JSONL) trace")
endif()

# bad input: not a trace, another command's JSON, a missing file, an output that is not .html, the input as output
file(WRITE "${WORK}/notes.txt" "hello\n")
kvlab_expect(RC 2 ARGS report "${WORK}/notes.txt" -o "${WORK}/x.html" ERR "notes.txt: line 1: .* is not a kvlab trace header")
file(WRITE "${WORK}/other.json" "{\"schema\": \"kvlab-report/1\", \"tables\": []}\n")
kvlab_expect(RC 2 ARGS report "${WORK}/other.json" -o "${WORK}/x.html" ERR "other.json: JSON that is not kvcalc's report")
kvlab_expect(RC 2 ARGS report "${WORK}/absent.jsonl" -o "${WORK}/x.html" ERR "absent.jsonl")
kvlab_expect(RC 2 ARGS report "${WORK}/run.csv" -o "${WORK}/x.svg" ERR "-o/--output: .*x.svg.*expected a file name ending in .html")
kvlab_expect(RC 2 ARGS report "${WORK}/run.csv" -o "${WORK}/run.csv" ERR "run.csv")
if(EXISTS "${WORK}/x.html" OR EXISTS "${WORK}/x.svg")
  message(SEND_ERROR "a refused report left a file behind")
endif()
