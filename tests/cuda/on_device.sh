#!/usr/bin/env bash
# Runs on the GPU machine, from a copy of this tree (docs/cuda.md says how it gets there):
# uses binaries built beside it when there are some (prebuilt/, same layout as build/, with
# lib/ holding the shared libraries the image lacks), else builds with CUDA=1 there. Then, as
# `make test-cuda`: the op tests, every V4 and V4.1 fixture through the CUDA backend, the same
# fixtures with a device budget that spills routed experts to pinned host memory, and a budget
# that must be refused (one after the other, so no run's time limit is spent waiting on the
# others' use of the device). Then the timings: `dsv4 bench --synthetic v4-flash --layers 2`
# with graph replay on and off, and with experts spilled. Last, the op test under compute-sanitizer.
# `on_device.sh bench`: instead, our rows of the benchmark table (43 layers, lanes, 4k prefill);
# `on_device.sh depths`: long context, decode and a chunk's prefill at depths to 1M, production and exact caches;
# `on_device.sh peers`: the transformers and PyTorch peers beside ours on the same 2 layers;
# `on_device.sh ncu`: the hardware counters of each kernel of one decode step;
# `on_device.sh ncu-tc`: the 64-token tensor-core pass and EXL3's tensor-core core under the counters (needs
# STAGE_BENCH_CUDA=1);
# `on_device.sh profile`: the op profile of a 4k prefill and of an 8-lane step (tensor cores on);
# `on_device.sh prod`: the linear kernels beside PyTorch at every row count, tensor cores on;
# `on_device.sh prod-bench`: issue 12's 43-layer rows in production numerics and exact, with the run's peaks;
# `on_device.sh v41`: V4.1-Flash's rows at 40 layers, REF and fp32, tensor cores and FMA kernels, a resumed
# 20k-token turn and the Engram tables streamed.
# `on_device.sh quick`: the op tests, the fixtures and the batch test, default kernels and tensor cores (about a
# minute, for a session with little device time; the full list stays the gate); SUBSET="ops v4-tc ..." runs the
# named runs of the list alone;
# `on_device.sh ab`: two builds' timings side by side, this one (prebuilt/) and the one stage.sh packed from
# STAGE_ALT (prebuilt-alt/): the linear kernels at two shapes with bf16 and fp32 x, and a 4-layer REF prefill;
# first the other build's op test with the tensor cores when it was packed (STAGE_ALT_OPS=1), which sets the exit status.
# `on_device.sh wg`: the many-token pass on wgmma against mma.sync's in one build (DSV4_CUDA_WG): the linear
# kernels at T = 64..4096, the 4-layer REF prefill and its op profile.
# `on_device.sh wgv`: the wgmma pass's block shapes (DSV4_CUDA_WG_V=4..6, or WGV_SHAPES="..."): the linear kernels with bf16 x, the op
# test with each (and with shapes 4 and 6 walking 3 items a block, DSV4_CUDA_WG_P=3), the linear kernels with fp32 x
# and the 4-layer REF prefill, beside prebuilt-alt/ when staged (STAGE_ALT: a build of the pass before them, 8fb25ab);
# `on_device.sh decode-ab`: exact batch-1 decode at 43 layers, this build beside prebuilt-alt/, timed and profiled.
# Logs go to $OUT; the exit status is that of the correctness runs.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/dsv4-out}
mkdir -p "$OUT"
F=tests/fixtures
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
if [ -x prebuilt/dsv4 ]; then
    B=prebuilt
    export LD_LIBRARY_PATH=$PWD/lib:${LD_LIBRARY_PATH:-}
elif make -j16 CUDA=1 BUILD=build >"$OUT/build.log" 2>&1; then
    B=build
else
    echo "== no prebuilt/ and the build failed:"; tail -n 3 "$OUT/build.log"; exit 1
