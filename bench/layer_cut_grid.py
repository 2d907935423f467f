#!/usr/bin/python3
"""The balanced layer cut on the DynaPipe grid of bench/scenarios/ (docs/benchmarks.md, "Uneven
layer cuts").

For every dynapipe-*.json scenario (model, cluster, data, tokens per batch, max sequence length,
memory limit) and schedule, plans ITERATIONS global batches with `sluice plan` under a pipeline
of PP stages (dp = devices / pp, ZeRO-1, DynaPipe's batching, as bench/optimizer_scenarios.py
plans them), once with the even cut and once with --layer-cut balanced, simulates every planned
batch (`sluice simulate --collectives closed-form`, the gradient reduction included), and prints
per row: the batches planned (out of memory counted), the mean simulated iteration of each, the
gain, the cut chosen and the time the cut search took; then the samples each scenario clipped or
dropped. A row where the two plan a different number of batches
says so and is left out of the gain's median (its means cover other batches). Prints a Markdown
table and the medians.

Usage: bench/layer_cut_grid.py [--sluice build/sluice] [--iterations 3] [--pp 4]
           [--schedules 1f1b,zb-h1] [--only SUBSTRING]
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

SUMMARY = re.compile(r"summary over (\d+) global batches \((\d+) planned, (\d+) out of memory\)")
MEAN = re.compile(r"mean makespan ([\d.]+) ms")
CUT = re.compile(r"layer cut: (\S+) .*?; (\d+) cuts estimated, (\d+) simulated, in (\d+) ms")


LOST = {}  # per scenario: the planner's line on clipped and dropped samples


def simulate(a, paths):
    """Mean simulated iteration (ms) of the plan files."""
    times = []
    for path in paths:
        out = path + ".sim.json"
        p = subprocess.run([a.sluice, "simulate", path, "--collectives", "closed-form", "--json",
                            out], capture_output=True, text=True)
        if p.returncode != 0:
            return None
        times.append(json.load(open(out))["iteration_time_ns"] / 1e6)
    return sum(times) / len(times) if times else None


def plan(a, sc, dp, schedule, cut, tmp):
    folder = os.path.join(tmp, f"{sc['name']}-{schedule}-{cut}")
    os.makedirs(folder, exist_ok=True)
    cmd = [a.sluice, "plan", "--model", sc["model"], "--cluster", sc["cluster"], "--parallel",
           f"dp={dp},pp={a.pp},zero=1", "--data", sc["data"], "--tokens-per-batch",
           str(sc["tokens_per_batch"]), "--max-seqlen", str(sc["max_seqlen"]), "--memory-limit",
           str(sc["memory_limit_mb"]), "--iterations", str(a.iterations), "--schedule", schedule,
           "--show", "0", "--layer-cut", cut, "--out", os.path.join(folder, "plan.json")]
    p = subprocess.run(cmd, capture_output=True, text=True)
    s = SUMMARY.search(p.stdout)
    m = MEAN.search(p.stdout)
    c = CUT.search(p.stdout)
    lost = re.search(r"^lost:\s*(.*)$", p.stdout, re.M)
    if lost:
        LOST[sc["name"].removeprefix("dynapipe-")] = lost.group(1)
    if s is None:
        err = (p.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": err}
    plans = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".json"))
    return {"batches": int(s.group(1)), "planned": int(s.group(2)), "oom": int(s.group(3)),
            "mean": simulate(a, plans) if m else None,
            "cut": c.group(1) if c else "even",
            "scored": f"{c.group(2)} / {c.group(3)}" if c else "-",
            "search_ms": int(c.group(4)) if c else 0}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", default="build/sluice")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--schedules", default="1f1b,zb-h1")
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    print("| scenario | schedule | batches planned (even / balanced) | even: simulated ms | "
          "balanced: simulated ms | "
          "shorter | cut | cuts estimated / simulated | search ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    gains, changed, rows, skipped, searches = [], 0, 0, 0, []
    tmp = tempfile.mkdtemp(prefix="sluice-layer-cut-")
    for path in sorted(glob.glob(os.path.join(here, "scenarios", "dynapipe-*.json"))):
        sc = json.load(open(path))
        if a.only not in sc["name"]:
            continue
        dp = int(sc["cluster"].split(":")[1]) // a.pp
        name = sc["name"].removeprefix("dynapipe-")
        for schedule in a.schedules.split(","):
            rows += 1
            even = plan(a, sc, dp, schedule, "even", tmp)
            bal = plan(a, sc, dp, schedule, "balanced", tmp)
            if "error" in even or "error" in bal:
                print(f"| {name} | {schedule} | failed: {even.get('error') or bal.get('error')} "
                      "| | | | | | |")
                skipped += 1
                continue
            planned = f"{even['planned']}/{even['batches']} / {bal['planned']}/{bal['batches']}"
            if even["mean"] is None or bal["mean"] is None or even["planned"] != bal["planned"]:
                print(f"| {name} | {schedule} | {planned} | {even['mean'] or '-'} | "
                      f"{bal['mean'] or '-'} | - (different batches) | {bal['cut']} | "
                      f"{bal['scored']} | {bal['search_ms']} |")
                skipped += 1
                continue
            gain = 100.0 * (even["mean"] - bal["mean"]) / even["mean"]
            gains.append(gain)
            searches.append(bal["search_ms"])
            changed += bal["cut"] != "even"
            print(f"| {name} | {schedule} | {planned} | {even['mean']:,.1f} | {bal['mean']:,.1f} | "
                  f"{gain:.2f}% | {bal['cut']} | {bal['scored']} | {bal['search_ms']} |")
            sys.stdout.flush()
    if gains:
        print(f"\n{rows} rows, {len(gains)} compared ({skipped} not: see the table); cut changed "
              f"on {changed}; median gain {statistics.median(gains):.2f}%, max "
              f"{max(gains):.2f}%, min {min(gains):.2f}%; median search {statistics.median(searches)}"
              f" ms, max {max(searches)} ms")
    if LOST:
        print("\nData lost before planning (the same for both cuts):")
        for name, line in LOST.items():
            print(f"- {name}: {line}")


if __name__ == "__main__":
    main()
