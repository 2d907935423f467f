#!/usr/bin/env bash
# moe_a2a_runtime.sh: MoE all-to-all time measured by the runtime (`sluice train`, Gloo
# alltoall_base between local CPU processes) against the simulator's prediction for the same
# plans (issue #18).
#
#   1. `sluice plan --out` makes the plans of the first batches for each configuration (padding,
#      recompute none; priced with the analytic model of the `cpu` cluster preset: a profiled
#      table cannot describe MoE layers yet);
#   2. `sluice simulate --json` predicts each plan: all-to-all busy time and its exposed part
#      (the max over ranks), and the iteration time;
#   3. `sluice train --plan ...` executes exactly those plans REPEATS times; --metrics gives per
#      iteration `all_to_all_s` (the max over ranks of the time spent inside the all-to-alls,
#      all of it exposed: an all-to-all blocks its compute op on CPU) and `time_s`;
#   4. a table per configuration: means over the iterations (the first of every repeat is
#      warm-up and not counted).
#
# Usage, from the repository root (knobs as environment variables, defaults below):
#   SLUICE=build/sluice bench/moe_a2a_runtime.sh
set -euo pipefail

SLUICE=${SLUICE:-build/sluice}
OUT=${OUT:-/tmp/sluice-moe-a2a}
REPEATS=${REPEATS:-2}
PORT=${PORT:-29740}
PY=${PY:-/usr/bin/python3}
# name:parallel:seed:batches. The seeds give the replicas of every ep group equal micro-batch
# counts on the first batches (the lowering requires it, docs/moe.md).
CONFIGS=(${CONFIGS:-dp2-ep2:dp=2,ep=2:4:3 dp2-ep2-pp2:dp=2,pp=2,ep=2:4:3})
COMMON=(--model gpt-tiny-moe --method padding --recompute none --data mixture-4task
        --tokens-per-batch 1200 --max-seqlen 96 --memory-limit 55)

rm -rf "$OUT"
mkdir -p "$OUT"
for cfg in "${CONFIGS[@]}"; do
  IFS=: read -r name par seed batches <<<"$cfg"
  dir="$OUT/$name"
  mkdir -p "$dir"
  dp=$(sed -n 's/.*dp=\([0-9]*\).*/\1/p' <<<"$par"); pp=$(sed -n 's/.*pp=\([0-9]*\).*/\1/p' <<<"$par")
  nproc=$(( ${dp:-1} * ${pp:-1} ))
  "$SLUICE" plan "${COMMON[@]}" --parallel "$par" --seed "$seed" --cluster "cpu:$nproc" \
    --iterations "$batches" --out "$dir/plan.json" --show 0 > "$dir/plan.log" 2>&1
  plans=()
  for b in $(seq 0 $((batches - 1))); do
    "$SLUICE" simulate "$dir/plan-$b.json" --json "$dir/sim-$b.json" > /dev/null
    plans+=("$dir/plan-$b.json")
  done
  for r in $(seq 1 "$REPEATS"); do
    MASTER_PORT=$PORT "$SLUICE" train --nproc "$nproc" "${COMMON[@]}" --parallel "$par" \
      --seed "$seed" --threads 1 --plan "${plans[@]}" --metrics "$dir/metrics-$r.jsonl" \
      > "$dir/train-$r.log" 2>&1
  done
done

"$PY" - "$OUT" "${CONFIGS[@]}" <<'PYEOF'
import glob, json, os, sys
out = sys.argv[1]
print(f"{'config':<14} {'iters':>5} {'a2a measured ms':>16} {'a2a simulated ms':>17} "
      f"{'exposed sim ms':>15} {'iter measured ms':>17} {'iter simulated ms':>18}")
for cfg in sys.argv[2:]:
    name = cfg.split(":")[0]
    d = os.path.join(out, name)
    sims = {}
    for f in glob.glob(os.path.join(d, "sim-*.json")):
        b = int(f.rsplit("-", 1)[1].split(".")[0])
        j = json.load(open(f))
        sims[b] = (max(r.get("all_to_all_ns", 0) for r in j["ranks"]) / 1e6,
                   max(r.get("exposed_all_to_all_ns", 0) for r in j["ranks"]) / 1e6,
                   j["iteration_time_ns"] / 1e6)
    meas, sim, exp, it_m, it_s = [], [], [], [], []
    for f in sorted(glob.glob(os.path.join(d, "metrics-*.jsonl"))):
        lines = [json.loads(l) for l in open(f) if l.strip()]
        for m in lines[1:]:  # the first iteration of a run is warm-up
            b = m["iteration"]
            meas.append(m["all_to_all_s"] * 1e3); it_m.append(m["time_s"] * 1e3)
            sim.append(sims[b][0]); exp.append(sims[b][1]); it_s.append(sims[b][2])
    mean = lambda v: sum(v) / len(v) if v else float("nan")
    print(f"{name:<14} {len(meas):>5} {mean(meas):>16.1f} {mean(sim):>17.1f} {mean(exp):>15.1f} "
          f"{mean(it_m):>17.1f} {mean(it_s):>18.1f}")
PYEOF