fi
mode=${1:-test}
# NCCL (--gpus): the system's, else the one PyTorch carries; multicast stays off (KINDS.md)
export NCCL_NVLS_ENABLE=0
if ! ldconfig -p | grep -q libnccl.so.2; then
    nd=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) + "/lib")' 2>/dev/null) &&
        export LD_LIBRARY_PATH=$nd:${LD_LIBRARY_PATH:-}
fi
if [ "$mode" = ranks ]; then
    # expert parallelism and --gpus alone (docs/multigpu.md), with the ops they touch
    export DSV4_TEST_DEVICE=cuda
    r=0
    for t in "$B/tests/cuda/test_cuda_ranks" "env DSV4_CUDA_TC=1 $B/tests/cuda/test_cuda_ranks" \
             "bash tests/cuda/ranks_cuda.sh $B"; do
        echo "== $t"; timeout 300 $t 2>&1 | tail -n 40; [ "${PIPESTATUS[0]}" = 0 ] || r=1
    done
    exit $r
fi
run() { echo "== $*"; stdbuf -oL timeout 500 "$@" 2>&1 | grep -v "loading\|building" | tee -a "$OUT/synth.log"; }
if [ "$mode" = bench ]; then
    # the benchmark table (docs/bench.md), ours: all 43 layers' shapes with the experts of 8
    # layers shared round-robin (same bytes read per token), a 64- and a 4096-token prefill,
    # batch-1 decode with and without graph replay, 4 and 8 lanes, with the default kernels
    # (attention and indexer on the tensor cores) and with every op on the FMA kernels
    # (DSV4_CUDA_TC=0); then every op on the tensor cores (DSV4_CUDA_TC=1), also at 16k and at
    # issue 12's lane counts
    DSV4_CUDA_TC=0 run $B/dsv4 bench --synthetic v4-flash --device cuda --layers 43 --expert-layers 8 \
        --prefill 64,4096 --decode 32 --lanes 1,4,8 --graphs on
    run $B/dsv4 bench --synthetic v4-flash --device cuda --layers 43 --expert-layers 8 --prefill 64,4096 --decode 32 \
        --lanes 1,4,8 --graphs both
    DSV4_CUDA_TC=1 run $B/dsv4 bench --synthetic v4-flash --device cuda --layers 43 --expert-layers 8 \
        --prefill 64,4096,16384 --decode 8 --lanes 1,4,8,16,32,64 --graphs on
    exit 0
fi
if [ "$mode" = prod ]; then
    # the linear kernels beside PyTorch at every projection shape and row count, tensor cores
    # on (bench_cuda needs STAGE_BENCH_CUDA=1 at staging); V4's production numerics are checked
    # by the test list (test_v4_fixtures, test_mini, test_backend_ops' linear_q)
    [ -x $B/tests/cuda/bench_cuda ] && DSV4_CUDA_TC=1 run $B/tests/cuda/bench_cuda
    echo "== peer: PyTorch FP8 / BF16 matmul at the projection shapes"
    PYTHONUNBUFFERED=1 timeout 200 python3 tests/cuda/peer_torch.py 2>&1 | tee "$OUT/peer.log"
    exit 0
fi
if [ "$mode" = prod-bench ]; then
    # issue 12's rows at 43 layers on the tensor cores, production numerics then exact, with
    # the run's tensor-core peaks first; then production numerics on the default kernels
    PYTHONUNBUFFERED=1 timeout 60 python3 tests/cuda/peer_torch.py --peak 2>&1
    DSV4_CUDA_TC=1 run $B/dsv4 bench --synthetic v4-flash --device cuda --layers 43 --expert-layers 8 \
        --prefill 4096,16384 --decode 8 --lanes 1,8,16,32,64 --graphs on --numerics ref
    DSV4_CUDA_TC=1 run $B/dsv4 bench --synthetic v4-flash --device cuda --layers 43 --expert-layers 8 \
        --prefill 16384 --decode 8 --lanes 16,32 --graphs on --numerics fp32
    run $B/dsv4 bench --synthetic v4-flash --device cuda --layers 43 --expert-layers 8 --prefill 64 --decode 16 \
        --lanes 1,8 --graphs on --numerics ref
    exit 0
