#!/usr/bin/env bash
# `dsv4 serve --device cuda` on models/mini: admission within the device memory the weights
# left (the log line names it, and a --kv-budget-mb beyond it is capped with a line of its own),
# a greedy chat completion, two at once equal to each alone (concurrent == solo), a prompt over
# the admitted context refused with a 400 JSON error, and a clean exit on SIGTERM. The client is
# Python's standard library (the device image has no node). $1: the folder holding dsv4.
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh
B=${1:-build}
tmp=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }

# a budget far past any card's memory, so the cap must be logged; 4 lanes
"$B/dsv4" serve -m models/mini --device cuda --host 127.0.0.1 --port 0 --lanes 4 --kv-budget-mb 100000000 \
    >"$tmp/serve.log" 2>&1 &
pid=$!
port=$(serve_port "$tmp/serve.log" "$pid" 1200)
if [ -z "$port" ]; then
    tail -5 "$tmp/serve.log"; echo "serve on cuda: 0 passed, 1 failed (the server did not start)"; exit 1
fi
grep -q "of the device memory free after the weights" "$tmp/serve.log" && ok "admission within the device memory" ||
    bad "admission: no line naming the device memory ($(grep 'KV caches' "$tmp/serve.log"))"
grep -q "is more than the .* MB of device memory free after the weights" "$tmp/serve.log" && ok "a larger --kv-budget-mb is capped" ||
    bad "no log line for the capped --kv-budget-mb"
ctx=$(grep -o 'KV caches; [0-9]* tokens of context' "$tmp/serve.log" | grep -o '[0-9]*' | head -1)

python3 - "$port" "${ctx:-0}" >"$tmp/client.txt" 2>&1 <<'EOF'
import json, sys, threading, urllib.request, urllib.error
port, ctx = int(sys.argv[1]), int(sys.argv[2])
url = f"http://127.0.0.1:{port}/v1/chat/completions"
def ask(content, n=24):
    body = json.dumps({"messages": [{"role": "user", "content": content}], "max_tokens": n, "temperature": 0}).encode()
    req = urllib.request.Request(url, body, {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")
st, a = ask("Hello there")
text = a.get("choices", [{}])[0].get("message", {}).get("content") if st == 200 else None
print("ok   greedy completion" if st == 200 and text else f"FAIL greedy completion: {st} {a}")
st2, b = ask("Count to five")
solo = [a, b]
got = [None, None]
def run(i, c):
    got[i] = ask(c)[1]
ts = [threading.Thread(target=run, args=(0, "Hello there")), threading.Thread(target=run, args=(1, "Count to five"))]
[t.start() for t in ts]
[t.join() for t in ts]
same = all(g and s and g["choices"][0]["message"]["content"] == s["choices"][0]["message"]["content"] for g, s in zip(got, solo))
print("ok   concurrent == solo" if same else f"FAIL concurrent differs from solo: {got} vs {solo}")
if ctx > 0:
    st, e = ask("word " * (ctx + 64), 4)
    print("ok   an overlong prompt is refused (400)" if st == 400 and "error" in e else f"FAIL overlong prompt: {st} {e}")
else:
    print("FAIL no admitted context in the log")
EOF
cat "$tmp/client.txt"
pass=$((pass + $(grep -c '^ok ' "$tmp/client.txt")))
fail=$((fail + $(grep -c '^FAIL' "$tmp/client.txt")))
[ "$(grep -c -E '^(ok|FAIL)' "$tmp/client.txt")" -ge 3 ] || { bad "the client did not finish"; tail -3 "$tmp/client.txt"; }
kill -TERM "$pid"
wait "$pid"
src=$?
pid=
[ "$src" -eq 0 ] && ok "SIGTERM: exit 0" || { bad "SIGTERM: exit $src"; tail -3 "$tmp/serve.log"; }
echo "serve on cuda: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
