#!/usr/bin/env bash
# `sluice replay` and `sluice calibrate` end to end on traces made by real runs:
#   1. examples/torch_pipeline_trace.py under torch 1.13 (PYTHON, python3-torch): 2 Gloo ranks,
#      send/recv and all_reduce under torch.profiler, export_chrome_trace per rank;
#   2. with SLUICE_TRAIN=1 (builds with libtorch): `sluice train --plan ... --trace-dir` of six
#      gpt-tiny pp=2 plans, replayed, calibrated on iterations 1-3 and simulated with the
#      calibration.
# Usage: tests/trace_cli_test.sh SLUICE_BINARY REPO_ROOT PYTHON [SLUICE_TRAIN]
sluice="$1"
root="$2"
python="${3:-/usr/bin/python3}"
train="${4:-0}"
source "$(dirname "$0")/cli_lib.sh"

expect "help lists replay" 0 "replay" -- --help
expect "help lists calibrate" 0 "calibrate" -- --help
expect "trace is no command any more" 2 "not expected: trace" -- trace replay "$tmp/nope"
expect "replay needs traces" 2 "traces is required" -- replay
expect "missing path is named" 2 "nope: no such trace file or folder" -- replay "$tmp/nope"
printf '{"traceEvents": [ {"name": "a"' > "$tmp/cut.json"
expect "truncated JSON names the file" 2 "cut.json" -- replay "$tmp/cut.json"
mkdir -p "$tmp/empty" && echo '[]' > "$tmp/empty/trace-rank-0.json" && echo '[]' > "$tmp/empty/trace-rank-1.json"
expect "traces without ops: an empty result, no crash" 0 "no iteration has ops on every rank" -- \
  replay "$tmp/empty"
expect "bad what-if" 2 "expected WHAT=FACTOR" -- replay "$tmp/cut.json" --what-if compute
expect "what-if duration needs a unit" 2 "'link\+=2': expected .*WHAT\+=DURATION" -- \
  replay "$tmp/cut.json" --what-if link+=2
expect "what-if addition must be >= 0" 2 "'link\+=-1ms': expected" -- \
  replay "$tmp/cut.json" --what-if link+=-1ms
expect "what-if factor must be >= 0" 2 "'comm=-1': expected" -- \
  replay "$tmp/cut.json" --what-if comm=-1

# 1. torch 1.13 CPU traces of the shipped example.
if ! "$python" -c "import torch, torch.distributed" 2>/dev/null; then
  echo "FAIL: $python cannot import torch (Debian: apt-get install python3-torch)"
  failed=$((failed + 1))
else
  port=$((29800 + RANDOM % 150))
  if "$python" "$root/examples/torch_pipeline_trace.py" "$tmp/torch" --iters 4 --port "$port" \
      > "$tmp/torch.log" 2>&1; then
    check "torch wrote one trace per rank" test -s "$tmp/torch/trace-rank-0.json" -a \
      -s "$tmp/torch/trace-rank-1.json"
    expect "torch traces: every message and all-reduce matched" 0 \
      "matched: 24 message\(s\), 4 collective\(s\); 0 op\(s\) unmatched" -- \
      replay "$tmp/torch" --json "$tmp/torch-replay.json"
    expect "torch traces: clocks aligned on the all-reduces" 0 \
      "rank 1: [-+][0-9.]+ ms \(collective ends \(n=4\)" -- replay "$tmp/torch"
    expect "torch traces: no causality bound broken" 0 "bounds, 0 still broken" -- \
      replay "$tmp/torch"
    expect "torch traces: measured replay reproduces the trace" 0 \
      "ops end within 0.000 ms of their measured end" -- replay "$tmp/torch"
    expect "torch traces: per-iteration replay within 5%" 0 \
      "replay: +mean \|error\| [0-4]\.[0-9]%" -- replay "$tmp/torch"
    expect "torch traces: HTML report" 0 "report written to" -- replay "$tmp/torch" \
      --report "$tmp/torch.html"
    check "report has both timelines" test "$(grep -o 'sluice-timeline"' "$tmp/torch.html" | wc -l)" \
      -eq 2
    expect "report iteration must exist" 2 "--report-iteration 99: not an iteration .*allowed: [0-9]+\.\.[0-9]+" \
      -- replay "$tmp/torch" --report "$tmp/torch2.html" --report-iteration 99
    check "report has the error table" grep -q "Replayed vs measured iteration time" \
      "$tmp/torch.html"
    expect "--plan needs sluice traces" 2 "--plan: .* is a torch-cpu trace" -- replay \
      "$tmp/torch" --plan "$tmp/none.json"
    expect "torch traces: what-if" 0 "what-if comm=0: iteration times predicted" -- \
      replay "$tmp/torch" --what-if comm=0
    check "replay JSON has the iterations" grep -q '"mean_iteration_replayed_ms"' \
      "$tmp/torch-replay.json"
    expect "calibration needs sluice traces" 2 "calibration needs sluice's runtime traces" -- \
      calibrate "$tmp/torch" --plan "$tmp/none.json" --out "$tmp/c.json"
  else
    echo "FAIL: examples/torch_pipeline_trace.py failed:"; tail -20 "$tmp/torch.log"
    failed=$((failed + 1))
  fi
