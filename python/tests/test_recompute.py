"""PipelineExecutor's activation recompute in one process (a one-stage plan, world size 1):
'selective' checkpoints the submodules a stage marks (the attention core), 'full' replays the
stage's forward in the backward. Losses and gradients must equal a plain autograd loop on the
same micro-batches within 1e-6, with the split backward too, and the activations kept between
forward and backward (saved-tensor bytes) must shrink."""

import math
import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import sluice  # noqa: E402
from sluice.torch import PipelineExecutor, PlanCollator  # noqa: E402

HIDDEN, HEADS, VOCAB, MAXLEN = 16, 2, 32, 64
SPEC = {"name": "t", "layers": 2, "hidden": HIDDEN, "heads": HEADS, "ffn_hidden": 32,
        "vocab": VOCAB, "max_position": MAXLEN, "tied_embeddings": False}


class Core(torch.nn.Module):
    """softmax(q k^T / sqrt(d) + mask) v with dropout: what Megatron's selective recompute
    recomputes. The class attribute marks it for PipelineExecutor."""
    sluice_recompute = True

    def __init__(self, marked=True):
        super().__init__()
        self.sluice_recompute = marked

    def forward(self, q, k, v, mask):
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        return F.dropout(scores.softmax(-1), p=0.1, training=self.training) @ v


