#!/usr/bin/env bash
# Runs on the GPU machine, from a copy of this tree (docs/cuda.md says how it gets there):
# uses binaries built beside it when there are some (prebuilt/, same layout as build/, with
# lib/ holding the shared libraries the image lacks), else builds with CUDA=1 there. Then, as
# `make test-cuda`: the op test, every V4 and V4.1 fixture through the CUDA backend, the same
# fixtures with a device budget that spills routed experts to pinned host memory, and a budget
# that must be refused (one after the other: eight at once ran past their limits). Then the
# timings: `dsv4 bench --synthetic v4-flash`, bench_cuda, the PyTorch peer at the same shapes,
# the synthetic bench again with experts spilled. Last, the op test under compute-sanitizer. Logs
# go to $OUT; the exit status is that of the correctness runs.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/dsv4-out}
mkdir -p "$OUT"
export DSV4_SHARED=${DSV4_SHARED:-$PWD}
F=$DSV4_SHARED/fixtures
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
if [ -x prebuilt/dsv4 ]; then
    B=prebuilt
    export LD_LIBRARY_PATH=$PWD/lib:${LD_LIBRARY_PATH:-}
elif make -j16 CUDA=1 BUILD=build >"$OUT/build.log" 2>&1; then
    B=build
else
    echo "== no prebuilt/ and the build failed:"; tail -n 3 "$OUT/build.log"; exit 1
fi
T=$(mktemp -d)   # the per-test logs come back as one archive, $OUT/tests.tgz
rc=0
ok() { # name, command...: runs it with its log in $T/name.log, records a failure
    local n=$1; shift
    if timeout 200 "$@" >"$T/$n.log" 2>&1; then echo "ok   $n"; else echo "FAIL $n"; echo "$n" >>"$T/failed"; fi
}
export DSV4_TEST_DEVICE=cuda
ok ops $B/tests/cuda/test_cuda_ops
ok v4 env DSV4_CUDA_POISON=1 $B/tests/test_v4_fixtures
ok v41 env DSV4_CUDA_POISON=1 $B/tests/test_v41_fixtures
ok spill-v4a env DSV4_CUDA_BUDGET=2.8M $B/tests/test_v4_fixtures $F/v4/v4-tiny-a
ok spill-v4b env DSV4_CUDA_BUDGET=1.8M $B/tests/test_v4_fixtures $F/v4/v4-tiny-b
ok spill-v4v env DSV4_CUDA_BUDGET=8.01M $B/tests/test_v4_fixtures $F/v4/v4-tiny-v
ok spill-v41 env DSV4_CUDA_BUDGET=2.2M $B/tests/test_v41_fixtures $F/v41/v41-tiny-a
ok refuse bash -c "DSV4_CUDA_BUDGET=1M $B/tests/test_v4_fixtures $F/v4/v4-tiny-a 2>&1 | grep 'the hot path does not fit'"
unset DSV4_TEST_DEVICE
[ -s "$T/failed" ] && rc=1
for n in ops v4 v41 spill-v4a spill-v4b spill-v4v spill-v41 refuse; do
    echo "== $n"
    grep -E "placement|passed|does not fit|FAIL|fail" "$T/$n.log" | grep -v "^  .* ok$" | head -n 12
done
tar -czf "$OUT/tests.tgz" -C "$T" .
echo "== dsv4 bench --synthetic v4-flash --layers 2 --device cuda"
timeout 100 $B/dsv4 bench --synthetic v4-flash --layers 2 --device cuda 2>&1 | grep -v "loading" | tee "$OUT/synth.log"
echo "== bench_cuda"
timeout 100 $B/tests/cuda/bench_cuda 2>&1 | tee "$OUT/bench.log"
echo "== peer (PyTorch)"
PYTHONUNBUFFERED=1 timeout 100 python3 tests/cuda/peer_torch.py 2>&1 | tee "$OUT/peer.log"
echo "== dsv4 bench --synthetic again, DSV4_CUDA_BUDGET=4G (experts spilled to pinned host memory)"
DSV4_CUDA_BUDGET=4G timeout 100 $B/dsv4 bench --synthetic v4-flash --layers 2 --device cuda 2>&1 | grep -v "loading" |
    tee "$OUT/synth_spill.log"
echo "== compute-sanitizer memcheck, op test"
timeout 60 compute-sanitizer --tool memcheck $B/tests/cuda/test_cuda_ops 2>&1 | tail -n 3
echo "== test rc $rc"
exit $rc
