#!/usr/bin/python3
"""PipelineExecutor's own cost at pp = 1 (docs/benchmarks.md, "Python: the pipeline example and
the sampler").

The GPT of examples/python/train_pipeline.py as one stage, in one Gloo process (world size 1),
on the same plans (dp 1, pp 1) two ways, alternating per step: `executor.run(plan, batches)`
(every instruction interpreted, wrapped in record_function, the optimizer stepped at STEP) and a
plain loop over the same collated micro-batches (forward, loss, backward, AdamW step). Both
models start from the same weights; the bench checks that they end at the same loss. Prints the
median step time of each and their ratio.

Usage: PYTHONPATH=build/python /usr/bin/python3 bench/python_executor_bench.py [--steps 16]
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples", "python"))
import sluice  # noqa: E402
import train_pipeline as example  # noqa: E402
from sluice.torch import PipelineExecutor, PlanCollator, PlanningBatchSampler  # noqa: E402


class Whole(torch.nn.Module):
    """The example's GPT as one stage: module(input_ids, batch)."""

    def __init__(self, gpt):
        super().__init__()
        self.gpt = gpt

    def forward(self, input_ids, batch):
        return self.gpt(batch)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=16)
    a = p.parse_args()
    args = example.parse_args(["--quiet"])
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        planner = sluice.Planner(model=example.model_spec(args),
                                 cluster=example.cpu_cluster(args), parallel="dp=1,pp=1",
                                 max_seqlen=args.max_seqlen, seed=args.seed)
        lengths = [len(x["input_ids"]) for x in args.dataset]
        sampler = PlanningBatchSampler(lengths, planner, args.tokens_per_batch, rank=0,
                                       world_size=1, seed=args.seed)
        collate = PlanCollator(args.dataset, planner.max_seqlen)
        stage, plain = Whole(example.build_model(args)), example.build_model(args)
        opt = torch.optim.AdamW(stage.parameters(), lr=args.lr)
        plain_opt = torch.optim.AdamW(plain.parameters(), lr=args.lr)
        ex = PipelineExecutor(stage, example.loss_fn, opt, parallel=planner.parallel)
        t_ex, t_plain, instr, k = [], [], [], 0
        losses = (0.0, 0.0)
        while k < a.steps + 1:
            sampler.set_epoch(k)
            for planned in sampler.plans():
                if k == a.steps + 1:
                    break
                batches = [collate(mb) for mb in planned.micro_batches]
                scale = 1.0 / planned.num_label_tokens()
                t0 = time.perf_counter()
                r = ex.run(planned.plan, batches, loss_scale=scale)
                t1 = time.perf_counter()
                total = 0.0
                for b in batches:
                    loss = example.loss_fn(plain(b), b) * scale
                    loss.backward()
                    total += loss.item()
                plain_opt.step()
                plain_opt.zero_grad(set_to_none=True)
                t2 = time.perf_counter()
                if k > 0:  # the first step warms up
                    t_ex.append(t1 - t0)
                    t_plain.append(t2 - t1)
                    instr.append(r["instructions"])
                losses = (r["loss"], total)
                k += 1
        dist.destroy_process_group()
    e, q = statistics.median(t_ex), statistics.median(t_plain)
    print(f"{a.steps} steps of {args.tokens_per_batch} tokens, median {statistics.median(instr)} "
          f"instructions per step; last loss executor {losses[0]:.6f}, plain {losses[1]:.6f}")
    print(f"  executor  {e * 1e3:8.1f} ms/step")
    print(f"  plain     {q * 1e3:8.1f} ms/step")
    print(f"  executor / plain {e / q:.3f} (median), {sum(t_ex) / sum(t_plain):.3f} (total)")


if __name__ == "__main__":
    sys.exit(main())
