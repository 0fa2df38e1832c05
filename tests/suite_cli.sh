#!/usr/bin/env bash
# The CLI as a user runs it: -h on every command, bad options and missing models refused with
# a non-zero exit, `dsv4 logits` by both paths against a fixture (compared by an independent
# stdlib reader), the synthetic default generating, and the synthetic V4.1 presets (bench -h
# lists them; Engram gather reported resident and streamed; DSpark-drafted == plain ids).
set -u
cd "$(dirname "$0")/.."
bin=build/dsv4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
check() { local what=$1; shift; if "$@" >"$tmp/out" 2>&1; then ok; else bad "$what"; tail -5 "$tmp/out"; fi; }
refuse() { local what=$1; shift; if "$@" >"$tmp/out" 2>&1; then bad "$what (should fail)"; else ok; fi; }

for c in $($bin -h | awk '/^  [a-z]/{print $1}'); do
    check "$c -h" $bin "$c" -h
done
refuse "unknown command" $bin frobnicate
refuse "unknown option" $bin info --frobnicate
refuse "missing model" $bin info -m "$tmp/nothing"
refuse "bad ids" $bin logits -m "tests/fixtures/v4/v4-tiny-a" --ids 1,x -o "$tmp/l"
refuse "id outside the vocabulary" $bin logits -m "tests/fixtures/v4/v4-tiny-a" --ids 1,5000 -o "$tmp/l"

fx="tests/fixtures/v4/v4-tiny-a"
ids=$(python3 -c "import json;print(','.join(map(str,json.load(open('$fx/cases.json'))['cases'][2]['ids'])))")
check "logits, one prefill" $bin logits -m "$fx" --ids "$ids" -o "$tmp/full.f32"
check "logits, one prefill == reference" python3 tests/tools/compare_logits.py "$tmp/full.f32" "$fx/expected.safetensors" case2.logits
check "logits, prefill 9 + decode" $bin logits -m "$fx" --ids "$ids" --prefill 9 -o "$tmp/inc.f32"
check "logits, prefill 9 + decode == reference" python3 tests/tools/compare_logits.py "$tmp/inc.f32" "$fx/expected.safetensors" case2.logits
check "info on the sharded fixture" $bin info -m "tests/fixtures/v4/v4-tiny-v"
grep -q "layers    0:HCA+hash/16 1:CSA/4 2:SWA" "$tmp/out" && ok || bad "info layer schedule"

check "synth tiny" $bin synth --preset tiny --layers 3 -o "$tmp/tiny"
check "generate on it" $bin generate -m "$tmp/tiny" --ids 0,1,2 -n 4
[ "$(head -1 "$tmp/out" | tr ',' '\n' | grep -c .)" = 4 ] && ok || bad "generate printed 4 ids"
check "bench, 2 lanes, experts of 2 layers" $bin bench --synthetic tiny --layers 4 --expert-layers 2 --prefill 8 --decode 2 --lanes 2
grep -q "experts: 2 layers own routed experts" "$tmp/out" && grep -q "2 lanes, .* aggregate" "$tmp/out" && ok || bad "bench lanes output"
refuse "bench --lanes 0" $bin bench --synthetic tiny --layers 2 --lanes 0
$bin bench -h | grep -q "v4.1-flash  V4.1-Flash" && ok || bad "bench -h lists the v4.1-flash preset"
for t in resident streamed; do
    check "bench v4.1-tiny, $t Engram tables" $bin bench --synthetic v4.1-tiny --layers 3 --prefill 8 --decode 2 \
        --engram-tables $t --engram-dir "$tmp"
    grep -q "^  engram ($t): 48 rows/token, gather" "$tmp/out" && ok || bad "bench reports the $t Engram gather"
done
[ -z "$(ls "$tmp" | grep dsv4-synthetic-engram)" ] && ok || bad "streamed synthetic tables left behind"
refuse "bench v4.1-flash, 41 layers" $bin bench --synthetic v4.1-flash --layers 41
check "synth v4.1-tiny" $bin synth --preset v4.1-tiny --layers 4 -o "$tmp/t41"
if $bin generate -m "$tmp/t41" --ids 0,5,7,9,5,7 -n 8 >"$tmp/plain" 2>/dev/null &&
   $bin generate -m "$tmp/t41" --ids 0,5,7,9,5,7 -n 8 --draft dspark >"$tmp/drafted" 2>"$tmp/out" &&
   grep -q "draft dspark: [0-9]* steps" "$tmp/out" && [ "$(grep -c , "$tmp/plain")" = 1 ] && cmp -s "$tmp/plain" "$tmp/drafted"; then
    ok
else
    bad "generate on synthetic v4.1-tiny: DSpark-drafted ids differ from plain"
fi
echo "cli: $pass passed, $fail failed"
[ $fail -eq 0 ]
