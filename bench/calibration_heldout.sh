#!/usr/bin/env bash
# calibration_heldout.sh: what issue #14's held-out prediction error is made of. The same ITERS
# plans (gpt-tiny pp 2, dynapipe, 1f1b; calibration_predict.sh's scenario) are trained REPEATS
# times with traces; each run r is calibrated on its own iterations 1-FIT (FIT = (ITERS-1)/2) and
# predicts iterations FIT+1 .. ITERS-1 (other batches, never fitted). Then, over those held-out
# iterations:
#   - single: run r's prediction against run r's measurement (what calibration_predict.sh
#     reports), per run and the mean over runs;
#   - vs median: run r's prediction against the median over the REPEATS runs of each held-out
#     iteration (run noise averaged; the runs' held-out windows are never fitted);
#   - ensemble: the median over runs of the predictions against the same medians;
#   - noise floor: one run against the median of the other runs, per iteration (what a perfect
#     model of the plans would score against one run), and two runs against each other;
#   - quietest: the fastest of the runs' predictions against the fastest of their measurements;
#   - the error's mean (bias: the drift of the machine's speed between fit and held-out windows
#     plus what the model gets wrong on average) and its scatter (per-iteration shape).
#
# Usage, from the repository root (timings: under the build lock on a shared machine):
#   flock /tmp/sluice-build.lock bench/calibration_heldout.sh
# Knobs (environment): SLUICE OUT ITERS (17) REPEATS (4) NICE (a prefix for the train runs)
# ALLOCATOR (train --host-allocator: cache, the default, or system; bench/host_allocator_ab.sh)
# CPU_BIND (train --cpu-bind: none, the default, or cores).
set -euo pipefail

SLUICE=${SLUICE:-build/sluice}
OUT=${OUT:-/tmp/sluice-calibration-heldout}
ITERS=${ITERS:-17}
REPEATS=${REPEATS:-4}
NICE=${NICE:-}
ALLOCATOR=${ALLOCATOR:-cache}
CPU_BIND=${CPU_BIND:-none}
PYTHON=${PYTHON:-/usr/bin/python3}
FIT=$(((ITERS - 1) / 2))
common=(--model gpt-tiny --cluster examples/cluster-cpu-2.json --parallel pp=2 --data mixture-4task
        --samples 800 --tokens-per-batch 2048 --max-seqlen 256 --seed 0)
rm -rf "$OUT" && mkdir -p "$OUT/plans"
"$SLUICE" plan "${common[@]}" --iterations "$ITERS" --method dynapipe --schedule 1f1b --show 0 \
  --out "$OUT/plans/plan.json" > "$OUT/plan.log"
PD=()
for ((i = 0; i < ITERS; i++)); do PD+=("$OUT/plans/plan-$i.json"); done
for ((r = 0; r < REPEATS; r++)); do
  $NICE "$SLUICE" train --nproc 2 "${common[@]}" --threads 1 --plan "${PD[@]}" \
    --host-allocator "$ALLOCATOR" --cpu-bind "$CPU_BIND" \
    --trace-dir "$OUT/d$r" --metrics "$OUT/d$r.jsonl" > "$OUT/d$r.log" 2>&1
  "$SLUICE" calibrate "$OUT/d$r" --plan "${PD[@]}" --fit-iterations "1-$FIT" \
    --metrics "$OUT/d$r.jsonl" --out "$OUT/c$r.json" > "$OUT/c$r.log"
done
"$PYTHON" - "$OUT" "$ITERS" "$FIT" "$REPEATS" <<'PY'
import statistics as st, sys
out, iters, fit, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def table(r):  # iteration -> (measured, simulated, calibrated) ms from sluice calibrate
    rows = {}
    for line in open(f"{out}/c{r}.log"):
        f = line.split()
        if len(f) == 7 and f[0].isdigit() and f[1] in ("yes", "no"):
            rows[int(f[0])] = tuple(float(x) for x in f[2:5])
    return rows
t = [table(r) for r in range(repeats)]
held = range(fit + 1, iters)
meas = {k: [t[r][k][0] for r in range(repeats)] for k in range(1, iters)}
med = {k: st.median(v) for k, v in meas.items()}
def mean_abs(pairs):
    pairs = list(pairs)
    return 100 * st.mean(abs(p / m - 1) for p, m in pairs)
single = [mean_abs((t[r][k][2], t[r][k][0]) for k in held) for r in range(repeats)]
uncal = [mean_abs((t[r][k][1], t[r][k][0]) for k in held) for r in range(repeats)]
vs_med = [mean_abs((t[r][k][2], med[k]) for k in held) for r in range(repeats)]
ens = {k: st.median(t[r][k][2] for r in range(repeats)) for k in held}
# Quietest: the machine's load only adds time, so the fastest of the runs estimates the
# uncontended time; the fastest of the runs' predictions comes from the quietest fit window (it
# depends on the fit windows only, as the reference on the held-out windows only).
quiet = mean_abs((min(t[r][k][2] for r in range(repeats)), min(meas[k])) for k in held)
print(f"  quietest: the fastest prediction vs the fastest measurement of each held-out iteration: "
      f"{quiet:.1f}%")