fi
if [ "$mode" = ab ]; then
    [ -x prebuilt-alt/dsv4 ] || { echo "== no prebuilt-alt/: stage with STAGE_ALT=<build dir>"; exit 1; }
    # the other build's op test first, when staged (STAGE_ALT_OPS=1): its kernels' bits before its timings
    r=0
    if [ -x prebuilt-alt/tests/cuda/test_cuda_ops ]; then
        for wg in 1 default; do
            echo "== prebuilt-alt op test, tensor cores, DSV4_CUDA_WG=$wg"
            env DSV4_CUDA_TC=1 $([ $wg = 1 ] && echo DSV4_CUDA_WG=1) timeout 200 prebuilt-alt/tests/cuda/test_cuda_ops \
                >"$OUT/alt_ops_wg$wg.log" 2>&1
            rc=$?
            echo "exit $rc: $(tail -n 1 "$OUT/alt_ops_wg$wg.log")"
            [ $rc = 0 ] || { r=1; grep -m 20 'FAIL\|NOT CAUGHT' "$OUT/alt_ops_wg$wg.log"; }
        done
    fi
    # rounds alternate the builds, so a drift of the machine shows as a spread within a build
    for round in 1 2; do
        for b in prebuilt prebuilt-alt; do
            echo "== round $round, $b"
            for sh in "wq_b FP8" "expert w1 FP4"; do
                for x in fp32 bf16; do
                    DSV4_CUDA_TC=1 BENCH_X=$x BENCH_ONLY="$sh" BENCH_T=16,512,4096 timeout 60 $b/tests/cuda/bench_cuda 2>&1 |
                        grep '\[' | sed "s/^/x $x: /"
                done
            done
            DSV4_CUDA_TC=1 timeout 90 $b/dsv4 bench --synthetic v4-flash --device cuda --layers 4 --prefill 4096 \
                --decode 4 --lanes 1,8 --graphs on --numerics ref 2>&1 | grep 'prefill:\|^decode'
        done
    done
    exit $r
fi
if [ "$mode" = wg ]; then
    # the many-token pass on wgmma (the default for FP8 and FP4) against mma.sync's (DSV4_CUDA_WG=0)
    # in one run: the linear kernels at T = 64..4096, REF's bf16 x and fp32 x, then the 4-layer
    # REF prefill in alternating rounds and its op profile each way
    for wg in 0 1; do
        for sh in "wq_b FP8" "wo_b FP8" "wq_a FP8" "gate BF16" "expert w1 FP4" "expert w2 FP4"; do
            for x in bf16 fp32; do
                DSV4_CUDA_WG=$wg DSV4_CUDA_TC=1 BENCH_X=$x BENCH_ONLY="$sh" BENCH_T=64,128,512,4096 timeout 60 \
                    $B/tests/cuda/bench_cuda 2>&1 | grep '\[' | grep -v '^weight' | sed "s/^/wg $wg x $x: /"
            done
        done
    done
    for round in 1 2; do
        for wg in 0 default; do
            DSV4_CUDA_WG=$wg DSV4_CUDA_TC=1 timeout 90 $B/dsv4 bench --synthetic v4-flash --device cuda --layers 4 \
                --prefill 4096 --decode 4 --graphs on --numerics ref 2>&1 | grep 'prefill:' | sed "s/^/wg $wg: /"
        done
    done
    for wg in 0 default; do
        echo "== op profile, DSV4_CUDA_WG=$wg"
        DSV4_CUDA_WG=$wg DSV4_CUDA_TC=1 DSV4_CUDA_PROFILE=1 run $B/dsv4 bench --synthetic v4-flash --device cuda \
            --layers 4 --graphs off --prefill 4096 --decode 4 --numerics ref
    done
    exit 0
