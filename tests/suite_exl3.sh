#!/usr/bin/env bash
# EXL3 decode against what the stdlib reference decoder made of the same layers
# (tests/fixtures/exl3, its README says how): random layers for every K 1..8 and every codebook,
# legacy .su/.sv, bias and padding.
#   dequant --inner == reference tiles, bit for bit;
#   dequant (full) == reference float64 W within one fp32 rounding: |d| <= 2^-24|ref| + 1e-12 max|ref|;
#   the fused matvec == dense dequant x within 1e-6 ||x|| ||W_c||, batched == per-row bitwise,
#   SIMD == scalar bitwise (build/tests/test_exl3 DIR);
#   FP8 (F32 / E8M0 block scales), FP4, BF16, F16, F32 dequant == exact values;
#   refused variants fail naming the tensor; dsv4 quantize makes a pack that reads back; a wrong expected file is reported (the comparator can fail).
set -u
cd "$(dirname "$0")/.."
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "exl3 FAIL: $*"; }
gen=tests/tools/exl3_gen.py
dsv4=build/dsv4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# a copy: one check below edits quantization_config.json
cp -r tests/fixtures/exl3 "$tmp/v"
if ! python3 $gen dense "$tmp/v" >"$tmp/gen.log" 2>&1; then
    cat "$tmp/gen.log"; echo "exl3: 0 passed, 1 failed (vector generation)"; exit 1
fi
while read -r p n k; do
    if $dsv4 dequant -m "$tmp/v" --tensor "$p" --shape "$n,$k" -o "$tmp/full.f32" 2>"$tmp/err"; then
        if python3 $gen cmp "$tmp/v/$p.full.f64" "$tmp/full.f32" full; then ok; else bad "$p: full dequant"; fi
    else bad "$p: dequant failed: $(cat "$tmp/err")"; fi
    if $dsv4 dequant -m "$tmp/v/exl3.safetensors" --tensor "$p.trellis" --shape "$n,$k" --inner -o "$tmp/inner.f32" 2>"$tmp/err"; then
        if python3 $gen cmp "$tmp/v/$p.inner.f32" "$tmp/inner.f32" inner; then ok; else bad "$p: tile decode"; fi
    else bad "$p: dequant --inner failed: $(cat "$tmp/err")"; fi
