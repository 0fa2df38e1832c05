#!/usr/bin/env bash
# `dsv4 generate --draft lookup` prints exactly the ids that the same command prints without
# it (lookup, and DSpark on the V4.1 fixture), greedy and seeded, on the default model (whose English replies repeat themselves, so
# proposals are kept) and on the held-out V4 fixtures (random weights: proposals are mostly
# refused, so the rollback path runs); and the acceptance line reports kept proposals. Then
# the server on the default model: chat requests with "draft" (and with the --draft default)
# answer with the ids, text and logprobs of the same requests without, streamed and not, and
# report what the drafts did in usage, the request log and /metrics.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
bin=build/dsv4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

# "<bos><User>What does ephemeral mean?<Assistant></think>" in the default model's tokenizer
mini_ids=0,3,293,307,2978,272,992,294,271,38,4,6
same() { # what, model, ids, extra options...
    local what=$1 model=$2 ids=$3; shift 3
    if ! $bin generate -m "$model" --ids "$ids" -n 48 "$@" >"$tmp/plain" 2>"$tmp/plain.err"; then
        bad "$what: plain run failed"; tail -3 "$tmp/plain.err"; return
    fi
    for d in "--draft-max 1" "--draft-max 5" "--draft-max 16 --ngram 2,4"; do
        # shellcheck disable=SC2086
        if ! $bin generate -m "$model" --ids "$ids" -n 48 "$@" --draft lookup $d >"$tmp/draft" 2>"$tmp/draft.err"; then
            bad "$what ($d): drafted run failed"; tail -3 "$tmp/draft.err"; continue
        fi
        if cmp -s "$tmp/plain" "$tmp/draft"; then ok; else bad "$what ($d): drafted ids differ from plain"; fi
        grep -h "draft lookup:" "$tmp/draft.err" >>"$tmp/acceptance"
    done
}
same "mini greedy" models/mini "$mini_ids"
same "mini seeded" models/mini "$mini_ids" --temperature 1.5 --seed 7
same "mini seeded, top-k" models/mini "$mini_ids" --temperature 0.8 --top-k 20 --top-p 0.9 --seed 99
for fx in tests/fixtures/v4/v4-held-1 tests/fixtures/v4/v4-held-2; do
    [ -d "$fx" ] || { bad "$fx missing"; continue; }
    same "$(basename "$fx") greedy" "$fx" 0,5,7,5,7,5,7,9
    same "$(basename "$fx") seeded" "$fx" 0,5,7,5,7,5,7,9 --temperature 1 --seed 3
done
# DSpark on the V4.1 fixture (random stages: low acceptance, so the rollback path runs), in its
# default ref numerics and in fp32; the trace has one well-formed line per drafted round
v41=tests/fixtures/v41/v41-tiny-a
dspark() { # what, options...
    local what=$1; shift
    if ! $bin generate -m "$v41" --ids 0,5,7,9,11,5,7 -n 40 --ignore-eos "$@" >"$tmp/plain" 2>"$tmp/plain.err"; then
        bad "$what: plain run failed"; tail -3 "$tmp/plain.err"; return
    fi
    for d in "--draft-max 2" "--draft-max 16"; do
        # shellcheck disable=SC2086
        if ! $bin generate -m "$v41" --ids 0,5,7,9,11,5,7 -n 40 --ignore-eos "$@" --draft dspark $d \
            --draft-trace "$tmp/trace" >"$tmp/draft" 2>"$tmp/draft.err"; then
            bad "$what ($d): drafted run failed"; tail -3 "$tmp/draft.err"; continue
        fi
        if cmp -s "$tmp/plain" "$tmp/draft"; then ok; else bad "$what ($d): drafted ids differ from plain"; fi
        steps=$(sed -n 's/^draft dspark: \([0-9]*\) steps.*/\1/p' "$tmp/draft.err")
        if python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
want = int(sys.argv[2]); cap = int(sys.argv[3])
assert len(rows) == want, (len(rows), want)
for r in rows:
    assert isinstance(r["pos"], int) and isinstance(r["anchor"], int) and r["kept"] <= len(r["draft"]) <= cap
    assert len(r["confidence"]) == len(r["draft"])
' "$tmp/trace" "${steps:-0}" "$([ "$d" = "--draft-max 2" ] && echo 2 || echo 4)"; then ok; else
            bad "$what ($d): the trace does not hold one round per step"; fi
    done
}
dspark "v41 dspark greedy"
dspark "v41 dspark seeded" --temperature 1.2 --seed 5
dspark "v41 dspark fp32 greedy" --numerics fp32
if $bin generate -m tests/fixtures/v4/v4-held-1 --ids 0,5,7 -n 4 --draft dspark >/dev/null 2>"$tmp/err"; then
    bad "--draft dspark on a checkpoint without stages ran"
