#!/usr/bin/env bash
# `--gpus N` (docs/multigpu.md) on models/mini and the V4/V4.1 fixtures' checkpoints:
# - --gpus 1 (a communicator of one rank, the experts' all-reduce through NCCL) gives the ids and
#   logits of the plain CUDA run, byte for byte, for generate, a drafted generate and logits;
# - with 2 or more GPUs, --gpus 2 gives them too (the experts split over two processes); with
#   one GPU, --gpus 2 is refused before any rank starts;
# - two ranks forced onto one GPU (DSV4_RANKS_ONE_GPU=1): NCCL refuses the communicator, and
#   every rank stops with the reason named, within the time limit (no hang);
# - serve --gpus 1 answers two requests at once as the plain server does;
# - --gpus on the CPU, and serve with --gpus 2, are refused with a clear error.
# $1: the folder holding dsv4.
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh
B=${1:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export NCCL_NVLS_ENABLE=0
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
D="$B/dsv4"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
ids=0,19923,14,2058,223,16,1041

same() { # what, then the two commands' outputs as files (an empty one never passes)
    if [ -s "$2" ] && cmp -s "$2" "$3"; then ok "$1"; else bad "$1: $(head -c 200 "$2") vs $(head -c 200 "$3")"; fi
}

timeout 300 "$D" generate --device cuda --ids $ids -n 24 --ignore-eos >"$tmp/g0" 2>"$tmp/e0"
timeout 300 "$D" generate --device cuda --gpus 1 --ids $ids -n 24 --ignore-eos >"$tmp/g1" 2>"$tmp/e1"
[ -s "$tmp/g0" ] || { tail -3 "$tmp/e0"; }
[ -s "$tmp/g1" ] || { tail -3 "$tmp/e1"; }
same "generate: --gpus 1 gives the plain run's ids" "$tmp/g0" "$tmp/g1"
timeout 300 "$D" generate --device cuda --gpus 1 --draft lookup --ids $ids -n 24 --ignore-eos >"$tmp/gd" 2>/dev/null
same "generate --draft lookup: --gpus 1 gives the plain run's ids" "$tmp/g0" "$tmp/gd"
for fx in v4/v4-tiny-a v41/v41-tiny-a; do
    m=tests/fixtures/$fx
    [ -f "$m/config.json" ] || continue
    rm -f "$tmp/l0" "$tmp/l1" "$tmp/l2"
    timeout 300 "$D" logits -m "$m" --device cuda --ids 1,5,9,13,2,7 -o "$tmp/l0" 2>/dev/null
    timeout 300 "$D" logits -m "$m" --device cuda --gpus 1 --ids 1,5,9,13,2,7 -o "$tmp/l1" 2>"$tmp/le"
    [ -s "$tmp/l1" ] || tail -3 "$tmp/le"
    same "logits of $fx: --gpus 1 equals the plain run, byte for byte" "$tmp/l0" "$tmp/l1"
    if [ "$gpus" -ge 2 ]; then
        timeout 300 "$D" logits -m "$m" --device cuda --gpus 2 --ids 1,5,9,13,2,7 -o "$tmp/l2" 2>"$tmp/le"
        [ -s "$tmp/l2" ] || tail -3 "$tmp/le"
        same "logits of $fx: --gpus 2 equals one GPU, byte for byte" "$tmp/l0" "$tmp/l2"
    fi
done
if [ "$gpus" -ge 2 ]; then
    timeout 300 "$D" generate --device cuda --gpus 2 --ids $ids -n 24 --ignore-eos >"$tmp/g2" 2>"$tmp/e2"
    same "generate: --gpus 2 gives one GPU's ids" "$tmp/g0" "$tmp/g2"
else
    timeout 60 "$D" generate --device cuda --gpus 2 --ids $ids -n 4 >"$tmp/o" 2>"$tmp/e"
    rc=$?
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "this machine has 1 GPU" "$tmp/e" &&
        ok "--gpus 2 on one GPU is refused ($(head -1 "$tmp/e"))" || bad "--gpus 2 on one GPU: rc $rc, $(head -2 "$tmp/e")"
fi
t0=$(date +%s)
DSV4_RANKS_ONE_GPU=1 timeout 120 "$D" generate --device cuda --gpus 2 --ids $ids -n 4 >"$tmp/o" 2>"$tmp/e"
rc=$? t=$(($(date +%s) - t0))
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -qi "nccl" "$tmp/e" &&
    ok "two ranks on one GPU: every rank stops in ${t}s, reason named ($(grep -m1 -i 'nccl' "$tmp/e" | head -c 240))" ||
    bad "two ranks on one GPU: rc $rc after ${t}s: $(head -c 400 "$tmp/e")"
timeout 60 "$D" generate --gpus 1 --ids $ids -n 4 >"$tmp/o" 2>"$tmp/e"
rc=$?
[ $rc -ne 0 ] && grep -q "add --device cuda" "$tmp/e" && ok "--gpus on the CPU is refused" || bad "--gpus on the CPU: rc $rc, $(head -2 "$tmp/e")"
timeout 60 "$D" serve --device cuda --gpus 2 --port 0 >"$tmp/o" 2>"$tmp/e"
rc=$?
[ $rc -eq 2 ] && grep -q "not built" "$tmp/e" && ok "serve --gpus 2 is refused" || bad "serve --gpus 2: rc $rc, $(head -2 "$tmp/e")"
# serve --gpus 1: two requests at once, greedy, the replies of the plain server
serve_replies() { # extra serve options...; prints the two replies, one a line
    "$D" serve --device cuda --host 127.0.0.1 --port 0 --lanes 2 "$@" >"$tmp/serve.log" 2>&1 &
    local pid=$! port
    port=$(serve_port "$tmp/serve.log" "$pid" 1200)
    [ -n "$port" ] && timeout 120 python3 - "$port" <<'EOF'
import json, sys, threading, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/v1/chat/completions"
out = [None, None]
def ask(i, content):
    body = json.dumps({"messages": [{"role": "user", "content": content}], "max_tokens": 24, "temperature": 0}).encode()
    with urllib.request.urlopen(urllib.request.Request(url, body, {"content-type": "application/json"}), timeout=100) as r:
        out[i] = json.loads(r.read())["choices"][0]["message"]["content"]
ts = [threading.Thread(target=ask, args=(0, "Hello there")), threading.Thread(target=ask, args=(1, "Count to five"))]
[t.start() for t in ts]
[t.join() for t in ts]
print(json.dumps(out[0])); print(json.dumps(out[1]))
EOF
    kill -TERM "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
}
serve_replies >"$tmp/s0"
serve_replies --gpus 1 >"$tmp/s1"
if [ "$(grep -c . "$tmp/s1")" -eq 2 ] && ! grep -q '^null$' "$tmp/s1"; then
    same "serve --gpus 1: two requests at once give the plain server's replies" "$tmp/s0" "$tmp/s1"
else
    bad "serve --gpus 1: $(head -c 300 "$tmp/s1") / $(tail -3 "$tmp/serve.log")"
fi
timeout 300 "$D" bench --synthetic v4-flash --device cuda --gpus 1 --layers 2 --prefill 64 --decode 4 >"$tmp/b" 2>&1 &&
    ok "bench --synthetic v4-flash --gpus 1 ($(grep -m1 'decode' "$tmp/b" | head -c 160))" || bad "bench --gpus 1: $(tail -3 "$tmp/b")"
echo "ranks on cuda: $pass passed, $fail failed"
[ $fail -eq 0 ]
