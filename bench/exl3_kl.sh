#!/usr/bin/env bash
# EXL3 packs of a checkpoint against the original: for each bit width, `dsv4 quantize --exl3 K`
# then `dsv4 logits` on every case of the fixture's cases.json (or a default id list), and the
# mean KL(original || EXL3) per position (nats) and top-1 agreement.
# usage: bench/exl3_kl.sh [FIXTURE_DIR] [BITS...]   (default tests/fixtures/v4/v4-tiny-a, 2 3 4 5 6)
set -eu
cd "$(dirname "$0")/.."
fx=${1:-tests/fixtures/v4/v4-tiny-a}
shift || true
bits=${*:-2 3 4 5 6}
hb=${HEAD_BITS:-6}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$fx" >"$tmp/cases" <<'PY'
import json, os, sys
p = os.path.join(sys.argv[1], "cases.json")
cases = json.load(open(p))["cases"] if os.path.exists(p) else [{"ids": list(range(1, 65))}]
for c in cases:
    print(",".join(map(str, c["ids"])))
PY
i=0
while read -r ids; do build/dsv4 logits -m "$fx" --ids "$ids" -o "$tmp/ref.$i"; i=$((i + 1)); done <"$tmp/cases"
echo "fixture $fx, head bits $hb, $(wc -l <"$tmp/cases") cases"
printf '%4s %12s %10s %10s %10s\n' K "bits/weight" "rel.err" "KL nats" "top-1"
for K in $bits; do
    build/dsv4 quantize --exl3 "$K" --head-bits "$hb" -m "$fx" -o "$tmp/p$K" >"$tmp/q$K.log" 2>/dev/null
    i=0
    while read -r ids; do build/dsv4 logits -m "$tmp/p$K" --ids "$ids" -o "$tmp/q.$i"; i=$((i + 1)); done <"$tmp/cases"
    python3 - "$tmp" "$i" "$K" "$(tail -n 1 "$tmp/q$K.log")" "$fx/config.json" <<'PY'
import json, math, re, struct, sys
d, n, K, summary = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
V = json.load(open(sys.argv[5]))["vocab_size"]
kl = agree = pos = 0
for i in range(n):
    a = open("%s/ref.%d" % (d, i), "rb").read(); b = open("%s/q.%d" % (d, i), "rb").read()
    a = struct.unpack("<%df" % (len(a) // 4), a); b = struct.unpack("<%df" % (len(b) // 4), b)
    for r in range(0, len(a), V):
        x, y = a[r:r + V], b[r:r + V]
        mx, my = max(x), max(y)
        lx = math.log(sum(math.exp(v - mx) for v in x)) + mx
        ly = math.log(sum(math.exp(v - my) for v in y)) + my
        kl += sum(math.exp(u - lx) * ((u - lx) - (v - ly)) for u, v in zip(x, y))
        agree += x.index(mx) == y.index(my)
        pos += 1
bpw = re.search(r"at ([0-9.]+) bits/weight", summary)
err = re.search(r"rel.err ([0-9.]+) overall", summary)
print("%4s %12s %10s %10.5f %9.1f%%" % (K, bpw.group(1) if bpw else "?", err.group(1) if err else "?", kl / pos, 100.0 * agree / pos))
PY
done
