"""Arguments an agent could be steered into passing: each must reach the training script literally, through every
backend's rendering (a batch script, an entrypoint, a task's run commands), never run by a shell."""

HOSTILE_ARGS = [
    "$(touch PWNED_subst)",
    "`touch PWNED_backtick`",
    "; touch PWNED_semicolon",
    "&& touch PWNED_and",
    "| tee PWNED_pipe",
    "> PWNED_redirect",
    "a b  c",
    "'single'",
    '"double"',
    "--flag=$HOME",
    "${IFS}",
    "*",
    "~",
    "\\",
    "line\nbreak",
    "tab\there",
    "ünïcødé",
    "",
]
