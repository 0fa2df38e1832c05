#!/usr/bin/env bash
# Drafting through the CUDA backend: `dsv4 generate --draft D` prints exactly the ids of the
# same command without it, greedy and seeded, at draft depths 2 and 16, with the tensor cores
# off and on. DSpark on the V4.1 fixture (fp32 numerics); V4's MTP stage on a synthetic
# checkpoint in the release layout (random weights, so few proposals are kept: the rollback
# path). $1: the folder holding dsv4.
set -u
cd "$(dirname "$0")/../.."
B=${1:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
if ! "$B/dsv4" synth --preset tiny --layers 3 -o "$tmp/syn" >"$tmp/synth.log" 2>&1; then
    echo "FAIL: dsv4 synth"; tail -2 "$tmp/synth.log"; fail=1
fi
# name, drafter, model, extra options
drafts() {
    local name=$1 drafter=$2 model=$3 opts=$4
    for tc in 0 1; do
        for s in "" "--temperature 1.2 --seed 5"; do
            # shellcheck disable=SC2086
            g() { DSV4_CUDA_TC=$tc "$B/dsv4" generate -m "$model" --ids 0,5,7,9,11,5,7 -n 40 --ignore-eos --device cuda \
                $opts $s "$@"; }
            if ! g >"$tmp/plain" 2>"$tmp/plain.err" || [ ! -s "$tmp/plain" ]; then
                fail=$((fail + 1)); echo "FAIL: $name tc=$tc [$s]: plain run failed"; tail -2 "$tmp/plain.err"; continue
            fi
            for d in 2 16; do
                if g --draft "$drafter" --draft-max $d >"$tmp/draft" 2>"$tmp/draft.err" && cmp -s "$tmp/plain" "$tmp/draft"; then
                    pass=$((pass + 1)); echo "ok   $name tc=$tc [$s] depth $d: $(grep "draft $drafter" "$tmp/draft.err")"
                else
                    fail=$((fail + 1)); echo "FAIL: $name tc=$tc [$s] depth $d: drafted ids differ from plain (or the run failed)"
                    tail -2 "$tmp/draft.err"
                fi
            done
        done
    done
}
drafts dspark dspark tests/fixtures/v41/v41-tiny-a "--numerics fp32"
[ -d "$tmp/syn" ] && drafts mtp mtp "$tmp/syn" ""
echo "drafts on cuda: $pass passed, $fail failed"
[ "$fail" = 0 ]
