"""Two processes on Gloo (CPU): each rank iterates its PlanningBatchSampler inside a tiny
training loop that all-reduces gradients after every micro-batch."""

import json
import os
import random
import socket

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp

import sluice
from sluice.torch import PackedCollator, PlanningBatchSampler

VOCAB = 50
PLANNER = dict(model="gpt-6.7b", cluster="a100-40g:8", parallel="dp=2,pp=4,zero=1",
               method="dynapipe", schedule="1f1b", max_seqlen=256)


def _dataset():
    rng = random.Random(11)
    return [{"idx": i, "input_ids": [rng.randrange(1, VOCAB) for _ in range(rng.randint(2, 300))]}
            for i in range(160)]


def _collate(features):
    return PackedCollator(max_seqlen=256)(features), [f["idx"] for f in features]


def _worker(rank, world_size, port, out_path):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    data = _dataset()
    lengths = [len(d["input_ids"]) for d in data]
    sampler = PlanningBatchSampler(lengths, sluice.Planner(**PLANNER), tokens_per_batch=2048,
                                   seed=3)  # rank and world size from torch.distributed
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler,
                                         collate_fn=_collate)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 16), torch.nn.Linear(16, VOCAB))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    lens = torch.tensor([len(sampler)])
    dist.all_reduce(lens, op=dist.ReduceOp.MAX)
    assert int(lens) == len(sampler), "__len__ differs between ranks"

    seen, losses, steps = [], [], 0
    for epoch in range(2):
        sampler.set_epoch(epoch)
        epoch_ids = []
        for batch, ids in loader:
            epoch_ids.extend(ids)
            opt.zero_grad()
            if batch["num_samples"]:
                logits = model(batch["input_ids"])
                # predict token t+1 from token t; labels already mask each document's first token
                loss = torch.nn.functional.cross_entropy(
                    logits[0, :-1], batch["labels"][0, 1:], ignore_index=-100, reduction="sum")
                loss.backward()
                losses.append(loss.item())
            for p in model.parameters():
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad)
                p.grad /= world_size
            opt.step()
            steps += 1
        seen.append(epoch_ids)
    checksum = float(sum(p.double().sum() for p in model.parameters()))
    gathered = [None] * world_size
    dist.all_gather_object(gathered, {"seen": seen, "steps": steps, "checksum": checksum,
                                      "len": len(sampler), "losses": len(losses)})
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(gathered, f)
    dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_distributed_gloo_training_loop(tmp_path):
    out = tmp_path / "result.json"
    mp.spawn(_worker, args=(2, _free_port(), str(out)), nprocs=2, join=True)
    r0, r1 = json.loads(out.read_text())
    n = len(_dataset())
    for epoch in range(2):
        ids = r0["seen"][epoch] + r1["seen"][epoch]
        assert sorted(ids) == list(range(n)), "every sample exactly once per epoch"
        assert not set(r0["seen"][epoch]) & set(r1["seen"][epoch])
    assert r0["seen"][0] != r0["seen"][1]  # set_epoch reshuffled
    assert r0["steps"] == r1["steps"] > 0
    assert r0["len"] == r1["len"]
    assert r0["losses"] > 0 and r1["losses"] > 0
    # the all-reduced gradients kept the replicas identical
    assert abs(r0["checksum"] - r1["checksum"]) < 1e-9 * max(1.0, abs(r0["checksum"]))


def _store_worker(rank, world_size, port, out_path):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    data = _dataset()
    lengths = [len(d["input_ids"]) for d in data]
    planner = sluice.Planner(**PLANNER)
    if rank != 0:  # only rank 0 may plan: the others read its plans from the store
        def refuse(*args, **kwargs):
            raise AssertionError(f"rank {rank} planned")
        planner.plan = refuse
    sampler = PlanningBatchSampler(lengths, planner, tokens_per_batch=2048, seed=5,
                                   share="store")
    seen, plans = [], []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        if epoch == 0:
            n = len(sampler)  # plans the epoch up front (reads every key once)
        mbs = list(sampler)
        seen.append([i for mb in mbs for i in mb])
        if epoch == 0:
            assert len(mbs) == n
        plans.append([(p.to_json(), p.micro_batches(sampler.replica) == p.micro_batches(
            sampler.replica)) for p in (pb.plan for pb in sampler.plans())])
    dist.barrier()
    store = dist.distributed_c10d._get_default_store()
    # delete_key is False for a key that is gone: the last reader deleted it.
    left = [k for k in (f"sluice/sampler/{e}/{b}" for e in range(2) for b in range(3))
            if rank == 0 and store.delete_key(k)]
    gathered = [None] * world_size
    dist.all_gather_object(gathered, {"seen": seen, "plans": [[j for j, _ in p] for p in plans],
                                      "len": n, "left": left})
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(gathered, f)
    dist.destroy_process_group()


def test_distributed_sampler_rank0_plans_through_store(tmp_path):
    out = tmp_path / "result.json"
    mp.spawn(_store_worker, args=(2, _free_port(), str(out)), nprocs=2, join=True)
    r0, r1 = json.loads(out.read_text())
    assert r0["plans"] == r1["plans"] and len(r0["plans"][0]) > 1  # rank 1 got rank 0's plans
    assert r0["len"] == r1["len"] > 0
    n = len(_dataset())
    for epoch in range(2):
        assert sorted(r0["seen"][epoch] + r1["seen"][epoch]) == list(range(n))
    assert r0["left"] == [] and r1["left"] == []  # the last reader deleted every key
