#!/usr/bin/env bash
# calibration_predict.sh: issue #14's "Prediction after calibration", measured. The same data is
# planned by two batching methods, DYNAMIC (default dynapipe) and packing; the runs are traced,
# the calibration is fitted on one run's first iterations, and the others are predicted.
#
#   1. `sluice plan` plans ITERS batches with each method (iteration 0 is warm-up: fitted and
#      predicted iterations are 1 .. ITERS-1).
#   2. D: `sluice train --plan` runs the DYNAMIC plans with --trace-dir.
#   3. `sluice calibrate D --fit-iterations 1-FIT` (FIT = (ITERS-1)/2): the held-out table of
#      iterations FIT+1 .. ITERS-1 of the same run, and `--fit-iterations` on the odd ones.
#   4. P and D2: `sluice train --calibration` runs the packing plans and the DYNAMIC plans again
#      (another run: the machine's drift between runs included), printing each plan's calibrated
#      prediction beside the measured time, and writing both to --metrics.
#   5. M: one run that interleaves the two methods' plans (DYNAMIC batch k, then packing batch
#      k), so that both see the same machine; `sluice calibrate M` is fitted on both methods'
#      iterations 1-FIT and predicts the rest.
#   6. Prints per run the held-out mean |error| before and after, the packing/DYNAMIC throughput
#      ratio measured vs predicted (calibrated and not), and the peak tensor memory: the memory
#      fit (calibrate --metrics: per pipeline rank a framework/workspace constant and an
#      activation scale, fitted on D's iterations 1-FIT) with its held-out error before and
#      after, and P's and D2's calibrated prediction against what they measured.
#
# Usage, from the repository root (timings: under the build lock on a shared machine):
#   flock /tmp/sluice-build.lock bench/calibration_predict.sh
# Knobs (environment, defaults below): SLUICE OUT ITERS DYNAMIC NICE (a prefix for the train
# runs, e.g. "nice -n -10" to be less disturbed by other work on the machine).
set -euo pipefail

SLUICE=${SLUICE:-build/sluice}
OUT=${OUT:-/tmp/sluice-calibration-predict}
ITERS=${ITERS:-17}
DYNAMIC=${DYNAMIC:-dynapipe}
NICE=${NICE:-}
PYTHON=${PYTHON:-/usr/bin/python3}
FIT=$(((ITERS - 1) / 2))
common=(--model gpt-tiny --cluster examples/cluster-cpu-2.json --parallel pp=2 --data mixture-4task
        --samples 800 --tokens-per-batch 2048 --max-seqlen 256 --seed 0)
rm -rf "$OUT" && mkdir -p "$OUT/dyn" "$OUT/pack" "$OUT/mix"
"$SLUICE" plan "${common[@]}" --iterations "$ITERS" --method "$DYNAMIC" --schedule 1f1b --show 0 \
  --out "$OUT/dyn/plan.json" > "$OUT/dyn/plan.log"
"$SLUICE" plan "${common[@]}" --iterations "$ITERS" --method packing --schedule 1f1b --show 0 \
  --out "$OUT/pack/plan.json" > "$OUT/pack/plan.log"
PD=() PP=() PM=() odd=()
for ((i = 0; i < ITERS; i++)); do
  PD+=("$OUT/dyn/plan-$i.json") PP+=("$OUT/pack/plan-$i.json")
  PM+=("$OUT/dyn/plan-$i.json" "$OUT/pack/plan-$i.json")
  ((i % 2 == 1)) && odd+=("$i")
done
train() { $NICE "$SLUICE" train --nproc 2 "${common[@]}" --threads 1 "$@"; }
train --plan "${PD[@]}" --trace-dir "$OUT/d" --metrics "$OUT/d.jsonl" > "$OUT/d.log" 2>&1
"$SLUICE" calibrate "$OUT/d" --plan "${PD[@]}" --fit-iterations "1-$FIT" --metrics "$OUT/d.jsonl" \
  --out "$OUT/c.json" > "$OUT/c.log"
"$SLUICE" calibrate "$OUT/d" --plan "${PD[@]}" --fit-iterations "$(IFS=,; echo "${odd[*]}")" \
  --metrics "$OUT/d.jsonl" --out "$OUT/c-odd.json" > "$OUT/c-odd.log"
train --plan "${PP[@]}" --calibration "$OUT/c.json" --metrics "$OUT/p.jsonl" > "$OUT/p.log" 2>&1
train --plan "${PD[@]}" --calibration "$OUT/c.json" --metrics "$OUT/d2.jsonl" > "$OUT/d2.log" 2>&1
train --iterations $((2 * ITERS)) --plan "${PM[@]}" --trace-dir "$OUT/m" --calibration "$OUT/c.json" \
  --metrics "$OUT/m.jsonl" > "$OUT/m.log" 2>&1
"$SLUICE" calibrate "$OUT/m" --plan "${PM[@]}" --fit-iterations "2-$((2 * FIT + 1))" \
  --out "$OUT/cm.json" > "$OUT/cm.log"
"$PYTHON" - "$OUT" "$ITERS" "$FIT" "$DYNAMIC" <<'PY'
import json, sys
out, iters, fit, dyn = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def metrics(name):
    return {j["iteration"]: j for j in map(json.loads, open(f"{out}/{name}.jsonl"))}