elif grep -q "no DSpark stages" "$tmp/err"; then ok; else bad "--draft dspark without stages: $(cat "$tmp/err")"; fi
# V4's MTP stage on a synthetic checkpoint in the release layout (random weights)
if $bin synth --preset tiny --layers 3 -o "$tmp/syn" >/dev/null 2>&1; then
    for samp in "" "--temperature 1.3 --seed 4"; do
        # shellcheck disable=SC2086
        $bin generate -m "$tmp/syn" --ids 0,5,7,9,5,7 -n 24 --ignore-eos $samp >"$tmp/plain" 2>/dev/null
        # shellcheck disable=SC2086
        if $bin generate -m "$tmp/syn" --ids 0,5,7,9,5,7 -n 24 --ignore-eos $samp --draft mtp --draft-max 3 >"$tmp/draft" \
            2>"$tmp/draft.err" && [ -s "$tmp/plain" ] && cmp -s "$tmp/plain" "$tmp/draft"; then ok; else
            bad "mtp ($samp): drafted ids differ from plain"; tail -2 "$tmp/draft.err"; fi
    done
else
    bad "dsv4 synth failed"
fi
if $bin generate -m "$v41" --ids 0,5,7 -n 4 --draft mtp >/dev/null 2>"$tmp/err"; then
    bad "--draft mtp on a checkpoint without the stage ran"
elif grep -q "no MTP stage" "$tmp/err"; then ok; else bad "--draft mtp without the stage: $(cat "$tmp/err")"; fi
if timeout 60 $bin serve --port 0 --drafter dspark >"$tmp/err" 2>&1; then
    bad "serve --drafter dspark on a model without stages ran"
elif grep -q "no DSpark stages" "$tmp/err"; then ok; else bad "serve --drafter dspark without stages: $(tail -1 "$tmp/err")"; fi

kept=$(awk '{for (i = 1; i <= NF; i++) if ($i == "kept" && $(i - 1) ~ /^[0-9]+$/) s += $(i - 1)} END {print s + 0}' \
    "$tmp/acceptance")
if [ "$kept" -gt 0 ]; then ok; else bad "no proposal was ever kept"; fi

# the server
build/dsv4 serve --port 0 --lanes 3 --threads 1 --draft 3 >"$tmp/server.log" 2>&1 &
spid=$!
port=$(serve_port "$tmp/server.log" "$spid" 300)
if [ -z "$port" ]; then
    bad "the server did not start"; tail -5 "$tmp/server.log"
