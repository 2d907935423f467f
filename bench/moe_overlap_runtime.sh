#!/usr/bin/env bash
# moe_overlap_runtime.sh: MoE all-to-all overlap measured for real (`sluice train --moe-overlap`,
# Gloo alltoall_base between local CPU processes) against the simulator's prediction for the
# same rewritten plans (issue #18, "Measured, for real").
#
#   1. `sluice plan --out` makes the plans of the first batches of each configuration (padding,
#      recompute none, priced with the analytic model of the `cpu` cluster preset) within
#      PLAN_LIMIT MB, and their memory limit is then raised to RUN_LIMIT MB: the planner fills
#      its budget, and a rewrite that holds more than one op's activations at once (megatron's
#      interleaving, dw's delayed weight gradients) must still fit (a rewrite the pass rejects
#      stops the script);
#   2. one run of the whole plans with --trace-dir, and `sluice calibrate` on it (every
#      iteration; the MoE all-to-alls inside whole ops are taken out of the compute fit): the
#      calibration every variant is then predicted with;
#   3. `sluice train --plan ... --calibration` executes them as lowered (`whole`) and rewritten
#      by each MoE overlap pass the runtime runs (none, dw, tutel, partition, lancet; megatron
#      and lancet-megatron at pp 1; VARIANTS, if set, names a subset, whole always in), one run per
#      variant in turn, REPEATS rounds (so a load change on the machine hits every variant
#      alike); each plan's prediction is the trainer's own (`predicted_time_s`,
#      `predicted_exposed_all_to_all_s` of --metrics: the simulation of the calibrated plan that
#      runs, rewritten after the calibration);
#   4. a table per configuration and variant: medians over every measured iteration (the first
#      iteration of every run is warm-up and not counted) of the exposed all-to-all time
#      (`all_to_all_s`: the max over ranks of the time blocked in all-to-alls) and the iteration
#      time, measured and predicted, and the ratio to the whole-op run of the same round.
#
# PROFILE=1: first `sluice profile --model gpt-tiny-moe --threads 1` (the MoE layer's parts
# included, docs/profiling.md), and the plans priced with that table (`--cost profiled:TABLE`)
# instead of the preset's analytic model: they then carry the measured slice overhead
# (`moe_slice_overhead_ns`) that the rewrites (tutel) price their slices with; the profile's
# summary is printed first. The variant `tutel-20us` then runs the same plans with that field
# taken out (the rewrite's default of 20 us per sliced piece): the same program runs, only the
# prediction differs.
#
# Usage, from the repository root (knobs as environment variables, defaults below):
#   SLUICE=build/sluice bench/moe_overlap_runtime.sh
set -euo pipefail

SLUICE=${SLUICE:-build/sluice}
OUT=${OUT:-/tmp/sluice-moe-overlap}
REPEATS=${REPEATS:-3}
PORT=${PORT:-29760}
PY=${PY:-/usr/bin/python3}
# The profiled table's activations (the runtime's fp32 tensors) are larger than the preset's
# analytic ones: with PROFILE=1 the limits default higher.
if [ "${PROFILE:-0}" = 1 ]; then
  PLAN_LIMIT=${PLAN_LIMIT:-120}
  RUN_LIMIT=${RUN_LIMIT:-200}
fi
PLAN_LIMIT=${PLAN_LIMIT:-55}
RUN_LIMIT=${RUN_LIMIT:-100}
# name:parallel:seed:batches[:tokens:plan_limit] (the seeds give the replicas of every ep group
# equal micro-batch counts on the first batches, which the lowering requires, docs/moe.md;
# tokens per batch default 1200, the plan limit PLAN_LIMIT, run within twice a given plan limit).
# dp2-ep2-rows: micro-batches of several rows, which the forward partition can cut (its token
# slices cut a micro-batch's rows; at 1,200 tokens and 55 MB they hold one or two).
CONFIGS=(${CONFIGS:-dp2-ep2:dp=2,ep=2:4:3 dp2-ep2-pp2:dp=2,pp=2,ep=2:4:3 dp2-ep2-rows:dp=2,ep=2:4:3:2400:150})
COMMON=(--model gpt-tiny-moe --method padding --recompute none --data mixture-4task
        --max-seqlen 96)

