#!/usr/bin/env bash
# optimizer_train_ab.sh: the plan optimizer trained for real (issue #17, "For real"): the same
# global batches planned without and with the optimizer, executed by `sluice train --plan` on PP
# local CPU processes, runs interleaved A/B/A/B, against the simulator's prediction.
#
#   1. `sluice plan` plans ITERS batches twice with the same flags and seed: A without the
#      optimizer, B with `--optimize-budget-ms BUDGET_MS` (a budget the 200-step bound ends first,
#      so B is reproducible). The optimizer runs after the lowering, so A and B hold the same
#      samples in the same micro-batches; only what the passes rewrite differs.
#   2. `sluice simulate` predicts every plan (closed-form collectives, as the optimizer scores).
#   3. `sluice train --plan` runs A and B alternately REPEATS times each (--metrics; the first
#      repeat of each also --dump-dir: every rank's gradients before the optimizer step).
#   4. Prints per iteration the predicted and the measured time (median over the repeats) of A
#      and B; the predicted gain 1 - sum(B)/sum(A) and the measured one over the same
#      iterations (iteration 0 is warm-up, not counted); the largest loss difference between A
#      and B over every repeat; the largest gradient difference between A and B.
#
# Usage, from the repository root (timings: run it under the build lock on a shared machine):
#   flock /tmp/sluice-build.lock bench/optimizer_train_ab.sh
# Knobs (environment, defaults below): SLUICE OUT MODEL PP ITERS REPEATS SCHEDULE RECOMPUTE
# MEMORY (--memory-limit in MB, empty = the cluster's) COST (--cost of the plans, e.g.
# profiled:TABLE from `sluice profile`; empty = the cluster's analytic model) BUDGET_MS TOKENS
# MAXLEN PORT CALIB_ITERS (> 0: also a calibrated prediction, below) PAIRED (> 0: also paired
# runs, below).
#
# With CALIB_ITERS=N (> 0), before the A/B runs: N other batches (the same flags, `--seed 1`, no
# optimizer: plans like A's), each planned twice, at RECOMPUTE and at CALIB_RECOMPUTE (default
# none), are trained once (2N iterations, alternating) with --trace-dir; `sluice calibrate` fits
# iterations 1..2N-1 (iteration 0 is warm-up), and every A and B plan is simulated again with
# `--calibration`: the predicted gain then comes from costs calibrated on a trace of unoptimized
# plans of other batches (nothing is fitted on the batches measured).
# With PAIRED=N (> 0), after the A/B runs: N more training runs, each with the A and B plans of a
# batch back to back (A0 B0 A1 B1 ...; every other run B first), so that each pair runs within
# seconds of each other: this VM's speed drifts by up to 1.5x within a minute (docs/benchmarks.md),
# which separate A and B runs take into the gain. The paired gain is computed as the separate
# one (medians over runs per batch, batch 0 not counted), with a 90% interval from resampling
# the runs (2,000 bootstrap draws, seeded), and set against both predictions.
# Exit status 1 when the losses or gradients differ by more than TOL (1e-5), or when the optimizer
# changed no plan (then nothing was compared).
set -euo pipefail

SLUICE=${SLUICE:-build/sluice}
OUT=${OUT:-/tmp/sluice-optimizer-ab}
MODEL=${MODEL:-gpt-tiny}
PP=${PP:-2}
ITERS=${ITERS:-6}
REPEATS=${REPEATS:-3}
SCHEDULE=${SCHEDULE:-1f1b}
RECOMPUTE=${RECOMPUTE:-full}
MEMORY=${MEMORY:-}
COST=${COST:-}
BUDGET_MS=${BUDGET_MS:-10000}
TOKENS=${TOKENS:-4096}
MAXLEN=${MAXLEN:-512}
PORT=${PORT:-29760}
CALIB_ITERS=${CALIB_ITERS:-0}
CALIB_RECOMPUTE=${CALIB_RECOMPUTE:-none}
PAIRED=${PAIRED:-0}
TOL=${TOL:-1e-5}
PY=${PY:-/usr/bin/python3}

if [[ ! -x "$SLUICE" ]]; then
  echo "optimizer_train_ab: SLUICE=$SLUICE is not an executable; build sluice with libtorch" \
    "(cmake --build build --target sluice) or set SLUICE to its path" >&2
  exit 2
