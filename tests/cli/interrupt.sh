#!/usr/bin/env bash
# Regression tests of issue 13 for signals, full disks and empty arguments (docs/reliability.md): what
# Ctrl-C, kill and a chart writer that fails silently leave behind. Usage: interrupt.sh KVLAB WORKDIR.
# Needs bash and a POSIX userland; takes a few seconds.
set -u
set -m  # job control: background jobs get their own process group
KVLAB=$(realpath "$1")
# kvlab keeps a signal ignored if it starts ignored (nohup); a test runner may start this script with
# SIGINT ignored (a background job), so the kvlab runs below reset the three signals to their defaults
# (env execs kvlab, so $! is kvlab's own pid)
KV=(env --default-signal=INT,TERM,HUP "$KVLAB")
WORK=$2
rm -rf "$WORK" && mkdir -p "$WORK" && cd "$WORK" || exit 1
fail() { echo "FAIL: $*" >&2; exit 1; }

# waits (up to 60 s) until a file matching the glob exists
wait_for() {
    for _ in $(seq 1 600); do
        compgen -G "$1" > /dev/null && return 0
        sleep 0.1
    done
    return 1
}

# 6a/6b. Ctrl-C (SIGINT) or SIGTERM while --save-checkpoint writes: the temporary file goes, the old
#     target is not created, and the process dies of the signal (exit 128 + signal number).
interrupt_save() {  # SIGNAL EXPECTED_EXIT
    "${KV[@]}" simulate --model stories110m -p 2 -n 2 -q --save-checkpoint big.bin > /dev/null 2>&1 &
    local pid=$! caught=0
    # stop the process while its temporary exists (the write may finish between two polls), signal, resume
    for _ in $(seq 1 600); do
        if compgen -G ".big.bin.tmp-*[0-9a-f]" > /dev/null; then
            kill -STOP $pid
            # SIGSTOP takes effect asynchronously: look again only once the process is really stopped (T)
            for _ in $(seq 1 200); do [ "$(cut -d' ' -f3 /proc/$pid/stat 2> /dev/null)" = T ] && break; sleep 0.01; done
            if compgen -G ".big.bin.tmp-*[0-9a-f]" > /dev/null; then caught=1; break; fi
            kill -CONT $pid
        fi
        sleep 0.05
    done
    [ $caught -eq 1 ] || fail "never caught the save with its temporary file present"
    kill -"$1" $pid
    kill -CONT $pid
    local rc=147
    while [ $rc -eq 147 ]; do  # with job control, wait also returns for the stop (128 + SIGSTOP): wait again
        wait $pid
        rc=$?
    done
    [ $rc -eq "$2" ] || fail "save interrupted by SIG$1: exit $rc, expected $2"
    compgen -G ".big.bin.tmp-*" > /dev/null && fail "SIG$1 left a temporary file behind: $(ls -a)"
    [ -e big.bin ] && fail "an interrupted save left big.bin"
    return 0
}
interrupt_save INT 130
interrupt_save TERM 143

# 9 / 11. The first Ctrl-C of a run stops it after the step: report, a trace kvlab reads back, exit 130,
#     and one stderr line saying how far it got. (stories110m, 1000 steps: minutes; stopped after ~1 s)
"${KV[@]}" simulate --model stories110m --prompt-ids 1,2,3,4 -n 1000 --mode cached --trace part.jsonl > out.txt 2> err.txt &
pid=$!
for _ in $(seq 1 600); do grep -q "generated ids: [0-9]" out.txt 2> /dev/null && break; sleep 0.1; done  # decoding
kill -INT $pid
wait $pid
rc=$?
[ $rc -eq 130 ] || fail "simulate interrupted: exit $rc, expected 130"
grep -Eq "interrupted after [0-9]+ of 1000 steps; 'part.jsonl' holds the steps done" err.txt || fail "no 'interrupted after' line: $(cat err.txt)"
"$KVLAB" trace summary part.jsonl > summary.txt || fail "the partial trace does not read back"
grep -q "interrupted" summary.txt || fail "the trace summary does not say the run was interrupted"

# 6d. A signal the parent ignores stays ignored (nohup ignores SIGHUP): the run goes on, Ctrl-C still stops it
( trap '' HUP; exec env --default-signal=INT,TERM "$KVLAB" simulate --model stories110m --prompt-ids 1,2,3,4 -n 1000 --mode cached > hup.txt 2> hup.err ) &
pid=$!
for _ in $(seq 1 600); do grep -q "generated ids: [0-9]" hup.txt 2> /dev/null && break; sleep 0.1; done
kill -HUP $pid
sleep 0.3
kill -0 $pid 2> /dev/null || fail "SIGHUP killed a run started with SIGHUP ignored (nohup)"
kill -INT $pid
wait $pid
rc=$?
[ $rc -eq 130 ] || fail "the nohup run, interrupted: exit $rc, expected 130"

