#!/usr/bin/env bash
# `sluice trace replay` and `sluice trace calibrate` end to end on traces made by real runs:
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

expect "help lists the subcommands" 0 "replay.*calibrate" -- trace --help
expect "replay needs traces" 2 "traces is required" -- trace replay
expect "missing path is named" 2 "nope: no such trace file or folder" -- trace replay "$tmp/nope"
printf '{"traceEvents": [ {"name": "a"' > "$tmp/cut.json"
expect "truncated JSON names the file" 2 "cut.json" -- trace replay "$tmp/cut.json"
expect "bad what-if" 2 "expected WHAT=FACTOR" -- trace replay "$tmp/cut.json" --what-if compute

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
      trace replay "$tmp/torch" --json "$tmp/torch-replay.json"
    expect "torch traces: clocks aligned on the all-reduces" 0 \
      "rank 1: [-+][0-9.]+ ms \(collective ends \(n=4\)" -- trace replay "$tmp/torch"
    expect "torch traces: no causality bound broken" 0 "bounds, 0 still broken" -- \
      trace replay "$tmp/torch"
    expect "torch traces: measured replay reproduces the trace" 0 \
      "ops end within 0.000 ms of their measured end" -- trace replay "$tmp/torch"
    expect "torch traces: what-if" 0 "what-if comm=0: mean iteration" -- \
      trace replay "$tmp/torch" --what-if comm=0
    check "replay JSON has the iterations" grep -q '"mean_iteration_replayed_ms"' \
      "$tmp/torch-replay.json"
    expect "calibration needs sluice traces" 2 "calibration needs sluice's runtime traces" -- \
      trace calibrate "$tmp/torch" --plan "$tmp/none.json" --out "$tmp/c.json"
  else
    echo "FAIL: examples/torch_pipeline_trace.py failed:"; tail -20 "$tmp/torch.log"
    failed=$((failed + 1))
  fi
fi

# 2. sluice's own traces of a short training run.
if [ "$train" = "1" ]; then
  common=(--model gpt-tiny --cluster "$root/examples/cluster-cpu-2.json" --parallel pp=2
          --data mixture-4task --samples 200 --tokens-per-batch 1024 --max-seqlen 128 --seed 0)
  mkdir -p "$tmp/p"
  expect "plan six batches" 0 "plans written" -- plan "${common[@]}" --iterations 6 \
    --method dynapipe --schedule 1f1b --show 0 --out "$tmp/p/plan.json"
  plans=()
  for i in 0 1 2 3 4 5; do plans+=("$tmp/p/plan-$i.json"); done
  port=$((29650 + RANDOM % 100))
  MASTER_PORT=$port expect "train with traces" 0 "trained 6 iterations" -- train --nproc 2 \
    "${common[@]}" --threads 1 --plan "${plans[@]}" --trace-dir "$tmp/t"
  expect "sluice traces: every transfer matched" 0 "0 op\(s\) unmatched" -- trace replay "$tmp/t"
  expect "sluice traces: measured replay exact" 0 "ops end within 0.000 ms" -- \
    trace replay "$tmp/t"
  expect "calibrate on 1-3, held out 4-5" 0 \
    "held-out iterations \(3\): mean \|error\| [0-9.]+% before, [0-9.]+% after" -- \
    trace calibrate "$tmp/t" --plan "${plans[@]}" --fit-iterations 1-3 --out "$tmp/cal.json"
  check "calibration file" grep -q '"format": "sluice-calibration/1"' "$tmp/cal.json"
  expect "simulate with the calibration" 0 "outcome: ok" -- simulate "${plans[4]}" \
    --calibration "$tmp/cal.json"
  expect "calibration against another plan is refused" 2 "a trace of another plan" -- \
    trace calibrate "$tmp/t" --plan "${plans[1]}" "${plans[0]}" --out "$tmp/cal2.json"
  printf '{"format": "sluice-calibration/1", "ops": 3}' > "$tmp/badcal.json"
  expect "bad calibration file" 2 "badcal.json: field 'ops'" -- simulate "${plans[4]}" \
    --calibration "$tmp/badcal.json"
fi
finish "trace_cli_test"