fi
# The help text is read whole first: `grep -q` would stop reading early and, under pipefail, the
# writer's SIGPIPE would fail the pipeline.
train_help="$("$SLUICE" train --help 2>/dev/null || true)"
if ! grep -q -- '--plan' <<<"$train_help"; then
  echo "optimizer_train_ab: $SLUICE has no 'train' command (a build without libtorch)" >&2
  exit 2
fi

rm -rf "$OUT"
mkdir -p "$OUT/a" "$OUT/b"
COMMON=(--model "$MODEL" --cluster cpu --parallel "pp=$PP" --tokens-per-batch "$TOKENS"
        --max-seqlen "$MAXLEN" --schedule "$SCHEDULE")
[[ -n "$MEMORY" ]] && COMMON+=(--memory-limit "$MEMORY")
[[ -n "$COST" ]] && COMMON+=(--cost "$COST")
BASE=("${COMMON[@]}")  # without --recompute
[[ -n "$RECOMPUTE" ]] && COMMON+=(--recompute "$RECOMPUTE")

"$SLUICE" plan "${COMMON[@]}" --iterations "$ITERS" --out "$OUT/a/plan.json" > "$OUT/plan-a.txt"
"$SLUICE" plan "${COMMON[@]}" --iterations "$ITERS" --optimize-budget-ms "$BUDGET_MS" \
  --out "$OUT/b/plan.json" > "$OUT/plan-b.txt"
grep -E '^  optimizer:' "$OUT/plan-b.txt" || true

# Plan files in batch order (a batch the planner skipped has no file in either run).
mapfile -t A_PLANS < <(ls "$OUT"/a/plan-*.json | sort -t- -k2 -n)
B_PLANS=()
for f in "${A_PLANS[@]}"; do
  b="$OUT/b/$(basename "$f")"
  [[ -f "$b" ]] || { echo "optimizer_train_ab: $b missing (A and B planned different batches)" >&2; exit 2; }
  B_PLANS+=("$b")
done
for v in a b; do
  for f in "$OUT/$v"/plan-*.json; do
    "$SLUICE" simulate "$f" --collectives closed-form | sed -n 's/^iteration \([0-9.]*\) ms.*/\1/p' \
      > "${f%.json}.sim"
  done
done

TRAIN=(--model "$MODEL" --parallel "pp=$PP" --max-seqlen "$MAXLEN" --nproc "$PP")
if (( CALIB_ITERS > 0 )); then
  # Other batches (--seed 1), unoptimized: planned as A (RECOMPUTE) and again with CALIB_RECOMPUTE
  # (the level the optimizer may move to), run in one training run, batch by batch alternately,
  # so the fit sees what a recompute level costs here (`calibrate`'s recomputed-token feature).
  mkdir -p "$OUT/calib"
  CAL=("${BASE[@]}" --recompute "$CALIB_RECOMPUTE")
  "$SLUICE" plan "${COMMON[@]}" --iterations "$CALIB_ITERS" --seed 1 \
    --out "$OUT/calib/x.json" > "$OUT/plan-calib-x.txt"
  "$SLUICE" plan "${CAL[@]}" --iterations "$CALIB_ITERS" --seed 1 \
    --out "$OUT/calib/y.json" > "$OUT/plan-calib-y.txt"
  C_PLANS=()
  for ((k = 0; k < CALIB_ITERS; ++k)); do
    for v in x y; do
      [[ -f "$OUT/calib/$v-$k.json" ]] && C_PLANS+=("$OUT/calib/$v-$k.json")
    done
  done
  MASTER_PORT=$((PORT + 1)) "$SLUICE" train "${TRAIN[@]}" --run-id ab-calib --plan "${C_PLANS[@]}" \
    --trace-dir "$OUT/calib/traces" > "$OUT/train-calib.txt"
  "$SLUICE" calibrate "$OUT/calib/traces" --plan "${C_PLANS[@]}" \
    --fit-iterations "1-$((${#C_PLANS[@]} - 1))" --out "$OUT/calibration.json" \
    > "$OUT/calibrate.txt"
  for v in a b; do
    for f in "$OUT/$v"/plan-*.json; do
      "$SLUICE" simulate "$f" --collectives closed-form --calibration "$OUT/calibration.json" |
        sed -n 's/^iteration \([0-9.]*\) ms.*/\1/p' > "${f%.json}.csim"
    done
  done
  echo "calibrated on ${#C_PLANS[@]} plans of $CALIB_ITERS other batches (seed 1, recompute" \
    "${RECOMPUTE:-default} and $CALIB_RECOMPUTE): $OUT/calibration.json"
