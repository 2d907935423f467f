#!/usr/bin/env bash
# End-to-end checks of `sluice simulate`: exit codes (0 ok or out of memory, 1 deadlock, 2 bad
# usage or input), the summary table, the files it writes (a Chrome trace that parses as JSON
# with one process per rank, the JSON result, the HTML report), the what-if flags, and messages
# that name the flag and the allowed values.
#
#   tests/simulate_cli_test.sh PATH/TO/sluice
set -u
sluice="$1"
. "$(dirname "$0")/cli_lib.sh"
python=python3

# Plans to simulate: the default scenario (gpt-6.7b, dp 2 x pp 4), one batch, JSON and MessagePack.
"$sluice" plan --iterations 1 --show 0 --out "$tmp/plan.json" >/dev/null 2>&1
"$sluice" plan --iterations 1 --show 0 --out "$tmp/plan.msgpack" >/dev/null 2>&1
check plan-made test -s "$tmp/plan.json"

expect help 0 "simulate" -- --help
expect simulate-help 0 "--straggler" -- simulate --help
expect simulate-ok 0 "outcome: ok" -- simulate "$tmp/plan.json"
expect simulate-table 0 "^ +7 +1 +3 " -- simulate "$tmp/plan.json"
expect simulate-msgpack 0 "outcome: ok" -- simulate "$tmp/plan.msgpack"
expect simulate-padded-tokens 0 "padded shapes" -- simulate "$tmp/plan.json"
expect simulate-real-tokens 0 "real tokens \(" -- simulate "$tmp/plan.json" --data mixture-4task
expect simulate-closed-form 0 "collectives closed-form" -- simulate "$tmp/plan.json" --collectives closed-form

# Files: trace, JSON and report.
expect simulate-files 0 "wrote report" -- simulate "$tmp/plan.json" --trace "$tmp/t.json" --json "$tmp/r.json" --report "$tmp/r.html"
check trace-parses "$python" -c "
import json, sys
t = json.load(open('$tmp/t.json'))
ev = t['traceEvents']
procs = {e['pid'] for e in ev if e['ph'] == 'M' and e['name'] == 'process_name'}
xs = [e for e in ev if e['ph'] == 'X']
assert procs == set(range(8)), procs
assert xs and all(e['dur'] >= 0 and 'microbatch' in e['args'] for e in xs)
assert any(e['name'].endswith('F0') for e in xs)
"
check json-result "$python" -c "
import json
r = json.load(open('$tmp/r.json'))
assert r['format'] == 'sluice-sim-result/1' and r['outcome'] == 'ok'
assert len(r['ranks']) == 8 and r['iteration_time_ns'] > 0
"
check report-html grep -q "sluice-timeline" "$tmp/r.html"

# What-if flags.
expect straggler 0 "outcome: ok" -- simulate "$tmp/plan.json" --straggler 2:1.5 --straggler 5:1.2
expect compute-scale 0 "outcome: ok" -- simulate "$tmp/plan.json" --compute-scale 0.5 --intra-bw-scale 0.1 --inter-latency-scale 2
expect no-buffers 0 "outcome: ok" -- simulate "$tmp/plan.json" --no-buffers --no-check

# Out of memory is an outcome (exit 0, printed first in capitals); a deadlock exits 1.
expect oom 0 "^OUT OF MEMORY: rank [0-9]+" -- simulate "$tmp/plan.json" --memory-limit 30000
"$python" - "$tmp/plan.json" "$tmp/deadlock.json" <<'EOF'
import json, sys
plan = json.load(open(sys.argv[1]))
ins = plan['ranks'][1]['instructions']
i = next(k for k, x in enumerate(ins) if x['op'] == 'recv-act-start')
del ins[i]
json.dump(plan, open(sys.argv[2], 'w'))
EOF
expect deadlock 1 "DEADLOCK: [0-9]+ rank" -- simulate "$tmp/deadlock.json"
expect deadlock-names-rank 1 "rank 1 at instruction [0-9]+: 1RECV_F0.wait" -- simulate "$tmp/deadlock.json"
expect deadlock-warns 1 "does not pass .sluice plan check" -- simulate "$tmp/deadlock.json"
expect deadlock-report 1 "wrote report" -- simulate "$tmp/deadlock.json" --report "$tmp/d.html"