fi
if [ "$mode" = wgv ]; then
    # what decides first, each step skipped once the call's time is mostly spent (WGV_S seconds,
    # 480 unless set): the linear kernels with REF's bf16 x, then the op tests, then fp32 x and
    # the 4-layer REF prefill
    shapes=${WGV_SHAPES:-4 5 6} # the shapes a candidate build adds are named here
    builds=$shapes
    [ -x prebuilt-alt/tests/cuda/bench_cuda ] && builds="alt $builds"
    left() { [ $SECONDS -lt "${WGV_S:-480}" ] || { echo "== skipped at ${SECONDS} s: $1"; return 1; }; }
    wgv_bench() { # x
        for c in $builds; do
            b=$B; v=$c
            [ "$c" = alt ] && b=prebuilt-alt
            for sh in "wq_b FP8" "wo_b FP8" "expert w1 FP4" "expert w2 FP4"; do
                left "bench $c $1" || return 0
                DSV4_CUDA_WG_V=$v DSV4_CUDA_TC=1 BENCH_X=$1 BENCH_ONLY="$sh" BENCH_T=512,4096 BENCH_NO_T1=1 timeout 60 \
                    $b/tests/cuda/bench_cuda 2>&1 | grep '\[' | grep -v '^weight' | sed "s/^/$c $1: /"
            done
        done
    }
    wgv_bench bf16
    cfgs=""
    for v in $shapes; do cfgs="$cfgs $v:1"; done
    for cfg in $cfgs 4:3 6:3; do
        cfg=${cfg/:/ }
        set -- $cfg
        left "op test $1 $2" || break
        DSV4_CUDA_WG_V=$1 DSV4_CUDA_WG_P=$2 DSV4_CUDA_TC=1 DSV4_CUDA_WG=1 timeout 200 $B/tests/cuda/test_cuda_ops \
            >"$OUT/ops_v$1p$2.log" 2>&1
        echo "op test, shape $1, walk $2: exit $? $(tail -n 1 "$OUT/ops_v$1p$2.log") (at ${SECONDS} s)"
    done
    wgv_bench fp32
    [ -x prebuilt-alt/dsv4 ] && builds="alt $shapes"
    for round in 1 2; do
        for c in $builds; do
            b=$B; v=$c
            [ "$c" = alt ] && b=prebuilt-alt
            left "prefill $c" || break 2
            DSV4_CUDA_WG_V=$v DSV4_CUDA_TC=1 timeout 90 $b/dsv4 bench --synthetic v4-flash \
                --device cuda --layers 4 --prefill 4096 --decode 2 --graphs on --numerics ref 2>&1 | grep 'prefill:' |
                sed "s/^/round $round, $c: /"
        done
    done
    exit 0
fi
if [ "$mode" = decode-ab ]; then
    # exact batch-1 decode at 43 layers on the default kernels, this build (prebuilt/) beside
    # prebuilt-alt/ (STAGE_ALT: an older build, e.g. 8fa966a, 11.28 ms on an H100), in alternating
    # rounds, then each one's op profile (each op waited for), to find where the step's time went
    [ -x prebuilt-alt/dsv4 ] || { echo "== no prebuilt-alt/: stage with STAGE_ALT=<build dir>"; exit 1; }
    A="--synthetic v4-flash --device cuda --layers 43 --expert-layers 8 --numerics fp32"
    for round in 1 2; do
        for b in $B prebuilt-alt; do
            echo "== round $round, $b"
            timeout 120 $b/dsv4 bench $A --prefill 64 --decode 32 --lanes 1,8 --graphs on 2>&1 | grep -v 'loading\|building'
        done
    done
    for b in $B prebuilt-alt; do
        echo "== op profile, $b"
        DSV4_CUDA_PROFILE=1 timeout 120 $b/dsv4 bench $A --prefill 64 --decode 8 --graphs off 2>&1 |
            grep -v 'loading\|building' | tee "$OUT/prof_$(basename $b).txt"
    done
    exit 0
