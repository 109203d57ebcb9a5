include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)

# Mistyped or missing subcommands: the nearest name, or the list (CLI11 alone said "A subcommand is required").
kvlab_expect(RC 2 ARGS kvcalcc ERR "^kvlab: error: unknown subcommand 'kvcalcc' of 'kvlab'; did you mean 'kvcalc'\\? \\(see kvlab --help\\)\n$")
kvlab_expect(RC 2 ARGS trace sumary run.json ERR "unknown subcommand 'sumary' of 'kvlab trace'; did you mean 'summary'\\? \\(see kvlab trace --help\\)")
kvlab_expect(RC 2 ARGS simualte -n 3 ERR "did you mean 'simulate'")
kvlab_expect(RC 2 ARGS frobnicate ERR "unknown subcommand 'frobnicate' of 'kvlab'; expected one of: kvcalc, presets, gpu, simulate, serve, trace, report, completion")
kvlab_expect(RC 2 ARGS ERR "'kvlab' needs a subcommand: kvcalc, presets, gpu, simulate, serve, trace, report, completion \\(see kvlab --help\\)")
kvlab_expect(RC 2 ARGS trace ERR "'kvlab trace' needs a subcommand: summary, steps, compare, plot \\(see kvlab trace --help\\)")

# Option errors point to the help of the subcommand they belong to, and list arguments in the order typed.
kvlab_expect(RC 2 ARGS simulate --kv-heads 2 ERR "unknown option '--kv-heads' \\(see kvlab simulate --help\\)")
kvlab_expect(RC 2 ARGS kvcalc -m llama-2-7b --contxt 4k ERR "unknown option '--contxt'; did you mean '--context'\\? \\(see kvlab kvcalc --help\\)")
kvlab_expect(RC 2 ARGS simulate --promt-len=3 ERR "unknown option '--promt-len'; did you mean '--prompt-len'\\?")
kvlab_expect(RC 2 ARGS simulate -n 3 extra1 extra2 ERR "unexpected arguments: 'extra1 extra2' \\(see kvlab simulate --help\\)")
kvlab_expect(RC 2 ARGS trace summary ERR "file is required \\(see kvlab trace summary --help\\)")
kvlab_expect(RC 2 ARGS kvcalc --units mib ERR "\\(see kvlab kvcalc --help\\)")

# --version everywhere, with the project's version
foreach(cmd "" kvcalc presets simulate trace "trace summary" "gpu attention")
  separate_arguments(words UNIX_COMMAND "${cmd}")
  kvlab_expect(RC 0 ARGS ${words} --version OUT "^kvlab [0-9]+\\.[0-9]+\\.[0-9]+\n$")
endforeach()

# Every subcommand's --help ends with an example to copy
foreach(cmd kvcalc presets simulate "trace summary" "trace steps" "trace compare" "trace plot" "gpu attention" completion)
  separate_arguments(words UNIX_COMMAND "${cmd}")
  kvlab_expect(RC 0 ARGS ${words} --help OUT "\nExamples?:\n  (source <\\(kvlab completion|kvlab ${cmd}[ \n])")
endforeach()