floor = [mean_abs((t[r][k][0], st.median(meas[k][:r] + meas[k][r + 1:])) for k in held)
         for r in range(repeats)]
pairs = [mean_abs((t[a][k][0], t[b][k][0]) for k in held)
         for a in range(repeats) for b in range(a + 1, repeats)]
print(f"gpt-tiny pp 2, {iters} plans trained {repeats} times; each run calibrated on its "
      f"iterations 1-{fit}, held out {fit + 1}-{iters - 1}")
print("  held-out mean |error| per run, single run (prediction vs the same run): " +
      ", ".join(f"{x:.1f}%" for x in single) + f"; mean {st.mean(single):.1f}% "
      f"(uncalibrated {st.mean(uncal):.1f}%)")
print("  the same predictions vs the median of the runs' measurements: " +
      ", ".join(f"{x:.1f}%" for x in vs_med) + f"; mean {st.mean(vs_med):.1f}%")
print(f"  ensemble (median over runs of the predictions) vs the median: "
      f"{mean_abs((ens[k], med[k]) for k in held):.1f}%")
print("  noise floor: one run vs the median of the others, per run: " +
      ", ".join(f"{x:.1f}%" for x in floor) + f"; mean {st.mean(floor):.1f}%; two runs against "
      f"each other: mean {st.mean(pairs):.1f}% (min {min(pairs):.1f}%, max {max(pairs):.1f}%)")
# Bias and scatter: the signed error's mean over the held-out iterations, and what is left.
for name, pred, ref in (("single", lambda r, k: t[r][k][2], lambda r, k: t[r][k][0]),
                        ("vs median", lambda r, k: t[r][k][2], lambda r, k: med[k])):
    bias, scatter = [], []
    for r in range(repeats):
        e = [pred(r, k) / ref(r, k) - 1 for k in held]
        b = st.mean(e)
        bias.append(100 * b)
        scatter.append(100 * st.mean(abs(x - b) for x in e))
    print(f"  {name}: bias per run " + ", ".join(f"{x:+.1f}%" for x in bias) +
          "; scatter around it " + ", ".join(f"{x:.1f}%" for x in scatter))
# The same split of the noise: two runs of the same plans, their per-iteration ratio's mean (the
# runs' speed apart) and its scatter (per-iteration noise).
nb, ns = [], []
for a in range(repeats):
    for b in range(a + 1, repeats):
        q = [t[a][k][0] / t[b][k][0] for k in held]
        m = st.mean(q)
        nb.append(100 * abs(m - 1))
        ns.append(100 * st.mean(abs(x / m - 1) for x in q))
print(f"  noise, two runs against each other: |speed apart| mean {st.mean(nb):.1f}% (max "
      f"{max(nb):.1f}%), per-iteration scatter around it mean {st.mean(ns):.1f}% (max {max(ns):.1f}%)")
# The machine's speed per iteration: measured / uncalibrated simulated time (the plan's fixed
# prediction), per run; a step in it is a change of load, not of the batches.
for r in range(repeats):
    print(f"  run {r} measured / simulated per iteration 1..{iters - 1}: " +
          " ".join(f"{t[r][k][0] / t[r][k][1]:.2f}" for k in range(1, iters)))
# The same as one figure per run: the scatter (standard deviation over mean) of that ratio over
# iterations 1..ITERS-1, which a steadier run keeps small whatever the model gets wrong.
print("  within-run scatter of measured / simulated, per run: " +
      ", ".join(f"{100 * st.pstdev(v) / st.mean(v):.1f}%"
                for v in ([t[r][k][0] / t[r][k][1] for k in range(1, iters)]
                          for r in range(repeats))))
drift = [st.mean(t[r][k][0] for k in held) / st.mean(t[r][k][0] for k in range(1, fit + 1))
         for r in range(repeats)]
drift_med = st.mean(med[k] for k in held) / st.mean(med[k] for k in range(1, fit + 1))
print("  held-out / fitted window mean measured time per run: " +
      ", ".join(f"{x:.3f}" for x in drift) + f"; of the medians {drift_med:.3f}")
print("  iteration  " + "  ".join(f"run{r} meas/pred ms" for r in range(repeats)) +
      "  median meas  ensemble pred  error")
for k in held:
    cells = "  ".join(f"{t[r][k][0]:>6.1f}/{t[r][k][2]:>6.1f}" for r in range(repeats))
    print(f"  {k:>9}  {cells}  {med[k]:>11.1f}  {ens[k]:>13.1f}  {100 * (ens[k] / med[k] - 1):+5.1f}%")
for r in range(repeats):
    mem = {}
    for line in open(f"{out}/c{r}.log"):
        f = line.split()
        if len(f) == 8 and f[0].isdigit() and f[1].isdigit() and f[2] in ("yes", "no"):
            mem[(int(f[0]), int(f[1]))] = tuple(float(x) for x in f[3:6])
    keys = [key for key in mem if key[0] in held]
    if keys:
        print(f"  run {r} peak memory, held-out {held.start}-{held.stop - 1}: mean |error| "
              f"{mean_abs((mem[k][1], mem[k][0]) for k in keys):.1f}% before, "
              f"{mean_abs((mem[k][2], mem[k][0]) for k in keys):.1f}% after ({len(keys)} peaks)")
PY
