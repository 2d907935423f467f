"""sluice.torch: PlanningBatchSampler and the collators."""

import random

import pytest
torch = pytest.importorskip("torch")
import torch.utils.data

import sluice
from sluice.torch import PackedCollator, PaddedCollator, PlanningBatchSampler

# sluice plans as for GPT-6.7B on 8 A100-40GB (2 replicas x 4 stages): the micro-batches a
# PyTorch loop gets are the ones that setting runs best.
PLANNER = dict(model="gpt-6.7b", cluster="a100-40g:8", parallel="dp=2,pp=4,zero=1",
               method="dynapipe", schedule="1f1b", max_seqlen=512)


def lengths_of(n, seed=1, top=700):
    rng = random.Random(seed)
    return [rng.randint(1, top) for _ in range(n)]


@pytest.fixture(scope="module")
def planner():
    return sluice.Planner(**PLANNER)


def samplers(planner, lengths, world_size=2, **kw):
    return [PlanningBatchSampler(lengths, planner, 4096, rank=r, world_size=world_size, **kw)
            for r in range(world_size)]


def test_every_sample_exactly_once_per_epoch_across_ranks(planner):
    lengths = lengths_of(300)
    ss = samplers(planner, lengths)
    seen = []
    for s in ss:
        for mb in s:
            seen.extend(mb)
    assert sorted(seen) == list(range(len(lengths)))
    # The budget holds for every global batch (clipped lengths).
    for b in ss[0].global_batches():
        assert sum(min(lengths[i], 512) for i in b) <= 4096


def test_len_agrees_across_ranks_and_matches_iteration(planner):
    lengths = lengths_of(300, seed=2)
    ss = samplers(planner, lengths)
    assert len(ss[0]) == len(ss[1]) > 0
    assert ss[0].steps() == ss[1].steps()
    fresh = samplers(planner, lengths)  # iterate without calling len first (background thread)
    counts = [sum(1 for _ in s) for s in fresh]
    assert counts == [len(ss[0])] * 2
    assert fresh[0].stats["batches_planned"] == len(fresh[0].global_batches())


def test_replicas_get_the_plans_micro_batches(planner):
    lengths = lengths_of(120, seed=3)
    s0, s1 = samplers(planner, lengths, equalize=False, shuffle=False)
    batch = s0.global_batches()[0]
    plan = planner.plan([min(lengths[i], 512) for i in batch], ids=batch)
    first0 = [mb["sample_ids"] for mb in plan.micro_batches(0)]
    first1 = [mb["sample_ids"] for mb in plan.micro_batches(1)]
    it0, it1 = iter(s0), iter(s1)
    assert [next(it0) for _ in first0] == first0
    assert [next(it1) for _ in first1] == first1


def test_deterministic_for_a_seed_and_set_epoch_changes_order(planner):
    lengths = lengths_of(200, seed=4)
    a = list(PlanningBatchSampler(lengths, planner, 4096, rank=0, world_size=2, seed=7))
    b = list(PlanningBatchSampler(lengths, planner, 4096, rank=0, world_size=2, seed=7))
    assert a == b
    c = PlanningBatchSampler(lengths, planner, 4096, rank=0, world_size=2, seed=7)
    c.set_epoch(1)
    assert list(c) != a
    d = list(PlanningBatchSampler(lengths, planner, 4096, rank=0, world_size=2, seed=8))
    assert d != a
    c.set_epoch(0)
    assert list(c) == a


def test_world_size_with_several_ranks_per_replica(planner):
    lengths = lengths_of(100, seed=5)
    ss = samplers(planner, lengths, world_size=8)  # dp=2: ranks 0..3 -> replica 0; 4..7 -> 1
    assert [s.replica for s in ss] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert list(ss[0]) == list(ss[3]) and list(ss[4]) == list(ss[7])
    assert list(ss[0]) != list(ss[4])
    with pytest.raises(sluice.Error, match="multiple of the planner's dp"):
        PlanningBatchSampler(lengths, planner, 4096, rank=0, world_size=3)


def test_long_samples_clip_or_drop(planner):
    lengths = [100, 2000, 300, 50, 9000, 20]
    clip = samplers(planner, lengths)
    assert sorted(i for s in clip for mb in s for i in mb) == list(range(6))
    drop = samplers(planner, lengths, long="drop")
    assert drop[0].dropped == [1, 4]
    assert sorted(i for s in drop for mb in s for i in mb) == [0, 2, 3, 5]
    with pytest.raises(sluice.Error, match="allowed: clip, drop"):
        PlanningBatchSampler(lengths, planner, 4096, rank=0, world_size=2, long="cut")
    with pytest.raises(sluice.Error, match="tokens_per_batch"):
        PlanningBatchSampler(lengths, planner, 100, rank=0, world_size=2)


