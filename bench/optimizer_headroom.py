#!/usr/bin/python3
"""How much shorter the plan optimizer could make a plan, and how much of that it gets
(docs/benchmarks.md, "The optimizer, fourth round").

For each scenario and schedule (pp 4, dp = devices / 4, ZeRO-1, DynaPipe's batching, the first
global batch; the plan of `sluice plan --out`, as `optimizer_scenarios.py` plans them), prints:
  - unoptimized: the lowered plan's simulated iteration (closed-form collectives);
  - 50 ms: `sluice optimize --data --budget-ms 50` (the default search);
  - large: the same with no practical bound (1,000,000 order estimates, --steps 2000, 10^6 ms);
  - exhaustive: every micro-batch order of each replica (--order-exhaustive-up-to 10, only when
    every replica has <= 10 micro-batches), then the other moves as "large";
  - bound: a lower bound on any plan of the same micro-batches at the recompute levels of the
    "large" plan: per pipeline rank, its compute time + the shortest fill (forwards of one
    micro-batch on the ranks before it) + the shortest drain (1F1B: its backwards there; ZB-H1:
    none, a rank may end on W ops), max over ranks and replicas; gradient reduction and optimizer
    step not counted;
  - bound with the reduction: the larger of the bound and, per rank, a lower bound on the end of
    its last backward (its fill and compute; with whole backwards also the next rank's last
    backward's end plus its own shortest backward) + its tail: its gradient collectives
    (uncontended, as the plan prices them) and optimizer step. It holds for the plans this
    script makes (dense models, vpp 1, ZeRO-1) at the "large" plan's buckets and recompute: the
    lowering posts a rank's reductions after its last backward and the bucketing pass keeps them
    there (a finer bucketing would add 2(n-1) latencies per bucket, a coarser one save them:
    about 0.1 ms per bucket here). Not for interleaved plans (a later chunk's reduction follows
    that chunk's last backward) nor MoE plans (passes/grad_overlap.h moves buckets under the
    last backward).
and the gains in percent of the unoptimized time.

Usage: bench/optimizer_headroom.py [--sluice build/sluice] [--only SUBSTRING,...]
           [--schedules 1f1b,zb-h1]
"""
import argparse
import glob
import json
import os
import re
import subprocess
import tempfile

TIME = re.compile(r"simulated iteration .*? -> .*? \(([-\d.]+)% shorter")


TAIL_OPS = ("all-reduce-grad", "reduce-scatter-grad", "all-gather-params", "optimizer-step")


def bound(plan, with_reduction=False):
    """The compute bound of the docstring, in ms; with_reduction: the bound with the reduction."""
    best = 0.0
    split = any(i["op"] == "backward-input" for r in plan["ranks"] for i in r["instructions"])
    by_replica = {}
    for rank in plan["ranks"]:
        by_replica.setdefault(rank["dp"], {})[rank["pp"]] = rank["instructions"]
    for progs in by_replica.values():
        fwd, back = {}, {}  # [(mb, pp rank)] ns
        work, tail = {}, {}
        for r, ins in progs.items():
            work[r] = 0
            tail[r] = sum(i.get("ns", 0) for i in ins if i["op"] in TAIL_OPS)
            for i in ins:
                if i["op"] in ("forward", "backward", "backward-input", "backward-weight"):
                    work[r] += i.get("ns", 0)
                if i["op"] == "forward":
                    fwd[(i["mb"], r)] = fwd.get((i["mb"], r), 0) + i.get("ns", 0)
                if i["op"] in ("backward", "backward-input"):
                    back[(i["mb"], r)] = back.get((i["mb"], r), 0) + i.get("ns", 0)
        mbs = sorted({k[0] for k in fwd})
        fill = {r: min(sum(fwd.get((m, s), 0) for s in range(r)) for m in mbs) for r in progs}
        for r in progs:
            # Zero-bubble plans: a rank may end on W ops while the ranks before it run the last
            # I's, so only the 1F1B drain (whole backwards) is counted.
            drain = 0 if split else min(sum(back.get((m, s), 0) for s in range(r)) for m in mbs)
            best = max(best, (fill[r] + work[r] + drain) / 1e6)
        if not with_reduction:
            continue
        # A rank's collectives and step start after its last backward. That ends no earlier
        # than its own fill and work, and (whole backwards) than the next rank's last backward
        # plus the shortest backward here: each micro-batch's B on rank r follows its B on r + 1.
        ends = {}
        for r in sorted(progs, reverse=True):
            ends[r] = fill[r] + work[r]
            if not split and r + 1 in ends:
                ends[r] = max(ends[r], ends[r + 1] + min(back.get((m, r), 0) for m in mbs))
            best = max(best, (ends[r] + tail[r]) / 1e6)
    return best


