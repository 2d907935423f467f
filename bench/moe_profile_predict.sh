#!/usr/bin/env bash
# moe_profile_predict.sh: how well plans priced with this machine's own MoE measurements
# (`sluice profile` of the MoE layer, and its --all-to-all link) predict real `sluice train`
# iterations of an MoE model with expert parallelism, against the uncalibrated `cpu` preset
# (issue #18: "`sluice profile` measures the MoE layer parts and the all-to-all on this machine").
#
#   1. `sluice profile --model gpt-tiny-moe --threads 1 --all-to-all 2`: the MoE layer table
#      (moe_encoder rows) at one thread per rank, and the measured all-to-all link as a cluster
#      file;
#   2. three pricings of the same job (gpt-tiny-moe, dp 2 x ep 2, padding, mixture-4task):
#        preset    --cost auto (the cpu preset's analytic model) --cluster cpu:2
#        table     --cost profiled:TABLE                          --cluster cpu:2
#        measured  --cost profiled:TABLE                          --cluster the measured file
#      each: `sluice plan` (ITERS batches), `sluice simulate` of every plan (the prediction),
#      then REPEATS runs of `sluice train --plan` on those plans, one pricing after the other per
#      round (a load change hits all three alike);
#   3. per pricing: per batch the median measured iteration time over the runs against the
#      simulated one; mean |error| and mean signed error over the batches (batch 0 left out: the
#      first iteration of a run pays one-time costs), and the exposed all-to-all (the
#      trainer's `all_to_all_s`, the slowest rank's time blocked in all-to-alls) against the
#      simulated exposed all-to-all. Every batch of every run must complete (else exit 1).
#
# Usage, from the repository root (knobs as environment variables, defaults below):
#   SLUICE=build/sluice bench/moe_profile_predict.sh
set -euo pipefail

SLUICE=${SLUICE:-build/sluice}
OUT=${OUT:-/tmp/sluice-moe-profile}
REPEATS=${REPEATS:-3}
ITERS=${ITERS:-6}
PORT=${PORT:-29790}
PY=${PY:-/usr/bin/python3}
LIMIT=${LIMIT:-100}
COMMON=(--model gpt-tiny-moe --method padding --recompute none --data mixture-4task
        --tokens-per-batch 1200 --max-seqlen 96 --parallel dp=2,ep=2 --seed 4
        --memory-limit "$LIMIT")

rm -rf "$OUT"
mkdir -p "$OUT"
MASTER_PORT=$PORT "$SLUICE" profile --model gpt-tiny-moe --threads 1 --mbs 1,2,4,8 \
  --seqlen 16,32,64,96 --repeats 5 --warmup 2 --all-to-all 2 \
  --cluster-out "$OUT/cpu-measured.json" --out "$OUT/moe-table.json" > "$OUT/profile.log" 2>&1
grep -E "^fit|bytes per peer" "$OUT/profile.log"

variants=(preset table measured)
pricing() {
  case $1 in
    preset) cost=(--cost auto --cluster cpu:2) ;;
    table) cost=(--cost "profiled:$OUT/moe-table.json" --cluster cpu:2) ;;
    measured) cost=(--cost "profiled:$OUT/moe-table.json" --cluster "$OUT/cpu-measured.json") ;;
  esac
}
for v in "${variants[@]}"; do
  pricing "$v"
  mkdir -p "$OUT/$v"
  "$SLUICE" plan "${COMMON[@]}" "${cost[@]}" --iterations "$ITERS" --out "$OUT/$v/plan.json" \
    --show 0 > "$OUT/$v/plan.log" 2>&1
  for b in $(seq 0 $((ITERS - 1))); do
    "$SLUICE" simulate "$OUT/$v/plan-$b.json" --json "$OUT/$v/sim-$b.json" > /dev/null
  done
done
for r in $(seq 1 "$REPEATS"); do
  for v in "${variants[@]}"; do
    plans=()
    for b in $(seq 0 $((ITERS - 1))); do plans+=("$OUT/$v/plan-$b.json"); done
    pricing "$v"
    MASTER_PORT=$PORT "$SLUICE" train --nproc 2 "${COMMON[@]}" "${cost[@]}" --threads 1 \
      --plan "${plans[@]}" --metrics "$OUT/$v/metrics-$r.jsonl" > "$OUT/$v/train-$r.log" 2>&1 || {
        echo "train $v round $r failed: see $OUT/$v/train-$r.log" >&2; exit 1; }
  done
done

"$PY" - "$OUT" "$REPEATS" "$ITERS" "${variants[@]}" <<'PYEOF'
import json, statistics, sys
out, repeats, iters, variants = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
print(f'{"pricing":<10} {"batch":>5} {"measured ms":>12} {"predicted ms":>13} {"error":>8} '
      f'{"a2a meas ms":>12} {"a2a pred ms":>12}')
summary = []
for v in variants:
    runs = []
    for r in range(1, repeats + 1):
        rows = [json.loads(l) for l in open(f'{out}/{v}/metrics-{r}.jsonl')]
        if len(rows) != iters:
            sys.exit(f'{v} run {r}: {len(rows)} of {iters} iterations ran')
        runs.append({row['iteration']: row for row in rows})  # iteration i runs plan-i
    errs, a2a_errs = [], []
    for b in range(iters):
        sim = json.load(open(f'{out}/{v}/sim-{b}.json'))
        pred = sim['iteration_time_ns'] / 1e6
        pred_a2a = max(rk.get('exposed_all_to_all_ns', 0) for rk in sim['ranks']) / 1e6
        meas = statistics.median(run[b]['time_s'] for run in runs) * 1e3
        meas_a2a = statistics.median(run[b]['all_to_all_s'] for run in runs) * 1e3
        err = pred / meas - 1
        note = '  (warm-up, not counted)' if b == 0 else ''
        if b > 0:
            errs.append(err)
            a2a_errs.append(pred_a2a / meas_a2a - 1 if meas_a2a > 0 else 0)
        print(f'{v:<10} {b:>5} {meas:>12.1f} {pred:>13.1f} {100 * err:>+7.1f}% '
              f'{meas_a2a:>12.1f} {pred_a2a:>12.1f}{note}')
    summary.append((v, statistics.mean(abs(e) for e in errs), statistics.mean(errs),
                    statistics.mean(a2a_errs)))
print()
for v, mae, bias, a2a in summary:
    print(f'{v:<10} iteration: mean |error| {100 * mae:.1f}%, mean signed error {100 * bias:+.1f}%; '
          f'exposed all-to-all: mean signed error {100 * a2a:+.1f}% (batches 1-{iters - 1}, '
          f'median of {repeats} runs each)')
PYEOF
