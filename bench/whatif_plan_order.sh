#!/usr/bin/env bash
# whatif_plan_order.sh: a what-if with another plan's order, made real (issue #14). The same
# global batches are planned twice, with schedule A (default 1f1b) and schedule B (default zb-h1):
# the same micro-batches, in another order, zb-h1 splitting each backward in halves. Each run's
# trace predicts the other's iteration times (`sluice replay RUN --plan ITS_PLANS --what-if-plan
# THE_OTHER_PLANS`: its measured op times and gaps replayed in the other plans' order), and the
# other run measured them.
#
#   1. `sluice plan` plans ITERS batches with each schedule (--out), so that A and B execute the
#      same batches.
#   2. REPEATS times, alternating: train A (--trace-dir), train B (--trace-dir); replay A with
#      --what-if-plan B (B predicted) and B with --what-if-plan A (A predicted), --json.
#   3. Prints per iteration the medians over the repeats of A measured, B predicted from A, B
#      measured, and the reverse (A predicted from B); then the means over iterations 1.. (0 is
#      warm-up) and the mean iteration error of each direction; then how many instructions each
#      pricing rule priced, and B / A compute per run (what the prediction cannot know).
#
# Usage, from the repository root (timings: run it under the build lock on a shared machine):
#   flock /tmp/sluice-build.lock bench/whatif_plan_order.sh
# Knobs (environment, defaults below): SLUICE OUT MODEL PARALLEL NPROC SCHEDULE_A SCHEDULE_B
# B_FLAGS ITERS REPEATS TOKENS MAXLEN SAMPLES PORT NICE TOL (the largest mean iteration |error| accepted,
# %; exit status 1 above it; default: no check).
set -euo pipefail

SLUICE=${SLUICE:-build/sluice}
OUT=${OUT:-/tmp/sluice-whatif-plan}
MODEL=${MODEL:-gpt-tiny}
PARALLEL=${PARALLEL:-pp=2}
NPROC=${NPROC:-2}
SCHEDULE_A=${SCHEDULE_A:-1f1b}
SCHEDULE_B=${SCHEDULE_B:-zb-h1}
B_FLAGS=${B_FLAGS:-}  # more `sluice plan` flags for B, e.g. --no-search (1f1b in the batching order)
ITERS=${ITERS:-12}
REPEATS=${REPEATS:-5}
TOKENS=${TOKENS:-1024}
MAXLEN=${MAXLEN:-128}
SAMPLES=${SAMPLES:-400}
PORT=${PORT:-29810}
NICE=${NICE:-}
TOL=${TOL:-}
PY=${PY:-/usr/bin/python3}

if [[ ! -x "$SLUICE" ]] || ! "$SLUICE" train --help >/dev/null 2>&1; then
  echo "whatif_plan_order: SLUICE=$SLUICE cannot train (build sluice with libtorch)" >&2
  exit 2
fi
rm -rf "$OUT"
mkdir -p "$OUT/plans"
SCEN=(--model "$MODEL" --parallel "$PARALLEL" --data mixture-4task --samples "$SAMPLES"
      --tokens-per-batch "$TOKENS" --max-seqlen "$MAXLEN" --seed 0)
declare -A PLANS
for side in a b; do
  schedule=$SCHEDULE_A extra=""
  [[ $side == b ]] && schedule=$SCHEDULE_B extra=$B_FLAGS
  # shellcheck disable=SC2086
  "$SLUICE" plan "${SCEN[@]}" --cluster "cpu:$NPROC" --iterations "$ITERS" --method dynapipe \
    --schedule "$schedule" $extra --show 0 --out "$OUT/plans/$side.json" >"$OUT/plan-$side.log"
  list=""
  for ((k = 0; k < ITERS; k++)); do list+="$OUT/plans/$side-$k.json "; done
  PLANS[$side]=$list
done

for ((r = 0; r < REPEATS; r++)); do
  port=$((PORT + 2 * r))
  for side in a b; do
    port=$((port + 1))
    # shellcheck disable=SC2086
    MASTER_PORT=$port $NICE "$SLUICE" train --nproc "$NPROC" "${SCEN[@]}" \
      --threads 1 --plan ${PLANS[$side]} --trace-dir "$OUT/$side$r" >"$OUT/$side$r.log" 2>&1 ||
      { cat "$OUT/$side$r.log" >&2; exit 1; }
  done
  # shellcheck disable=SC2086
  "$SLUICE" replay "$OUT/a$r" --plan ${PLANS[a]} --what-if-plan ${PLANS[b]} --json "$OUT/a$r.json" \
    >"$OUT/a$r.replay.txt"
  # shellcheck disable=SC2086
  "$SLUICE" replay "$OUT/b$r" --plan ${PLANS[b]} --what-if-plan ${PLANS[a]} --json "$OUT/b$r.json" \
    >"$OUT/b$r.replay.txt"