# Bad usage and input.
expect no-plan 2 "plan" -- simulate
expect missing-plan 2 "no-such-plan.json" -- simulate "$tmp/no-such-plan.json"
expect bad-collectives 2 "stepwise, closed-form" -- simulate "$tmp/plan.json" --collectives tree
expect bad-straggler 2 "RANK:FACTOR" -- simulate "$tmp/plan.json" --straggler fast
expect straggler-rank 2 "--straggler.*allowed: 0..7" -- simulate "$tmp/plan.json" --straggler 99:2
expect bad-scale 2 "--compute-scale.*> 0" -- simulate "$tmp/plan.json" --compute-scale 0
expect bad-memory 2 "--memory-limit" -- simulate "$tmp/plan.json" --memory-limit -5
printf '{"format": "sluice-plan/1"}' >"$tmp/empty-plan.json"
expect incomplete-plan 2 "empty-plan.json" -- simulate "$tmp/empty-plan.json"
printf 'not json' >"$tmp/text.json"
expect not-a-plan 2 "text.json: not a plan file: .*allowed: .*JSON.*MessagePack" -- simulate "$tmp/text.json"
: >"$tmp/zero.json"
expect empty-file 2 "zero.json: not a plan file: the file is empty" -- simulate "$tmp/zero.json"
expect plan-is-folder 2 "is a folder; expected a file" -- simulate "$tmp"
expect memory-nan 2 "--memory-limit: 'nan' is not allowed; allowed: .*0 = the plan's" -- simulate "$tmp/plan.json" --memory-limit nan
expect memory-inf 2 "--memory-limit: 'inf' is not allowed" -- simulate "$tmp/plan.json" --memory-limit inf
expect scale-nan 2 "--compute-scale.*nan.*finite number > 0" -- simulate "$tmp/plan.json" --compute-scale nan
expect latency-negative 2 "--intra-latency-scale.*>= 0" -- simulate "$tmp/plan.json" --intra-latency-scale -1
expect straggler-no-factor 2 "--straggler '3:': expected RANK:FACTOR" -- simulate "$tmp/plan.json" --straggler 3:
expect straggler-text 2 "--straggler '2:abc': expected RANK:FACTOR" -- simulate "$tmp/plan.json" --straggler 2:abc
expect straggler-zero 2 "--straggler.*slowdown.*finite number > 0" -- simulate "$tmp/plan.json" --straggler 3:0
expect straggler-twice 2 "--straggler.*listed twice" -- simulate "$tmp/plan.json" --straggler 3:2 --straggler 3:1.5
expect samples-negative 2 "--samples: '-1' is not allowed" -- simulate "$tmp/plan.json" --data mixture-4task --samples -1
expect seed-negative 2 "--seed: '-2' is not allowed; allowed: an integer >= 0" -- simulate "$tmp/plan.json" --seed -2
expect data-missing 2 "--data: 'nope': no such file and no such preset" -- simulate "$tmp/plan.json" --data nope
# Output paths are checked before the run (no summary printed) and name the flag.
expect trace-no-folder 2 "^sluice: error: --trace '$tmp/no/t.json': the folder '$tmp/no' does not exist$" -- simulate "$tmp/plan.json" --trace "$tmp/no/t.json"
expect report-is-folder 2 "--report '$tmp': is a folder" -- simulate "$tmp/plan.json" --report "$tmp"
expect json-unwritable 2 "--json '/proc/sluice.json': cannot write there" -- simulate "$tmp/plan.json" --json /proc/sluice.json
check no-file-left test ! -e "$tmp/no" -a ! -e /proc/sluice.json

# Expert parallelism: a dp 2 x ep 2 plan of the tiny MoE model has all-to-alls, which the plan
# check accepts and the simulator runs on the all-to-all stream (summary line, JSON, trace).
"$sluice" plan --model gpt-tiny-moe --cluster a100-40g:2 --parallel dp=2,ep=2 --samples 2000 \
  --tokens-per-batch 16384 --max-seqlen 1024 --method packing --iterations 1 --show 0 \
  --out "$tmp/moe.json" >/dev/null 2>&1
