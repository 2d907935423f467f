#!/usr/bin/env python3
"""A small GPT in plain torch.nn, cut by hand into 2 pipeline stages and trained with sluice.

The model (token + position embedding, pre-LayerNorm blocks of causal self-attention and a GELU
MLP, final LayerNorm, a head tied to the token embedding as in GPT) is written here, in plain
torch.nn. The user splits it into two stage modules: `Stage0` (embeddings and the first half of
the blocks) and `Stage1` (the other blocks and the head). The tied weight then lives on both
ranks; `PipelineExecutor(tied_parameters=...)` sums its two gradients every step (Megatron's
embedding group). The attention core (`CoreAttention`) is marked `sluice_recompute = True`, so
a plan recomputing 'selective' (`--recompute selective`) checkpoints it.

sluice plans every global batch of variable-length samples for that same model shape (a
ModelSpec dict below) on two pipeline stages; `PlanningBatchSampler.plans()`
yields the plans, `PlanCollator` builds each micro-batch in the plan's padded shape, and
`PipelineExecutor` runs each rank's instruction stream (1F1B here) with torch.distributed
point-to-point transfers on 2 Gloo processes.

    /usr/bin/python3 examples/python/train_pipeline.py                 # 2 processes, Gloo, CPU
    /usr/bin/python3 examples/python/train_pipeline.py --reference     # 1 process, same batches
    /usr/bin/python3 examples/python/train_pipeline.py --method packing    # packed micro-batches
    /usr/bin/python3 examples/python/train_pipeline.py --device cuda --backend nccl   # 2 GPUs
    /usr/bin/python3 examples/python/train_pipeline.py --dp 2 --schedule zb-h1   # 4 processes
    /usr/bin/python3 examples/python/train_pipeline.py --recompute selective     # attention core

With --dp D the job is D data-parallel replicas of the 2-stage pipeline (2 D processes; the
executor all-reduces each stage's gradients by the plan's buckets), and the reference sums the
micro-batches of every replica.

Needs `import sluice` (PYTHONPATH=build/python, or `pip install .`). Prints one line per step
(the batch's mean token loss) and the tokens/s of the loop. `--out FILE` writes the losses and
timings as JSON (the test reads them); `--grads PREFIX` writes the first step's gradients
(PREFIX-rank-R.pt, PREFIX-reference.pt: {parameter name: gradient}).
"""
import argparse
import json
import math
import os
import contextlib
import random
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

import sluice
from sluice.torch import PipelineExecutor, PlanCollator, PlanningBatchSampler

# --- the model, in plain torch.nn -------------------------------------------------------------


class CoreAttention(nn.Module):
    """softmax(q k^T / sqrt(d), masked) v: the part whose activations grow with seqlen^2, which
    Megatron's selective recompute recomputes. `sluice_recompute = True` marks it for
    PipelineExecutor: a micro-batch the plan recomputes 'selective' runs it under
    torch.utils.checkpoint."""
    sluice_recompute = True

    def forward(self, q, k, v, mask):  # (b, heads, t, head_dim), mask (b, 1, t, t)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        return scores.softmax(-1) @ v


class Block(nn.Module):
    def __init__(self, hidden, heads, ffn):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.core = CoreAttention()
        self.fc1, self.fc2 = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

    def forward(self, x, mask):
        b, t, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, h // self.heads).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))  # (b, heads, t, head_dim)
        att = self.core(q, k, v, mask).transpose(1, 2).reshape(b, t, h)
        x = x + self.proj(att)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def attention_mask(batch):
    """(b, 1, t, t) bool: causal, within a document for varlen micro-batches, within the row's
    real tokens otherwise (PlanCollator's document_ids: 0 on padding). Padding attends to
    itself so that no softmax row is empty."""
    doc = batch["document_ids"]
    t = doc.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=doc.device).tril()
    if batch["varlen"]:
        same = doc[:, :, None] == doc[:, None, :]
    else:
        real = doc > 0
        same = real[:, :, None] & real[:, None, :]
    eye = torch.eye(t, dtype=torch.bool, device=doc.device)
    return ((same & causal) | eye)[:, None]


class GPT(nn.Module):
    def __init__(self, vocab, hidden, heads, layers, ffn, max_position, tied=True):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, hidden), nn.Embedding(max_position, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads, ffn) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(hidden), nn.Linear(hidden, vocab, bias=False)
        if tied:  # GPT's tied embeddings: the head's weight is the token embedding
            self.head.weight = self.tok.weight
            nn.init.normal_(self.tok.weight, std=hidden ** -0.5)  # N(0, 1) makes huge logits

    def forward(self, batch):
        mask = attention_mask(batch)
        x = self.tok(batch["input_ids"]) + self.pos(batch["position_ids"])
        for blk in self.blocks:
            x = blk(x, mask)
        return self.head(self.ln(x))


