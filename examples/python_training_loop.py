#!/usr/bin/env python3
"""A PyTorch user's own training loop fed by sluice's planner (docs/python.md).

Each process is one data-parallel replica. PlanningBatchSampler cuts every epoch into global
batches of --tokens-per-batch tokens, has sluice plan them (method and schedule as given), and
gives each replica its micro-batches; PackedCollator packs each micro-batch into one row with
cu_seqlens and per-document position_ids; the model (a tiny causal transformer written here in
plain torch.nn; sluice plans the batches as for --model, GPT-6.7B by default) attends within
documents only; gradients are all-reduced over Gloo after every
micro-batch. Before training, rank 0 prints what sluice predicts for the first global batch on
the planned cluster (the simulator) and the replica's pipelining CSV.

    PYTHONPATH=build/python /usr/bin/python3 examples/python_training_loop.py --nproc 2

Runs on CPU (torch 1.13 from Debian: Gloo). It trains a toy model on random tokens: the loss
falls because the data has a simple rule (each token is the previous one + 1, mod the vocab).
"""

import argparse
import os
import random
import socket
import functools
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import sluice
from sluice.torch import PackedCollator, PlanningBatchSampler

print = functools.partial(print, flush=True)  # ranks print whole lines


class TinyCausalLM(torch.nn.Module):
    def __init__(self, vocab, hidden=64, heads=4, layers=2, max_len=512):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.pos = torch.nn.Embedding(max_len, hidden)
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(hidden, heads, 4 * hidden, dropout=0.0,
                                             batch_first=True, norm_first=True)
            for _ in range(layers))
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, input_ids, position_ids, cu_seqlens):
        # One packed row: attention stays inside each document (block-diagonal causal mask).
        n = input_ids.shape[1]
        doc = torch.repeat_interleave(torch.arange(len(cu_seqlens) - 1),
                                      (cu_seqlens[1:] - cu_seqlens[:-1]).long())
        i = torch.arange(n)
        blocked = (doc[:, None] != doc[None, :]) | (i[None, :] > i[:, None])  # True = masked
        x = self.embed(input_ids) + self.pos(position_ids)
        for block in self.blocks:
            x = block(x, src_mask=blocked)
        return self.head(x)


def make_data(n, vocab, max_len, seed):
    rng = random.Random(seed)
    data = []
    for _ in range(n):
        length = min(max_len, int(rng.lognormvariate(4.0, 0.9)) + 2)
        start = rng.randrange(vocab)
        data.append({"input_ids": [(start + t) % vocab for t in range(length)]})
    return data


def run(rank, world_size, port, args):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    data = make_data(args.samples, args.vocab, args.max_seqlen, seed=0)
    lengths = [len(d["input_ids"]) for d in data]
    # sluice plans as if the job were --model on --cluster with one pipeline of --pp stages per
    # process; this loop is the data-parallel part of it, training its own toy model.
    planner = sluice.Planner(model=args.model, cluster=args.cluster,
                             parallel=f"dp={world_size},pp={args.pp},zero=1", method=args.method,
                             schedule="1f1b", max_seqlen=args.max_seqlen)
    sampler = PlanningBatchSampler(lengths, planner, args.tokens_per_batch, seed=args.seed)
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler,
                                         collate_fn=PackedCollator(max_seqlen=args.max_seqlen))
    if rank == 0:
        first = sampler.global_batches()[0]
        plan = planner.plan([min(lengths[i], args.max_seqlen) for i in first], ids=first)
        sim = sluice.simulate(plan)
        print(f"{planner}: first global batch of {len(first)} samples -> "
              f"{sum(len(plan.micro_batches(d)) for d in range(plan.dp))} micro-batches; "
              f"simulated on {planner.cluster.name}: {sim.iteration_time_ms:.2f} ms, "
              f"{sim.tokens_per_second:,.0f} tokens/s, peak {max(sim.peak_memory_bytes) / 1e9:.2f} "
              f"GB, bubble {100 * sim.bubble_fraction:.1f}%")
        print("replica 0 pipelining CSV:\n" + plan.to_csv(replica=0))
        print(f"{len(sampler)} micro-batches per replica per epoch "
              f"({len(sampler.global_batches())} global batches)")

    torch.manual_seed(0)
    model = TinyCausalLM(args.vocab, max_len=args.max_seqlen)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    t0 = time.perf_counter()
    tokens = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total, count = 0.0, 0
        for batch in loader:
            opt.zero_grad()
            if batch["num_samples"]:
                logits = model(batch["input_ids"], batch["position_ids"], batch["cu_seqlens"])
                loss = torch.nn.functional.cross_entropy(
                    logits[0, :-1], batch["labels"][0, 1:], ignore_index=-100)
                loss.backward()
                total += loss.item()
                count += 1
                tokens += batch["num_tokens"]
            for p in model.parameters():  # data parallelism by hand: average the gradients
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad)
                p.grad /= world_size
            opt.step()
        print(f"rank {rank} epoch {epoch}: {count} micro-batches, mean loss "
              f"{total / max(count, 1):.3f}")
    elapsed = time.perf_counter() - t0
    s = sampler.stats
    print(f"rank {rank}: {tokens} tokens in {elapsed:.1f} s ({tokens / elapsed:,.0f} tokens/s); "
          f"planned {s['batches_planned']} global batches in {s['planning_seconds']:.3f} s, "
          f"loop waited {s['wait_seconds']:.3f} s for plans")
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, default=2, help="data-parallel processes (Gloo)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--samples", type=int, default=400)
    ap.add_argument("--vocab", type=int, default=97)
    ap.add_argument("--max-seqlen", type=int, default=256)
    ap.add_argument("--tokens-per-batch", type=int, default=4096)
    ap.add_argument("--model", default="gpt-6.7b", help="the model sluice plans for")
    ap.add_argument("--pp", type=int, default=4, help="pipeline stages sluice plans per replica")
    ap.add_argument("--cluster", default=None, help="default: a100-40g:(NPROC x PP)")
    ap.add_argument("--method", default="dynapipe")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    args.cluster = args.cluster or f"a100-40g:{args.nproc * args.pp}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(args.nproc, port, args), nprocs=args.nproc, join=True)


if __name__ == "__main__":
    main()
