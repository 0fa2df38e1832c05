#!/usr/bin/env bash
# `dsv4 generate --draft lookup` prints exactly the ids that the same command prints without
# it, greedy and seeded, on the default model (whose English replies repeat themselves, so
# proposals are kept) and on the held-out V4 fixtures (random weights: proposals are mostly
# refused, so the rollback path runs); and the acceptance line reports kept proposals.
set -u
cd "$(dirname "$0")/.."
bin=build/dsv4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

# "<bos><User>What does ephemeral mean?<Assistant></think>" in the default model's tokenizer
mini_ids=0,3,293,307,2978,272,992,294,271,38,4,6
same() { # what, model, ids, extra options...
    local what=$1 model=$2 ids=$3; shift 3
    if ! $bin generate -m "$model" --ids "$ids" -n 48 "$@" >"$tmp/plain" 2>"$tmp/plain.err"; then
        bad "$what: plain run failed"; tail -3 "$tmp/plain.err"; return
    fi
    for d in "--draft-max 1" "--draft-max 5" "--draft-max 16 --ngram 2,4"; do
        # shellcheck disable=SC2086
        if ! $bin generate -m "$model" --ids "$ids" -n 48 "$@" --draft lookup $d >"$tmp/draft" 2>"$tmp/draft.err"; then
            bad "$what ($d): drafted run failed"; tail -3 "$tmp/draft.err"; continue
        fi
        if cmp -s "$tmp/plain" "$tmp/draft"; then ok; else bad "$what ($d): drafted ids differ from plain"; fi
        grep -h "draft lookup:" "$tmp/draft.err" >>"$tmp/acceptance"
    done
}
same "mini greedy" models/mini "$mini_ids"
same "mini seeded" models/mini "$mini_ids" --temperature 1.5 --seed 7
same "mini seeded, top-k" models/mini "$mini_ids" --temperature 0.8 --top-k 20 --top-p 0.9 --seed 99
for fx in tests/fixtures/v4/v4-held-1 tests/fixtures/v4/v4-held-2; do
    [ -d "$fx" ] || { bad "$fx missing"; continue; }
    same "$(basename "$fx") greedy" "$fx" 0,5,7,5,7,5,7,9
    same "$(basename "$fx") seeded" "$fx" 0,5,7,5,7,5,7,9 --temperature 1 --seed 3
done
kept=$(awk '{for (i = 1; i <= NF; i++) if ($i == "kept" && $(i - 1) ~ /^[0-9]+$/) s += $(i - 1)} END {print s + 0}' \
    "$tmp/acceptance")
if [ "$kept" -gt 0 ]; then ok; else bad "no proposal was ever kept"; fi
echo "draft suite: $pass passed, $fail failed"
[ $fail -eq 0 ]
