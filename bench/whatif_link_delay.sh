#!/usr/bin/env bash
# whatif_link_delay.sh: a what-if made real (issue #14): `sluice replay --what-if link+=Dms`
# predicts, from the trace of a run A, the iteration times of the same plans run with every
# point-to-point send delayed D ms; `sluice train --link-delay-ms D` then runs it (B) and the
# prediction is compared with what B measured.
#
#   1. `sluice plan` plans ITERS global batches once (--out plan-K.json), so that A and B execute
#      the same plans (the same micro-batches, orders and transfers).
#   2. REPEATS times, alternating: train A (--link-delay-ms 0, --trace-dir), then B
#      (--link-delay-ms D, --trace-dir); `sluice replay A --what-if link+=Dms --json` (the
#      prediction) and `sluice replay B --json` (B's measured iteration times, first op to last
#      op over the ranks, as replay measures A's).
#   3. Prints per iteration the medians over the repeats of A measured, B predicted (the
#      per-iteration replay: each iteration from its measured start; and the whole-run replay,
#      iterations chained) and B measured, with the prediction's error; then the mean over the
#      iterations (iteration 0, warm-up, is left out of the means); then what the prediction
#      cannot know: B's compute time against A's per run, and how late the link-delay thread
#      handed the sends over.
#
# Usage, from the repository root (timings: run it under the build lock on a shared machine):
#   flock /tmp/sluice-build.lock bench/whatif_link_delay.sh
# Knobs (environment, defaults below): SLUICE OUT MODEL PARALLEL NPROC SCHEDULE ITERS REPEATS
# DELAY_MS TOKENS MAXLEN SAMPLES PORT TOL (the largest mean |error| accepted, %; exit status 1
# above it; default: no check).
set -euo pipefail

SLUICE=${SLUICE:-build/sluice}
OUT=${OUT:-/tmp/sluice-whatif}
MODEL=${MODEL:-gpt-tiny}
PARALLEL=${PARALLEL:-pp=2}
NPROC=${NPROC:-2}
SCHEDULE=${SCHEDULE:-1f1b}
ITERS=${ITERS:-12}
REPEATS=${REPEATS:-3}
DELAY_MS=${DELAY_MS:-20}
TOKENS=${TOKENS:-1024}
MAXLEN=${MAXLEN:-128}
SAMPLES=${SAMPLES:-400}
PORT=${PORT:-29780}
TOL=${TOL:-}
PY=${PY:-/usr/bin/python3}

if [[ ! -x "$SLUICE" ]]; then
  echo "whatif_link_delay: SLUICE=$SLUICE is not an executable; build sluice with libtorch" >&2
  exit 2
fi
train_help="$("$SLUICE" train --help 2>/dev/null || true)"
if ! grep -q -- '--link-delay-ms' <<<"$train_help"; then
  echo "whatif_link_delay: $SLUICE has no 'train --link-delay-ms' (a build without libtorch?)" >&2
  exit 2
fi

rm -rf "$OUT"
mkdir -p "$OUT/plans"
SCEN=(--model "$MODEL" --parallel "$PARALLEL" --data mixture-4task --samples "$SAMPLES"
      --tokens-per-batch "$TOKENS" --max-seqlen "$MAXLEN" --seed 0)
"$SLUICE" plan "${SCEN[@]}" --cluster "cpu:$NPROC" --iterations "$ITERS" --method dynapipe \
  --schedule "$SCHEDULE" --show 0 --out "$OUT/plans/plan.json" >"$OUT/plan.log"
PLANS=()
for ((k = 0; k < ITERS; k++)); do
  [[ -f "$OUT/plans/plan-$k.json" ]] || { echo "whatif_link_delay: no plan-$k.json" >&2; exit 1; }
  PLANS+=("$OUT/plans/plan-$k.json")
done

for ((r = 0; r < REPEATS; r++)); do
  for side in a b; do
    delay=0
    [[ $side == b ]] && delay=$DELAY_MS
    MASTER_PORT=$((PORT + r)) "$SLUICE" train --nproc "$NPROC" "${SCEN[@]}" --threads 1 \
      --plan "${PLANS[@]}" --link-delay-ms "$delay" --trace-dir "$OUT/$side$r" \
      >"$OUT/$side$r.log" 2>&1 || { cat "$OUT/$side$r.log" >&2; exit 1; }
  done
  "$SLUICE" replay "$OUT/a$r" --what-if "link+=${DELAY_MS}ms" --json "$OUT/a$r.json" \
    >"$OUT/a$r.replay.txt"
  "$SLUICE" replay "$OUT/b$r" --json "$OUT/b$r.json" >"$OUT/b$r.replay.txt"