def test_out_of_memory_batches_are_split():
    # 16 samples of 2048 tokens do not fit a 20,000 MB budget under 1F1B with padding; 4 do
    # (test_bindings.py, test_out_of_memory_is_an_outcome): the sampler splits 16 -> 8 -> 4.
    tight = sluice.Planner(model="gpt-6.7b", cluster="a100-40g:8",
                           parallel={"dp": 2, "pp": 4, "zero": 1, "memory_limit_mb": 20000},
                           max_seqlen=2048, method="padding")
    lengths = [2048] * 16
    ss = [PlanningBatchSampler(lengths, tight, 16 * 2048, rank=r, world_size=2) for r in (0, 1)]
    seen = sorted(i for s in ss for mb in s for i in mb)
    assert seen == list(range(16))
    assert ss[0].stats["plans_split"] >= 1
    assert len(ss[0].steps()) >= 2  # planned as more than one plan


def test_background_planning_runs_ahead(planner):
    lengths = lengths_of(400, seed=6)
    s = PlanningBatchSampler(lengths, planner, 4096, rank=0, world_size=2, prefetch=4)
    import time
    it = iter(s)
    next(it)
    time.sleep(0.5)  # the "training step": the planner thread fills the queue meanwhile
    planned_before = s.stats["batches_planned"]
    rest = list(it)
    assert planned_before >= 2  # ran ahead of the consumer
    assert len(rest) + 1 == len(PlanningBatchSampler(lengths, planner, 4096, rank=0,
                                                     world_size=2))


def test_dataloader_end_to_end(planner):
    lengths = lengths_of(150, seed=7)
    data = [{"input_ids": list(range(1, n + 1))} for n in lengths]
    s = PlanningBatchSampler(lengths, planner, 4096, rank=1, world_size=2)
    loader = torch.utils.data.DataLoader(data, batch_sampler=s,
                                         collate_fn=PackedCollator(max_seqlen=512))
    n = 0
    for batch, ids in zip(loader, PlanningBatchSampler(lengths, planner, 4096, rank=1,
                                                       world_size=2)):
        assert batch["num_samples"] == len(ids)
        assert batch["num_tokens"] == sum(min(lengths[i], 512) for i in ids)
        n += 1
    assert n == len(loader) == len(s)


def test_packed_collator():
    feats = [{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}, {"input_ids": [1, 2, 3, 4]}]
    b = PackedCollator()(feats)
    assert b["input_ids"].tolist() == [[5, 6, 7, 8, 9, 1, 2, 3, 4]]
    assert b["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2, 3]]
    assert b["labels"].tolist() == [[-100, 6, 7, -100, 9, -100, 2, 3, 4]]
    assert b["cu_seqlens"].dtype == torch.int32
    assert b["cu_seqlens"].tolist() == [0, 3, 5, 9]
    assert b["cu_seq_lens_q"] is b["cu_seqlens"] and b["max_length_k"] == 4
    assert b["max_seqlen"] == 4 and b["num_tokens"] == 9 and b["num_samples"] == 3
    # explicit labels, truncation, plain sequences
    b = PackedCollator(max_seqlen=2)([{"input_ids": [1, 2, 3], "labels": [7, 8, 9]},
                                      torch.tensor([4, 5])])
    assert b["input_ids"].tolist() == [[1, 2, 4, 5]]
    assert b["labels"].tolist() == [[-100, 8, -100, 5]]
    assert b["cu_seqlens"].tolist() == [0, 2, 4]
    empty = PackedCollator()([])
    assert empty["input_ids"].shape == (1, 0) and empty["cu_seqlens"].tolist() == [0]
    with pytest.raises(sluice.Error, match="labels"):
        PackedCollator()([{"input_ids": [1, 2], "labels": [1]}])


def test_padded_collator():
    feats = [[5, 6, 7], [8], [1, 2, 3, 4, 5]]
    b = PaddedCollator(pad_token_id=0)(feats)
    assert b["input_ids"].tolist() == [[5, 6, 7, 0, 0], [8, 0, 0, 0, 0], [1, 2, 3, 4, 5]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1] * 5]
    assert b["labels"][1].tolist() == [8, -100, -100, -100, -100]
    assert b["position_ids"][0].tolist() == [0, 1, 2, 0, 0]
    assert b["num_tokens"] == 9
    b = PaddedCollator(pad_to_multiple_of=8)(feats)
    assert b["input_ids"].shape == (3, 8)
    assert PaddedCollator()([])["input_ids"].shape == (0, 0)