class Model(torch.nn.Module):
    """Embedding, 2 attention blocks (qkv, core, proj, MLP), head: one stage."""

    def __init__(self, marked=True):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(VOCAB, HIDDEN)
        self.blocks = torch.nn.ModuleList()
        for _ in range(2):
            blk = torch.nn.Module()
            blk.qkv, blk.proj = torch.nn.Linear(HIDDEN, 3 * HIDDEN), torch.nn.Linear(HIDDEN, HIDDEN)
            blk.core, blk.ln = Core(marked), torch.nn.LayerNorm(HIDDEN)
            blk.fc = torch.nn.Linear(HIDDEN, HIDDEN)
            self.blocks.append(blk)
        self.head = torch.nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids, batch):
        doc = batch["document_ids"]
        t = doc.shape[1]
        same = (doc[:, :, None] == doc[:, None, :]) & torch.ones(t, t, dtype=torch.bool).tril()
        mask = (same | torch.eye(t, dtype=torch.bool))[:, None]
        x = self.emb(ids)
        for blk in self.blocks:
            b, t, h = x.shape
            q, k, v = blk.qkv(x).view(b, t, 3, HEADS, h // HEADS).unbind(2)
            att = blk.core(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask)
            x = x + blk.proj(att.transpose(1, 2).reshape(b, t, h))
            x = x + blk.fc(torch.tanh(blk.ln(x)))
        return self.head(x)


def _loss(logits, batch):
    return F.cross_entropy(logits.reshape(-1, VOCAB), batch["labels"].reshape(-1),
                           ignore_index=-100, reduction="sum")


def _data():
    return [{"input_ids": [(i * 7 + j) % VOCAB for j in range(5 + (i * 13) % 58)]}
            for i in range(24)]


def _cluster(memory_mib):
    """One device small enough that the tiny model's batch needs several micro-batches."""
    return {"name": "small", "nodes": 1, "devices_per_node": 1,
            "device": {"name": "small", "peak_tflops": 0.17, "memory_gib": memory_mib / 1024,
                       "hbm_gb_per_s": 12.9},
            "intra_node": {"bandwidth_gb_per_s": 0.85, "latency_us": 2000}}


def _plan(schedule, recompute, micro_batches=2):
    """A plan of the data in several micro-batches, each recomputing `recompute`: the largest
    device memory (of a few) at which the planner needs at least `micro_batches`."""
    data = _data()
    for mib in (3, 2, 1.5, 1, 0.75, 0.5):
        planner = sluice.Planner(model=SPEC, cluster=_cluster(mib), parallel="dp=1,pp=1",
                                 max_seqlen=MAXLEN, schedule=schedule, recompute=recompute,
                                 method="packing")
        plan = planner.plan([len(d["input_ids"]) for d in data])
        if plan.ok and len(plan.micro_batches(0)) >= micro_batches:
            break
    assert plan.ok, plan.infeasible_reason
    collate = PlanCollator(data, MAXLEN)
    batches = [collate(mb) for mb in plan.micro_batches(0)]
    return planner, plan, batches


def _reference(batches, scale):
    """The plain loop: forward and backward of every micro-batch, no recompute."""
    model = Model()
    torch.manual_seed(1)
    total = 0.0
    for b in batches:
        loss = _loss(model(b["input_ids"], b), b) * scale
        loss.backward()
        total += loss.item()
    return total, {n: q.grad.clone() for n, q in model.named_parameters()}


def _executor_run(planner, plan, batches, scale, model=None, **options):
    model = model or Model()
    ex = PipelineExecutor(model, _loss, None, parallel=planner.parallel, **options)
    torch.manual_seed(1)
    loss = ex.run(plan, batches, loss_scale=scale)["loss"]
    return loss, {n: q.grad.clone() for n, q in model.named_parameters()}


def _assert_same(got, want):
    (loss, grads), (ref_loss, ref_grads) = got, want
    assert abs(loss - ref_loss) <= 1e-6, (loss, ref_loss)
    assert grads.keys() == ref_grads.keys()
    for n in grads:
        assert torch.allclose(grads[n], ref_grads[n], rtol=0, atol=1e-6), \
            (n, (grads[n] - ref_grads[n]).abs().max().item())


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1", "gpipe"])
@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_recompute_equals_plain_loop(one_process, schedule, recompute):
    planner, plan, batches = _plan(schedule, recompute)
    assert {mb["recompute"] for mb in plan.micro_batches(0)} == {recompute}
    assert len(batches) >= 2
    ops = {i["op"] for i in plan.program(0)["instructions"]}
    assert ("backward-weight" in ops) == (schedule == "zb-h1")  # split backward (B/W)
    scale = 1.0 / sum(b["num_labels"] for b in batches)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the core is marked: no fallback warning
        got = _executor_run(planner, plan, batches, scale)
    _assert_same(got, _reference(batches, scale))


class _SavedBytes:
    """Peak bytes of the tensors autograd keeps for backward (saved_tensors_hooks), counted
    once per storage while some saved tensor still refers to it; parameters left out. Tensors
    saved inside a non-reentrant checkpoint are not kept (the checkpoint's own hooks replace
    them), and what the checkpoint keeps instead (its inputs) is counted by `inputs`."""

    def __init__(self, params):
        self.params = {q.data_ptr() for q in params}
        self.live, self.refs, self.now, self.peak = {}, {}, 0, 0

    def pack(self, x):
        s = x.storage()
        key, n = s.data_ptr(), s.nbytes()
        if key in self.params:
            return x
        count = self.refs.get(key, 0)
        if count == 0:
            self.now += n
            self.peak = max(self.peak, self.now)
            self.live[key] = n
        self.refs[key] = count + 1
        return _Held(x, self, key)

    @staticmethod
    def unpack(h):
        return h.x if isinstance(h, _Held) else h

    def release(self, key):
        self.refs[key] -= 1
        if self.refs[key] == 0:
            self.now -= self.live.pop(key)


class _Held:
    def __init__(self, x, counter, key):
        self.x, self.counter, self.key = x, counter, key

    def __del__(self):
        self.counter.release(self.key)


def _peak_saved(planner, plan, batches, recompute, monkeypatch):
    model = Model()
    counter = _SavedBytes(model.parameters())
    inputs = [0]  # bytes of the checkpointed calls' tensor inputs (kept until their backward)
    real = torch.utils.checkpoint.checkpoint

    def counting(fn, *args, **kwargs):
        seen = {a.storage().data_ptr(): a.storage().nbytes() for a in args if torch.is_tensor(a)}
        inputs[0] += sum(seen.values())
        return real(fn, *args, **kwargs)

    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", counting)
    ex = PipelineExecutor(model, _loss, None, parallel=planner.parallel, recompute=recompute)
    torch.manual_seed(1)
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
        ex.run(plan, batches, loss_scale=1e-3)
    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", real)
    assert counter.now == 0  # every saved tensor was released by its backward
    return counter.peak, inputs[0]


def test_recompute_saves_activation_memory(one_process, monkeypatch):
    # GPipe: every micro-batch's forward runs before the first backward, so the peak holds
    # all of their activations; the override runs the same plan three ways.
    planner, plan, batches = _plan("gpipe", "full", micro_batches=6)
    assert len(batches) >= 6
    none, none_in = _peak_saved(planner, plan, batches, "none", monkeypatch)
    sel, sel_in = _peak_saved(planner, plan, batches, "selective", monkeypatch)
    full, full_in = _peak_saved(planner, plan, batches, "full", monkeypatch)
    assert none_in == 0 and full_in == 0 and sel_in > 0
    # Selective drops the attention cores' scores and probabilities (mbs x heads x seqlen^2
    # per block) and keeps their inputs (q, k, v, the mask) instead: still less in all.
    assert sel + sel_in < none, (none, sel, sel_in)
    # Full keeps no activation between forward and backward, only one micro-batch's replayed
    # graph at a time (of 6 or more).
    assert full < none / 3, (none, full)


def test_selective_without_marks_recomputes_full(one_process):
    planner, plan, batches = _plan("zb-h1", "selective")
    scale = 1.0 / sum(b["num_labels"] for b in batches)
    with pytest.warns(RuntimeWarning, match=r"stage 0 marks nothing to recompute selectively "
                                            r"\(no submodule has sluice_recompute = True\), so "
                                            r"its 'selective' micro-batches recompute 'full'"):
        got = _executor_run(planner, plan, batches, scale, model=Model(marked=False))
    _assert_same(got, _reference(batches, scale))
    with pytest.warns(RuntimeWarning, match=r"recompute_modules matches no submodule"):
        _executor_run(planner, plan, batches, scale, recompute_modules=["nothing.*"])


def test_recompute_modules_names_and_callable(one_process):
    # zb-h1: with "blocks.0" marked, that block's linear layers run inside the checkpoint and
    # are left out of the split backward's tape (autograd computes their weight gradients).
    planner, plan, batches = _plan("zb-h1", "selective")
    scale = 1.0 / sum(b["num_labels"] for b in batches)
    want = _reference(batches, scale)
    calls = []

    def pick(stage, module):
        calls.append(stage)
        return [blk.core for blk in module.blocks]

    for how in (["blocks.*.core"], pick, ["blocks.0", "blocks.*.core"]):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _assert_same(_executor_run(planner, plan, batches, scale,
                                       model=Model(marked=False), recompute_modules=how), want)
    assert calls == [0]  # asked once per stage
    with pytest.raises(sluice.Error, match=r"recompute_modules: the callable returned Linear "
                                           r"for stage 0; allowed: submodules"):
        _executor_run(planner, plan, batches, scale,
                      recompute_modules=lambda s, m: [torch.nn.Linear(2, 2)])
    with pytest.raises(sluice.Error, match=r"recompute: 'some' is not allowed; allowed: None"):
        PipelineExecutor(Model(), _loss, parallel=planner.parallel, recompute="some")
    with pytest.raises(TypeError, match="recompute_modules: expected None, a list"):
        PipelineExecutor(Model(), _loss, parallel=planner.parallel, recompute_modules=3)


def test_checkpointed_forward_is_restored(one_process):
    planner, plan, batches = _plan("1f1b", "selective")
    model = Model()
    _executor_run(planner, plan, batches, 1e-3, model=model)
    for blk in model.blocks:
        assert "forward" not in blk.core.__dict__  # the class's forward again