fi
for r in $(seq 1 "$REPEATS"); do
  for v in a b; do
    if [[ $v == a ]]; then plans=("${A_PLANS[@]}"); else plans=("${B_PLANS[@]}"); fi
    dump=()
    [[ $r == 1 ]] && dump=(--dump-dir "$OUT/dump-$v")
    [[ $v == a ]] && port=$((PORT + 2 * r)) || port=$((PORT + 2 * r + 1))
    MASTER_PORT=$port \
      "$SLUICE" train "${TRAIN[@]}" --run-id "ab-$v-$r" --plan "${plans[@]}" \
      --metrics "$OUT/$v-$r.jsonl" "${dump[@]}" > "$OUT/train-$v-$r.txt"
    echo "run $r $v: $(tail -1 "$OUT/train-$v-$r.txt" | grep -o 'trained.*tokens/s' || true)"
  done
done

for ((r = 1; r <= PAIRED; ++r)); do
  plans=()
  for k in "${!A_PLANS[@]}"; do
    if ((r % 2 == 1)); then plans+=("${A_PLANS[k]}" "${B_PLANS[k]}"); else plans+=("${B_PLANS[k]}" "${A_PLANS[k]}"); fi
  done
  MASTER_PORT=$((PORT + 2 * REPEATS + 2 + r)) \
    "$SLUICE" train "${TRAIN[@]}" --run-id "ab-p-$r" --plan "${plans[@]}" \
    --metrics "$OUT/p-$r.jsonl" > "$OUT/train-p-$r.txt"
  echo "paired run $r: $(tail -1 "$OUT/train-p-$r.txt" | grep -o 'trained.*tokens/s' || true)"
done

"$PY" - "$OUT" "$REPEATS" "$PP" "$TOL" "$PAIRED" <<'EOF'
import glob, json, os, random, statistics, struct, sys

out, repeats, pp, tol = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
paired = int(sys.argv[5])

def metrics(v):
    runs = []
    for r in range(1, repeats + 1):
        with open(f"{out}/{v}-{r}.jsonl") as f:
            runs.append([json.loads(line) for line in f if line.strip()])
    return runs

def sims(v, ext="sim"):
    files = sorted(glob.glob(f"{out}/{v}/plan-*.{ext}"),
                   key=lambda p: int(p.rsplit("-", 1)[1].split(".")[0]))
    return [float(open(p).read().strip()) for p in files]