def simulate(sluice, plan):
    p = subprocess.run([sluice, "simulate", plan, "--collectives", "closed-form"],
                       capture_output=True, text=True)
    m = re.search(r"iteration ([\d.]+) ms", p.stdout)
    return float(m.group(1))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", default="build/sluice")
    ap.add_argument("--only", default="gpt-08gpu-len2048-tok016k")
    ap.add_argument("--schedules", default="1f1b,zb-h1")
    ap.add_argument("--batch", type=int, default=0,
                    help="which global batch of the scenario (0: the first)")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="sluice-headroom-")
    print("| scenario | schedule | micro-batches per replica | unoptimized ms | 50 ms: gain (ms/batch) "
          "| large: gain (time) | exhaustive orders: gain (time) | bound: gain (bound) "
          "| bound with the reduction: gain (bound) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for path in sorted(glob.glob(os.path.join(here, "scenarios", "dynapipe-*.json"))):
        sc = json.load(open(path))
        if not any(o in sc["name"] for o in a.only.split(",")):
            continue
        dp = int(sc["cluster"].split(":")[1]) // 4
        for schedule in a.schedules.split(","):
            plan = os.path.join(tmp, "plan.json")
            many = a.batch > 0  # sluice plan --out then writes PATH-<batch>.json per batch
            subprocess.run([a.sluice, "plan", "--model", sc["model"], "--cluster", sc["cluster"],
                            "--parallel", f"dp={dp},pp=4,zero=1", "--data", sc["data"],
                            "--tokens-per-batch", str(sc["tokens_per_batch"]), "--max-seqlen",
                            str(sc["max_seqlen"]), "--memory-limit", str(sc["memory_limit_mb"]),
                            "--iterations", str(a.batch + 1), "--method", "dynapipe",
                            "--schedule", schedule, "--out", plan],
                           capture_output=True, text=True, check=True)
            if many:
                plan = os.path.join(tmp, f"plan-{a.batch}.json")
            p = json.load(open(plan))
            sizes = [len(r["micro_batches"]) for r in p["replicas"]]
            before = simulate(a.sluice, plan)
            base = [a.sluice, "optimize", plan, "--data", sc["data"], "--max-seqlen",
                    str(sc["max_seqlen"])]
            cells = []
            runs = [("50", ["--budget-ms", "50"]),
                    ("large", ["--budget-ms", "1000000", "--steps", "2000",
                               "--order-estimates", "1000000"])]
            if max(sizes) <= 10:
                runs.append(("exhaustive", ["--budget-ms", "1000000", "--steps", "2000",
                                            "--order-estimates", "1000000",
                                            "--order-exhaustive-up-to", "10"]))
            large_plan = None
            for name, extra in runs:
                out = os.path.join(tmp, f"{name}.json")
                o = subprocess.run(base + ["--out", out] + extra, capture_output=True, text=True)
                g = TIME.search(o.stdout)
                w = re.search(r"accepted, \d+ passes kept, ([\d.]+) ms", o.stdout)
                if g is None:
                    cells.append("failed")
                    continue
                wall = float(w.group(1))
                if name == "50":
                    cells.append(f"{float(g.group(1)):.2f}% ({wall:.1f} ms)")
                else:
                    cells.append(f"{float(g.group(1)):.2f}% ({wall / 1000:.1f} s)")
                if name == "large":
                    large_plan = out
            if len(runs) == 2:
                cells.append("- (more than 10 micro-batches)")
            for with_reduction in (False, True):
                b = (bound(json.load(open(large_plan)), with_reduction) if large_plan
                     else float("nan"))
                cells.append(f"{100 * (before - b) / before:.2f}% ({b:,.1f} ms)")
            print(f"| {sc['name'].removeprefix('dynapipe-')} | {schedule} | "
                  f"{'/'.join(map(str, sizes))} | {before:,.1f} | " + " | ".join(cells) + " |",
                  flush=True)


if __name__ == "__main__":
    main()