# --- the user's split into two stages ---------------------------------------------------------


class Stage0(nn.Module):
    def __init__(self, gpt, cut):
        super().__init__()
        self.tok, self.pos, self.blocks = gpt.tok, gpt.pos, gpt.blocks[:cut]

    def forward(self, input_ids, batch):
        mask = attention_mask(batch)
        x = self.tok(input_ids) + self.pos(batch["position_ids"])
        for blk in self.blocks:
            x = blk(x, mask)
        return x


class Stage1(nn.Module):
    def __init__(self, gpt, cut):
        super().__init__()
        self.blocks, self.ln, self.head = gpt.blocks[cut:], gpt.ln, gpt.head

    def forward(self, x, batch):
        mask = attention_mask(batch)
        for blk in self.blocks:
            x = blk(x, mask)
        return self.head(self.ln(x))


def loss_fn(logits, batch):
    """Sum of the token losses (the step scales it by 1 / labels of the global batch)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1),
                           ignore_index=-100, reduction="sum")


# --- data and plans ---------------------------------------------------------------------------


def make_dataset(n, vocab, max_len, seed):
    """Variable-length samples (long-tailed lengths) of a learnable pattern: each sample counts
    up by its own stride, mod vocab."""
    rng = random.Random(seed)
    data = []
    for _ in range(n):
        length = min(max_len, max(8, int(rng.lognormvariate(math.log(60), 0.8))))
        start, stride = rng.randrange(vocab), rng.randrange(1, 7)
        data.append({"input_ids": [(start + stride * i) % vocab for i in range(length)]})
    return data


def model_spec(args):
    """The ModelSpec sluice plans for: the same shape as the GPT above (hidden size, layers,
    heads, vocabulary), so the plan's boundary shapes [mbs, seqlen, hidden] are this model's."""
    return {"name": "example-gpt", "layers": args.layers, "hidden": args.hidden,
            "heads": args.heads, "ffn_hidden": 4 * args.hidden, "vocab": args.vocab,
            "max_position": args.max_seqlen, "tied_embeddings": not args.untied}


def cpu_cluster(args):
    """One CPU core per process (examples/cluster-cpu-2.json's figures, 2 dp devices)."""
    return {"name": "cpu", "nodes": 1, "devices_per_node": 2 * args.dp,
            "device": {"name": "cpu-1t", "peak_tflops": 0.17, "memory_gib": 4,
                       "hbm_gb_per_s": 12.9},
            "intra_node": {"bandwidth_gb_per_s": 0.85, "latency_us": 2000}}


def make_sampler(args, rank, world_size, share=None):
    planner = sluice.Planner(model=model_spec(args), cluster=args.cluster or cpu_cluster(args),
                             parallel={"dp": args.dp, "pp": 2, "zero": 1}, method=args.method,
                             schedule=args.schedule, max_seqlen=args.max_seqlen, seed=args.seed,
                             recompute=args.recompute)
    lengths = [len(x["input_ids"]) for x in args.dataset]
    return planner, PlanningBatchSampler(lengths, planner, args.tokens_per_batch, rank=rank,
                                         world_size=world_size, seed=args.seed,
                                         share=share or args.share)


def build_model(args):
    torch.manual_seed(args.seed)  # every process builds the same initial weights
    return GPT(args.vocab, args.hidden, args.heads, args.layers, 4 * args.hidden, args.max_seqlen,
               tied=not args.untied)


def save_grads(gpt, module, path):
    """{parameter name in `gpt` (a tied weight: its first name): gradient} of the parameters
    `module` (the GPT or a stage made from it) holds."""
    names = {id(q): n for n, q in gpt.named_parameters()}
    torch.save({names[id(q)]: q.grad.detach().cpu().clone() for q in module.parameters()
                if q.grad is not None}, path)


def to_device(batch, device):
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}


def steps(sampler, args):
    """The plans of the run: args.steps of them, across epochs."""
    n, epoch = 0, 0
    while True:
        sampler.set_epoch(epoch)
        for planned in sampler.plans():
            if n == args.steps:
                return
            yield planned
            n += 1
        epoch += 1


# --- measuring activation memory (--saved-bytes) ----------------------------------------------


