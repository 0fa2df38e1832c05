#!/usr/bin/env bash
# Runs on the GPU machine, from a copy of this tree (docs/cuda.md says how it gets there):
# builds with CUDA=1 there when the image can, else uses binaries built beside it (prebuilt/,
# same layout as build/, with lib/ holding the shared libraries the image lacks). Then the
# CUDA tests (op by op, fixtures through the CUDA backend), the op test under
# compute-sanitizer, and the benchmark. Logs go to $OUT.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/dsv4-out}
mkdir -p "$OUT"
export DSV4_SHARED=${DSV4_SHARED:-$PWD}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
B=build
if make -j16 CUDA=1 BUILD=$B >"$OUT/build.log" 2>&1; then
    echo "== built on the device"
else
    echo "== build on the device failed, using prebuilt/:"
    tail -n 3 "$OUT/build.log"
    B=prebuilt
    export LD_LIBRARY_PATH=$PWD/lib:${LD_LIBRARY_PATH:-}
fi
rc=0
echo "== op by op"
$B/tests/cuda/test_cuda_ops >"$OUT/test_ops.log" 2>&1 || rc=1
cat "$OUT/test_ops.log"
echo "== fixtures through CUDA (device outputs poisoned)"
DSV4_TEST_DEVICE=cuda DSV4_CUDA_POISON=1 $B/tests/test_v4_fixtures >"$OUT/fixtures.log" 2>&1 || rc=1
cat "$OUT/fixtures.log"
echo "== compute-sanitizer memcheck, op test"
timeout 240 compute-sanitizer --tool memcheck $B/tests/cuda/test_cuda_ops >"$OUT/memcheck.log" 2>&1
tail -n 3 "$OUT/memcheck.log"
echo "== bench"
timeout 240 $B/tests/cuda/bench_cuda 2>&1 | tee "$OUT/bench.log"
echo "== test rc $rc"
exit $rc
