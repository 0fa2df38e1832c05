#!/usr/bin/env bash
# The many-token pass's kernels as ptxas builds them, without a device: for each k_wg_* kernel of
# the given .cu files (default linear.cu and experts.cu), its registers, its spills and any
# "Potential Performance Loss" notice (C75xx: ptxas serializes the warpgroup's MMAs; the notice
# names the cause). A kernel listed with C75xx runs its MMAs one at a time.
#   tests/cuda/ptxas_report.sh [src/kernels/cuda/x.cu ...]
set -eu
cd "$(dirname "$0")/../.."
NVCC=${NVCC:-nvcc}
files=${*:-src/kernels/cuda/linear.cu src/kernels/cuda/experts.cu}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
for f in $files; do
    "$NVCC" -O2 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Iinclude -Isrc -DDSV4_NCCL -Xptxas -v -c \
        -o "$T/o.o" "$f" >"$T/log" 2>&1 || { tail -n 5 "$T/log"; exit 1; }
    awk '
        /Compiling entry function/ { match($0, /_Z[^'"'"']*/); fn = substr($0, RSTART, RLENGTH); next }
        /\(C75[0-9][0-9]\)/ { match($0, /\(C75[0-9][0-9]\)/); c = substr($0, RSTART + 1, 5);
                              match($0, /function '"'"'[^'"'"']*/); w[substr($0, RSTART + 10, RLENGTH - 10)] = c; next }
        /spill stores/ { sp[fn] = $5 + 0 }
        /Used [0-9]+ registers/ { match($0, /Used [0-9]+/); rg[fn] = substr($0, RSTART + 5, RLENGTH - 5) }
        END { for (f in rg) if (f ~ /k_wg_(linear|ex_up|ex_down)/)
                  print f, rg[f], "regs", sp[f] + 0, "spill", (f in w) ? w[f] : "" }
    ' "$T/log" | c++filt | sed 's/(.*)//' | sort
done