class SavedBytes:
    """Peak bytes of the activations autograd keeps for the backward, while active: the tensors
    saved for backward (torch.autograd.graph.saved_tensors_hooks; parameters left out), once
    per storage while any saved tensor refers to it, plus the inputs a checkpointed submodule
    keeps instead of what it would save (selective recompute), for as long as its graph lives.
    """

    def __init__(self, params):
        self.params = {q.data_ptr() for q in params}
        self.refs, self.size, self.now, self.peak = {}, {}, 0, 0
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def hold(self, x):
        s = x.storage()
        key = s.data_ptr()
        if key in self.params:
            return None
        if self.refs.get(key, 0) == 0:
            self.size[key] = s.nbytes()
            self.now += self.size[key]
            self.peak = max(self.peak, self.now)
        self.refs[key] = self.refs.get(key, 0) + 1
        return _Held(self, key)

    def release(self, key):
        self.refs[key] -= 1
        if self.refs[key] == 0:
            self.now -= self.size.pop(key)

    def pack(self, x):
        return (x, self.hold(x))

    @staticmethod
    def unpack(packed):
        return packed[0]

    def checkpoint(self, real):
        def counting(fn, *args, **kwargs):
            held = [self.hold(a) for a in args if torch.is_tensor(a)]
            out = real(fn, *args, **kwargs)
            if torch.is_tensor(out) and out.grad_fn is not None:
                out.grad_fn.register_hook(lambda *_, held=held: None)  # lives with the graph
            return out
        return counting

    def __enter__(self):
        self.real = torch.utils.checkpoint.checkpoint
        torch.utils.checkpoint.checkpoint = self.checkpoint(self.real)
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)
        torch.utils.checkpoint.checkpoint = self.real


class _Held:
    def __init__(self, counter, key):
        self.counter, self.key = counter, key

    def __del__(self):
        self.counter.release(self.key)


# --- the two runs -----------------------------------------------------------------------------