done

"$PY" - "$OUT" "$REPEATS" "$MODEL $PARALLEL" "$SCHEDULE_A" "$SCHEDULE_B $B_FLAGS" "$TOL" <<'PY'
import glob, json, statistics, sys
out, repeats, what, sa, sb, tol = sys.argv[1], int(sys.argv[2]), sys.argv[3], *sys.argv[4:]
def its(path, *key):
    node = json.load(open(path))
    for k in key:
        node = node[k]
    return {i["iteration"]: i for i in node["iterations"]}
rows = {}
for r in range(repeats):
    am = its(f"{out}/a{r}.json", "per_iteration")
    bp = its(f"{out}/a{r}.json", "what_if", "per_iteration")
    bm = its(f"{out}/b{r}.json", "per_iteration")
    ap = its(f"{out}/b{r}.json", "what_if", "per_iteration")
    for it in sorted(set(am) & set(bm)):
        rows.setdefault(it, []).append((am[it]["measured_ms"], bp[it]["replayed_ms"],
                                        bm[it]["measured_ms"], ap[it]["replayed_ms"]))
print(f"{what}: A = {sa}, B = {sb} (the same batches), {repeats} alternating runs of each; "
      "medians over the runs")
print("  iteration  A measured ms  B predicted from A  B measured ms   error  "
      "A predicted from B   error")
sums, eb, ea = [0, 0, 0, 0], [], []
for it, vals in sorted(rows.items()):
    med = [statistics.median(v[k] for v in vals) for k in range(4)]
    e1 = 100 * (med[1] / med[2] - 1)
    e2 = 100 * (med[3] / med[0] - 1)
    print(f"  {it:>9}  {med[0]:>13.1f}  {med[1]:>18.1f}  {med[2]:>13.1f}  {e1:>+5.1f}%  "
          f"{med[3]:>18.1f}  {e2:>+5.1f}%" + ("  (warm-up, not in the means)" if it == 0 else ""))
    if it == 0:
        continue
    eb.append(abs(e1))
    ea.append(abs(e2))
    for k in range(4):
        sums[k] += med[k]
n = len(eb)
err_b = 100 * (sums[1] / sums[2] - 1)
err_a = 100 * (sums[3] / sums[0] - 1)
print(f"  mean over iterations 1..: A measured {sums[0] / n:.1f} ms, B predicted {sums[1] / n:.1f}"
      f" ms, B measured {sums[2] / n:.1f} ms: B's mean iteration error {err_b:+.1f}% (per "
      f"iteration mean |error| {statistics.mean(eb):.1f}%, worst {max(eb):.1f}%)")
print(f"  the other way: A predicted from B {sums[3] / n:.1f} ms vs A measured {sums[0] / n:.1f} "
      f"ms: {err_a:+.1f}% (per iteration mean |error| {statistics.mean(ea):.1f}%, worst "
      f"{max(ea):.1f}%)")
print(f"  B / A measured {sums[2] / sums[0]:.3f}, predicted from A {sums[1] / sums[0]:.3f}, "
      f"from B {sums[2] / sums[3]:.3f}")
# Per-run errors (no medians): how much one pair of runs can say.
per_run = []
for r in range(repeats):
    am = its(f"{out}/a{r}.json", "per_iteration")
    bp = its(f"{out}/a{r}.json", "what_if", "per_iteration")
    bm = its(f"{out}/b{r}.json", "per_iteration")
    k = [i for i in am if i >= 1 and i in bm]
    per_run.append(100 * (sum(bp[i]["replayed_ms"] for i in k) /
                          sum(bm[i]["measured_ms"] for i in k) - 1))
print("  B's mean iteration error per run (one pair, no medians): " +
      ", ".join(f"{e:+.1f}%" for e in per_run))
pricing = json.load(open(f"{out}/a0.json"))["what_if"]["pricing"]
print("  B priced from A's trace (run 0): " + ", ".join(f"{k} {v}" for k, v in pricing.items()))
def compute_ms(d):
    s = 0
    for f in glob.glob(f"{d}/trace-rank-*.json"):
        for e in json.load(open(f))["traceEvents"]:
            if (e.get("ph") == "X" and e["tid"] == 0 and e["args"]["iteration"] >= 1 and
                    e["args"]["op"] in ("forward", "backward", "backward-input", "backward-weight")):
                s += e["dur"] / 1e3
    return s
print("  compute (forward/backward own time, iterations 1..) of B / A per run: " +
      ", ".join(f"{compute_ms(f'{out}/b{r}') / compute_ms(f'{out}/a{r}'):.3f}"
                for r in range(repeats)))
if tol and max(abs(err_b), abs(err_a)) > float(tol):
    print(f"whatif_plan_order: mean iteration error above TOL={tol}%")
    sys.exit(1)
PY