else
    ask() { # body -> the reply's ids, text and logprobs, one JSON line (python3 reads it)
        curl -s --max-time 60 "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' -d "$1"
    }
    fields() { python3 -c '
import json, sys
j = json.load(sys.stdin)
c = j["choices"][0]
print(json.dumps([c["message"]["content"], c["token_ids"], [t["logprob"] for t in c["logprobs"]["content"]]]))
print(json.dumps(j["usage"].get("draft")), file=sys.stderr)'; }
    q='"messages":[{"role":"user","content":"What does ephemeral mean?"}],"logprobs":true,"return_token_ids":true,"max_tokens":40'
    for samp in '"temperature":0' '"temperature":1.5,"seed":11'; do
        ask "{$q,$samp,\"draft\":0}" | fields >"$tmp/plain.json" 2>/dev/null
        [ -f "$tmp/greedy.json" ] || cp "$tmp/plain.json" "$tmp/greedy.json"
        ask "{$q,$samp,\"draft\":6}" | fields >"$tmp/drafted.json" 2>"$tmp/usage6.json"
        ask "{$q,$samp}" | fields >"$tmp/default.json" 2>"$tmp/usage3.json"
        if [ -s "$tmp/plain.json" ] && cmp -s "$tmp/plain.json" "$tmp/drafted.json" && cmp -s "$tmp/plain.json" "$tmp/default.json"; then
            ok
        else
            bad "server ($samp): drafted replies differ from plain"; head -c 300 "$tmp/plain.json" "$tmp/drafted.json"
        fi
        if grep -q '"kept_tokens"' "$tmp/usage6.json" && grep -q '"kept_tokens"' "$tmp/usage3.json"; then ok; else
            bad "server ($samp): usage has no draft report"; fi
    done
    # streamed: the same text as the whole reply
    curl -sN --max-time 60 "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' \
        -d "{$q,\"temperature\":0,\"draft\":6,\"stream\":true}" | python3 -c '
import json, sys
out = []
for line in sys.stdin:
    line = line.strip()
    if line.startswith("data: {"):
        for ch in json.loads(line[6:])["choices"]:
            out.append(ch["delta"].get("content") or "")
print("".join(out))' >"$tmp/stream.txt"
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[0])' "$tmp/greedy.json" >"$tmp/plain.txt"
    if cmp -s "$tmp/stream.txt" "$tmp/plain.txt"; then ok; else bad "server: a drafted stream differs from the plain reply"; fi
    bad_draft=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/chat/completions" \
        -H 'content-type: application/json' -d "{$q,\"draft\":99}")
    if [ "$bad_draft" = 400 ]; then ok; else bad "server: draft 99 answered $bad_draft, not 400"; fi
    kept_m=$(curl -s "http://127.0.0.1:$port/metrics" | awk '$1 == "dsv4_draft_kept_tokens_total" {print $2}')
    if [ "${kept_m:-0}" -gt 0 ]; then ok; else bad "server: /metrics reports no kept draft tokens"; fi
    if grep -q ' draft=[0-9]*/[0-9]* at=[0-9]*/[0-9]*' "$tmp/server.log"; then ok; else
        bad "server: the request log has no draft field with its per-position counts"; fi
    # per-position acceptance: in usage (the extension's positions add up to kept_tokens) and /metrics
    if python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["positions"] and sum(p["kept"] for p in d["positions"]) == d["kept_tokens"], d
assert all(p["kept"] <= p["reached"] for p in d["positions"])' "$tmp/usage6.json"; then ok; else
        bad "server: usage.draft.positions missing or not adding up: $(cat "$tmp/usage6.json")"; fi
    curl -s "http://127.0.0.1:$port/metrics" >"$tmp/metrics"
    pk=$(awk '$1 ~ /^dsv4_draft_position_kept_total/ {s += $2} END {print s + 0}' "$tmp/metrics")
    tk=$(awk '$1 == "dsv4_draft_kept_tokens_total" {print $2}' "$tmp/metrics")
    if [ "$pk" -gt 0 ] && [ "$pk" = "$tk" ] && grep -q '^dsv4_draft_off_total{reason="busy_lanes"}' "$tmp/metrics"; then ok; else
        bad "server: /metrics per-position kept ($pk) does not add up to the total ($tk), or no off counters"; fi
    kill "$spid"; wait "$spid" 2>/dev/null
fi
echo "draft suite: $pass passed, $fail failed"
[ $fail -eq 0 ]
