#!/usr/bin/env bash
# sluice-dynamic's screen (compare/compare_dynamic.h) against planning every strategy, side by
# side on one binary.
#
#   bench/dynamic_screen.sh [SLUICE] [ITERATIONS] [MARGIN] [REPEATS] [SCENARIO...]
#
# For each scenario (default: the GPT-6.7B 8-GPU 64K-token scenario, where the homogeneous
# strategies win, and the LLaMA-7B 16-GPU 16K one, where a heterogeneous mix wins) it runs
# `compare --methods sluice,sluice-dynamic --cp 1,2,4,8` over ITERATIONS global batches (default
# 12) with `--dynamic-screen off` and `--dynamic-screen MARGIN` (default 0.15) alternately,
# REPEATS times (default 1; the order alternates between repeats, so use an even count), and
# prints per scenario: the planning time per batch of each (mean and max over the batches of the
# fastest repeat per batch, and the ratio), the same ratio for `sluice`'s own planning in the
# same runs as a control (the flag does not touch it: its distance from 1 is the noise), the
# heterogeneous plans the screen skipped, the batches each ran (failures count), the batches on which the
# screened run chose another strategy than the unscreened one and what that cost in simulated
# iteration time, and tokens/s of both. The scenario's lost data (clipped or dropped samples) is
# printed from results.json. Exit 1 when a run fails. It is a timing: run it on a quiet machine.
#
# COMPARE=refresh (environment) compares `--dynamic-refresh full` (the baseline, in the "off"
# columns) with `quick` (the "screened" columns), both with the screen at MARGIN: how a mix the
# screen would skip is planned when its refresh is due (compare/compare_dynamic.h).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
sluice="${1:-$here/../build/sluice}"
iterations="${2:-12}"
margin="${3:-0.15}"
repeats="${4:-1}"
shift $(($# < 4 ? $# : 4))
if ! [[ "$margin" =~ ^(0(\.[0-9]+)?|\.[0-9]+)$ ]]; then
  echo "dynamic_screen.sh: MARGIN '$margin' must be a number in [0, 1) (the run it is compared with is 'off')" >&2
  exit 2
fi
if ! [[ "$repeats" =~ ^[1-9][0-9]*$ && "$iterations" =~ ^[1-9][0-9]*$ ]]; then
  echo "dynamic_screen.sh: ITERATIONS and REPEATS must be integers >= 1" >&2
  exit 2
fi
scenarios=("$@")
if [ ${#scenarios[@]} -eq 0 ]; then
  scenarios=("$here/scenarios/dynapipe-gpt-08gpu-len2048-tok065k.json"
             "$here/scenarios/hydraulis-llama7b-16gpu-len16k.json")
fi
flag=(--dynamic-screen)
values=(off "$margin")
if [ "${COMPARE:-screen}" = refresh ]; then
  flag=(--dynamic-screen "$margin" --dynamic-refresh)
  values=(full quick)
elif [ "${COMPARE:-screen}" != screen ]; then
  echo "dynamic_screen.sh: COMPARE '${COMPARE}' must be screen or refresh" >&2
  exit 2
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
for s in "${scenarios[@]}"; do
  name="$(basename "$s" .json)"
  for r in $(seq 1 "$repeats"); do
    # A run right after another one on the same scenario planned faster on this VM (about 0.8x,
    # with the flag not acting): the order alternates between repeats.
    order=("${values[0]}" "${values[1]}")
    [ $((r % 2)) -eq 0 ] && order=("${values[1]}" "${values[0]}")
    for m in "${order[@]}"; do
      "$sluice" compare --scenario "$s" --methods sluice,sluice-dynamic --iterations "$iterations" \
        --cp 1,2,4,8 --no-html "${flag[@]}" "$m" --out "$out/$name-$m-$r" \
        > "$out/$name-$m-$r.txt" 2>&1 || { cat "$out/$name-$m-$r.txt"; exit 1; }
    done
  done
done
/usr/bin/python3 - "$out" "${values[0]}" "${values[1]}" "$repeats" "${scenarios[@]}" <<'PY'
import json, os, sys
out, base, margin, repeats, scenarios = (sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]),
                                         sys.argv[5:])

def run_of(path):
    d = json.load(open(path))
    return d, next(x for x in d['own'] if x['method'] == 'sluice-dynamic')

print(f'"off" columns: {base}, "screened" columns: {margin}; planning ms per batch: the fastest of {repeats} repeat(s) of each batch')
print(f'{"scenario":44} {"plan ms off":>11} {"(max)":>7} {"screened":>9} {"(max)":>7} '
      f'{"ratio":>6} {"skipped":>9} {"ran off/on":>10} {"choice differs":>14} '
      f'{"iter cost":>9} {"tok/s off":>10} {"tok/s on":>10} {"on/off":>7} {"control":>7}')
for s in scenarios:
    name = os.path.basename(s)[:-5]
    runs = {m: [run_of(f'{out}/{name}-{m}-{r}/results.json') for r in range(1, repeats + 1)]
            for m in (base, margin)}
    d, off = runs[base][0]
    _, on = runs[margin][0]
    plan = {m: [min(x) for x in zip(*[[b['planning_ms'] for b in run['batches']]
                                      for _, run in runs[m]])] for m in runs}
    mean = {m: sum(v) / len(v) for m, v in plan.items()}
    # The control: `sluice`'s own planning in the same runs, which the flag does not touch.
    ctl = {m: [min(x) for x in zip(*[[b['planning_ms'] for b in
                                      next(y for y in dd['own'] if y['method'] == 'sluice')['batches']]
                                     for dd, _ in runs[m]])] for m in runs}
    control = sum(ctl[margin]) / max(sum(ctl[base]), 1e-9)
    hetero = sum(1 for st in on['strategies'] if st.startswith('heterogeneous'))
    skipped = sum(len(b.get('screened', [])) for b in on['batches'])
    possible = hetero * len(on['batches'])
    differs = [(a, b) for a, b in zip(off['batches'], on['batches'])
               if a.get('strategy') != b.get('strategy') or a['outcome'] != b['outcome']]
    extra = sum(b['iteration_ms'] - a['iteration_ms'] for a, b in differs
                if a['outcome'] == 'ok' and b['outcome'] == 'ok')
    total = sum(a['iteration_ms'] for a in off['batches'] if a['outcome'] == 'ok')
    loss = d['data_loss']
    ran = f'{off["ok_batches"]}/{on["ok_batches"]}'
    changed = f'{len(differs)}/{len(off["batches"])}'
    print(f'{name:44} {mean[base]:11.2f} {max(plan[base]):7.1f} {mean[margin]:9.2f} '
          f'{max(plan[margin]):7.1f} {mean[margin] / mean[base]:6.3f} '
          f'{f"{skipped}/{possible}":>9} {ran:>10} {changed:>14} '
          f'{100 * extra / max(total, 1e-9):+8.2f}% {off["tokens_per_s"]:10,.0f} '
          f'{on["tokens_per_s"]:10,.0f} {on["tokens_per_s"] / max(off["tokens_per_s"], 1e-9):7.4f} '
          f'{control:7.3f}')
    print(f'{"":44} lost: {loss["clipped_samples"]} samples clipped ({loss["clipped_tokens"]:,} '
          f'tokens), {loss["dropped_long_samples"] + loss["dropped_budget_samples"]} dropped, of '
          f'{loss["samples"]:,} samples ({loss["tokens"]:,} tokens)')
PY