rm -rf "$OUT"
mkdir -p "$OUT"
if [ "${PROFILE:-0}" = 1 ]; then
  "$SLUICE" profile --model gpt-tiny-moe --threads 1 --mbs 1,2,4,8 --seqlen 16,32,64,96 \
    --repeats 5 --warmup 2 --out "$OUT/moe-table.json" > "$OUT/profile.log" 2>&1 || {
      echo "profile failed: see $OUT/profile.log" >&2; exit 1; }
  sed -n '/^moe layer parts/,$p' "$OUT/profile.log" | grep -v "^wrote"
  COMMON+=(--cost "profiled:$OUT/moe-table.json")
fi
for cfg in "${CONFIGS[@]}"; do
  IFS=: read -r name par seed batches tokens plan_limit <<<"$cfg"
  tokens=${tokens:-1200}
  run_limit=$RUN_LIMIT
  if [ -n "${plan_limit:-}" ]; then run_limit=$(( plan_limit * 2 )); else plan_limit=$PLAN_LIMIT; fi
  dir="$OUT/$name"
  mkdir -p "$dir"
  dp=$(sed -n 's/.*dp=\([0-9]*\).*/\1/p' <<<"$par"); pp=$(sed -n 's/.*pp=\([0-9]*\).*/\1/p' <<<"$par")
  nproc=$(( ${dp:-1} * ${pp:-1} ))
  "$SLUICE" plan "${COMMON[@]}" --tokens-per-batch "$tokens" --parallel "$par" --seed "$seed" \
    --cluster "cpu:$nproc" --memory-limit "$plan_limit" --iterations "$batches" \
    --out "$dir/plan.json" --show 0 \
    > "$dir/plan.log" 2>&1 || { echo "plan $name failed: see $dir/plan.log" >&2; exit 1; }
  plans=()
  default_plans=()
  for b in $(seq 0 $((batches - 1))); do
    "$PY" -c 'import json, sys
p = json.load(open(sys.argv[1])); p["parallel"]["memory_limit_mb"] = float(sys.argv[2])
json.dump(p, open(sys.argv[1], "w"))
p.pop("moe_slice_overhead_ns", None); json.dump(p, open(sys.argv[3], "w"))' \
      "$dir/plan-$b.json" "$run_limit" "$dir/plan-$b-default.json"
    plans+=("$dir/plan-$b.json")
    default_plans+=("$dir/plan-$b-default.json")
  done
  if [ "${PROFILE:-0}" = 1 ] && ! grep -q moe_slice_overhead_ns "$dir/plan-0.json"; then
    echo "$name: the profiled plans carry no moe_slice_overhead_ns" >&2; exit 1
  fi
  MASTER_PORT=$PORT "$SLUICE" train --nproc "$nproc" "${COMMON[@]}" --parallel "$par" \
    --tokens-per-batch "$tokens" --memory-limit "$run_limit" --seed "$seed" \
    --cluster "cpu:$nproc" --threads 1 --plan "${plans[@]}" --trace-dir "$dir/calib-trace" > "$dir/calib-train.log" 2>&1
  "$SLUICE" calibrate "$dir/calib-trace" --plan "${plans[@]}" --out "$dir/cal.json" \
    > "$dir/calibrate.log" 2>&1
  variants=(whole none dw tutel partition lancet)
  if [ "${PROFILE:-0}" = 1 ]; then variants+=(tutel-20us); fi
  if [ "${pp:-1}" = 1 ]; then variants+=(megatron lancet-megatron); fi
  if [ -n "${VARIANTS:-}" ]; then
    keep=(whole)
    for v in "${variants[@]}"; do
      if [ "$v" != whole ] && [[ " $VARIANTS " == *" $v "* ]]; then keep+=("$v"); fi
    done
    variants=("${keep[@]}")
  fi
  echo "${variants[*]}" > "$dir/variants"
  for r in $(seq 1 "$REPEATS"); do
    for v in "${variants[@]}"; do
      extra=()
      run_plans=("${plans[@]}")
      if [ "$v" = tutel-20us ]; then
        extra=(--moe-overlap tutel)
        run_plans=("${default_plans[@]}")
      elif [ "$v" != whole ]; then
        extra=(--moe-overlap "$v")
      fi
      MASTER_PORT=$PORT "$SLUICE" train --nproc "$nproc" "${COMMON[@]}" --parallel "$par" \
        --tokens-per-batch "$tokens" --memory-limit "$run_limit" --seed "$seed" \
        --cluster "cpu:$nproc" --threads 1 \
        --plan "${run_plans[@]}" "${extra[@]}" --calibration "$dir/cal.json" \
        --metrics "$dir/metrics-$v-$r.jsonl" \
        > "$dir/train-$v-$r.log" 2>&1 || {
          echo "train $name $v round $r failed: see $dir/train-$v-$r.log" >&2; exit 1; }
      if grep -q "applied with less" "$dir/train-$v-$r.log"; then
        echo "note: train $name $v round $r: $(grep -m1 -o 'applied with less: .\{0,160\}' "$dir/train-$v-$r.log")"
      fi
      if grep -q "moe-overlap not applied" "$dir/train-$v-$r.log"; then
        echo "train $name $v round $r: the rewrite was not applied: see $dir/train-$v-$r.log" >&2
        exit 1
      fi
    done
  done
