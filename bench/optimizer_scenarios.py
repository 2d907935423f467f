#!/usr/bin/python3
"""The plan optimizer on the DynaPipe grid of bench/scenarios/ (docs/benchmarks.md, "Plan passes
and the optimizer").

For every dynapipe-*.json scenario (model, cluster, data, tokens per batch, max sequence length,
memory limit), plans ITERATIONS global batches with `sluice plan` under a pipeline of PP stages
(dp = devices / pp, ZeRO-1) for each schedule and method, with the optimizer on
(--optimize-budget-ms), and reads the plan summary's optimizer line: the mean simulated iteration
of the lowered plans and of the optimized ones, how many plans changed, and the optimizer's mean
wall time per batch. One process, one core. Prints a Markdown table, one row per (scenario,
schedule, method), and the medians over the rows.

Usage: bench/optimizer_scenarios.py [--sluice build/sluice] [--iterations 3] [--budget-ms 50]
           [--pp 4] [--schedules 1f1b,zb-h1] [--methods dynapipe] [--only SUBSTRING]
"""
import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys

LINE = re.compile(r"optimizer: mean simulated iteration ([\d.]+) ms -> ([\d.]+) ms \(([-\d.]+)% "
                  r"shorter\), (\d+) of (\d+) plans changed, mean optimizer time ([\d.]+) ms")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", default="build/sluice")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--budget-ms", type=float, default=50)
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--schedules", default="1f1b,zb-h1")
    ap.add_argument("--methods", default="dynapipe")
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    rows = []
    print("| scenario | schedule | method | unoptimized ms | optimized ms | shorter | plans "
          "changed | optimizer ms/batch |")
    print("|---|---|---|---|---|---|---|---|")
    for path in sorted(glob.glob(os.path.join(here, "scenarios", "dynapipe-*.json"))):
        sc = json.load(open(path))
        if a.only not in sc["name"]:
            continue
        devices = int(sc["cluster"].split(":")[1])
        dp = devices // a.pp
        for schedule in a.schedules.split(","):
            for method in a.methods.split(","):
                cmd = [a.sluice, "plan", "--model", sc["model"], "--cluster", sc["cluster"],
                       "--parallel", f"dp={dp},pp={a.pp},zero=1", "--data", sc["data"],
                       "--tokens-per-batch", str(sc["tokens_per_batch"]), "--max-seqlen",
                       str(sc["max_seqlen"]), "--memory-limit", str(sc["memory_limit_mb"]),
                       "--iterations", str(a.iterations), "--method", method, "--schedule",
                       schedule, "--optimize-budget-ms", str(a.budget_ms)]
                p = subprocess.run(cmd, capture_output=True, text=True)
                m = LINE.search(p.stdout)
                name = sc["name"].removeprefix("dynapipe-")
                if m is None:
                    why = (p.stdout + p.stderr).strip().splitlines()
                    print(f"| {name} | {schedule} | {method} | - | - | - | - | - |"
                          f" <!-- {why[-1] if why else 'no output'} -->")
                    continue
                before, after, gain, changed, total, ms = m.groups()
                rows.append((float(before), float(after), float(gain), float(ms)))
                print(f"| {name} | {schedule} | {method} | {float(before):,.1f} | "
                      f"{float(after):,.1f} | {float(gain):.2f}% | {changed}/{total} | "
                      f"{float(ms):.1f} |")
                sys.stdout.flush()
    if rows:
        print()
        print(f"{len(rows)} rows; median unoptimized {statistics.median(r[0] for r in rows):,.1f} "
              f"ms, median optimized {statistics.median(r[1] for r in rows):,.1f} ms, median "
              f"gain {statistics.median(r[2] for r in rows):.2f}% (max "
              f"{max(r[2] for r in rows):.2f}%), median optimizer time "
              f"{statistics.median(r[3] for r in rows):.1f} ms/batch (max "
              f"{max(r[3] for r in rows):.1f})")


if __name__ == "__main__":
    main()
