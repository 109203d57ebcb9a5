#!/usr/bin/env python3
"""Regenerate docs/*.md from docs/src/*.md by running every command they show.

A template line `@@RUN <cmd>@@` becomes a console block with the command and its real output;
`@@RUN <cmd> ||| <shell filter>@@` keeps only the lines the filter passes (dropped runs shown as
'...'); `@@ERR <cmd>@@` expects a failure and shows stderr and the exit code. Commands run from the
repository root with build/release on PATH. Usage: scripts/gen-docs.py [docs/src/NAME.md ...]
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PATH=os.path.join(ROOT, "build", "release") + os.pathsep + os.environ["PATH"])


def run(cmd):
    p = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=ENV, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def keep_with_gaps(full, kept):
    """Lines of `full` that the filter kept, in order, with '...' where lines were dropped."""
    full_lines = full.rstrip("\n").split("\n")
    out, i = [], 0
    for k in kept.rstrip("\n").split("\n"):
        j = i
        while j < len(full_lines) and full_lines[j] != k:
            j += 1
        if j == len(full_lines):
            raise SystemExit(f"filter produced a line not in the output: {k!r}")
        if j > i:
            out.append("...")
        out.append(k)
        i = j + 1
    if i < len(full_lines):
        out.append("...")
    return out


def expand(line, failures):
    m = re.fullmatch(r"@@(RUN|ERR) (.*)@@", line.strip())
    if not m:
        return [line]
    kind, body = m.groups()
    cmd, _, filt = body.partition(" ||| ")
    cmd = cmd.strip()
    rc, out, err = run(cmd)
    lines = ["```console", "$ " + cmd]
    if kind == "RUN":
        if rc != 0 or err.strip():
            failures.append(f"RUN failed rc={rc}: {cmd}\n{err}")
        if filt:
            p = subprocess.run(["bash", "-c", filt], input=out, capture_output=True, text=True)
            body_lines = keep_with_gaps(out, p.stdout)
        else:
            body_lines = out.rstrip("\n").split("\n")
        lines += [l.rstrip() for l in body_lines]
    else:
        if rc == 0:
            failures.append(f"ERR expected a failure but got exit 0: {cmd}")
        if out.strip():
            failures.append(f"ERR printed to stdout: {cmd}")
        lines += [l.rstrip() for l in err.rstrip("\n").split("\n")]
        lines += ["$ echo $?", str(rc)]
    lines.append("```")
    return lines


def main(sources):
    failures = []
    for src in sources:
        out = []
        with open(src) as f:
            for line in f.read().split("\n"):
                out += expand(line, failures)
        dst = os.path.join(ROOT, "docs", os.path.basename(src))
        with open(dst, "w") as f:
            f.write("\n".join(out))
        print(f"wrote {os.path.relpath(dst, ROOT)}")
    for f in failures:
        print("WARNING:", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    srcs = sys.argv[1:] or sorted(os.path.join(ROOT, "docs", "src", n) for n in os.listdir(os.path.join(ROOT, "docs", "src")))
    sys.exit(main(srcs))
