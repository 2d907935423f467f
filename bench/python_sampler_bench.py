#!/usr/bin/python3
"""Speed of sluice's Python planning path (docs/benchmarks.md, "Python: sampler speed").

Global batches of 65,536 tokens of data/lengths/mixture-4task.jsonl (input + target tokens,
clipped to 2048; the sampler's seed-0 shuffle), planned as bench/plan_bench.cc plans them:
gpt-6.7b on a100-40g x 16 with the profiled tables, dp 2, pp 8, ZeRO-1, 36,000 MB, dynapipe,
1f1b. Every figure is a median over the batches (after one warm-up batch).

1. plans/s. `cpp`: the C++ planner's own wall time (PlanResult.planning_time, measured inside
   Planner::Plan). `binding`: the wall time of `Planner.plan(lengths, ids=...)` from Python
   (lists in, the plan object out). `sampler`: PlanningBatchSampler's whole per-batch work (plan,
   this replica's micro-batches as index lists, equalize). Overheads are relative to `cpp`.
2. Planning ahead. A loop "trains" each micro-batch for --step-ms of torch work (a matmul loop on
   one thread, which releases the GIL as real kernels do) over --batches global batches, three
   ways: plans made beforehand (no planning in the loop: the baseline), prefetch=0 (planned in
   the loop's thread), prefetch=2 (planned ahead by the background thread). Prints the time the
   loop waited for plans and its wall time against the baseline.

Usage: PYTHONPATH=build/python /usr/bin/python3 bench/python_sampler_bench.py [--batches 24]
       [--step-ms 5] [--repeats 3] [--skip-ahead]
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

import sluice
from sluice.torch import PlanningBatchSampler

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLANNER = dict(model="gpt-6.7b", cluster="a100-40g:16",
               parallel={"dp": 2, "pp": 8, "zero": 1, "memory_limit_mb": 36000},
               method="dynapipe", schedule="1f1b", max_seqlen=2048, cost="auto")


def lengths():
    with open(os.path.join(ROOT, "data", "lengths", "mixture-4task.jsonl")) as f:
        return [min(2048, r["input_len"] + r.get("target_len", 0)) for r in map(json.loads, f)]


def median_ms(xs):
    return statistics.median(xs) * 1e3


def plans_per_second(planner, sampler, batches):
    """Paired per batch: each wall time against the C++ time of the same call's plan."""
    cpp, binding, whole, b_ratio, w_ratio = [], [], [], [], []
    for k, batch in enumerate(batches):
        ls = [sampler.lengths[i] for i in batch]
        t0 = time.perf_counter()
        plan = planner.plan(ls, ids=batch)
        dt = time.perf_counter() - t0
        assert plan.ok, plan.infeasible_reason
        t1 = time.perf_counter()
        entries = sampler._plan_global_batch(0, k, batch)
        dw = time.perf_counter() - t1
        if k == 0 or len(entries) != 1:
            continue  # warm-up; a batch split to fit memory is not one plan
        c, cw = plan.planning_time_ms / 1e3, entries[0][2].planning_time_ms / 1e3
        cpp.append(c)
        binding.append(dt)
        whole.append(dw)
        b_ratio.append(dt / c)
        w_ratio.append(dw / cw)
    c, b, w = median_ms(cpp), median_ms(binding), median_ms(whole)
    print(f"plans/s over {len(cpp)} batches of 65,536 tokens (medians; overhead: median of the "
          f"per-call ratio to that call's C++ time)")
    print(f"  cpp      {c:7.3f} ms/plan  {1e3 / c:7.1f} plans/s")
    print(f"  binding  {b:7.3f} ms/plan  {1e3 / b:7.1f} plans/s  overhead "
          f"{100 * (statistics.median(b_ratio) - 1):+.1f}%")
    print(f"  sampler  {w:7.3f} ms/plan  {1e3 / w:7.1f} plans/s  overhead "
          f"{100 * (statistics.median(w_ratio) - 1):+.1f}%")


def busy(ms, a):
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        torch.mm(a, a)


def loop(sampler, step_ms, a):
    t0 = time.perf_counter()
    n = 0
    for _ in sampler:
        busy(step_ms, a)
        n += 1
    return time.perf_counter() - t0, n


def planning_ahead(ls, batches, step_ms, repeats):
    torch.set_num_threads(1)
    a = torch.randn(64, 64)
    modes = (("planned beforehand", 2), ("prefetch=0", 0), ("prefetch=2", 2))
    runs = {m: [] for m, _ in modes}
    for _ in range(repeats):  # modes alternate so that load changes hit all of them
        for mode, prefetch in modes:
            s = PlanningBatchSampler(ls, sluice.Planner(**PLANNER), 65536, rank=0, world_size=2,
                                     prefetch=prefetch)
            s.global_batches = (lambda b: (lambda epoch=None: b))(batches)
            if mode == "planned beforehand":
                len(s)  # plans the epoch now; iteration reads the cache
            s.stats["wait_seconds"] = 0.0
            wall, n = loop(s, step_ms, a)
            runs[mode].append((wall, s.stats["wait_seconds"], n))
    base = statistics.median(w for w, _, _ in runs["planned beforehand"])
    n = runs["planned beforehand"][0][2]
    print(f"planning ahead: {len(batches)} global batches, {n} micro-batches of replica 0, "
          f"{step_ms} ms of torch work each; medians of {repeats} runs")
    for mode, _ in modes:
        wall = statistics.median(w for w, _, _ in runs[mode])
        wait = statistics.median(x for _, x, _ in runs[mode])
        print(f"  {mode:19s} loop {wall:6.2f} s ({100 * (wall / base - 1):+5.1f}%)  waited "
              f"{wait:6.3f} s for plans")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", type=int, default=24)
    p.add_argument("--step-ms", type=float, default=5.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-ahead", action="store_true")
    args = p.parse_args()
    ls = lengths()
    planner = sluice.Planner(**PLANNER)
    sampler = PlanningBatchSampler(ls, planner, 65536, rank=0, world_size=2, prefetch=0)
    batches = sampler.global_batches()[:args.batches + 1]
    print(f"{planner!r}, cost {planner.cost_model[:60]}")
    plans_per_second(planner, sampler, batches)
    if not args.skip_ahead:
        planning_ahead(ls, batches[1:], args.step_ms, args.repeats)


if __name__ == "__main__":
    sys.exit(main())
