"""Encoder-decoder samples: PackedSeq2SeqCollator (encoder and decoder packed separately) and
PlanningBatchSampler planning t5 models with target lengths."""

import random

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import sluice  # noqa: E402
from sluice.torch import (PackedSeq2SeqCollator, PipelineExecutor, PlanCollator,  # noqa: E402
                          PlanningBatchSampler)

T5 = dict(model="t5-tiny", cluster="a100-40g:4", parallel="dp=2,pp=2", max_seqlen=256)


def _samples(n, seed=5, longest=300):
    rng = random.Random(seed)
    return [{"input_ids": [rng.randrange(1, 100) for _ in range(rng.randint(1, longest))],
             "labels": [rng.randrange(1, 100) for _ in range(rng.randint(1, longest // 3))]}
            for _ in range(n)]


def _unpack(row, cu):
    row, cu = row.reshape(-1).tolist(), cu.tolist()
    return [row[cu[i]:cu[i + 1]] for i in range(len(cu) - 1)]


def _check_round_trip(batch, features, max_seqlen, start=0):
    cut = (lambda x: list(x)[:max_seqlen]) if max_seqlen else list
    enc = [cut(f["input_ids"]) for f in features]
    tgt = [cut(f["labels"]) for f in features]
    assert _unpack(batch["input_ids"], batch["encoder_cu_seqlens"]) == enc
    assert _unpack(batch["labels"], batch["decoder_cu_seqlens"]) == tgt
    want_dec = [cut(f["decoder_input_ids"]) if "decoder_input_ids" in f else
                ([start] + t[:-1] if t else []) for f, t in zip(features, tgt)]
    assert _unpack(batch["decoder_input_ids"], batch["decoder_cu_seqlens"]) == want_dec
    for part, pos, cu in (("encoder", batch["encoder_position_ids"], batch["encoder_cu_seqlens"]),
                          ("decoder", batch["decoder_position_ids"], batch["decoder_cu_seqlens"])):
        assert _unpack(pos, cu) == [list(range(len(x))) for x in (enc if part == "encoder"
                                                                   else tgt)]
        assert cu.dtype == torch.int32 and cu[0].item() == 0
    assert batch["encoder_seq_lens"].tolist() == [len(x) for x in enc]
    assert batch["decoder_seq_lens"].tolist() == [len(x) for x in tgt]
    assert batch["encoder_max_seqlen"] == max((len(x) for x in enc), default=0)
    assert batch["decoder_max_seqlen"] == max((len(x) for x in tgt), default=0)
    # The cross-attention's pair: decoder queries against encoder keys.
    assert batch["cu_seq_lens_q"] is batch["decoder_cu_seqlens"]
    assert batch["cu_seq_lens_k"] is batch["encoder_cu_seqlens"]
    assert (batch["max_length_q"], batch["max_length_k"]) == \
        (batch["decoder_max_seqlen"], batch["encoder_max_seqlen"])
    e, d = sum(map(len, enc)), sum(map(len, tgt))
    assert (batch["num_encoder_tokens"], batch["num_decoder_tokens"], batch["num_tokens"],
            batch["num_samples"]) == (e, d, e + d, len(features))
    assert batch["input_ids"].shape == (1, e) and batch["labels"].shape == (1, d)


def test_seq2seq_collator_round_trip():
    features = _samples(9)
    features[3]["labels"] = [7]  # one target token: decoder input is the start token alone
    _check_round_trip(PackedSeq2SeqCollator()(features), features, None)
    _check_round_trip(PackedSeq2SeqCollator(max_seqlen=64, decoder_start_token_id=3)(features),
                      features, 64, start=3)
    given = [{**f, "decoder_input_ids": [x + 1 for x in f["labels"]]} for f in features]
    _check_round_trip(PackedSeq2SeqCollator()(given), given, None)
    _check_round_trip(PackedSeq2SeqCollator()([]), [], None)
    tensors = [{k: torch.tensor(v) for k, v in f.items()} for f in features[:3]]
    _check_round_trip(PackedSeq2SeqCollator()(tensors), features[:3], None)


def test_seq2seq_collator_errors():
    with pytest.raises(sluice.Error, match=r"features\[0\]: expected a dict with 'input_ids' "
                                           r"\(encoder tokens\) and 'labels'"):
        PackedSeq2SeqCollator()([[1, 2, 3]])
    with pytest.raises(sluice.Error, match=r"features\[0\]: 1 decoder_input_ids for 2 'labels'"):
        PackedSeq2SeqCollator()([{"input_ids": [1], "labels": [2, 3], "decoder_input_ids": [0]}])


def test_seq2seq_planner_gives_encoder_and_decoder_shapes():
    planner = sluice.Planner(**T5)
    assert planner.model.is_encoder_decoder
    plan = planner.plan([100, 200, 30, 250], target_lengths=[10, 60, 5, 40])
    assert plan.ok
    for d in range(2):
        for mb in plan.micro_batches(d):
            assert mb["seqlen"] >= 1 and mb["dec_seqlen"] >= 1
    load = next(i for i in plan.program(0)["instructions"] if i["op"] == "load-input")
    mb = plan.micro_batches(0)[load["mb"]]
    assert load["shapes"] == [[mb["mbs"], mb["seqlen"]], [mb["mbs"], mb["dec_seqlen"]]]
    with pytest.raises(sluice.Error, match="target_lengths: model 't5-tiny' is encoder-decoder"):
        planner.plan([100, 200])


def test_seq2seq_sampler_every_sample_once_with_targets():
    data = _samples(120, longest=400)  # some inputs over max_seqlen 256: clipped
    lengths = [len(f["input_ids"]) for f in data]
    targets = [len(f["labels"]) for f in data]
    planner = sluice.Planner(**T5)
    seen = []
    for rank in range(4):  # dp 2 x pp 2: ranks 0, 1 are replica 0; 2, 3 replica 1
        s = PlanningBatchSampler(lengths, planner, 4096, target_lengths=targets, rank=rank,
                                 world_size=4, seed=2)
        mbs = list(s)
        assert len(mbs) == len(s)
        if rank % 2 == 0:
            seen.extend(i for mb in mbs for i in mb)
        for batch in s.global_batches():  # the budget counts inputs and targets
            tokens = sum(min(lengths[i], 256) + targets[i] for i in batch)
            assert tokens <= 4096 or len(batch) == 1
        loader = torch.utils.data.DataLoader(
            data, batch_sampler=s, collate_fn=PackedSeq2SeqCollator(max_seqlen=256))
        for ids, batch in zip(mbs, loader):
            _check_round_trip(batch, [data[i] for i in ids], 256)
    assert sorted(seen) == list(range(len(data)))
    drop = PlanningBatchSampler(lengths, planner, 4096, target_lengths=targets, rank=0,
                                world_size=4, long="drop")
    assert drop.dropped == [i for i, n in enumerate(lengths) if n > 256]
    kept = [i for mb in drop for i in mb]
    assert not set(kept) & set(drop.dropped)


def test_seq2seq_sampler_errors():
    data = _samples(8)
    lengths = [len(f["input_ids"]) for f in data]
    with pytest.raises(sluice.Error, match=r"target_lengths: model 't5-tiny' is encoder-decoder; "
                                           r"give one target \(decoder\) length per sample"):
        PlanningBatchSampler(lengths, sluice.Planner(**T5), 4096, rank=0, world_size=4)
    with pytest.raises(sluice.Error, match=r"target_lengths: model 'gpt-tiny' is decoder-only"):
        PlanningBatchSampler(lengths, sluice.Planner(model="gpt-tiny", cluster="a100-40g:1",
                                                     parallel="dp=1,pp=1", max_seqlen=256),
                             4096, target_lengths=lengths)
    with pytest.raises(sluice.Error, match=r"target_lengths: 3 values for 8 lengths"):
        PlanningBatchSampler(lengths, sluice.Planner(**T5), 4096, target_lengths=[1, 2, 3],
                             rank=0, world_size=4)
    with pytest.raises(sluice.Error, match=r"target_lengths\[1\]: 0 tokens; allowed: >= 1"):
        PlanningBatchSampler(lengths, sluice.Planner(**T5), 4096, target_lengths=[1, 0] + [1] * 6,
                             rank=0, world_size=4)


def test_seq2seq_plans_refused_by_executor(tmp_path):
    planner = sluice.Planner(model="t5-tiny", cluster="a100-40g:1", parallel="dp=1,pp=1",
                             max_seqlen=256)
    plan = planner.plan([50, 60, 70], target_lengths=[5, 6, 7])
    mb = plan.micro_batches(0)[0]
    with pytest.raises(sluice.Error, match=r"micro_batch: encoder-decoder \(dec_seqlen \d+\); "
                                           r"PlanCollator builds decoder-only rows"):
        PlanCollator(_samples(3), 256)(mb)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    try:
        ex = PipelineExecutor(torch.nn.Linear(2, 2), lambda out, b: out.sum(),
                              parallel=planner.parallel)
        with pytest.raises(sluice.Error, match=r"plan: an encoder-decoder plan .* "
                                               r"PipelineExecutor runs decoder-only plans"):
            ex.run(plan, [{} for _ in plan.micro_batches(0)])
    finally:
        dist.destroy_process_group()
