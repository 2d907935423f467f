#!/usr/bin/python3
"""The plan optimizer on the DynaPipe grid of bench/scenarios/ (docs/benchmarks.md, "Plan passes
and the optimizer").

For every dynapipe-*.json scenario (model, cluster, data, tokens per batch, max sequence length,
memory limit), plans ITERATIONS global batches with `sluice plan` under a pipeline of PP stages
(dp = devices / pp, ZeRO-1) for each schedule and method, with the optimizer on
(--optimize-budget-ms), and reads the plan summary's optimizer line: the mean simulated iteration
of the lowered plans and of the optimized ones, how many plans changed, and the optimizer's mean
and largest wall time per batch. One process, one core. Prints a Markdown table, one row per
(scenario, schedule, method), the medians over the rows and how many rows are >= 5% shorter.

With --searches mcmc,greedy it compares the searches instead: per scenario and schedule it writes
the first batch's plan (`sluice plan --out`, no optimizer) and runs `sluice optimize` on it with
each search and each of --seeds (with --data, so recompute moves are priced), bounded by --steps
simulations (not by the clock), printing the gain and wall time of each.

Usage: bench/optimizer_scenarios.py [--sluice build/sluice] [--iterations 3] [--budget-ms 50]
           [--pp 4] [--schedules 1f1b,zb-h1] [--methods dynapipe] [--only SUBSTRING]
           [--searches mcmc,greedy --seeds 0,1,2 --steps 100] [--layer-cut even|balanced]
           [--order tp-cp-dp-pp|tp-cp-pp-dp]
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
LINE = re.compile(r"optimizer: mean simulated iteration ([\d.]+) ms -> ([\d.]+) ms \(([-\d.]+)% "
                  r"shorter\), (\d+) of (\d+) plans changed, mean optimizer time ([\d.]+) ms "
                  r"\(max ([\d.]+) ms\)")


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
    ap.add_argument("--searches", default="")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--order", default="tp-cp-dp-pp", choices=["tp-cp-dp-pp", "tp-cp-pp-dp"],
                    help="device order of every configuration (docs/formats.md); tp-cp-pp-dp "
                         "is how plans were placed before 2026-12-02")
    ap.add_argument("--layer-cut", default="even", choices=["even", "balanced"],
                    help="the plans' layer cut (sluice plan --layer-cut): the optimizer then "
                    "starts from the balanced cut's lowered plans")
    a = ap.parse_args()
    if a.searches:
        return compare_searches(a, here)
    rows = []
    lost = {}  # per scenario: the planner's line on clipped and dropped samples
    batches = [0, 0]  # global batches asked for, and of them out of memory (not planned)
    print("| scenario | schedule | method | batches planned | unoptimized ms | optimized ms | "
          "shorter | plans changed | optimizer ms/batch: mean (max) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for path in sorted(glob.glob(os.path.join(here, "scenarios", "dynapipe-*.json"))):
        sc = json.load(open(path))
        if a.only not in sc["name"]:
            continue
        devices = int(sc["cluster"].split(":")[1])
        dp = devices // a.pp
        for schedule in a.schedules.split(","):
            for method in a.methods.split(","):
                cmd = [a.sluice, "plan", "--model", sc["model"], "--cluster", sc["cluster"],
                       "--parallel", f"dp={dp},pp={a.pp},zero=1,order={a.order}", "--data", sc["data"],
                       "--tokens-per-batch", str(sc["tokens_per_batch"]), "--max-seqlen",
                       str(sc["max_seqlen"]), "--memory-limit", str(sc["memory_limit_mb"]),
                       "--iterations", str(a.iterations), "--method", method, "--schedule",
                       schedule, "--optimize-budget-ms", str(a.budget_ms),
                       "--layer-cut", a.layer_cut]
                p = subprocess.run(cmd, capture_output=True, text=True)
                m = LINE.search(p.stdout)
                name = sc["name"].removeprefix("dynapipe-")
                lost_line = re.search(r"^lost:\s*(.*)$", p.stdout, re.M)
                if lost_line:
                    lost[name] = lost_line.group(1)
                # Batches the planner could not plan (out of memory) have no plan to optimize:
                # counted here, not left out.
                sm = SUMMARY.search(p.stdout)
                planned = (f"{sm.group(2)} of {sm.group(1)}" +
                           (f" ({sm.group(3)} out of memory)" if sm.group(3) != "0" else "")
                           if sm else "-")
                if sm:
                    batches[0] += int(sm.group(1))
                    batches[1] += int(sm.group(3))
                if m is None:
                    why = (p.stdout + p.stderr).strip().splitlines()
                    print(f"| {name} | {schedule} | {method} | {planned} | - | - | - | - | - |"
                          f" <!-- {why[-1] if why else 'no output'} -->")
                    continue
                before, after, gain, changed, total, ms, ms_max = m.groups()
                rows.append((float(before), float(after), float(gain), float(ms), float(ms_max)))
                print(f"| {name} | {schedule} | {method} | {planned} | {float(before):,.1f} | "
                      f"{float(after):,.1f} | {float(gain):.2f}% | {changed}/{total} | "
                      f"{float(ms):.1f} ({float(ms_max):.1f}) |")
                sys.stdout.flush()
    if lost:
        print()
        print("Lost data (the whole data set, as `sluice plan` counts it):")
        for name, line in lost.items():
            print(f"- {name}: {line}")
    if rows:
        print()
        print(f"{len(rows)} rows; median unoptimized {statistics.median(r[0] for r in rows):,.1f} "
              f"ms, median optimized {statistics.median(r[1] for r in rows):,.1f} ms, median "
              f"gain {statistics.median(r[2] for r in rows):.2f}% (max "
              f"{max(r[2] for r in rows):.2f}%), median optimizer time "
              f"{statistics.median(r[3] for r in rows):.1f} ms/batch (slowest batch "
              f"{max(r[4] for r in rows):.1f} ms); {sum(r[2] >= 5 for r in rows)} of {len(rows)} "
              f"rows >= 5%; {batches[1]} of {batches[0]} global batches out "
              f"of memory (not planned, so not optimized; the means are over the planned ones)")


OPT = re.compile(r"simulated iteration .* \(([-\d.]+)% shorter.*\n.*?(\d+) simulations.*?([\d.]+) ms")


def compare_searches(a, here):
    searches = a.searches.split(",")
    seeds = a.seeds.split(",")
    print("| scenario | schedule | " + " | ".join(f"{s} gain % (seeds {a.seeds})" for s in searches)
          + " | " + " | ".join(f"{s} ms" for s in searches) + " |")
    print("|---|---|" + "---|" * (2 * len(searches)))
    gains = {s: [] for s in searches}
    tmp = tempfile.mkdtemp(prefix="sluice-opt-")
    for path in sorted(glob.glob(os.path.join(here, "scenarios", "dynapipe-*.json"))):
        sc = json.load(open(path))
        if a.only not in sc["name"]:
            continue
        dp = int(sc["cluster"].split(":")[1]) // a.pp
        for schedule in a.schedules.split(","):
            plan = os.path.join(tmp, "plan.json")
            p = subprocess.run([a.sluice, "plan", "--model", sc["model"], "--cluster",
                                sc["cluster"], "--parallel", f"dp={dp},pp={a.pp},zero=1,order={a.order}", "--data",
                                sc["data"], "--tokens-per-batch", str(sc["tokens_per_batch"]),
                                "--max-seqlen", str(sc["max_seqlen"]), "--memory-limit",
                                str(sc["memory_limit_mb"]), "--iterations", "1", "--method",
                                a.methods.split(",")[0], "--schedule", schedule, "--out", plan],
                               capture_output=True, text=True)
            if p.returncode != 0 or not os.path.exists(plan):
                continue
            cells, times = [], []
            for search in searches:
                g, t = [], []
                for seed in seeds:
                    o = subprocess.run([a.sluice, "optimize", plan, "--out",
                                        os.path.join(tmp, "out.json"), "--search", search,
                                        "--seed", seed, "--steps", str(a.steps), "--budget-ms",
                                        "1000000", "--data", sc["data"]],
                                       capture_output=True, text=True)
                    m = OPT.search(o.stdout)
                    if m is None:
                        g.append(float("nan"))
                        continue
                    g.append(float(m.group(1)))
                    t.append(float(m.group(3)))
                gains[search] += g
                cells.append(" / ".join(f"{x:.2f}" for x in g))
                times.append(f"{statistics.median(t):.0f}" if t else "-")
            print(f"| {sc['name'].removeprefix('dynapipe-')} | {schedule} | " + " | ".join(cells)
                  + " | " + " | ".join(times) + " |")
            sys.stdout.flush()
            os.remove(plan)
    print()
    for s in searches:
        if gains[s]:
            print(f"{s}: median gain {statistics.median(gains[s]):.2f}% over {len(gains[s])} "
                  f"runs, mean {statistics.mean(gains[s]):.2f}%")


if __name__ == "__main__":
    main()