fi
if [ "$mode" = v41 ]; then
    # V4.1-Flash's rows (docs/bench.md): all 40 layers, the experts of 8 shared round-robin, a
    # 3k prefill and batch-1 decode on the tensor cores in REF numerics (the default where
    # the checkpoint is the release's) and in fp32, then REF on the FMA kernels with lanes
    for nm in ref fp32; do
        DSV4_CUDA_TC=1 run $B/dsv4 bench --synthetic v4.1-flash --device cuda --layers 40 --expert-layers 8 \
            --prefill 3072 --decode 8 --numerics $nm
    done
    run $B/dsv4 bench --synthetic v4.1-flash --device cuda --layers 40 --expert-layers 8 --prefill 64 --decode 16 \
        --lanes 1,8 --numerics ref
    # a resumed long turn: a 78-token suffix on a 20,480-token state, both kernel families
    run $B/dsv4 bench --synthetic v4.1-flash --device cuda --layers 40 --expert-layers 8 --depths 20480 --prefill 78 \
        --decode 8
    DSV4_CUDA_TC=1 run $B/dsv4 bench --synthetic v4.1-flash --device cuda --layers 40 --expert-layers 8 \
        --depths 20480 --prefill 78 --decode 8
    # the Engram tables streamed from disk (written to /tmp, read by row)
    DSV4_CUDA_TC=1 run $B/dsv4 bench --synthetic v4.1-flash --device cuda --layers 40 --expert-layers 8 \
        --engram-tables streamed --engram-dir /tmp --prefill 3072 --decode 8
    exit 0
fi
if [ "$mode" = depths ]; then
    # long context (issue 15, docs/bench.md): all 43 layers at V4-Flash shapes, each state filled
    # with random rows to the depth (1,048,550 leaves room for the chunk and the decode steps in the
    # 1,048,576-token context), a 16-token chunk and batch-1 decode with the default kernels,
    # production then exact caches; then the share of attn_step's indexer of a decode step at each
    # depth (op profile, each op waited for)
    for kv in production exact; do
        run $B/dsv4 bench --synthetic v4-flash --device cuda --layers 43 --expert-layers 8 --kv $kv \
            --depths 4096,4096,16384,131072,524288,1048550 --prefill 16 --decode 8
    done
    for D in 4096 16384 131072 524288 1048550; do
        DSV4_CUDA_PROFILE=1 run $B/dsv4 bench --synthetic v4-flash --device cuda --layers 43 \
            --expert-layers 8 --kv production --graphs off --depths $D --prefill 1 --decode 4
    done
    exit 0
fi
if [ "$mode" = profile ]; then
    # where a 4k prefill's and an 8-lane step's time goes, op by op (each op waited for), with
    # the tensor cores on: 4 layers at V4-Flash shapes (2 CSA, 2 HCA)
    DSV4_CUDA_TC=1 DSV4_CUDA_PROFILE=1 run $B/dsv4 bench --synthetic v4-flash --device cuda --layers 4 --graphs off \
        --prefill 4096 --decode 4
    DSV4_CUDA_TC=1 DSV4_CUDA_PROFILE=1 run $B/dsv4 bench --synthetic v4-flash --device cuda --layers 4 --graphs off \
        --prefill 64 --decode 6 --lanes 8
    exit 0
fi
if [ "$mode" = ncu-tc ]; then
    # the many-token tensor-core pass under the counters (wgmma's, the default at these shapes;
    # DSV4_CUDA_WG=0 for mma.sync's): wq_b FP8 and expert w1 FP4 at T = 4096 with REF's bf16 x (one
    # term), and the EXL3 tensor-core core at T = 4096: throughput, occupancy,
    # where the warps stall and what the schedulers issue, to $OUT/ncu_tc.txt. One launch a shape is
    # profiled: the third, inside the first timed graph's warm-up (the first is the call bench_cuda
    # makes before capturing, so that EXL3's scratch grows outside the capture)
    for sh in "wq_b FP8" "expert w1 FP4" "wo_b EXL3"; do
        DSV4_CUDA_TC=1 BENCH_X=bf16 BENCH_ONLY="$sh" BENCH_T=4096 BENCH_NO_T1=1 timeout 150 ncu --clock-control none \
            --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
            --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section LaunchStats \
            -k 'regex:k_tc_linear|k_wg_linear|exl3_core_tc' --launch-skip 2 --launch-count 1 \
            $B/tests/cuda/bench_cuda >>"$OUT/ncu_tc.txt" 2>&1
        echo "ncu $sh exit $?"
    done
    grep -E 'Duration|Compute \(SM\) Throughput|Memory Throughput|Issued Ipc|No Eligible|Achieved Occupancy|Registers Per|Stall|One or More' \
        "$OUT/ncu_tc.txt" | head -n 60
    exit 0