def table(log):  # iteration -> (measured, simulated, calibrated) ms from sluice calibrate
    rows = {}
    for line in open(f"{out}/{log}"):
        f = line.split()
        if len(f) == 7 and f[0].isdigit() and f[1] in ("yes", "no"):
            rows[int(f[0])] = tuple(float(x) for x in f[2:5])
    return rows
def mean_abs(pairs):
    pairs = list(pairs)
    return 100 * sum(abs(p / m - 1) for p, m in pairs) / len(pairs)
held = range(fit + 1, iters)
for log, name, its in (("c.log", f"D, fitted 1-{fit}", held),
                       ("c-odd.log", "D, fitted on odd iterations", range(2, iters, 2))):
    t = table(log)
    print(f"{name}: held-out {its.start}..{its.stop - 1} mean |error| "
          f"{mean_abs((t[k][1], t[k][0]) for k in its):.1f}% before, "
          f"{mean_abs((t[k][2], t[k][0]) for k in its):.1f}% after calibration")
every = range(1, iters)
for name in ("p", "d2"):
    m = metrics(name)
    print(f"{name.upper()} (train --calibration, calibration of D 1-{fit}): iterations 1..{iters - 1} "
          f"mean |error| {mean_abs((m[k]['predicted_time_s'], m[k]['time_s']) for k in every):.1f}%")
def throughput(m, idx, key, its):
    return sum(m[idx(k)]["tokens"] for k in its) / sum(m[idx(k)][key] for k in its)
d2, p, mm = metrics("d2"), metrics("p"), metrics("m")
ident = lambda k: k
for label, md, mp, idd, idp in (("separate runs D2, P", d2, p, ident, ident),
                                ("interleaved run M", mm, mm, lambda k: 2 * k, lambda k: 2 * k + 1)):
    meas = throughput(mp, idp, "time_s", every) / throughput(md, idd, "time_s", every)
    pred = (throughput(mp, idp, "predicted_time_s", every) /
            throughput(md, idd, "predicted_time_s", every))
    print(f"{label}: packing/{dyn} throughput measured {meas:.3f}, predicted with D's "
          f"calibration {pred:.3f} ({100 * (pred / meas - 1):+.1f}%)")
t = table("cm.log")
tok = lambda k: mm[k]["tokens"]
for its, what in ((range(fit + 1, iters), f"held out {fit + 1}-{iters - 1}"),
                  (range(1, fit + 1), f"fitted 1-{fit}")):
    def ratio(col):
        dyn_t = sum(tok(2 * k) for k in its) / sum(t[2 * k][col] for k in its)
        pack_t = sum(tok(2 * k + 1) for k in its) / sum(t[2 * k + 1][col] for k in its)
        return pack_t / dyn_t
    meas, plain, cal = ratio(0), ratio(1), ratio(2)
    errs = [mean_abs((t[2 * k + s][2], t[2 * k + s][0]) for k in its) for s in (0, 1)]
    print(f"M calibrated on both methods' 1-{fit}, {what}: throughput ratio measured {meas:.3f}, "
          f"uncalibrated {plain:.3f} ({100 * (plain / meas - 1):+.1f}%), calibrated {cal:.3f} "
          f"({100 * (cal / meas - 1):+.1f}%); per-iteration mean |error| {dyn} {errs[0]:.1f}%, "
          f"packing {errs[1]:.1f}%")
def memory_table(log):  # (iteration, rank) -> (measured, simulated, calibrated) MB
    rows = {}
    for line in open(f"{out}/{log}"):
        f = line.split()
        if len(f) == 8 and f[0].isdigit() and f[1].isdigit() and f[2] in ("yes", "no"):
            rows[(int(f[0]), int(f[1]))] = tuple(float(x) for x in f[3:6])
    return rows
for log, name, its in (("c.log", f"D, fitted 1-{fit}", held),
                       ("c-odd.log", "D, fitted on odd iterations", range(2, iters, 2))):
    for line in open(f"{out}/{log}"):
        if "memory, pipeline rank" in line:
            print(f"{name}: {line.strip()}")
    t = memory_table(log)
    keys = [key for key in t if key[0] in its]
    print(f"{name}: held-out {its.start}..{its.stop - 1}, peak tensor memory per rank mean |error| "
          f"{mean_abs((t[k][1], t[k][0]) for k in keys):.1f}% before, "
          f"{mean_abs((t[k][2], t[k][0]) for k in keys):.1f}% after calibration ({len(keys)} peaks)")
for name, m in (("D2", d2), ("P", p)):
    for r in range(len(m[1]["peak_tensor_bytes_by_rank"])):
        meas = [m[k]["peak_tensor_bytes_by_rank"][r] for k in every]
        sim = [m[k]["predicted_peak_bytes_by_rank"][r] for k in every]
        print(f"{name} rank {r}: peak tensor memory measured {min(meas) / 1e6:.1f}-"
              f"{max(meas) / 1e6:.1f} MB, simulated with D's calibration (memory included) "
              f"{min(sim) / 1e6:.1f}-{max(sim) / 1e6:.1f} MB, "
              f"mean |error| {mean_abs(zip(sim, meas)):.1f}%")
PY
