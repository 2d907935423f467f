#!/usr/bin/env python3
"""A two-stage pipeline with data-parallel gradient reduction, traced by torch.profiler.

Starts WORLD processes (default 2) on this host with the Gloo backend. Ranks form pipelines of
two stages when WORLD is even (rank 2k: stage 0, rank 2k+1: stage 1; pipelines reduce gradients
over the ranks of the same stage); with WORLD = 1 the one rank runs both stages. Each iteration:
micro-batches go forward (stage 0 sends activations with torch.distributed.send, stage 1
receives them), backward (gradients sent back); with WORLD >= 4 the ranks of a stage all-reduce their
gradients (torch.distributed.all_reduce over a new_group); every rank all-reduces the squared
gradient norm over all ranks (global norm clipping, as pipeline trainers do) and steps SGD. torch.profiler records ITERS
iterations after one warm-up; each rank writes OUT/trace-rank-R.json with export_chrome_trace.

record_function names say what each range is and with whom it talks ("send act mb=1 to=1",
"recv grad mb=1 from=1"), so a reader can match communications that the torch 1.13 CPU trace
shows only as c10d::send / c10d::recv_ / gloo:* events without peer or size.

Usage: /usr/bin/python3 examples/torch_pipeline_trace.py OUT [--world 2] [--iters 4]
       [--microbatches 3] [--hidden 256] [--port 29650]
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile, record_function, schedule


def stage_module(hidden, layers):
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(hidden, hidden), torch.nn.GELU()]
    return torch.nn.Sequential(*mods)


def run(rank, args):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    pipelined = args.world % 2 == 0
    stage = rank % 2 if pipelined else -1
    peer = rank ^ 1 if pipelined else -1
    dp_group = None
    if pipelined and args.world >= 4:
        # Every rank creates every group, in the same order (torch.distributed's rule).
        groups = [dist.new_group(list(range(s, args.world, 2))) for s in (0, 1)]
        dp_group = groups[stage]
    model = stage_module(args.hidden, 4 if stage == 1 else 2)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    shape = (args.batch, args.hidden)

    def iteration(step):
        acts = []
        for mb in range(args.microbatches):
            with record_function(f"forward mb={mb}"):
                if stage == 1:
                    x = torch.empty(shape)
                    with record_function(f"recv act mb={mb} from={peer}"):
                        dist.recv(x, src=peer)
                    x.requires_grad_(True)
                else:
                    x = torch.randn(shape, generator=torch.Generator().manual_seed(step * 100 + mb))
                y = model(x)
                if stage == 0:
                    with record_function(f"send act mb={mb} to={peer}"):
                        dist.send(y.detach(), dst=peer)
                acts.append((x, y))
        for mb in range(args.microbatches):
            x, y = acts[mb]
            with record_function(f"backward mb={mb}"):
                if stage == 0:
                    g = torch.empty(shape)
                    with record_function(f"recv grad mb={mb} from={peer}"):
                        dist.recv(g, src=peer)
                    y.backward(g)
                else:
                    y.pow(2).mean().backward()
                if stage == 1:
                    with record_function(f"send grad mb={mb} to={peer}"):
                        dist.send(x.grad, dst=peer)
        if dp_group is not None:
            with record_function("allreduce grads"):
                flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
                dist.all_reduce(flat, group=dp_group)
                flat /= args.world // 2
        with record_function("allreduce grad norm"):
            # The global gradient norm for clipping, over every rank (both stages).
            sq = torch.stack([p.grad.pow(2).sum() for p in model.parameters()]).sum().reshape(1)
            dist.all_reduce(sq)
            scale = min(1.0, args.clip / (float(sq.sqrt()) + 1e-6))
            for p in model.parameters():
                p.grad.mul_(scale)
        with record_function("optimizer step"):
            opt.step()
            opt.zero_grad()

    prof_schedule = schedule(wait=0, warmup=1, active=args.iters, repeat=1)
    with profile(activities=[ProfilerActivity.CPU], schedule=prof_schedule) as prof:
        for step in range(1 + args.iters):
            iteration(step)
            prof.step()
    dist.barrier()
    prof.export_chrome_trace(os.path.join(args.out, f"trace-rank-{rank}.json"))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--iters", type=int, default=4)
    p.add_argument("--microbatches", type=int, default=3)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--port", type=int, default=29650)
    args = p.parse_args()
    if args.world < 1 or args.iters < 1 or args.microbatches < 1:
        sys.exit("torch_pipeline_trace.py: --world, --iters and --microbatches must be >= 1")
    os.makedirs(args.out, exist_ok=True)
    mp.spawn(run, args=(args,), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
