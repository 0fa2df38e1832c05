#!/usr/bin/env bash
# Prints the README's set-up commands, one a line: the indented lines of README.md's "## Set up"
# section. .ci/run and tests/fresh run what this prints, so they run what a reader is told to.
# Fails unless there are exactly two (build and run the main job; run the tests).
set -euo pipefail
readme=${1:-"$(dirname "$0")/../README.md"}
mapfile -t cmds < <(awk '/^## /{on = /^## Set up/; next} on && /^    [^ ]/{sub(/^    /, ""); print}' "$readme")
if [ ${#cmds[@]} -ne 2 ]; then
    echo "readme_commands: $readme's Set up section has ${#cmds[@]} indented command lines, not 2" >&2
    exit 1
fi
printf '%s\n' "${cmds[@]}"