def train_rank(rank, args):
    """One of the 2 dp pipeline processes: even ranks run Stage0, odd ranks Stage1 (plan rank =
    dp_index * 2 + stage)."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    torch.set_num_threads(1)
    world = 2 * args.dp
    dist.init_process_group(args.backend, rank=rank, world_size=world)
    device = torch.device(args.device if args.device == "cpu" else f"{args.device}:{rank}")
    gpt = build_model(args)
    stage = (Stage0(gpt, args.layers // 2) if rank % 2 == 0 else Stage1(gpt, args.layers // 2))
    stage = stage.to(device)
    opt = torch.optim.AdamW(stage.parameters(), lr=args.lr)
    planner, sampler = make_sampler(args, rank, world)
    collate = PlanCollator(args.dataset, planner.max_seqlen)
    # The tied weight: the token embedding on the first stage, the head on the last. The
    # executor sums their gradients between the two ranks after every backward.
    tied = None if args.untied else \
        {"word_embeddings": stage.tok.weight if rank % 2 == 0 else stage.head.weight}
    # With --grads the loop steps the optimizer itself (after saving the first gradients).
    executor = PipelineExecutor(stage, loss_fn, None if args.grads else opt,
                                parallel=planner.parallel, tied_parameters=tied,
                                recompute=args.exec_recompute)
    losses, tokens, seconds = [], 0, 0.0
    prof = None
    if args.profile:  # torch.profiler over the steps after the warm-up; ranges = plan names
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                      schedule=torch.profiler.schedule(
                                          wait=0, warmup=args.warmup, active=args.steps))
        prof.start()
    counter = SavedBytes(stage.parameters()) if args.saved_bytes else None
    for k, planned in enumerate(steps(sampler, args)):
        batches = [to_device(collate(mb), device) for mb in planned.micro_batches]
        t0 = time.perf_counter()
        with counter or contextlib.nullcontext():
            r = executor.run(planned.plan, batches, loss_scale=1.0 / planned.num_label_tokens())
        if args.grads:
            if k == 0:
                save_grads(gpt, stage, f"{args.grads}-rank-{rank}.pt")
            opt.step()
            opt.zero_grad(set_to_none=True)
        if prof is not None:
            prof.step()
        if k >= args.warmup:  # tokens/s over the steps after the warm-up
            seconds += time.perf_counter() - t0
            tokens += sum(b["num_tokens"] for b in batches)
        # The batch's loss: the sum of the replicas' shares (last-stage ranks hold them).
        loss = torch.tensor([r["loss"] or 0.0], dtype=torch.float64)
        dist.all_reduce(loss)
        loss = float(loss)
        losses.append(loss)
        if rank == 1 and args.verbose:
                print(f"step {k}: loss {loss:.6f} ({len(batches)} micro-batches, "
                      f"{r['seconds'] * 1e3:.0f} ms)", flush=True)
    saved = torch.zeros(world, dtype=torch.float64)  # every rank's peak saved-tensor bytes
    saved[rank] = counter.peak if counter else 0
    dist.all_reduce(saved)
    if prof is not None:
        prof.stop()
        os.makedirs(args.profile, exist_ok=True)
        prof.export_chrome_trace(os.path.join(args.profile, f"trace-rank-{rank}.json"))
    if rank == 1 and args.out:
        with open(args.out, "w") as f:
            json.dump({"losses": losses, "tokens": tokens, "seconds": seconds,
                       "tokens_per_second": tokens / seconds if seconds else 0.0,
                       "wait_seconds": executor.stats["wait_seconds"],
                       "sampler_wait_seconds": sampler.stats["wait_seconds"],
                       "peak_saved_bytes": saved.tolist()}, f)
    if rank == 1:
        print(f"pipeline ({args.method}): {len(losses)} steps, {tokens / max(seconds, 1e-9):,.0f} "
              f"tokens/s after {args.warmup} warm-up steps", flush=True)
        if counter:
            print("peak saved activations per rank: "
                  + ", ".join(f"{x / 2**20:.2f} MiB" for x in saved.tolist()), flush=True)
    dist.destroy_process_group()


def train_reference(args):
    """The same model, in one process, on the same plans' micro-batches in the same order."""
    torch.set_num_threads(1)
    model = build_model(args)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    # The pipeline's plans: every rank of the pipeline gets rank 0's (planning is deterministic).
    planner, sampler = make_sampler(args, 0, 2 * args.dp, share="seed")
    collate = PlanCollator(args.dataset, planner.max_seqlen)
    losses = []
    for k, planned in enumerate(steps(sampler, args)):
        scale = 1.0 / planned.num_label_tokens()
        total = 0.0
        for mb in (m for d in range(args.dp) for m in planned.plan.micro_batches(d)):
            batch = collate(mb)
            loss = loss_fn(model(batch), batch) * scale
            loss.backward()
            total += loss.item()
        if args.grads and k == 0:
            save_grads(model, model, f"{args.grads}-reference.pt")
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total)
        if args.verbose:
            print(f"step {k}: loss {total:.6f}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"losses": losses}, f)
    return losses


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reference", action="store_true", help="train in one process instead")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=1, help="steps left out of tokens/s")
    p.add_argument("--samples", type=int, default=400)
    p.add_argument("--tokens-per-batch", type=int, default=4096)
    p.add_argument("--max-seqlen", type=int, default=512)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--method", default="dynapipe", help="sluice batching method (or packing)")
    p.add_argument("--schedule", default="1f1b", help="1f1b, gpipe, zb-h1 (split backward)...")
    p.add_argument("--dp", type=int, default=1, help="data-parallel replicas (2 dp processes)")
    p.add_argument("--recompute", default=None, help="none, selective, full (planner's)")
    p.add_argument("--exec-recompute", default=None, choices=["none", "selective", "full"],
                   help="the executor recomputes so for every micro-batch, whatever the plan "
                        "says (same plans, other memory)")
    p.add_argument("--untied", action="store_true",
                   help="an untied head (default: tied to the token embedding, as GPT)")
    p.add_argument("--saved-bytes", action="store_true",
                   help="measure each rank's peak saved activations (saved_tensors_hooks)")
    p.add_argument("--grads", default="", help="write the first step's gradients to "
                                               "PREFIX-rank-R.pt / PREFIX-reference.pt")
    p.add_argument("--cluster", default="",
                   help="cluster preset or JSON file; default: 2 dp CPU cores (cpu_cluster)")
    p.add_argument("--share", default="seed", choices=["seed", "store"],
                   help="every rank plans (seed) or rank 0 plans and shares (store)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", default="gloo")
    p.add_argument("--port", type=int, default=0, help="0: a free one")
    p.add_argument("--out", default="", help="write losses and timings as JSON")
    p.add_argument("--profile", default="", help="write DIR/trace-rank-R.json (torch.profiler)")
    p.add_argument("--quiet", dest="verbose", action="store_false")
    args = p.parse_args(argv)
    if args.steps < 1 or args.layers < 2 or args.dp < 1:
        p.error("--steps and --dp must be >= 1, --layers >= 2")
    args.dataset = make_dataset(args.samples, args.vocab, args.max_seqlen, args.seed)
    args.port = args.port or free_port()
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.reference:
        train_reference(args)
    else:
        mp.spawn(train_rank, args=(args,), nprocs=2 * args.dp, join=True)


if __name__ == "__main__":
    sys.exit(main())
