#!/usr/bin/env bash
# End-to-end checks of `sluice compare`: the default scenario, scenario files and folders, the
# files it writes, exit codes (0 ok, 1 failed or interrupted run, 2 bad usage or input), error
# messages naming the file, the field and the allowed values, and Ctrl-C.
#
#   tests/compare_cli_test.sh PATH/TO/sluice
set -u
sluice="$1"
here="$(cd "$(dirname "$0")" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

# expect NAME RC PATTERN -- ARGS...: runs sluice ARGS, checks the exit code and that the combined
# output matches the extended regex PATTERN.
expect() {
  local name="$1" want_rc="$2" pattern="$3"
  shift 4
  local out rc
  out="$("$sluice" "$@" 2>&1)"
  rc=$?
  if [ "$rc" -ne "$want_rc" ]; then
    echo "FAIL $name: exit $rc, want $want_rc; output:"; echo "$out" | tail -20
    failed=$((failed + 1))
  elif ! grep -Eq -- "$pattern" <<<"$out"; then
    echo "FAIL $name: output does not match /$pattern/:"; echo "$out" | tail -20
    failed=$((failed + 1))
  else
    echo "ok   $name"
    passed=$((passed + 1))
  fi
}

# check NAME COMMAND...: a shell condition on the files written.
check() {
  local name="$1"
  shift
  if "$@"; then
    echo "ok   $name"
    passed=$((passed + 1))
  else
    echo "FAIL $name: $*"
    failed=$((failed + 1))
  fi
}

quick=(--iterations 2 --score-batches 1 --simulate-top 1)

# Usage.
expect help 0 "scenario-dir" -- compare --help
expect both-sources 2 "--scenario and --scenario-dir" -- compare --scenario a.json --scenario-dir b
expect bad-iterations 2 "--iterations" -- compare --iterations many
expect bad-method 2 "--methods.*fastest.*allowed.*'packing'" -- compare --methods packing,fastest
expect bad-model 2 "--model.*gpt-6.7b" -- compare --model gpt-7b "${quick[@]}"
expect seqlen-too-long 2 "--max-seqlen.*max position" -- compare --max-seqlen 100000 "${quick[@]}"
expect memory-above-device 2 "--memory-limit.*exceeds" -- compare --memory-limit 90000 "${quick[@]}"

# The default scenario (fewer batches): tables, files, the report's path.
expect default 0 "report: .*/default-out/report.html" -- compare "${quick[@]}" --out "$tmp/default-out"
check default-results test -s "$tmp/default-out/results.json"
check default-report grep -q "sluice-bar-chart" "$tmp/default-out/report.html"
check default-timelines grep -q "sluice-timeline" "$tmp/default-out/report.html"
check default-format grep -q '"format": "sluice-compare/1"' "$tmp/default-out/results.json"
check default-not-partial grep -q '"partial": false' "$tmp/default-out/results.json"
expect default-tables 0 "Controlled: every method on dp" -- compare "${quick[@]}" --no-html --out "$tmp/o2"
check no-html test ! -e "$tmp/o2/report.html"

# Scenario files: the shipped example, flags overriding it, strict validation.
expect example 0 "scenario: compare-small" -- \
  compare --scenario "$here/../examples/compare-small.json" --out "$tmp/example"
expect example-override 0 "1 batches|, 1 batches" -- \
  compare --scenario "$here/../examples/compare-small.json" --iterations 1 --out "$tmp/override"
printf '{"model": "gpt-6.7b", "colour": 1}\n' >"$tmp/bad-key.json"
expect unknown-key 2 "bad-key.json.*colour.*(allowed|known)" -- compare --scenario "$tmp/bad-key.json"
printf '{"methods": ["packing", {"name": "x", "batching": ["dynapipe"], "schedules": ["zigzag"]}]}\n' >"$tmp/bad-schedule.json"
expect bad-schedule 2 "bad-schedule.json.*methods\[1\].schedules.*zb-h1" -- \
  compare --scenario "$tmp/bad-schedule.json"
printf '{"iterations": 0}\n' >"$tmp/bad-iter.json"
expect bad-iterations-file 2 "bad-iter.json.*iterations.*all" -- compare --scenario "$tmp/bad-iter.json"
printf '{"max_seqlen": 100000}\n' >"$tmp/long.json"
expect seqlen-file 2 "long.json: field 'max_seqlen'" -- compare --scenario "$tmp/long.json"
expect missing-file 2 "nope.json" -- compare --scenario "$tmp/nope.json"

# Methods that cannot run are shown, not dropped.
expect t5-unsupported 0 "hydraulis +unsupported" -- \
  compare --model t5-11b --data flan-like --samples 2000 --tokens-per-batch 8192 --max-seqlen 512 \
  --methods packing,hydraulis,dynapipe --reference packing "${quick[@]}" --no-html --out "$tmp/t5"
expect all-oom 1 "no method fits memory" -- \
  compare --memory-limit 2000 --methods packing,dynapipe "${quick[@]}" --no-html --out "$tmp/oom"
check all-oom-results grep -q '"state": "out-of-memory"' "$tmp/oom/results.json"

# A folder of scenarios: one sub-folder each and a summary table.
mkdir -p "$tmp/dir"
printf '{"name": "a", "tokens_per_batch": 8192, "max_seqlen": 512, "methods": ["packing", "dynapipe"], "controlled": "dynapipe", "search": {"pp": [1, 2], "score_batches": 1, "simulate_top": 1}}\n' >"$tmp/dir/a.json"
printf '{"name": "b", "tokens_per_batch": 8192, "max_seqlen": 1024, "methods": ["packing", "dynapipe"], "controlled": "dynapipe", "search": {"pp": [1, 2], "score_batches": 1, "simulate_top": 1}}\n' >"$tmp/dir/b.json"
expect scenario-dir 0 "\| b \| [0-9,]+ \| 1.00x" -- compare --scenario-dir "$tmp/dir" --iterations 1 --out "$tmp/dir-out"
check dir-results test -s "$tmp/dir-out/a/results.json" -a -s "$tmp/dir-out/b/report.html"
check dir-summary grep -q "| b |" "$tmp/dir-out/summary.md"
printf '{"bogus": 1}\n' >"$tmp/dir/c.json"
expect scenario-dir-bad 2 "c.json.*bogus" -- compare --scenario-dir "$tmp/dir" --out "$tmp/dir-out2"
mkdir -p "$tmp/empty"
expect scenario-dir-empty 2 "no \*.json" -- compare --scenario-dir "$tmp/empty"

# Ctrl-C: a long run stops after the current batch, writes partial results and says so.
"$sluice" compare --iterations all --no-html --out "$tmp/int" >"$tmp/int.log" 2>&1 &
pid=$!
sleep 2
kill -INT "$pid"
wait "$pid"
rc=$?
check interrupt-exit-code test "$rc" -eq 1
check interrupt-message grep -q "partial" "$tmp/int.log"
check interrupt-results grep -q '"partial": true' "$tmp/int/results.json"

echo "compare_cli_test: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
