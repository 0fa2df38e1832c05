#!/usr/bin/env bash
# Stages what a device run needs in .dev/cuda (git-ignored; sent with the run's `carry`): the
# device image has nvcc but not libcjson's headers, so the CUDA build is made here
# (BUILD=${BUILD:-build-cuda}), stripped, with the shared libraries the image lacks and the
# scripts; the fixtures and the default model are the tree's own (tests/fixtures, models, linked). On the device:
#   cd .dev/cuda && tar -xJf prebuilt.tar.xz && bash tests/cuda/on_device.sh [bench]
set -eu
cd "$(dirname "$0")/../.."
B=${BUILD:-build-cuda}
D=.dev/cuda
make -j"$(nproc)" CUDA=1 BUILD="$B" all "$B/tests/cuda/test_cuda_ops" >/dev/null
rm -rf "$D/prebuilt" "$D/lib" "$D/tests" "$D/bench" "$D/tools" "$D/fixtures" "$D/prebuilt.tar.xz"
mkdir -p "$D/prebuilt/tests/cuda" "$D/lib" "$D/tests/cuda" "$D/bench"
for f in dsv4 tests/test_backend_ops tests/test_v4_fixtures tests/test_v41_fixtures tests/test_batch tests/test_lanes tests/test_mini tests/test_draft tests/test_mtp tests/test_dspark tests/test_kv $(cd "$B" && ls tests/cuda/* | grep -v '\.d$\|\.o$'); do
    # a run carries the tree and this folder within 64 MiB: bench_cuda (the linear kernels'
    # timings, not a test) goes only when asked for with STAGE_BENCH_CUDA=1
    [ "$f" = tests/cuda/bench_cuda ] && [ "${STAGE_BENCH_CUDA:-0}" != 1 ] && continue
    [ -f "$B/$f" ] && install -s "$B/$f" "$D/prebuilt/$f"
done
# every library the CLI links but the C runtime's own (the image lacks libmicrohttpd and its TLS
# stack) and NCCL's (200 MB; on_device.sh finds the system's or PyTorch's)
ldd "$B/dsv4" | awk '$3 ~ /^\// {print $3}' | grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|libdl|libpthread|librt|libcudart|libnccl)\.so' |
    while read -r l; do cp -L "$l" "$D/lib/"; done
cp -L "$(dirname "$(command -v nvcc)")/../lib64/libcudart.so.13" "$D/lib/" 2>/dev/null ||
    cp -L "$(find / -name 'libcudart.so.13' 2>/dev/null | head -1)" "$D/lib/"
mkdir -p "$D/tests/tools"
cp tests/cuda/on_device.sh tests/cuda/draft_cuda.sh tests/cuda/peer_torch.py "$D/tests/cuda/"
cp tests/tools/exl3_gen.py "$D/tests/tools/"
cp bench/peer_transformers.py bench/draft_bench.sh "$D/bench/"
ln -sfn ../../../tests/fixtures "$D/tests/fixtures"
ln -sfn ../../models "$D/models"
# the binaries carry every kernel (about 3.5 MB each, mostly the same bytes): one dictionary spans
# them all, so they compress about 100x; the run unpacks them
XZ_OPT="--lzma2=preset=9,dict=256MiB" tar -C "$D" -cJf "$D/prebuilt.tar.xz" prebuilt lib && rm -rf "$D/prebuilt" "$D/lib"
du -sh "$D"