done

"$PY" - "$OUT" "$REPEATS" "$DELAY_MS" "$MODEL $PARALLEL $SCHEDULE" "${TOL}" <<'EOF'
import json, statistics, sys
out, repeats, delay, what, tol = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
def times(path, key):
    j = json.load(open(path))
    node = j
    for k in key:
        node = node[k]
    return {i["iteration"]: i for i in node["iterations"]}
rows = {}
for r in range(repeats):
    a = times(f"{out}/a{r}.json", ["per_iteration"])
    p = times(f"{out}/a{r}.json", ["what_if", "per_iteration"])
    w = times(f"{out}/a{r}.json", ["what_if", "whole_run"])
    b = times(f"{out}/b{r}.json", ["per_iteration"])
    for it in sorted(set(a) & set(b)):
        rows.setdefault(it, []).append((a[it]["measured_ms"], p[it]["replayed_ms"],
                                        w[it]["replayed_ms"], b[it]["measured_ms"]))
print(f"{what}: link delay {delay} ms, {repeats} alternating runs of A (no delay) and B "
      f"(--link-delay-ms {delay}); medians over the runs")
print("  iteration  A measured ms  B predicted ms  whole-run ms  B measured ms   error  "
      "whole-run error")
errs, werrs, sums = [], [], [0, 0, 0, 0]
for it, vals in sorted(rows.items()):
    med = [statistics.median(v[k] for v in vals) for k in range(4)]
    e = 100 * (med[1] - med[3]) / med[3]
    we = 100 * (med[2] - med[3]) / med[3]
    print(f"  {it:>9}  {med[0]:>13.1f}  {med[1]:>14.1f}  {med[2]:>12.1f}  {med[3]:>13.1f}  "
          f"{e:>+5.1f}%  {we:>+14.1f}%" + ("  (warm-up, not in the means)" if it == 0 else ""))
    if it == 0:
        continue
    errs.append(abs(e))
    werrs.append(abs(we))
    for k in range(4):
        sums[k] += med[k]
n = len(errs)
print(f"  mean over iterations 1..: A {sums[0] / n:.1f} ms, B predicted {sums[1] / n:.1f} ms "
      f"(whole-run {sums[2] / n:.1f}), B measured {sums[3] / n:.1f} ms: mean iteration error "
      f"{100 * (sums[1] - sums[3]) / sums[3]:+.1f}% (whole-run "
      f"{100 * (sums[2] - sums[3]) / sums[3]:+.1f}%); per iteration mean |error| "
      f"{statistics.mean(errs):.1f}%, worst {max(errs):.1f}% (whole-run {statistics.mean(werrs):.1f}%, "
      f"worst {max(werrs):.1f}%)")
print(f"  the delay's measured effect: {100 * (sums[3] / sums[0] - 1):+.1f}%, predicted "
      f"{100 * (sums[1] / sums[0] - 1):+.1f}%")
# What the prediction cannot know: how fast B computed (the same ops; on a shared machine the
# ranks' compute speed changes from run to run, and a rank that waits more leaves the cores to
# the other) and how late the link-delay thread woke (B's handed_ts against each send's post).
import glob
def compute_ms(trace_dir):
    s = 0
    for f in glob.glob(f"{trace_dir}/trace-rank-*.json"):
        for e in json.load(open(f))["traceEvents"]:
            if (e.get("ph") == "X" and e["tid"] == 0 and e["args"]["iteration"] >= 1 and
                    e["args"]["op"] in ("forward", "backward", "backward-input", "backward-weight")):
                s += e["dur"] / 1e3
    return s
ratios = [compute_ms(f"{out}/b{r}") / compute_ms(f"{out}/a{r}") for r in range(repeats)]
late = []
for f in glob.glob(f"{out}/b*/trace-rank-*.json"):
    for e in json.load(open(f))["traceEvents"]:
        if e.get("ph") == "X" and "handed_ts" in e.get("args", {}):
            late.append((e["args"]["handed_ts"] - e["ts"]) / 1e3 - float(delay))
late.sort()
print("  compute (forward/backward own time, iterations 1..) of B / A per run: " +
      ", ".join(f"{x:.3f}" for x in ratios))
print(f"  sends handed to c10d later than the delay by: median {statistics.median(late):.2f} ms, "
      f"p90 {late[int(0.9 * len(late))]:.2f} ms, max {late[-1]:.2f} ms ({len(late)} sends)")
if tol and statistics.mean(errs) > float(tol):
    print(f"whatif_link_delay: mean |error| {statistics.mean(errs):.1f}% is above TOL={tol}%")
    sys.exit(1)
EOF
