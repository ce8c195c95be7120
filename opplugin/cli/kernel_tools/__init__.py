"""The tools around a user's kernel file, apart from what a run needs (user_kernels/):
they may use the lab and the checks, and only the command line imports them.

cli_support     the --kernel files' registry, --sanitize and --watch as run and check call
                them, the lines plan, run and check print about user kernels
sanitize        --sanitize: each user kernel under compute-sanitizer, findings at source lines
sanitize_child  the process sanitize runs under compute-sanitizer
watch           --watch: recompile, re-check and re-time on each save
"""