done <"$tmp/v/cases.txt"
# the comparators must reject a near miss: another layer's tiles, and a full weight off by 2 ulp
p=$(head -n 1 "$tmp/v/cases.txt" | cut -d' ' -f1); q=$(sed -n 2p "$tmp/v/cases.txt" | cut -d' ' -f1)
$dsv4 dequant -m "$tmp/v" --tensor "$q" --inner -o "$tmp/q.f32" 2>/dev/null
if python3 $gen cmp "$tmp/v/$p.inner.f32" "$tmp/q.f32" inner >/dev/null; then bad "inner comparator accepts a wrong layer"; else ok; fi
python3 - "$tmp/v/$p.full.f64" "$tmp/off.f32" <<'PY'
import struct, sys
e = open(sys.argv[1], "rb").read(); v = list(struct.unpack("<%dd" % (len(e) // 8), e))
f = struct.unpack("<%df" % len(v), struct.pack("<%df" % len(v), *v))
i = max(range(len(v)), key=lambda j: abs(v[j]))
g = list(f); g[i] = f[i] * (1 + 2 * 2.0 ** -23)
open(sys.argv[2], "wb").write(struct.pack("<%df" % len(g), *g))
PY
if python3 $gen cmp "$tmp/v/$p.full.f64" "$tmp/off.f32" full >/dev/null; then bad "full comparator accepts a 2-ulp error"; else ok; fi
# refused variants
while read -r stem layer name; do
    if $dsv4 dequant -m "$tmp/v/bad/$stem.safetensors" --tensor "$layer" -o "$tmp/x.f32" 2>"$tmp/err"; then
        bad "$stem: accepted"
    elif grep -qF "$name" "$tmp/err"; then ok
    else bad "$stem: message does not name $name: $(cat "$tmp/err")"; fi
done <"$tmp/v/bad/cases.txt"
# quantization_config.json must agree with the tensors
python3 -c 'import json, sys
p = sys.argv[1]; q = json.load(open(p))
q["tensor_storage"]["layers.3.3inst"]["bits_per_weight"] = 4
json.dump(q, open(p, "w"))' "$tmp/v/quantization_config.json"
if ! $dsv4 dequant -m "$tmp/v" --tensor layers.3.3inst -o "$tmp/x.f32" 2>"$tmp/err" && grep -q "bits_per_weight" "$tmp/err"; then ok
else bad "a bits_per_weight mismatch in quantization_config.json is not reported: $(cat "$tmp/err")"; fi
# the other forms through the same command, bit-exact
while read -r w; do
    if $dsv4 dequant -m "$tmp/v/dense.safetensors" --tensor "$w.weight" -o "$tmp/d.f32" 2>"$tmp/err"; then
        if python3 $gen cmp "$tmp/v/$w.f32" "$tmp/d.f32" inner; then ok; else bad "$w: dequant differs"; fi
    else bad "$w: dequant failed: $(cat "$tmp/err")"; fi
done <"$tmp/v/dense.txt"
# fused matvec on the same layers
if out=$(build/tests/test_exl3 "$tmp/v" 2>&1); then ok; else bad "matvec: $out"; fi
# dsv4 quantize: a small checkpoint to K=3 (head 5, mcg); the pack's layout, configs and copies,
# then each layer read back against the source: relative error within the trellis' Gaussian
# error (K=3: 0.141 measured, bound 0.17; K=5: 0.036, bound 0.045)
python3 $gen ckpt "$tmp/ck"
if $dsv4 quantize --exl3 3 --head-bits 5 --codebook mcg -m "$tmp/ck" -o "$tmp/pk" >"$tmp/q.log" 2>&1; then
    ok
    if python3 $gen checkpack "$tmp/ck" "$tmp/pk" 3 5 mcg; then ok; else bad "quantize: pack layout"; fi
    while read -r p n k kind; do
        b=0.17; [ "$kind" = h ] && b=0.045
        if $dsv4 dequant -m "$tmp/pk" --tensor "$p" --shape "$n,$k" -o "$tmp/a.f32" 2>"$tmp/err" &&
           $dsv4 dequant -m "$tmp/ck" --tensor "$p.weight" -o "$tmp/b.f32" 2>>"$tmp/err"; then
            if python3 $gen relerr "$tmp/a.f32" "$tmp/b.f32" $b; then ok; else bad "quantize: $p error"; fi
        else bad "quantize: $p: $(cat "$tmp/err")"; fi
    done <"$tmp/ck/layers.txt"
else bad "quantize failed: $(tail -n 5 "$tmp/q.log")"; fi
# the forward with EXL3 weights == the forward with the same weights dequantized to F32: a few
# linears of a repo fixture (an attention projection, the grouped wo_a used by row ranges, a
# routed and a shared expert) quantized, logits through both checkpoints. Same weight values, two
# summation orders (rotated fp32 vs the dense dot): measured 4e-6 on logits of magnitude ~4;
# bound 1e-4. A mis-routed layer, wrong rows or a wrong stride gives O(0.1) or more.
fx=tests/fixtures/v4/v4-held-1
only=layers.1.attn.wo_a,layers.0.ffn.experts.2.w2,layers.2.ffn.shared_experts.w1,layers.2.attn.wq_b
if [ -d "$fx" ] && $dsv4 quantize --exl3 3 --only "$only" -m "$fx" -o "$tmp/fp" >"$tmp/q2.log" 2>&1; then
    mkdir -p "$tmp/deq"
    python3 $gen layers "$fx" "$tmp/fp" >"$tmp/deq/layers.txt"
    okd=1
    while read -r p n k; do
        $dsv4 dequant -m "$tmp/fp" --tensor "$p" --shape "$n,$k" -o "$tmp/deq/$p.f32" 2>/dev/null || okd=0
    done <"$tmp/deq/layers.txt"
    [ "$(wc -l <"$tmp/deq/layers.txt")" -eq 4 ] || okd=0
    ids=$(python3 -c 'import json, sys; print(",".join(map(str, json.load(open(sys.argv[1]))["cases"][0]["ids"])))' "$fx/cases.json")
    if [ $okd = 1 ] && python3 $gen deqckpt "$tmp/fp" "$tmp/deq" "$tmp/fd" &&
       $dsv4 logits -m "$tmp/fp" --ids "$ids" -o "$tmp/la.f32" 2>"$tmp/err" &&
       $dsv4 logits -m "$tmp/fd" --ids "$ids" -o "$tmp/lb.f32" 2>>"$tmp/err"; then
        if python3 $gen maxdiff "$tmp/la.f32" "$tmp/lb.f32" 1e-4; then ok; else bad "forward: EXL3 pack vs its dequantized weights"; fi
        if python3 $gen maxdiff "$tmp/la.f32" "$tmp/lb.f32" 1e-9 >/dev/null; then bad "forward: the pack's EXL3 path was not taken (bitwise equal)"; else ok; fi
    else bad "forward check: $(cat "$tmp/err")"; fi
else bad "quantize --only on $fx: $(tail -n 3 "$tmp/q2.log" 2>/dev/null)"; fi
echo "exl3: $pass passed, $fail failed"
[ $fail -eq 0 ]