fi
if [ "$mode" = ncu ]; then
    # each kernel of one batch-1 decode step (2 layers at V4-Flash shapes, ops one by one):
    # its time, DRAM bytes and launch shape, from the hardware counters, to $OUT/ncu.csv
    timeout 400 ncu --clock-control none --profile-from-start off --csv --metrics \
        gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size,launch__registers_per_thread \
        $B/dsv4 bench --synthetic v4-flash --device cuda --layers 2 --prefill 64 --decode 2 --graphs off --capture \
        >"$OUT/ncu.csv" 2>"$OUT/ncu.err"
    echo "ncu exit $?"; tail -n 3 "$OUT/ncu.err"; grep -c k_ "$OUT/ncu.csv"
    # where the slowest kinds stall: throughput, occupancy and warp states of one of each
    timeout 150 ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
        --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section LaunchStats \
        -k 'regex:k_ex_up|k_attn|k_hc_pre|k_linear<|k_emit' --launch-count 6 \
        $B/dsv4 bench --synthetic v4-flash --device cuda --layers 2 --prefill 64 --decode 2 --graphs off --capture \
        >"$OUT/ncu_detail.txt" 2>&1
    echo "ncu detail exit $?"
    exit 0
fi
if [ "$mode" = peers ]; then
    # the peers on the same shapes: transformers' DeepseekV4 eager forward (2 layers at V4-Flash
    # shapes, bf16), ours on the same 2 layers, PyTorch's FP8 / BF16 matmuls at the projections
    echo "== peer: transformers DeepseekV4 eager, 2 layers at V4-Flash shapes"
    PYTHONUNBUFFERED=1 timeout 300 python3 bench/peer_transformers.py --layers 2 2>&1 | tee "$OUT/peer_transformers.log"
    run $B/dsv4 bench --synthetic v4-flash --device cuda --layers 2 --prefill 64,4096 --decode 16
    echo "== peer: PyTorch FP8 / BF16 matmul at the projection shapes"
    PYTHONUNBUFFERED=1 timeout 100 python3 tests/cuda/peer_torch.py 2>&1 | tee "$OUT/peer.log"
    exit 0