# 5. A chart writer that exits 0 after a short write (a full disk): kvlab fails, the old chart stays.
echo "old chart" > chart.svg
cat > fake-gnuplot <<'GP'
#!/bin/sh
printf '<svg><g>truncated'   # stdout is the chart kvlab keeps; no closing tag
exit 0
GP
chmod +x fake-gnuplot
"$KVLAB" simulate -p 2 -n 3 -q --trace run.csv > /dev/null || fail "simulate for the plot test"
KVLAB_GNUPLOT=./fake-gnuplot "$KVLAB" trace plot run.csv -o chart.svg > out.txt 2> err.txt
rc=$?
[ $rc -eq 1 ] || fail "trace plot with a truncated chart: exit $rc, expected 1"
grep -q "incomplete" err.txt || fail "no 'incomplete' in: $(cat err.txt)"
grep -q "wrote" out.txt && fail "trace plot said 'wrote' for a truncated chart"
[ "$(cat chart.svg)" = "old chart" ] || fail "the old chart was replaced by a truncated one"
compgen -G ".chart.svg.tmp-*" > /dev/null && fail "a failed plot left temporary files: $(ls -a)"

# 6c. Ctrl-C while gnuplot draws: no .dat/.gp/.log/chart temporaries left
cat > slow-gnuplot <<'GP'
#!/bin/sh
echo $$ > gnuplot.pid
exec sleep 30
GP
chmod +x slow-gnuplot
KVLAB_GNUPLOT=./slow-gnuplot "${KV[@]}" trace plot run.csv -o chart2.svg > /dev/null 2>&1 &
pid=$!
wait_for ".chart2.svg.tmp-*.gp" || fail "no gnuplot script appeared"
kill -INT $pid
wait $pid
rc=$?
[ -f gnuplot.pid ] && kill "$(cat gnuplot.pid)" 2> /dev/null
[ $rc -eq 130 ] || fail "plot interrupted: exit $rc, expected 130"
compgen -G ".chart2.svg.tmp-*" > /dev/null && fail "Ctrl-C during trace plot left: $(ls -a | grep tmp)"
[ -e chart2.svg ] && fail "an interrupted plot wrote chart2.svg"
# 9. An empty value for a number flag is refused (CMake's CLI tests cannot pass an empty argument).
"$KVLAB" simulate -n "" > out.txt 2> err.txt
rc=$?
[ $rc -eq 2 ] || fail "simulate -n '': exit $rc, expected 2"
grep -q -- "--steps: empty value" err.txt || fail "simulate -n '': $(cat err.txt)"
# 10. An empty text value (an unset shell variable) is refused too, not read as "not given": no
# random-weight run in place of a checkpoint, no run that "succeeds" without writing its trace.
empty_refused() {  # option, then the command
    local opt=$1
    shift
    "$KVLAB" "$@" > out.txt 2> err.txt
    rc=$?
    [ $rc -eq 2 ] || fail "$* (empty $opt): exit $rc, expected 2"
    grep -q -- "$opt: empty value; expected a non-empty one" err.txt || fail "$* (empty $opt): $(cat err.txt)"
    [ -s out.txt ] && fail "$* (empty $opt) wrote to stdout"
    return 0
}
empty_refused --checkpoint simulate -q -n 2 --checkpoint ""
empty_refused --trace simulate --model stories260k -q -n 2 --trace ""
empty_refused --save-checkpoint simulate --model stories260k -q -n 2 --save-checkpoint ""
empty_refused --prompt-ids simulate --model stories260k -q -n 2 --prompt-ids ""
empty_refused --context kvcalc -m llama-3-8b --context ""
empty_refused --gpu kvcalc -m llama-3-8b --gpu ""
empty_refused --checkpoint serve -q --requests 2 --checkpoint ""
empty_refused file trace summary ""
# an empty prompt is a prompt: the BOS token alone
"$KVLAB" simulate --model tiny-llama -n 2 --prompt "" > out.txt 2> err.txt || fail "simulate --prompt '': $(cat err.txt)"
grep -q "prompt 1 token," out.txt || fail "simulate --prompt '' did not run on the BOS token alone"
echo "interrupt tests passed"