def grads(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b"SLGD", path
    (count,), pos = struct.unpack_from("<q", data, 4), 12
    values = {}
    for _ in range(count):
        (n,) = struct.unpack_from("<q", data, pos); pos += 8
        name = data[pos:pos + n].decode(); pos += n
        (k,) = struct.unpack_from("<q", data, pos); pos += 8
        values[name] = struct.unpack_from(f"<{k}f", data, pos); pos += 4 * k
    return values

def plan_files(v):
    return sorted(glob.glob(f"{out}/{v}/plan-*.json"),
                  key=lambda p: int(p.rsplit("-", 1)[1].split(".")[0]))

changed = sum(open(a, "rb").read() != open(b, "rb").read()
              for a, b in zip(plan_files("a"), plan_files("b")))
print(f"plans the optimizer changed: {changed} of {len(plan_files('a'))}")
ma, mb = metrics("a"), metrics("b")
sa, sb = sims("a"), sims("b")
iters = len(ma[0])
assert all(len(x) == iters for x in ma + mb) and len(sa) == len(sb) == iters
med = lambda runs, i: statistics.median(run[i]["time_s"] for run in runs)
print(f"\n{'iter':>4} {'pred A ms':>10} {'pred B ms':>10} {'pred gain':>10} "
      f"{'meas A ms':>10} {'meas B ms':>10} {'meas gain':>10}")
for i in range(iters):
    a, b = med(ma, i) * 1e3, med(mb, i) * 1e3
    print(f"{i:>4} {sa[i]:>10.1f} {sb[i]:>10.1f} {100 * (1 - sb[i] / sa[i]):>9.2f}% "
          f"{a:>10.1f} {b:>10.1f} {100 * (1 - b / a):>9.2f}%" + ("  (warm-up)" if i == 0 else ""))
counted = range(1, iters) if iters > 1 else range(iters)
pa, pb = sum(sa[i] for i in counted), sum(sb[i] for i in counted)
xa, xb = sum(med(ma, i) for i in counted) * 1e3, sum(med(mb, i) for i in counted) * 1e3
pred, meas = 100 * (1 - pb / pa), 100 * (1 - xb / xa)
print(f"\npredicted: A {pa / len(counted):.1f} ms, B {pb / len(counted):.1f} ms per iteration: "
      f"gain {pred:.2f}%")
print(f"measured:  A {xa / len(counted):.1f} ms, B {xb / len(counted):.1f} ms per iteration "
      f"(median of {repeats}): gain {meas:.2f}%")
print(f"measured - predicted gain: {meas - pred:+.2f} percentage points")
ca, cb = sims("a", "csim"), sims("b", "csim")
if ca and cb:
    assert len(ca) == len(cb) == iters
    qa, qb = sum(ca[i] for i in counted), sum(cb[i] for i in counted)
    cpred = 100 * (1 - qb / qa)
    print(f"calibrated predicted: A {qa / len(counted):.1f} ms, B {qb / len(counted):.1f} ms per "
          f"iteration: gain {cpred:.2f}%")
    print(f"measured - calibrated predicted gain: {meas - cpred:+.2f} percentage points")
if paired > 0:
    # Run r holds batch k's A and B at positions 2k and 2k+1, B first in even runs.
    pa, pb = [], []
    for r in range(1, paired + 1):
        with open(f"{out}/p-{r}.jsonl") as f:
            t = [json.loads(line)["time_s"] for line in f if line.strip()]
        assert len(t) == 2 * iters, (r, len(t))
        first, second = t[0::2], t[1::2]
        pa.append(first if r % 2 == 1 else second)
        pb.append(second if r % 2 == 1 else first)

    def paired_gain(runs):
        xa = sum(statistics.median(pa[r][i] for r in runs) for i in counted)
        xb = sum(statistics.median(pb[r][i] for r in runs) for i in counted)
        return 100 * (1 - xb / xa), xa, xb

    pg, xa, xb = paired_gain(range(paired))
    rng = random.Random(0)
    draws = sorted(paired_gain([rng.randrange(paired) for _ in range(paired)])[0]
                   for _ in range(2000))
    lo, hi = draws[int(0.05 * len(draws))], draws[int(0.95 * len(draws)) - 1]
    per_run = [100 * (1 - sum(pb[r][i] for i in counted) / sum(pa[r][i] for i in counted))
               for r in range(paired)]
    print(f"paired:    A {1e3 * xa / len(counted):.1f} ms, B {1e3 * xb / len(counted):.1f} ms "
          f"per iteration "
          f"(median of {paired} runs, each batch's A and B back to back): gain {pg:.2f}% "
          f"(90% interval {lo:.2f}-{hi:.2f}%; per run {min(per_run):.2f}-{max(per_run):.2f}%)")
    print(f"paired - predicted gain: {pg - pred:+.2f} percentage points")
    if ca and cb:
        print(f"paired - calibrated predicted gain: {pg - cpred:+.2f} percentage points "
              f"(interval {lo - cpred:+.2f} to {hi - cpred:+.2f})")
loss_diff = max(abs(x["loss"] - y["loss"]) for ra in ma for rb in mb for x, y in zip(ra, rb))
print(f"loss max |A - B| over {iters} iterations x {repeats}x{repeats} runs: {loss_diff:.3g}")
grad_diff, tensors = 0.0, 0
for i in range(iters):
    for r in range(pp):
        ga = grads(f"{out}/dump-a/grads-iter-{i}-rank-{r}.bin")
        gb = grads(f"{out}/dump-b/grads-iter-{i}-rank-{r}.bin")
        assert ga.keys() == gb.keys(), (i, r)
        for name in ga:
            tensors += 1
            grad_diff = max(grad_diff, max((abs(x - y) for x, y in zip(ga[name], gb[name])),
                                           default=0.0))
print(f"gradient max |A - B| over {tensors} tensors ({iters} iterations x {pp} ranks): "
      f"{grad_diff:.3g}")
if changed == 0:
    print("FAIL: the optimizer changed no plan: A and B ran the same plans (pick a configuration "
          "where it changes them, e.g. RECOMPUTE=full)")
    sys.exit(1)
if loss_diff > tol or grad_diff > tol:
    print(f"FAIL: A and B differ by more than {tol:g}")
    sys.exit(1)
EOF