fi

# 2. sluice's own traces of a short training run.
if [ "$train" = "1" ]; then
  common=(--model gpt-tiny --cluster "$root/examples/cluster-cpu-2.json" --parallel pp=2
          --data mixture-4task --samples 200 --tokens-per-batch 1024 --max-seqlen 128 --seed 0)
  mkdir -p "$tmp/p" "$tmp/m"
  expect "plan six batches" 0 "plans written" -- plan "${common[@]}" --iterations 6 \
    --method dynapipe --schedule 1f1b --show 0 --out "$tmp/p/plan.json"
  plans=()
  for i in 0 1 2 3 4 5; do plans+=("$tmp/p/plan-$i.json"); done
  port=$((29650 + RANDOM % 100))
  MASTER_PORT=$port expect "train with traces" 0 "trained 6 iterations" -- train --nproc 2 \
    "${common[@]}" --threads 1 --plan "${plans[@]}" --trace-dir "$tmp/t" --metrics "$tmp/t.jsonl"
  # More plan files than --iterations' default (20): all of them run unless --iterations is given.
  many=("${plans[@]}" "${plans[@]}" "${plans[@]}" "${plans[@]}")
  MASTER_PORT=$((port + 3)) expect "train runs every plan file given" 0 "trained 24 iterations" \
    -- train --nproc 2 "${common[@]}" --threads 1 --plan "${many[@]}"
  MASTER_PORT=$((port + 4)) expect "train --iterations takes the first plan files" 0 \
    "trained 3 iterations" -- train --nproc 2 "${common[@]}" --threads 1 --plan "${many[@]}" \
    --iterations 3
  # The trace dir also holds the plans as they ran; calibrate matches the traces against them.
  expect "calibrate from the plans the run wrote" 0 "calibration written" -- calibrate "$tmp/t" \
    --plan "$tmp/t/plan-0.json" "$tmp/t/plan-1.json" "$tmp/t/plan-2.json" \
    "$tmp/t/plan-3.json" "$tmp/t/plan-4.json" "$tmp/t/plan-5.json" --out "$tmp/t-cal.json"
  # A run whose plans --moe-overlap rewrote (segmented MoE ops, Lancet's dW scheduling): its
  # traces match the plans it wrote, and not the plans it was given.
  moe=(--model gpt-tiny-moe --parallel dp=2,ep=2 --method padding --recompute none
       --data mixture-4task --tokens-per-batch 1200 --max-seqlen 96 --memory-limit 100 --seed 4)
  expect "plan MoE batches" 0 "plans written" -- plan "${moe[@]}" --cluster cpu:2 \
    --iterations 2 --show 0 --out "$tmp/m/plan.json"
  MASTER_PORT=$((port + 2)) expect "train rewritten MoE plans with traces" 0 "trained 2 iterations" \
    -- train --nproc 2 "${moe[@]}" --threads 1 --plan "$tmp/m/plan-0.json" "$tmp/m/plan-1.json" \
    --moe-overlap dw --trace-dir "$tmp/tm"
  expect "calibrate a rewritten run" 0 "calibration written" -- calibrate "$tmp/tm" \
    --plan "$tmp/tm/plan-0.json" "$tmp/tm/plan-1.json" --out "$tmp/tm-cal.json"
  expect "the given plans are not what ran" 2 "ran the plan-K.json files its --trace-dir holds" \
    -- calibrate "$tmp/tm" --plan "$tmp/m/plan-0.json" "$tmp/m/plan-1.json" --out "$tmp/x.json"
  expect "sluice traces: every transfer matched" 0 "0 op\(s\) unmatched" -- replay "$tmp/t"
  expect "sluice traces: measured replay exact" 0 "ops end within 0.000 ms" -- \
    replay "$tmp/t"
  expect "sluice traces: per-iteration replay within 3%" 0 \
    "replay: +mean \|error\| [0-2]\.[0-9]%, worst [0-4]\.[0-9]%" -- replay "$tmp/t"
  # A what-if made real: the same plans with every send delayed 30 ms (train --link-delay-ms),
  # predicted from the run above by replay --what-if link+=30ms.
  expect "link delay below 0 is refused" 2 \
    "--link-delay-ms: '-1' is not allowed; allowed: a number of milliseconds in \[0, 10000\]" -- \
    train --nproc 2 "${common[@]}" --link-delay-ms -1
  expect "link delay above 10 s is refused" 2 "--link-delay-ms: '20000' is not allowed" -- \
    train --nproc 2 "${common[@]}" --link-delay-ms 20000
  expect "link delay must be a number" 2 "--link-delay-ms: 'fast' is not allowed" -- \
    train --nproc 2 "${common[@]}" --link-delay-ms fast
  expect "link delay at or above --timeout is refused" 2 \
    "--link-delay-ms 5000: must be below --timeout \(3 s\)" -- \
    train --nproc 2 "${common[@]}" --link-delay-ms 5000 --timeout 3
  MASTER_PORT=$((port + 1)) expect "train with a link delay" 0 "sends delayed 30.000 ms" -- \
    train --nproc 2 "${common[@]}" --threads 1 --plan "${plans[@]}" --link-delay-ms 30 \
    --trace-dir "$tmp/t30"
  expect "what-if link+=30ms predicts" 0 "what-if link\+=30ms: iteration times predicted" -- \
    replay "$tmp/t" --what-if link+=30ms --json "$tmp/t-whatif.json"
  expect "replay of the delayed run" 0 "ops end within 0.000 ms" -- \
    replay "$tmp/t30" --json "$tmp/t30.json"
  check "delayed sends record when they were handed to c10d (>= 30 ms after their post)" \
    "$python" - "$tmp/t30" <<'PY'
