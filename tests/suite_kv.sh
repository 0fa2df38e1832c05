#!/usr/bin/env bash
# Production KV caches (docs/kv.md) beyond the engine tests (test_kv, test_kvformat):
#  - the lanes' contracts (concurrent == solo, resumed == fresh through the prompt cache, drafted
#    == plain with its rollbacks) and drafted decoding's, with production caches: test_lanes and
#    test_draft under DSV4_TEST_KV=production;
#  - `dsv4 generate --kv production --draft lookup` prints the ids of the plain run;
#  - --kv takes exact or production only;
#  - the server's admission on the default model: the start log names the format and the context
#    each lane is admitted; a request past it gets 400 context_length_exceeded naming the budget,
#    one within it is served; a budget that cannot hold the lanes is refused at start.
# Prints "kv: N passed, M failed"; exits non-zero on any failure. Kills its servers.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
bin=build/dsv4
model=models/mini
tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

for t in test_lanes test_draft; do
    if DSV4_TEST_KV=production build/tests/$t >"$tmp/$t.out" 2>&1; then ok; else bad "$t with production caches"; tail -5 "$tmp/$t.out"; fi
done

ids=0,3,293,307,2978,272,992,294,271,38,4,6
$bin generate -m $model --ids $ids -n 40 --kv production >"$tmp/plain" 2>/dev/null || bad "generate --kv production failed"
$bin generate -m $model --ids $ids -n 40 --kv production --draft lookup >"$tmp/draft" 2>/dev/null || bad "drafted generate failed"
if [ -s "$tmp/plain" ] && cmp -s "$tmp/plain" "$tmp/draft"; then ok; else bad "drafted != plain with production caches"; fi

if $bin generate -m $model --ids $ids -n 1 --kv fp8 >/dev/null 2>"$tmp/badkv"; then
    bad "--kv fp8 was accepted"
elif grep -q "exact or production" "$tmp/badkv"; then ok; else bad "--kv fp8: $(cat "$tmp/badkv")"; fi

# start LOG ARGS...: a server on the default model; sets $pid and $port (empty when it did not start)
start() {
    local log=$1; shift
    $bin serve -m $model --host 127.0.0.1 --port 0 --threads 1 "$@" >"$log" 2>&1 &
    pid=$!
    pids+=("$pid")
    port=$(serve_port "$log" "$pid" 300)
}
start "$tmp/s1.log" --lanes 4 --kv-budget-mb 5
if [ -z "$port" ]; then
    bad "the server did not start"; tail -5 "$tmp/s1.log"
else
    line=$(grep -o 'production KV caches; [0-9]* tokens of context for each of 4 lanes' "$tmp/s1.log")
    fit=$(printf '%s' "$line" | grep -o '[0-9]* tokens' | grep -o '[0-9]*')
    if [ -n "$fit" ]; then ok; else bad "the start log names no admission: $(grep 'KV' "$tmp/s1.log")"; fi
    chat() { # max_tokens -> status code, body in $tmp/body
        curl -s -o "$tmp/body" -w '%{http_code}' "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
            -d "{\"messages\":[{\"role\":\"user\",\"content\":\"What does ephemeral mean?\"}],\"max_tokens\":$1,\"temperature\":0}"
    }
    code=$(chat $((fit + 1)))
    if [ "$code" = 400 ] && grep -q context_length_exceeded "$tmp/body" && grep -q kv-budget-mb "$tmp/body"; then ok
    else bad "a request past the admitted context: $code $(cat "$tmp/body")"; fi
    code=$(chat 8)
    if [ "$code" = 200 ]; then ok; else bad "a request within it: $code $(cat "$tmp/body")"; fi
    models=$(curl -s "http://127.0.0.1:$port/v1/models")
    if printf '%s' "$models" | grep -q "\"max_model_len\":$fit"; then ok; else bad "/v1/models: $models (want max_model_len $fit)"; fi
    kill -TERM "$pid"; wait "$pid" 2>/dev/null
fi
start "$tmp/s2.log" --lanes 64 --kv-budget-mb 1
if [ -z "$port" ] && grep -q "does not hold one empty sequence for each of 64 lanes" "$tmp/s2.log"; then ok
else bad "a budget too small for the lanes: $(tail -2 "$tmp/s2.log")"; fi

echo "kv: $pass passed, $fail failed"
[ $fail -eq 0 ]
