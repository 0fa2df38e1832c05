#!/usr/bin/env bash
# Stages what a device run needs in .dev/run/prebuilt.tar.xz (git-ignored; sent with the run's
# `carry`, beside the tree, within the run's 64 MiB): the device image has nvcc but not libcjson's
# headers, so the CUDA build is made here (BUILD=${BUILD:-build-cuda}), stripped, with the shared
# libraries the image lacks. The scripts, fixtures and models are the tree's own. On the device,
# from the tree's root:
#   tar -xJf .dev/run/prebuilt.tar.xz && bash tests/cuda/on_device.sh [mode]
# STAGE_ALT=<build dir>: that build's dsv4 and (when built) bench_cuda go too, as prebuilt-alt/ (`on_device.sh ab`
# times the two side by side; the one dictionary keeps the second copy small), with its op test when
# STAGE_ALT_OPS=1; more dirs, space separated, go as prebuilt-alt2/, prebuilt-alt3/ ... STAGE_DIR: where the
# archive goes (.dev/run).
# A run carries the tracked tree (about 62 MiB: the fixtures and models/mini) and these files within
# 64 MiB counted in disk blocks, so the archive is checked against what the tree leaves.
set -eu
cd "$(dirname "$0")/../.."
B=${BUILD:-build-cuda}
D=${STAGE_DIR:-.dev/run}
S=$(mktemp -d)
trap 'rm -rf "$S"' EXIT
make -j"$(nproc)" CUDA=1 BUILD="$B" all "$B/tests/cuda/test_cuda_ops" >/dev/null
mkdir -p "$D" "$S/prebuilt/tests/cuda" "$S/lib"
rm -f "$D/prebuilt.tar.xz"
for f in dsv4 tests/test_backend_ops tests/test_v4_fixtures tests/test_v41_fixtures tests/test_batch tests/test_lanes tests/test_mini tests/test_draft tests/test_mtp tests/test_dspark tests/test_kv $(cd "$B" && ls tests/cuda/* | grep -v '\.d$\|\.o$'); do
    # bench_cuda (the linear kernels' timings, not a test) goes only when asked for with
    # STAGE_BENCH_CUDA=1: the run's 64 MiB hold the tree and little more
    [ "$f" = tests/cuda/bench_cuda ] && [ "${STAGE_BENCH_CUDA:-0}" != 1 ] && continue
    # STAGE_CLI_ONLY=1: dsv4 alone (a timing of two builds, `on_device.sh decode-ab`, within the 64 MiB);
    # STAGE_ONLY="<paths>": those alone (e.g. "dsv4 tests/cuda/bench_cuda" for `on_device.sh ab`)
    [ "$f" != dsv4 ] && [ "${STAGE_CLI_ONLY:-0}" = 1 ] && continue
    [ -n "${STAGE_ONLY:-}" ] && ! printf ' %s ' "$STAGE_ONLY" | grep -q " $f " && continue
    [ -f "$B/$f" ] && install -s "$B/$f" "$S/prebuilt/$f"
done
# every library the CLI links but those the image has: the C runtime's, the GnuTLS stack
# libmicrohttpd pulls in (seen there, 2026-12-06) and NCCL's (200 MB; on_device.sh finds
# PyTorch's)
ldd "$B/dsv4" | awk '$3 ~ /^\// {print $3}' |
    grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|libdl|libpthread|librt|libcudart|libnccl|libgnutls|libunistring|libgmp|libp11-kit|libhogweed|libnettle|libidn2|libtasn1|libffi)\.so' |
    while read -r l; do cp -L "$l" "$S/lib/"; done
cp -L "$(dirname "$(command -v nvcc)")/../lib64/libcudart.so.13" "$S/lib/" 2>/dev/null ||
    cp -L "$(find / -name 'libcudart.so.13' 2>/dev/null | head -1)" "$S/lib/"
alts=""
n=1
for a in ${STAGE_ALT:-}; do
    d=prebuilt-alt
    if [ $n -gt 1 ]; then d=$d$n; fi
    mkdir -p "$S/$d/tests/cuda"
    install -s "$a/dsv4" "$S/$d/dsv4"
    if [ -f "$a/tests/cuda/bench_cuda" ]; then install -s "$a/tests/cuda/bench_cuda" "$S/$d/tests/cuda/bench_cuda"; fi
    # STAGE_ALT_OPS=1: its op test too (`on_device.sh ab` runs it first)
    if [ "${STAGE_ALT_OPS:-0}" = 1 ]; then install -s "$a/tests/cuda/test_cuda_ops" "$S/$d/tests/cuda/test_cuda_ops"; fi
    alts="$alts $d"
    n=$((n + 1))
done
# the binaries carry every kernel (about 3.5 MB each, mostly the same bytes): one dictionary spans
# them all, so they compress about 100x; the run unpacks them
XZ_OPT="--lzma2=preset=9,dict=256MiB" tar -C "$S" -cJf "$D/prebuilt.tar.xz" prebuilt lib $alts
du -sh "$D/prebuilt.tar.xz"
tree_k=$(git ls-files -z | xargs -0 du -c | tail -n 1 | cut -f1)
have_k=$(du -s "$D" | cut -f1)
if [ $((tree_k + have_k)) -gt 65536 ]; then
    echo "stage.sh: the tree (${tree_k} KiB) and $D (${have_k} KiB) pass a run's 64 MiB: carry less" >&2
    exit 1
fi
