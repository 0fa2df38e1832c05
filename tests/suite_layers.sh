#!/usr/bin/env bash
# The layering of docs/architecture.md (tests/tools/check_layers.py): the tree's includes obey it,
# and the checker refuses each kind of violation planted in a small tree of its own (an include
# up a layer, a lower layer including the public API, text including the model, the model
# including text beyond its token map, a backend's device header or the CPU backend's ops header, the server including the
# model's internals, an include cycle in model/, an include that names no file).
# Prints "layers: N passed, M failed".
set -u
cd "$(dirname "$0")/.."
pass=0 fail=0
ok() { pass=$((pass + 1)); }
ko() { echo "layers: $1"; fail=$((fail + 1)); }
command -v python3 >/dev/null || { echo "layers: python3 is not installed"; echo "layers: 0 passed, 1 failed"; exit 1; }
check=tests/tools/check_layers.py

out=$(python3 "$check" 2>&1) && ok || ko "the tree breaks the layering:
$out"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# A minimal tree that obeys the layering: each case copies it and adds one violation.
base="$tmp/base"
mkdir -p "$base"/src/{core,io,kernels,text,model,serve,cli} "$base/include"
printf '#include "core/err.h"\n' > "$base/include/dsv4.h"
: > "$base/src/core/err.h"
printf '#include "core/err.h"\n' > "$base/src/io/io.h"
printf '#include "io/io.h"\n' > "$base/src/kernels/backend.h"
mkdir -p "$base/src/kernels/cuda"
printf '#include "kernels/backend.h"\n' > "$base/src/kernels/cuda/cuda.h"
mkdir -p "$base/src/kernels/cpu"
printf '#include "kernels/backend.h"\n' > "$base/src/kernels/cpu/cpu.h"
printf '#include "core/err.h"\n' > "$base/src/text/token_map.h"
printf '#include "core/err.h"\n' > "$base/src/text/tokenizer.h"
printf '#include "dsv4.h"\n#include "kernels/backend.h"\n#include "text/token_map.h"\n#include "model/b.h"\n' > "$base/src/model/a.h"
printf '#include "io/io.h"\n' > "$base/src/model/b.h"
printf '#include "dsv4.h"\n#include "text/tokenizer.h"\n' > "$base/src/serve/lanes.h"
printf '#include "serve/lanes.h"\n#include "model/a.h"\n' > "$base/src/cli/main.c"
out=$(python3 "$check" "$base" 2>&1) && ok || ko "a tree that obeys the layering is refused:
$out"

# plant FILE LINE WANT: the checker must refuse the base tree with LINE appended to FILE,
# saying WANT.
plant() {
    local t="$tmp/case$((pass + fail))"
    cp -r "$base" "$t"
    printf '%s\n' "$2" >> "$t/src/$1"
    out=$(python3 "$check" "$t" 2>&1)
    if [ $? -ne 0 ] && grep -qF -- "$3" <<< "$out"; then ok; else ko "$1 + '$2': want a refusal saying '$3', got:
$out"; fi
}
plant core/err.h '#include "io/io.h"' 'core/err.h:1: #include "io/io.h" runs from core to io'
plant io/io.h '#include "kernels/backend.h"' 'runs from io to kernels'
plant kernels/backend.h '#include "model/b.h"' 'runs from kernels to model'
plant kernels/backend.h '#include "dsv4.h"' 'kernels/backend.h:2: #include "dsv4.h" runs from kernels to model'
plant core/err.h '#include "dsv4.h"' 'runs from core to model'
plant text/token_map.h '#include "dsv4.h"' 'runs from text to model'
plant text/token_map.h '#include "kernels/backend.h"' 'runs from text to kernels'
plant model/b.h '#include "text/tokenizer.h"' 'model/b.h:2: #include "text/tokenizer.h" runs from model to text'
plant model/b.h '#include "serve/lanes.h"' 'runs from model to serve'
plant model/b.h '#include "kernels/cuda/cuda.h"' 'runs from model to kernels (model may include: core, model, io, kernels, dsv4.h, text/token_map.h; never kernels/cuda/; never kernels/cpu/cpu.h)'
plant model/b.h '#include "kernels/cpu/cpu.h"' 'model/b.h:2: #include "kernels/cpu/cpu.h" runs from model to kernels'
plant serve/lanes.h '#include "model/a.h"' 'runs from serve to model'
plant serve/lanes.h '#include "cli/main.c"' 'runs from serve to cli'
plant serve/lanes.h '#include "cli/cli.h"' 'is not a file of src/'
plant model/b.h '#include "model/a.h"' 'include cycle in model/: model/a.h -> model/b.h -> model/a.h'

echo "layers: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