import json, sys
n = 0
for r in (0, 1):
    for e in json.load(open(f"{sys.argv[1]}/trace-rank-{r}.json"))["traceEvents"]:
        if e.get("ph") == "X" and e["tid"] == 1:
            assert e["args"]["handed_ts"] >= e["ts"] + 30e3 - 1, e
            assert e["ts"] + e["dur"] >= e["args"]["handed_ts"], e
            n += 1
assert n > 0
PY
  check "undelayed sends have no handed_ts" "$python" -c "
import json, sys
ev = json.load(open('$tmp/t/trace-rank-0.json'))['traceEvents']
sys.exit(any('handed_ts' in e.get('args', {}) for e in ev))"
  # The what-if lengthens the replayed iteration by at least one delayed transfer (30 ms above the
  # run it replays: both numbers come from the same trace, so this depends neither on the load nor
  # on the machine's speed; a ratio did: 1.11x on a machine 1.8x slower than the one it was set on),
  # and the prediction is within a factor of 2 of the delayed run's mean iteration. That the
  # delayed run really waited is the handed_ts check above. Not an accuracy test: the two runs are
  # single runs at different moments beside whatever else the machine runs (under ctest -j2 the
  # undelayed run once measured 402 ms and the delayed one 428 ms; another time 245 and 608 ms);
  # the accuracy figure is bench/whatif_link_delay.sh's medians of alternating runs
  # (docs/benchmarks.md).
  check "the what-if lengthens the iteration; the delayed run is within 2x of it" \
    "$python" - "$tmp/t-whatif.json" "$tmp/t30.json" <<'PY'
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
def mean(its, key):
    v = [i[key] for i in its if i["iteration"] >= 1]
    return sum(v) / len(v)
