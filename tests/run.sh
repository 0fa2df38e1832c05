#!/usr/bin/env bash
# Runs every test: the unit/fixture binaries in build/tests, then the script suites in
# tests/*.sh (each prints its own "N passed, M failed" line). Ends with one total line.
set -u
cd "$(dirname "$0")/.."
pass=0 fail=0 failed=()
for t in build/tests/test_*; do
    [ -x "$t" ] || continue
    out=$("$t" 2>&1); rc=$?
    line=$(printf '%s\n' "$out" | grep -E '[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    echo "$line"
    if [ $rc -ne 0 ]; then
        printf '%s\n' "$out" | grep -v -E '[0-9]+ passed, [0-9]+ failed' | tail -n 30
        fail=$((fail + 1)); failed+=("$t")
    else
        pass=$((pass + 1))
    fi
done
for s in tests/suite_*.sh; do
    [ -f "$s" ] || continue
    bash "$s"; rc=$?
    if [ $rc -ne 0 ]; then fail=$((fail + 1)); failed+=("$s"); else pass=$((pass + 1)); fi
done
[ ${#failed[@]} -gt 0 ] && echo "failed suites: ${failed[*]}"
echo "tests: $pass passed, $fail failed"
[ $fail -eq 0 ]