check moe-plan-has-all-to-alls grep -q '"all-to-all-dispatch"' "$tmp/moe.json"
expect moe-plan-check 0 "valid plan of gpt-tiny-moe" -- plan check "$tmp/moe.json"
expect moe-simulate 0 "all-to-all \(MoE dispatch and combine\): [0-9.]+ ms per rank" -- simulate "$tmp/moe.json" --trace "$tmp/moe-t.json" --json "$tmp/moe-r.json"
check moe-json-and-trace "$python" -c "
import json
r = json.load(open('$tmp/moe-r.json'))
assert all(x['all_to_all_ns'] > 0 and 0 <= x['exposed_all_to_all_ns'] <= x['all_to_all_ns'] for x in r['ranks']), r['ranks']
t = json.load(open('$tmp/moe-t.json'))['traceEvents']
assert any(e['ph'] == 'M' and e['name'] == 'thread_name' and e['args']['name'] == 'all-to-all' for e in t)
"
expect moe-simulate-report 0 "wrote report" -- simulate "$tmp/moe.json" --report "$tmp/moe-report.html"
check moe-report-all-to-all grep -q "rank 0 all-to-all" "$tmp/moe-report.html"
check moe-report-all-to-all-summary grep -q "all-to-all (mean per rank)" "$tmp/moe-report.html"
expect moe-simulate-closed-form 0 "all-to-all \(MoE dispatch and combine\)" -- simulate "$tmp/moe.json" --collectives closed-form
# MoE overlap rewrites: one applied (its pieces and the all-to-all stream in the trace), all side
# by side, and the flag's errors.
expect moe-overlap-lancet 0 "--moe-overlap lancet: rank 0: [0-9]+ MoE ops segmented" -- simulate "$tmp/moe.json" --moe-overlap lancet --trace "$tmp/moe-lancet.json"
check moe-overlap-trace "$python" -c "
import json
t = json.load(open('$tmp/moe-lancet.json'))['traceEvents']
assert any(e['ph'] == 'X' and '.s1' in e['name'] for e in t), 'no segment in the trace'
assert any(e['ph'] == 'M' and e['name'] == 'thread_name' and e['args']['name'] == 'all-to-all' for e in t)
"
expect moe-overlap-all 0 "^lancet +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+x" -- simulate "$tmp/moe.json" --moe-overlap all
expect moe-overlap-default-slice 0 "priced with 20.0 us each: the default" -- simulate "$tmp/moe.json" --moe-overlap all
# A slice overhead measured by the plan's cost model (a `sluice profile` table with moe_parts)
# travels in the plan and prices the slices.
"$python" -c "
import json, sys
p = json.load(open(sys.argv[1])); p['moe_slice_overhead_ns'] = 250000
json.dump(p, open(sys.argv[2], 'w'))" "$tmp/moe.json" "$tmp/moe-measured.json"
expect moe-overlap-measured-slice 0 "priced with 250.0 us each: measured by the plan's cost model" -- simulate "$tmp/moe-measured.json" --moe-overlap all
expect moe-overlap-bad 2 "--moe-overlap 'fast' is not an MoE overlap; allowed: none, tutel, megatron, dw, partition, lancet, lancet-megatron, all" -- simulate "$tmp/moe.json" --moe-overlap fast
expect moe-overlap-dense 2 "--moe-overlap tutel: .* has no expert parallelism" -- simulate "$tmp/plan.json" --moe-overlap tutel

# Ctrl-C (SIGINT from `timeout -s INT 8`) while the plan is still being read from a pipe that is
# written after 12 s: exit 1 with one message, no files written. (It was 4 s and 6 s; this test
# failed once in a loaded parallel ctest run, which check was not recorded, and this is its only
# timing-dependent one: sluice, which loads libtorch, must have installed its handler by then.)
# The writer gives up after 30 s
# (a sluice that died before opening the pipe would otherwise leave it blocked forever, and
# `wait` with it: a hang instead of a failure on a loaded machine).
mkfifo "$tmp/pipe.json"
(sleep 12; timeout 30 sh -c "cat '$tmp/plan.json' >'$tmp/pipe.json'") &
timeout --preserve-status -s INT 8 "$sluice" simulate "$tmp/pipe.json" --json "$tmp/int.json" \
  >"$tmp/int.log" 2>&1
rc=$?
wait
check interrupt-exit-code test "$rc" -eq 1
check interrupt-message grep -q "^sluice: error: $tmp/pipe.json: interrupted (Ctrl-C) before the simulation" "$tmp/int.log"
check interrupt-no-json test ! -e "$tmp/int.json"

finish
