#!/usr/bin/env bash
# host_allocator_ab.sh: `sluice train --host-allocator cache` (the default) against `system`
# (glibc's own malloc policy), side by side. PAIRS times, the two policies each run
# bench/calibration_heldout.sh (the same 17 gpt-tiny pp 2 plans trained REPEATS times, each run
# calibrated on its iterations 1-8 and predicting 9-16), the order alternating between pairs so
# that neither policy always runs first. Printed per policy, over every run of every pair:
#   - issue #14's held-out error (prediction vs the same run), mean, median and runs within 5%;
#   - the within-run scatter of measured / simulated time per iteration (the machine's and the
#     allocator's jitter; the plans are the same in every run);
#   - throughput (real tokens/s of the whole run) and peak resident memory over ranks;
#   - pairs where cache's mean held-out error is the lower one.
# Usage, from the repository root, nothing else running: bench/host_allocator_ab.sh
# Knobs (environment): SLUICE OUT PAIRS (6) REPEATS (4) SETTINGS: the two settings compared, each
# ALLOCATOR:CPU_BIND (train --host-allocator and --cpu-bind), the first the baseline; default
# "system:none cache:none" (the policies above); "cache:none cache:cores" compares core binding.
set -euo pipefail

SLUICE=${SLUICE:-build/sluice}
OUT=${OUT:-/tmp/sluice-host-allocator-ab}
PAIRS=${PAIRS:-6}
REPEATS=${REPEATS:-4}
read -r -a settings <<< "${SETTINGS:-system:none cache:none}"
if [ "${#settings[@]}" -ne 2 ]; then
  echo "SETTINGS: '${SETTINGS:-}' must name two settings ALLOCATOR:CPU_BIND" >&2
  exit 2
fi
PYTHON=${PYTHON:-/usr/bin/python3}
here=$(dirname "$0")
rm -rf "$OUT" && mkdir -p "$OUT"
for ((k = 0; k < PAIRS; k++)); do
  order=("${settings[0]}" "${settings[1]}")
  ((k % 2)) && order=("${settings[1]}" "${settings[0]}")
  for policy in "${order[@]}"; do
    SLUICE=$SLUICE OUT="$OUT/$policy-$k" REPEATS=$REPEATS ALLOCATOR=${policy%%:*} \
      CPU_BIND=${policy##*:} "$here/calibration_heldout.sh" > "$OUT/$policy-$k.txt"
    echo "pair $k: $policy done" >&2
  done
done
"$PYTHON" - "$OUT" "$PAIRS" "$REPEATS" "${settings[@]}" <<'PY'
import json, re, statistics as st, sys
out, pairs, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
base, new = sys.argv[4], sys.argv[5]
def runs(policy, k):
    text = open(f"{out}/{policy}-{k}.txt").read()
    single = re.search(r"single run \(prediction vs the same run\): (.*?); mean", text).group(1)
    errors = [float(x.rstrip("%")) for x in single.split(", ")]
    scatter = re.search(r"within-run scatter of measured / simulated, per run: (.*)", text).group(1)
    scatters = [float(x.rstrip("%")) for x in scatter.split(", ")]
    tps, rss = [], []
    for r in range(repeats):
        log = open(f"{out}/{policy}-{k}/d{r}.log").read()
        tps.append(float(re.search(r"^trained .* = (\d+) tokens/s", log, re.M).group(1)))
        peaks = [json.loads(line).get("peak_rss_bytes", 0)
                 for line in open(f"{out}/{policy}-{k}/d{r}.jsonl") if line.strip()]
        rss.append(max(peaks) / 1e6)
    return errors, scatters, tps, rss
data = {p: [runs(p, k) for k in range(pairs)] for p in (base, new)}
print(f"gpt-tiny pp 2 on 2 local ranks, {pairs} pairs x {repeats} runs of 17 iterations per "
      f"setting (--host-allocator:--cpu-bind), order alternating")
print(f"{'setting':<12} {'held-out error: mean':>21} {'median':>7} {'runs <= 5%':>11} "
      f"{'within-run scatter':>19} {'tokens/s median':>16} {'peak RSS MB median':>19}")
for p, rows in data.items():
    errors = [e for r in rows for e in r[0]]
    scatters = [s for r in rows for s in r[1]]
    tps = [x for r in rows for x in r[2]]
    rss = [x for r in rows for x in r[3]]
    print(f"{p:<12} {st.mean(errors):>20.1f}% {st.median(errors):>6.1f}% "
          f"{sum(e <= 5 for e in errors):>5} of {len(errors):<3} {st.median(scatters):>18.1f}% "
          f"{st.median(tps):>16.0f} {st.median(rss):>19.0f}")
wins = sum(st.mean(data[new][k][0]) < st.mean(data[base][k][0]) for k in range(pairs))
ratio = [st.median(data[new][k][2]) / st.median(data[base][k][2]) for k in range(pairs)]
print(f"pairs where {new}'s mean held-out error is lower: {wins} of {pairs}; "
      f"throughput {new} / {base} per pair: " + ", ".join(f"{x:.3f}" for x in ratio) +
      f"; median {st.median(ratio):.3f}")
PY
