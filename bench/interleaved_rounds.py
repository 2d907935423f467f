#!/usr/bin/python3
"""Interleaved 1F1B in padded vs flexible rounds on the DynaPipe grid of bench/scenarios/
(docs/benchmarks.md, "Flexible interleaved rounds").

For every dynapipe-*.json scenario (model, cluster, data, tokens per batch, max sequence length,
memory limit), plans ITERATIONS global batches with `sluice plan --schedule interleaved` under
pp = PP and vpp = VPP (dp = devices / pp, ZeRO-1), once with --interleaved-rounds padded (Megatron's
rounds of pp) and once with --interleaved-rounds auto (flexible rounds per replica where they fit
the memory budget and are estimated shorter), writes every plan (`--out`) and simulates it
(`sluice simulate --collectives closed-form`). Prints a Markdown table, one row per (scenario,
pp, method): the replicas whose micro-batch count is not a multiple of pp, how many of them run
flexible rounds, the mean simulated iteration of both, the gain, and the largest simulated peak
memory of any rank (the plan's memory rule) of both. One process, one core.

Usage: bench/interleaved_rounds.py [--sluice build/sluice] [--iterations 3] [--pp 4,8]
           [--vpp 2] [--methods dynapipe] [--only SUBSTRING] [--no-search]
"""
import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

ITER = re.compile(r"iteration ([\d.]+) ms")
PEAK = re.compile(r"memory: peak ([\d,]+) MB")


def plan_and_simulate(a, sc, pp, method, rounds, tmp):
    """Returns {batch tag: (iteration ms, replicas, uneven replicas, flexible replicas, peak MB)}
    for the batches that planned (out-of-memory batches write no plan)."""
    devices = int(sc["cluster"].split(":")[1])
    out = os.path.join(tmp, f"{rounds}.json")
    cmd = [a.sluice, "plan", "--model", sc["model"], "--cluster", sc["cluster"], "--parallel",
           f"dp={devices // pp},pp={pp},vpp={a.vpp},zero=1", "--data", sc["data"],
           "--tokens-per-batch", str(sc["tokens_per_batch"]), "--max-seqlen",
           str(sc["max_seqlen"]), "--memory-limit", str(sc["memory_limit_mb"]), "--iterations",
           str(a.iterations), "--method", method, "--schedule", "interleaved",
           "--interleaved-rounds", rounds, "--out", out]
    if a.no_search:
        cmd.append("--no-search")
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        why = (p.stdout + p.stderr).strip().splitlines()
        raise RuntimeError(why[-1] if why else "no output")
    rows = {}
    for path in sorted(glob.glob(os.path.join(tmp, f"{rounds}*.json"))):
        plan = json.load(open(path))
        s = subprocess.run([a.sluice, "simulate", path, "--collectives", "closed-form"],
                           capture_output=True, text=True)
        m = ITER.search(s.stdout)
        if m is None:
            raise RuntimeError(f"simulate {path}: {(s.stdout + s.stderr).strip()[-200:]}")
        reps = plan["replicas"]
        uneven = sum(1 for r in reps if len(r["micro_batches"]) % pp != 0)
        flex = sum(1 for r in reps if r["schedule"] == "interleaved-flex")
        peak = PEAK.search(s.stdout)
        rows[os.path.basename(path)[len(rounds):]] = (
            float(m.group(1)), len(reps), uneven, flex,
            float(peak.group(1).replace(",", "")) if peak else float("nan"))
        os.remove(path)
    return rows


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", default="build/sluice")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--pp", default="4,8")
    ap.add_argument("--vpp", type=int, default=2)
    ap.add_argument("--methods", default="dynapipe")
    ap.add_argument("--only", default="")
    ap.add_argument("--no-search", action="store_true",
                    help="keep the batching order (no micro-batch order search)")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="sluice-rounds-")
    gains = []
    print("| scenario | pp | method | replicas m % pp != 0 | of which flexible | padded ms | "
          "auto ms | shorter | peak MB padded | peak MB auto |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    try:
        for path in sorted(glob.glob(os.path.join(here, "scenarios", "dynapipe-*.json"))):
            sc = json.load(open(path))
            if a.only not in sc["name"]:
                continue
            devices = int(sc["cluster"].split(":")[1])
            name = sc["name"].removeprefix("dynapipe-")
            for pp in (int(x) for x in a.pp.split(",")):
                if devices % pp != 0:
                    continue
                for method in a.methods.split(","):
                    try:
                        pad = plan_and_simulate(a, sc, pp, method, "padded", tmp)
                        auto = plan_and_simulate(a, sc, pp, method, "auto", tmp)
                    except RuntimeError as e:
                        print(f"| {name} | {pp} | {method} | - | - | - | - | - | - | - |"
                              f" <!-- {e} -->")
                        continue
                    both = sorted(set(pad) & set(auto))
                    only = (f" (+{len(set(auto) - set(pad))} planned by auto only)"
                            if set(auto) - set(pad) else "")
                    only += (f" (+{len(set(pad) - set(auto))} planned by padded only)"
                             if set(pad) - set(auto) else "")
                    if not both:
                        print(f"| {name} | {pp} | {method} | - | - | - | - | - | - | - |"
                              f" <!-- no batch planned by both{only} -->")
                        continue
                    p = [pad[k] for k in both]
                    q = [auto[k] for k in both]
                    before = statistics.mean(r[0] for r in p)
                    after = statistics.mean(r[0] for r in q)
                    gain = 100.0 * (before - after) / before
                    gains.append(gain)
                    reps = sum(r[1] for r in q)
                    uneven = sum(r[2] for r in q)
                    flex = sum(r[3] for r in q)
                    print(f"| {name}{only} | {pp} | {method} | {uneven}/{reps} | {flex} | "
                          f"{before:,.1f} | {after:,.1f} | {gain:.2f}% | "
                          f"{max(r[4] for r in p):,.0f} | {max(r[4] for r in q):,.0f} |")
                    sys.stdout.flush()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if gains:
        print()
        print(f"{len(gains)} rows; median gain {statistics.median(gains):.2f}%, mean "
              f"{statistics.mean(gains):.2f}%, max {max(gains):.2f}%, min {min(gains):.2f}%")


if __name__ == "__main__":
    main()
