#!/usr/bin/env bash
# CPU figures for docs/bench.md: the V4-Flash synthetic (real shapes and storage forms, random
# weights in memory) and the tiny default, with the machine they ran on.
set -eu
cd "$(dirname "$0")/.."
layers=${LAYERS:-2}
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/Mem:/{print $2}') GiB; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo none)"
echo "== dsv4 bench --synthetic v4-flash --layers $layers --prefill 64 --decode 8"
build/dsv4 bench --synthetic v4-flash --layers "$layers" --prefill 64 --decode 8 2>/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
build/dsv4 synth --preset tiny -o "$tmp/tiny" 2>/dev/null
echo "== dsv4 bench -m tiny (the make demo model) --prefill 256 --decode 64"
build/dsv4 bench -m "$tmp/tiny" --prefill 256 --decode 64 2>/dev/null