before = mean(a["per_iteration"]["iterations"], "measured_ms")
pred = mean(a["what_if"]["per_iteration"]["iterations"], "replayed_ms")
meas = mean(b["per_iteration"]["iterations"], "measured_ms")
print(f"  without delay {before:.1f} ms, predicted {pred:.1f} ms, measured {meas:.1f} ms")
sys.exit(0 if 0.5 * meas <= pred <= 2 * meas and pred >= before + 30 else 1)
PY
  expect "replay tied to its plans" 0 "tied to 6 plan\(s\)" -- replay "$tmp/t" --plan "${plans[@]}" \
    --report "$tmp/t.html"
  check "report lists the op classes against the plan" grep -q "Op classes against the plan" \
    "$tmp/t.html"
  expect "replay against another plan is refused" 2 \
    "trace-rank-0.json: .*rank 0 .*iteration 0 .*a trace of another plan" \
    -- replay "$tmp/t" --plan "${plans[1]}" "${plans[0]}" "${plans[@]:2}"
  expect "fewer plans than traced iterations are refused" 2 \
    "the traces hold 6 iterations but 5 plan file\(s\) are given: iteration 5 has no plan" \
    -- replay "$tmp/t" --plan "${plans[@]:0:5}"
  mkdir -p "$tmp/t-one" && cp "$tmp/t/trace-rank-0.json" "$tmp/t-one/"
  expect "a rank's trace missing is refused" 2 "has 2 ranks but the traces hold 1 \(missing: rank 1\)" \
    -- calibrate "$tmp/t-one" --plan "${plans[@]}" --out "$tmp/c-one.json"
  cp -r "$tmp/t" "$tmp/t-copy"
  expect "calibrate --out onto one of its traces is refused" 2 \
    "--out '.*t-copy/trace-rank-1.json' and trace '.*t-copy/trace-rank-1.json' are the same file" \
    -- calibrate "$tmp/t-copy" --plan "${plans[@]}" --out "$tmp/t-copy/trace-rank-1.json"
  expect "a what-if that matches no op is refused" 2 "'no-such-op' matches no op of the trace" \
    -- replay "$tmp/t" --what-if no-such-op=2
  # What-if with another plan's order: the same six batches planned with zb-h1 (the same
  # micro-batches in another order, the backward split in halves), replayed from the 1f1b trace.
  expect "plan the same batches with zb-h1" 0 "plans written" -- plan "${common[@]}" \
    --iterations 6 --method dynapipe --schedule zb-h1 --show 0 --out "$tmp/p/zb.json"
  zb=()
  for i in 0 1 2 3 4 5; do zb+=("$tmp/p/zb-$i.json"); done
  expect "what-if plan: zb-h1's order predicted from the 1f1b trace" 0 \
    "what-if plans .*zb-0.json .. .*zb-5.json: iteration times predicted" -- \
    replay "$tmp/t" --plan "${plans[@]}" --what-if-plan "${zb[@]}" --json "$tmp/t-zb.json"
  expect "what-if plan: the halves are derived from the measured backward" 0 \
    "priced from the trace: [0-9]+ instructions measured .*, [1-9][0-9]* derived .*0 by the calibrated cost model, 0 by the plan's own durations; [1-9][0-9]* transfers measured, 0 by" \
    -- replay "$tmp/t" --plan "${plans[@]}" --what-if-plan "${zb[@]}"
  check "what-if plan: prediction in the JSON" "$python" -c "