fi
T=$(mktemp -d)   # the per-test logs come back as one archive, $OUT/tests.tgz
rc=0
# quick: the op tests, the fixtures, the batch test and the trained model, default kernels and
# tensor cores, out of the list below
subset=""
[ "$mode" = quick ] && subset=" ops backend-ops exl3ops v4 v41 batch ops-tc exl3ops-tc backend-ops-tc v4-tc v41-tc batch-tc mini-tc "
[ -n "${SUBSET:-}" ] && subset=" $SUBSET "
ok() { # name, command...: runs it with its log in $T/name.log, records a failure
    local n=$1; shift
    [ -z "$subset" ] || [[ "$subset" == *" $n "* ]] || return 0
    echo "$n" >>"$T/ran"
    if timeout 200 "$@" >"$T/$n.log" 2>&1; then echo "ok   $n"; else echo "FAIL $n"; echo "$n" >>"$T/failed"; fi
}
export DSV4_TEST_DEVICE=cuda
ok ops $B/tests/cuda/test_cuda_ops
ok backend-ops $B/tests/test_backend_ops
ok exl3ops $B/tests/cuda/test_cuda_exl3
ok v4 env DSV4_CUDA_POISON=1 $B/tests/test_v4_fixtures
ok v41 env DSV4_CUDA_POISON=1 $B/tests/test_v41_fixtures
ok batch $B/tests/test_batch
ok lanes $B/tests/test_lanes
ok mini $B/tests/test_mini
ok draft $B/tests/test_draft
ok mtp $B/tests/test_mtp
ok dspark $B/tests/test_dspark
ok drafts bash tests/cuda/draft_cuda.sh $B
ok serve bash tests/cuda/serve_cuda.sh $B
ok ranks-ops $B/tests/cuda/test_cuda_ranks
ok ranks bash tests/cuda/ranks_cuda.sh $B
ok kv $B/tests/test_kv
ok lanes-prod env DSV4_TEST_KV=production $B/tests/test_lanes
# the tensor-core path (DSV4_CUDA_TC=1): the op test and the end-to-end contracts again
ok ops-tc env DSV4_CUDA_TC=1 $B/tests/cuda/test_cuda_ops
# the many-token pass on wgmma for every kind (BF16 included), and on mma.sync for every kind
ok ops-wg env DSV4_CUDA_TC=1 DSV4_CUDA_WG=1 $B/tests/cuda/test_cuda_ops
for v in 5 6; do ok ops-wg$v env DSV4_CUDA_TC=1 DSV4_CUDA_WG=1 DSV4_CUDA_WG_V=$v $B/tests/cuda/test_cuda_ops; done
ok ops-walk env DSV4_CUDA_TC=1 DSV4_CUDA_WG=1 DSV4_CUDA_WG_P=3 $B/tests/cuda/test_cuda_ops
ok ops-mma env DSV4_CUDA_TC=1 DSV4_CUDA_WG=0 $B/tests/cuda/test_cuda_ops
ok exl3ops-tc env DSV4_CUDA_TC=1 $B/tests/cuda/test_cuda_exl3
ok ranks-ops-tc env DSV4_CUDA_TC=1 $B/tests/cuda/test_cuda_ranks
ok backend-ops-tc env DSV4_CUDA_TC=1 $B/tests/test_backend_ops
ok v4-tc env DSV4_CUDA_TC=1 DSV4_CUDA_POISON=1 $B/tests/test_v4_fixtures
ok v41-tc env DSV4_CUDA_TC=1 DSV4_CUDA_POISON=1 $B/tests/test_v41_fixtures
ok batch-tc env DSV4_CUDA_TC=1 $B/tests/test_batch
ok lanes-tc env DSV4_CUDA_TC=1 $B/tests/test_lanes
ok mini-tc env DSV4_CUDA_TC=1 $B/tests/test_mini
ok draft-tc env DSV4_CUDA_TC=1 $B/tests/test_draft
ok mtp-tc env DSV4_CUDA_TC=1 $B/tests/test_mtp
ok dspark-tc env DSV4_CUDA_TC=1 $B/tests/test_dspark
ok kv-tc env DSV4_CUDA_TC=1 $B/tests/test_kv
# every kernel on the FMA path (DSV4_CUDA_TC=0): step.cu's attention and indexer, which the
# default leaves to the tensor cores
ok ops-fma env DSV4_CUDA_TC=0 $B/tests/cuda/test_cuda_ops
ok backend-ops-fma env DSV4_CUDA_TC=0 $B/tests/test_backend_ops
ok v4-fma env DSV4_CUDA_TC=0 DSV4_CUDA_POISON=1 $B/tests/test_v4_fixtures
ok kv-fma env DSV4_CUDA_TC=0 $B/tests/test_kv
ok spill-v4a env DSV4_CUDA_BUDGET=2.45M $B/tests/test_v4_fixtures $F/v4/v4-tiny-a
ok spill-v4b env DSV4_CUDA_BUDGET=1.85M $B/tests/test_v4_fixtures $F/v4/v4-tiny-b
ok spill-v4v env DSV4_CUDA_BUDGET=9.004M $B/tests/test_v4_fixtures $F/v4/v4-tiny-v
ok spill-v41 env DSV4_CUDA_BUDGET=2.8M $B/tests/test_v41_fixtures $F/v41/v41-tiny-a
ok refuse bash -c "DSV4_CUDA_BUDGET=1M $B/tests/test_v4_fixtures $F/v4/v4-tiny-a 2>&1 | grep 'the hot path does not fit'"
ok refuse-host bash -c "DSV4_CUDA_BUDGET=2.45M DSV4_HOST_BUDGET=64K $B/tests/test_v4_fixtures $F/v4/v4-tiny-a 2>&1 | grep 'do not fit the host'"
unset DSV4_TEST_DEVICE
[ -s "$T/failed" ] && rc=1
for n in $(cat "$T/ran"); do
    echo "== $n"
    grep -E "placement|passed|does not fit|FAIL|fail" "$T/$n.log" | grep -v "^  .* ok$" | head -n 12
