#!/usr/bin/env bash
# Planning latency of `sluice-dynamic` per global batch, two sluice binaries side by side.
#
#   bench/dynamic_latency.sh BEFORE AFTER [REPEATS] [ITERATIONS] [SCENARIO] [OUT]
#
# Runs `compare --methods sluice-dynamic` (cp 1,2,4,8) with BEFORE and AFTER alternately REPEATS
# times (default 3; which goes first alternates too, so use an even count) on SCENARIO (default
# the GPT-6.7B 8-GPU 65,536-token scenario) over ITERATIONS global batches (default 12), and prints per run the mean planning time per batch
# (every strategy's plan and the choice; the strategies are planned one after another on one
# core) and the mean over the batches the search did not score, then the median per binary and
# the ratio, and the same from the fastest of the repeats of each batch (the least disturbed
# measurement on a shared machine). It also checks that every run's results, timings left out,
# are identical (same strategies, choices, plans and simulated figures); exit 1 when not. Run it
# under the build lock on a shared machine: it is a timing.
set -euo pipefail
before="$1"
after="$2"
repeats="${3:-3}"
iterations="${4:-12}"
here="$(cd "$(dirname "$0")" && pwd)"
scenario="${5:-$here/scenarios/dynapipe-gpt-08gpu-len2048-tok065k.json}"
out="${6:-$(mktemp -d)}"
mkdir -p "$out"
for r in $(seq 1 "$repeats"); do
  # A process that follows another on the same scenario planned faster on this VM (about
  # 0.7-0.8x, docs/benchmarks.md "sluice-dynamic's screen"): the order alternates between repeats.
  order=(before after)
  [ $((r % 2)) -eq 0 ] && order=(after before)
  for which in "${order[@]}"; do
    bin="$before"
    [ "$which" = after ] && bin="$after"
    "$bin" compare --scenario "$scenario" --methods sluice-dynamic --iterations "$iterations" \
      --cp 1,2,4,8 --no-html --out "$out/$which-$r" > "$out/$which-$r.txt"
  done
done
/usr/bin/python3 - "$out" "$repeats" <<'PY'
import json, statistics, sys
out, repeats = sys.argv[1], int(sys.argv[2])

def strip(x):
    if isinstance(x, dict):
        return {k: strip(v) for k, v in x.items()
                if 'seconds' not in k and 'planning' not in k}
    if isinstance(x, list):
        return [strip(v) for v in x]
    return x

means = {'before': [], 'after': []}
per_batch = {'before': [], 'after': []}  # [run] planning ms per batch
unscored = {'before': [], 'after': []}
reference = None
same = True
for r in range(1, repeats + 1):
    for which in ('before', 'after'):
        d = json.load(open(f'{out}/{which}-{r}/results.json'))
        run = next(x for x in d['own'] if x['method'] == 'sluice-dynamic')
        ms = [b['planning_ms'] for b in run['batches']]
        rest = [b['planning_ms'] for b in run['batches'] if b['batch'] not in d['score_batches']]
        means[which].append(sum(ms) / len(ms))
        per_batch[which].append(ms)
        unscored[which].append(sum(rest) / max(1, len(rest)))
        print(f'{which} run {r}: {means[which][-1]:.2f} ms/batch over {len(ms)} batches '
              f'({unscored[which][-1]:.2f} over the {len(rest)} unscored), per batch: '
              + ' '.join(f'{x:.1f}' for x in ms))
        s = strip(d)
        if reference is None:
            reference = s
        elif s != reference:
            same = False
            print(f'{which} run {r}: results differ from before run 1')
for which in ('before', 'after'):
    print(f'{which}: median {statistics.median(means[which]):.2f} ms/batch '
          f'(unscored batches {statistics.median(unscored[which]):.2f})')
print(f'after / before: {statistics.median(means["after"]) / statistics.median(means["before"]):.3f}')
# A shared machine slows down in stretches that can cover whole runs; the fastest of the repeats
# of each batch is the least disturbed measurement of it.
least = {w: [min(x) for x in zip(*per_batch[w])] for w in per_batch}
for which in ('before', 'after'):
    print(f'{which}: mean over the batches of the fastest of {repeats} runs '
          f'{sum(least[which]) / len(least[which]):.2f} ms/batch')
print(f'after / before (fastest per batch): {sum(least["after"]) / sum(least["before"]):.3f}')
print('results identical' if same else 'RESULTS DIFFER')
sys.exit(0 if same else 1)
PY
