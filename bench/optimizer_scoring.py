#!/usr/bin/python3
"""Scoring speed of the plan optimizer, two builds side by side (docs/benchmarks.md, "Partial
re-checking of candidates").

For every dynapipe-*.json scenario of bench/scenarios/ (or those whose name holds --only), and
each schedule, plans the first global batch under a pipeline of PP stages (dp = devices / pp,
ZeRO-1, DynaPipe's batching) with --sluice, writes it (`sluice plan --out`), then runs
`sluice optimize` on it with each build (--baseline, then --sluice) for each seed, bounded by
--steps simulations and not by the clock (so that both builds walk the same search), with --data
(recompute moves priced). Per run it reads the optimizer's line: candidates tried (simulated +
refused by the plan check) and its wall time. Prints per (scenario, schedule) the time per
candidate of each build and the ratio, and whether the two builds wrote byte-identical plans with
the same simulated times for every seed (the exactness check); then the medians.

Usage: bench/optimizer_scoring.py --baseline OLD/sluice [--sluice build/sluice] [--pp 4]
           [--schedules 1f1b,zb-h1] [--seeds 0,1,2] [--steps 200] [--only SUBSTRING]
Exit status 1 when any run's plans or times differ between the builds.
"""
import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

LINE = re.compile(r"simulated iteration (\S+ \S+) -> (\S+ \S+) \(([-\d.]+)% shorter.*\n"
                  r"search \S+ seed \d+: (\d+) simulations, (\d+) candidates refused by the plan "
                  r"check, (\d+) accepted, \d+ passes kept, ([\d.]+) ms")


def optimize(binary, plan, out, seed, steps, data):
    p = subprocess.run([binary, "optimize", plan, "--out", out, "--seed", str(seed), "--steps",
                        str(steps), "--budget-ms", "1000000", "--data", data],
                       capture_output=True, text=True)
    m = LINE.search(p.stdout)
    if p.returncode != 0 or m is None:
        raise SystemExit(f"optimize failed ({binary}): {(p.stdout + p.stderr).strip()[-400:]}")
    before, after, gain, sims, refused, accepted, ms = m.groups()
    with open(out, "rb") as f:
        body = f.read()
    return {"times": (before, after), "gain": float(gain), "tried": int(sims) + int(refused),
            "ms": float(ms), "plan": body}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", default="build/sluice")
    ap.add_argument("--baseline", required=True)
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--schedules", default="1f1b,zb-h1")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="sluice-scoring-")
    print("| scenario | schedule | candidates tried (per seed) | baseline us/candidate | "
          "new us/candidate | speedup | identical plans and times |")
    print("|---|---|---|---|---|---|---|")
    ratios, mismatches, rows = [], 0, 0
    for path in sorted(glob.glob(os.path.join(here, "scenarios", "dynapipe-*.json"))):
        sc = json.load(open(path))
        if a.only not in sc["name"]:
            continue
        dp = int(sc["cluster"].split(":")[1]) // a.pp
        for schedule in a.schedules.split(","):
            plan = os.path.join(tmp, "plan.json")
            p = subprocess.run([a.sluice, "plan", "--model", sc["model"], "--cluster",
                                sc["cluster"], "--parallel", f"dp={dp},pp={a.pp},zero=1", "--data",
                                sc["data"], "--tokens-per-batch", str(sc["tokens_per_batch"]),
                                "--max-seqlen", str(sc["max_seqlen"]), "--memory-limit",
                                str(sc["memory_limit_mb"]), "--iterations", "1", "--method",
                                "dynapipe", "--schedule", schedule, "--out", plan],
                               capture_output=True, text=True)
            name = sc["name"].removeprefix("dynapipe-")
            if p.returncode != 0 or not os.path.exists(plan):
                print(f"| {name} | {schedule} | - | - | - | - | not planned |")
                continue
            tried, old_ms, new_ms, same = [], 0.0, 0.0, True
            for seed in a.seeds.split(","):
                old = optimize(a.baseline, plan, os.path.join(tmp, "old.json"), seed, a.steps,
                               sc["data"])
                new = optimize(a.sluice, plan, os.path.join(tmp, "new.json"), seed, a.steps,
                               sc["data"])
                same = same and old["plan"] == new["plan"] and old["times"] == new["times"] and \
                    old["tried"] == new["tried"]
                tried.append(new["tried"])
                old_ms += old["ms"]
                new_ms += new["ms"]
            n = sum(tried)
            ratio = old_ms / new_ms if new_ms > 0 else float("nan")
            ratios.append(ratio)
            rows += 1
            mismatches += not same
            print(f"| {name} | {schedule} | {' / '.join(map(str, tried))} | "
                  f"{1e3 * old_ms / n:.0f} | {1e3 * new_ms / n:.0f} | {ratio:.2f}x | "
                  f"{'yes' if same else 'NO'} |")
            sys.stdout.flush()
    if ratios:
        print()
        print(f"{rows} rows; median speedup {statistics.median(ratios):.2f}x (min "
              f"{min(ratios):.2f}x, max {max(ratios):.2f}x); rows whose plans or times differ: "
              f"{mismatches}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
