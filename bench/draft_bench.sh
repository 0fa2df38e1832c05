#!/usr/bin/env bash
# Drafted decode for docs/bench.md: plain vs drafted tok/s and the share of rounds that kept
# each proposal position, per drafter (prompt lookup, DSpark, MTP), on prompts that repeat and
# prompts that do not; then where the server's policy turns drafting off: busy lanes, and on a
# GPU, routed experts left in host memory (DSV4_CUDA_BUDGET below the weights).
#   bash bench/draft_bench.sh            (N=64 tokens a run; THREADS=1 by default)
#   DEVICE=cuda BIN=prebuilt/dsv4 bash bench/draft_bench.sh    (on the GPU machine)
set -u
cd "$(dirname "$0")/.."
bin=${BIN:-build/dsv4}
N=${N:-64}
T=${THREADS:-1}
DEV=${DEVICE:-cpu}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; [ -n "${spid:-}" ] && kill "$spid" 2>/dev/null' EXIT
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo none), device $DEV, threads $T, $N tokens a run"
$bin synth --preset tiny --layers 3 -o "$tmp/syn" >/dev/null 2>&1

rate() { sed -n 's/.*generated, \([0-9.]*\) tok\/s decode.*/\1/p' "$1"; }
run() { # model label prompt-kind ids drafter
    local model=$1 label=$2 kind=$3 ids=$4 drafter=$5
    $bin generate -m "$model" --ids "$ids" -n "$N" --ignore-eos --threads "$T" --device "$DEV" >"$tmp/p" 2>"$tmp/pe" || return
    $bin generate -m "$model" --ids "$ids" -n "$N" --ignore-eos --threads "$T" --device "$DEV" --draft "$drafter" --draft-max 4 \
        >"$tmp/d" 2>"$tmp/de" || return
    local same=no
    cmp -s "$tmp/p" "$tmp/d" && same=yes
    # "draft X: S steps, P proposed, K kept (A tokens a step); kept at position k0 k1 ..."
    local line steps per at
    line=$(grep "^draft $drafter:" "$tmp/de")
    steps=$(echo "$line" | sed -n 's/^draft [a-z]*: \([0-9]*\) steps.*/\1/p')
    per=$(echo "$line" | sed -n 's/.*(\([0-9.]*\) tokens a step).*/\1/p')
    at=$(echo "$line" | sed -n 's/.*kept at position //p' | awk -v s="$steps" '{for (i = 1; i <= NF; i++) printf "%s%.2f", (i > 1 ? " " : ""), (s ? $i / s : 0)}')
    printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$label" "$drafter" "$kind" "$(rate "$tmp/pe")" "$(rate "$tmp/de")" \
        "$per" "$at" "$same"
}
echo
echo "| model | drafter | prompt | plain tok/s | drafted tok/s | tokens a step | kept share by position 0..3 | ids equal |"
echo "|---|---|---|---|---|---|---|---|"
mini_rep=0,3,293,307,2978,272,992,294,271,38,4,6     # "What does ephemeral mean?": the reply repeats it
mini_new=0,3,392,1352,96,21,4,6                      # another of the model's questions
run models/mini "mini (trained, 8.8M)" repeating "$mini_rep" lookup
run models/mini "mini (trained, 8.8M)" other "$mini_new" lookup
v41=tests/fixtures/v41/v41-tiny-a
rep=0,5,7,9,5,7,9,5,7,9,5,7,9
new=0,101,202,303,404,505,606,707,808,909
run "$v41" "v41-tiny-a (random)" repeating "$rep" dspark
run "$v41" "v41-tiny-a (random)" non-repeating "$new" dspark
run "$v41" "v41-tiny-a (random)" repeating "$rep" lookup
run "$tmp/syn" "synthetic V4 tiny + mtp.0 (random)" repeating "$rep" mtp
run "$tmp/syn" "synthetic V4 tiny + mtp.0 (random)" non-repeating "$new" mtp
run "$tmp/syn" "synthetic V4 tiny + mtp.0 (random)" repeating "$rep" lookup

post() { # url body
    if command -v curl >/dev/null; then
        curl -s --max-time 120 "$1" -H 'content-type: application/json' -d "$2"
    else
        python3 -c 'import sys, urllib.request as u; print(u.urlopen(u.Request(sys.argv[1], sys.argv[2].encode(), {"content-type": "application/json"}), timeout=120).read().decode())' "$1" "$2"
    fi
}
get() { if command -v curl >/dev/null; then curl -s "$1"; else python3 -c 'import sys, urllib.request as u; print(u.urlopen(sys.argv[1]).read().decode())' "$1"; fi; }
# a server on models/mini with the given options; six drafting requests at once, then one alone;
# its draft counters and the log's per-request draft fields
policy() {
    echo
    echo "dsv4 serve --device $DEV --lanes 6 --draft 4 $*${BUDGET:+ (DSV4_CUDA_BUDGET=$BUDGET)}"
    env ${BUDGET:+DSV4_CUDA_BUDGET=$BUDGET} $bin serve --port 0 --lanes 6 --threads "$T" --device "$DEV" --draft 4 "$@" >"$tmp/log" 2>&1 &
    spid=$!
    port=""
    for _ in $(seq 1 300); do
        port=$(sed -n 's/.*listening on .*:\([0-9][0-9]*\).*/\1/p' "$tmp/log" | head -1)
        [ -n "$port" ] && break
        sleep 0.1
    done
    grep -m1 "placement" "$tmp/log" | sed 's/^/    /'
    q='"messages":[{"role":"user","content":"What does ephemeral mean?"}],"max_tokens":48,"temperature":0'
    local pids=""
    for i in 1 2 3 4 5 6; do
        post "http://127.0.0.1:$port/v1/chat/completions" "{$q}" >"$tmp/r$i" &
        pids="$pids $!"
    done
    # shellcheck disable=SC2086
    wait $pids
    post "http://127.0.0.1:$port/v1/chat/completions" "{$q}" >"$tmp/solo"
    get "http://127.0.0.1:$port/metrics" | grep -E '^dsv4_draft_(off_total|proposed|kept_tokens)' | sed 's/^/    /'
    grep -o 'draft=[^ ]*\( at=[^ ]*\)\?' "$tmp/log" | sed 's/^/    log: /'
    kill "$spid"
    wait "$spid" 2>/dev/null
    spid=""
}
# the busy bound: 6 drafting requests on 6 lanes with the bound at 4
policy --draft-busy-max 4
if [ "$DEV" = cuda ]; then
    # experts in host memory: a budget that holds the hot path and half the routed experts
    $bin generate -m models/mini --ids 0,3 -n 1 --device cuda 2>&1 >/dev/null | grep -m1 placement >"$tmp/pl"
    BUDGET=$(sed -n 's/.*hot path \([0-9.]*\) MiB + routed experts \([0-9.]*\) MiB.*/\1 \2/p' "$tmp/pl" |
        awk '{printf "%.3fM", $1 + $2 / 2}')
    [ -n "$BUDGET" ] && policy --draft-busy-max 0
fi