import json, sys
w = json.load(open('$tmp/t-zb.json'))['what_if']
sys.exit(not (w['plan'].endswith('zb-5.json') and w['pricing']['derived'] > 0 and
              len(w['per_iteration']['iterations']) == 6))"
  expect "what-if plan: the run's own plans replay to the per-iteration replay" 0 \
    "mean: ([0-9.]+) ms replayed -> \1 ms with the what-if \(\+0\.0%\)" -- \
    replay "$tmp/t" --plan "${plans[@]}" --what-if-plan "${plans[@]}"
  expect "what-if plan needs --plan" 2 "--what-if-plan needs --plan" -- \
    replay "$tmp/t" --what-if-plan "${zb[@]}"
  expect "what-if plan: one per plan" 2 "--what-if-plan: 1 file\(s\) given but --plan has 6" -- \
    replay "$tmp/t" --plan "${plans[@]}" --what-if-plan "${zb[0]}"
  expect "what-if plan of another batch is refused" 2 \
    "--what-if-plan .*zb-1.json: another batch .* than the plan iteration 0 of the trace ran" -- \
    replay "$tmp/t" --plan "${plans[@]}" --what-if-plan "${zb[1]}" "${zb[@]:1}"
  expect "plan the first batch of another model" 0 "mean makespan" -- plan \
    "${common[@]/gpt-tiny/t5-tiny}" --iterations 1 --show 0 --out "$tmp/p/t5.json"
  expect "what-if plan of another model is refused" 2 \
    "--what-if-plan .*t5.json: another model \('t5-tiny' vs 'gpt-tiny'\)" -- \
    replay "$tmp/t" --plan "${plans[@]}" --what-if-plan "$tmp/p/t5.json" "${zb[@]:1}"

  # Bad traces: each an error naming the file and the event, or a partial result saying what
  # it left out.
  mkdir -p "$tmp/bad/missing" "$tmp/bad/unmatched" "$tmp/bad/shift" "$tmp/bad/cut"
  cp "$tmp/t/trace-rank-1.json" "$tmp/bad/missing/"
  expect "missing rank is named" 2 "rank\(s\) 0 missing" -- replay "$tmp/bad/missing"
  head -c 20000 "$tmp/t/trace-rank-0.json" > "$tmp/bad/cut/trace-rank-0.json"
  cp "$tmp/t/trace-rank-1.json" "$tmp/bad/cut/"
  expect "truncated rank trace names the file" 2 "cut/trace-rank-0.json" -- replay "$tmp/bad/cut"
  "$python" - "$tmp/t" "$tmp/bad" <<'PY'
import json, sys
src, bad = sys.argv[1], sys.argv[2]
for r in (0, 1):
    doc = json.load(open(f"{src}/trace-rank-{r}.json"))
    ev = doc["traceEvents"]
    kept = ev
    if r == 0:  # lose rank 0's first activation send of iteration 2 (its start and its wait)
        name = next(e["name"] for e in ev if e.get("ph") == "X" and e["tid"] == 0
                    and e["args"].get("iteration") == 2 and e["args"]["op"] == "send-act-start")
        kept = [e for e in ev if not (e.get("ph") == "X" and e["args"].get("iteration") == 2
                                      and e["name"] in (name, name + ".wait"))]
    json.dump(dict(doc, traceEvents=kept), open(f"{bad}/unmatched/trace-rank-{r}.json", "w"))
    moved = [dict(e, ts=e["ts"] + 3e6) if r == 1 and "ts" in e else e for e in ev]
    json.dump(dict(doc, traceEvents=moved), open(f"{bad}/shift/trace-rank-{r}.json", "w"))
