#!/usr/bin/env bash
# Loads a kvlab bash completion script and prints what it offers for words a user would type:
# "[kvlab kvcalc --un] --units". Used by tests/cli/install.cmake.
source "$1"
t() { COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); COMPREPLY=(); _kvlab; echo "[$*] ${COMPREPLY[*]}"; }
t kvlab tr
t kvlab kvcalc --un
t kvlab kvcalc --units ''
t kvlab trace s
t kvlab simulate --mode b
t kvlab kvcalc --gpu h2