done

"$PY" - "$OUT" "$REPEATS" "${CONFIGS[@]}" <<'PYEOF'
import glob, json, os, statistics, sys
out, repeats = sys.argv[1], int(sys.argv[2])
med = lambda v: statistics.median(v) if v else float("nan")
print(f"{'config':<12} {'variant':<15} {'iters':>5} {'exposed a2a ms':>15} {'predicted':>10} "
      f"{'iteration ms':>13} {'predicted':>10} {'error':>7} {'vs whole':>9} {'predicted':>10}")
for cfg in sys.argv[3:]:
    name = cfg.split(":")[0]
    d = os.path.join(out, name)
    variants = open(os.path.join(d, "variants")).read().split()
    rows = {}
    for v in variants:
        a2a, a2a_p, it, it_p, per_round = [], [], [], [], {}
        for r in range(1, repeats + 1):
            lines = [json.loads(l) for l in open(os.path.join(d, f"metrics-{v}-{r}.jsonl"))
                     if l.strip()]
            for m in lines[1:]:  # the first iteration of a run is warm-up
                b = m["iteration"]
                a2a.append(m["all_to_all_s"] * 1e3); it.append(m["time_s"] * 1e3)
                a2a_p.append(m["predicted_exposed_all_to_all_s"] * 1e3)
                it_p.append(m["predicted_time_s"] * 1e3)
                per_round.setdefault(r, []).append((m["time_s"] * 1e3, it_p[-1]))
        rows[v] = (a2a, a2a_p, it, it_p, per_round)
    for v in variants:
        a2a, a2a_p, it, it_p, per_round = rows[v]
        # Ratio to the whole-op run of the same round (medians per round, then the median).
        ratios, pred = [], []
        for r, pairs in per_round.items():
            w = rows["whole"][4].get(r)
            if not w:
                continue
            ratios.append(med([p[0] for p in pairs]) / med([p[0] for p in w]))
            pred.append(med([p[1] for p in pairs]) / med([p[1] for p in w]))
        err = 100 * (med(it_p) / med(it) - 1)
        print(f"{name:<12} {v:<15} {len(it):>5} {med(a2a):>15.1f} {med(a2a_p):>10.1f} "
              f"{med(it):>13.1f} {med(it_p):>10.1f} {err:>+6.1f}% {med(ratios):>9.3f} "
              f"{med(pred):>10.3f}")
PYEOF
