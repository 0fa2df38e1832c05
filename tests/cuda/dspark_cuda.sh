#!/usr/bin/env bash
# DSpark drafting through the CUDA backend (V4.1 fixture, fp32 numerics): `dsv4 generate
# --draft dspark` prints exactly the ids of the same command without it, greedy and seeded, at
# draft depths 2 and 16, with the tensor cores off and on. $1: the folder holding dsv4.
set -u
cd "$(dirname "$0")/../.."
B=${1:-build}
F=tests/fixtures/v41/v41-tiny-a
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
for tc in 0 1; do
    for s in "" "--temperature 1.2 --seed 5"; do
        # shellcheck disable=SC2086
        g() { DSV4_CUDA_TC=$tc "$B/dsv4" generate -m $F --ids 0,5,7,9,11,5,7 -n 40 --ignore-eos --device cuda \
            --numerics fp32 $s "$@"; }
        if ! g >"$tmp/plain" 2>"$tmp/plain.err"; then
            fail=$((fail + 1)); echo "FAIL: tc=$tc [$s]: plain run failed"; tail -2 "$tmp/plain.err"; continue
        fi
        for d in 2 16; do
            if g --draft dspark --draft-max $d >"$tmp/draft" 2>"$tmp/draft.err" && cmp -s "$tmp/plain" "$tmp/draft"; then
                pass=$((pass + 1)); echo "ok   tc=$tc [$s] depth $d: $(grep 'draft dspark' "$tmp/draft.err")"
            else
                fail=$((fail + 1)); echo "FAIL: tc=$tc [$s] depth $d: drafted ids differ from plain (or the run failed)"
                tail -2 "$tmp/draft.err"
            fi
        done
    done
done
echo "dspark on cuda: $pass passed, $fail failed"
[ "$fail" = 0 ]