done
tar -czf "$OUT/tests.tgz" -C "$T" .
[ -n "$subset" ] && exit $rc
echo "== an EXL3 pack (four layers at K=3) through the CUDA backend against the CPU, FMA and tensor-core cores"
ids=$(python3 -c 'import json, sys; print(",".join(map(str, json.load(open(sys.argv[1]))["cases"][0]["ids"])))' "$F/v4/v4-tiny-a/cases.json")
only=layers.1.attn.wo_a,layers.0.ffn.experts.2.w2,layers.2.ffn.shared_experts.w1,layers.2.attn.wq_b
if $B/dsv4 quantize --exl3 3 --only $only -m "$F/v4/v4-tiny-a" -o "$T/pack" >"$T/quant.log" 2>&1 &&
   $B/dsv4 logits -m "$T/pack" --ids "$ids" -o "$T/exl3_cpu.f32" && $B/dsv4 logits -m "$T/pack" --ids "$ids" --device cuda -o "$T/exl3_gpu.f32" &&
   python3 tests/tools/exl3_gen.py maxdiff "$T/exl3_cpu.f32" "$T/exl3_gpu.f32" 1e-4 &&
   DSV4_CUDA_TC=1 $B/dsv4 logits -m "$T/pack" --ids "$ids" --device cuda -o "$T/exl3_tc.f32" &&
   python3 tests/tools/exl3_gen.py maxdiff "$T/exl3_cpu.f32" "$T/exl3_tc.f32" 1e-4; then echo "ok   exl3 forward"; else echo "FAIL exl3 forward"; rc=1; fi
echo "== dsv4 bench --synthetic v4-flash --layers 2 --device cuda (graph replay on, then off)"
stdbuf -oL timeout 150 $B/dsv4 bench --synthetic v4-flash --layers 2 --device cuda --decode 16 --graphs both >"$T/b.log" 2>&1
r=$?
grep -v "loading" "$T/b.log" | tee -a "$OUT/synth.log"; echo "exit $r"
if [ $r -ge 128 ] && [ $r != 137 ]; then
    echo "== backtrace"; timeout 200 cuda-gdb -batch -ex run -ex bt --args $B/dsv4 bench --synthetic v4-flash --layers 2 --device cuda --decode 4 2>&1 | tail -n 30
fi
echo "== dsv4 bench --synthetic again, DSV4_CUDA_BUDGET=4G (experts spilled to pinned host memory)"
DSV4_CUDA_BUDGET=4G timeout 100 $B/dsv4 bench --synthetic v4-flash --layers 2 --device cuda 2>&1 | grep -v "loading" |
    tee "$OUT/synth_spill.log"
echo "== compute-sanitizer memcheck, op test"
timeout 60 compute-sanitizer --tool memcheck $B/tests/cuda/test_cuda_ops 2>&1 | tail -n 3
echo "== test rc $rc"
exit $rc