PY
  expect "unmatched send: a partial result naming what it left out" 0 \
    "note: rank 1 receives 1 message\(s\) \(act, iteration 2 mb [0-9]+\) from rank 0, which sends none; left out" \
    -- replay "$tmp/bad/unmatched"
  expect "unmatched send: counted" 0 "1 op\(s\) unmatched" -- replay "$tmp/bad/unmatched"
  expect "clock off by 3 s is found" 0 "rank 1: -(2999|3000)\.[0-9]+ ms \(own clock \+ causality\)" \
    -- replay "$tmp/bad/shift"
  expect "clock off by 3 s is reported as another host or run" 0 \
    "note: .*shift/trace-rank-1.json: rank 1's receives end before their sends were posted" \
    -- replay "$tmp/bad/shift"
  expect "calibrate on 1-3, held out 4-5" 0 \
    "held-out iterations \(3\): mean \|error\| [0-9.]+% before, [0-9.]+% after" -- \
    calibrate "$tmp/t" --plan "${plans[@]}" --fit-iterations 1-3 --out "$tmp/cal.json"
  check "calibration file" grep -q '"format": "sluice-calibration/2"' "$tmp/cal.json"
  check "calibration has the iteration offset" grep -q '"iteration"' "$tmp/cal.json"
  expect "calibrate --fit scale (the /1 line)" 0 "held-out iterations \(3\)" -- \
    calibrate "$tmp/t" --plan "${plans[@]}" --fit-iterations 1-3 --fit scale --out "$tmp/cals.json"
  # Peak memory: fitted on iterations 1-3 from the run's metrics, held out 0 and 4-5.
  expect "calibrate --metrics fits each rank's peak memory" 0 \
    "memory, pipeline rank 1: [-+][0-9.]+ MB framework/workspace, activations x [0-9.]+ \(from 3 peaks" \
    -- calibrate "$tmp/t" --plan "${plans[@]}" --fit-iterations 1-3 --metrics "$tmp/t.jsonl" \
    --out "$tmp/calm.json"
  expect "calibrate --metrics: held-out peaks before and after" 0 \
    "held-out peaks \(6 iteration x rank\): peak memory mean \|error\| [0-9.]+% before, [0-9.]+% after" \
    -- calibrate "$tmp/t" --plan "${plans[@]}" --fit-iterations 1-3 --metrics "$tmp/t.jsonl" \
    --out "$tmp/calm.json"
  check "calibration file has the memory corrections" grep -q '"activation_scale"' "$tmp/calm.json"
  expect "simulate prices memory with the calibration" 0 "outcome: ok" -- simulate "${plans[4]}" \
    --calibration "$tmp/calm.json"
  printf '{"iteration": 0}\nnot json\n' > "$tmp/badm.jsonl"
  expect "calibrate --metrics: a bad line is named" 2 \
    "--metrics .*badm.jsonl: line 2: not a JSON object" -- calibrate "$tmp/t" --plan "${plans[@]}" \
    --metrics "$tmp/badm.jsonl" --out "$tmp/calb.json"
  printf '{"iteration": 0}\n' > "$tmp/nopeak.jsonl"
  expect "calibrate --metrics: no peaks is an error" 2 \
    "--metrics .*nopeak.jsonl: no line has 'peak_tensor_bytes_by_rank'" -- calibrate "$tmp/t" \
    --plan "${plans[@]}" --metrics "$tmp/nopeak.jsonl" --out "$tmp/calb.json"
  expect "calibrate --fit names its values" 2 "--fit 'x': not a fit \(allowed: features, scale\)" \
    -- calibrate "$tmp/t" --plan "${plans[@]}" --fit x --out "$tmp/calx.json"
  # train --calibration: each plan's calibrated prediction beside the measured time, a summary,
  # and the figures in --metrics; what runs is the same plans.
  port=$((29750 + RANDOM % 100))
  MASTER_PORT=$port expect "train --calibration: prediction summary" 0 \
    "calibrated prediction over 2 iterations: mean \|error\| [0-9.]+% per iteration, total [0-9.]+ s predicted vs [0-9.]+ s measured \([-+][0-9.]+%\); peak tensor memory per rank mean \|error\| [0-9.]+%" \
    -- train --nproc 2 "${common[@]}" --threads 1 --plan "${plans[@]:4:2}" \
    --calibration "$tmp/cal.json" --metrics "$tmp/cal-train.jsonl"
  check "train --calibration: a prediction per iteration in the metrics" test \
    "$(grep -c '"predicted_time_s"' "$tmp/cal-train.jsonl")" -eq 2
  check "train --calibration metrics: per-rank peaks" grep -q \
    '"peak_tensor_bytes_by_rank":\[[0-9]*,[0-9]*\],.*"predicted_peak_bytes_by_rank":\[[0-9]*,[0-9]*\]' \
    "$tmp/cal-train.jsonl"
  printf '{"format": "sluice-calibration/2", "ops": [{"op": 3}]}' > "$tmp/badcal3.json"
  expect "train: bad calibration names file and field" 2 \
    "--calibration: .*badcal3.json: field 'ops\[0\]\.stage'" -- train --nproc 2 "${common[@]}" \
    --plan "${plans[4]}" --calibration "$tmp/badcal3.json"
  expect "simulate with the calibration" 0 "outcome: ok" -- simulate "${plans[4]}" \
    --calibration "$tmp/cal.json"
  expect "calibration against another plan is refused" 2 "a trace of another plan" -- \
    calibrate "$tmp/t" --plan "${plans[1]}" "${plans[0]}" "${plans[@]:2}" --out "$tmp/cal2.json"
  expect "plan priced with the calibration" 0 "mean makespan" -- plan "${common[@]}" \
    --iterations 1 --show 0 --calibration "$tmp/cal.json"
  printf '{"format": "sluice-calibration/1", "ops": [{"op": 3}]}' > "$tmp/badcal2.json"
  expect "plan: bad calibration names file and field" 2 \
    "--calibration: .*badcal2.json: field 'ops\[0\]\.stage'" -- plan "${common[@]}" \
    --iterations 1 --calibration "$tmp/badcal2.json"
  expect "compare: bad calibration names file and field" 2 \
    "--calibration: .*badcal2.json: field 'ops\[0\]\.stage'" -- compare --out "$tmp/cmp" \
    --calibration "$tmp/badcal2.json"
  printf '{"format": "sluice-calibration/1", "ops": 3}' > "$tmp/badcal.json"
  expect "bad calibration file" 2 "badcal.json: field 'ops'" -- simulate "${plans[4]}" \
    --calibration "$tmp/badcal.json"
  # MoE: a whole compute op performs its all-to-alls inside its own time; calibrate takes them
  # out of the op's measured time (the plan prices them as all-to-all instructions).
  moe=(--model gpt-tiny-moe --parallel dp=2,ep=2 --method padding --recompute none
       --data mixture-4task --tokens-per-batch 1200 --max-seqlen 96 --memory-limit 55 --seed 4
       --cluster cpu:2)
  mkdir -p "$tmp/moe"
  expect "MoE plans" 0 "plans written" -- plan "${moe[@]}" --iterations 2 --show 0 \
    --out "$tmp/moe/p.json"
  MASTER_PORT=$((port + 2)) expect "MoE train with traces" 0 "trained 2 iterations" -- \
    train --nproc 2 "${moe[@]}" --threads 1 --plan "$tmp/moe/p-0.json" "$tmp/moe/p-1.json" \
    --trace-dir "$tmp/moe/t"
  expect "calibrate takes the MoE all-to-alls out of the compute fit" 0 \
    "MoE all-to-alls inside whole compute ops: [1-9][0-9.]* ms" -- calibrate "$tmp/moe/t" \
    --plan "$tmp/moe/p-0.json" "$tmp/moe/p-1.json" --out "$tmp/moe/cal.json"
fi
finish "trace_cli_test"
