"""PipelineExecutor: plans run on user stage modules. Multi-process tests (names with
"distributed") run examples/python/train_pipeline.py on Gloo and compare its losses with the
same model trained in one process on the same micro-batches; the others run in this process."""

import json
import os
import socket
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import sluice  # noqa: E402
from sluice.torch import PipelineExecutor, PlanCollator, PlanningBatchSampler  # noqa: E402

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples",
                       "python", "train_pipeline.py")
SMALL = ["--steps", "3", "--samples", "160", "--tokens-per-batch", "2048", "--max-seqlen", "256",
         "--quiet"]


def _example(tmp_path, name, *args):
    out = tmp_path / f"{name}.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, EXAMPLE, *SMALL, *args, "--out", str(out)], env=env,
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(out.read_text())


def _grads(prefix, ranks):
    return [torch.load(f"{prefix}-rank-{r}.pt") for r in ranks]


def _same_grads(got, want, tol, what):
    """Every gradient in `got` (one rank's {name: grad}) equals `want`'s within tol."""
    assert got, what
    for name, g in got.items():
        err = (g - want[name]).abs().max().item()
        assert err <= tol, (what, name, err)


def _compare(tmp_path, *args, grads=False):
    """The example on processes against --reference (one process, the same micro-batches):
    every step's loss within 1e-5 and, with grads, every first-step gradient of every rank."""
    extra = ["--grads", str(tmp_path / "g")] if grads else []
    pipe = _example(tmp_path, "pipe", *args, *extra)
    ref = _example(tmp_path, "ref", "--reference", *args, *extra)
    assert len(pipe["losses"]) == len(ref["losses"]) == 3
    for a, b in zip(pipe["losses"], ref["losses"]):
        assert abs(a - b) <= 1e-5, (pipe["losses"], ref["losses"])
    assert ref["losses"][-1] < ref["losses"][0]  # it trains
    assert pipe["tokens_per_second"] > 0
    if grads:
        want = torch.load(tmp_path / "g-reference.pt")
        for r, got in enumerate(_grads(tmp_path / "g", range(2))):
            _same_grads(got, want, 1e-5, f"rank {r}")
    return pipe


def test_pipeline_distributed_1f1b_matches_one_process(tmp_path):
    # The example as shipped: 2 processes, dp 1, pp 2, 1F1B, dynapipe, the head tied to the
    # token embedding (the executor sums the tied weight's two gradients): losses and every
    # gradient of both ranks (the tied weight's on both) equal the one-process tied model's.
    _compare(tmp_path, grads=True)
    want = torch.load(tmp_path / "g-reference.pt")
    first, last = _grads(tmp_path / "g", range(2))
    assert "tok.weight" in first and "tok.weight" in last  # the tied weight, on both ends
    assert "head.weight" not in want  # one parameter in the one-process model
    assert set(first) | set(last) == set(want)


def test_pipeline_distributed_untied(tmp_path):
    _compare(tmp_path, "--untied")


def test_pipeline_distributed_dp2_split_backward_store(tmp_path):
    # 4 processes: 2 replicas of 2 stages; zb-h1 splits every backward into I and W; gradients
    # are all-reduced by the plan's buckets; rank 0 plans and shares its plans via the store.
    _compare(tmp_path, "--dp", "2", "--schedule", "zb-h1", "--share", "store")


def test_pipeline_distributed_recompute_full_gpipe(tmp_path):
    _compare(tmp_path, "--schedule", "gpipe", "--recompute", "full", "--method", "packing",
             "--untied")


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
def test_pipeline_distributed_recompute_selective(tmp_path, schedule):
    # The plans recompute 'selective': the executor checkpoints the example's CoreAttention.
    # Against the one-process reference (1e-5) and against the same plans run without
    # recompute (--exec-recompute none): losses and gradients within 1e-6.
    # --saved-bytes: every rank's peak activation bytes kept for the backward are less.
    sel = _compare(tmp_path, "--schedule", schedule, "--recompute", "selective", "--saved-bytes",
                   grads=True)
    sel_grads = _grads(tmp_path / "g", range(2))
    keep = _example(tmp_path, "keep", "--schedule", schedule, "--recompute", "selective",
                    "--exec-recompute", "none", "--grads", str(tmp_path / "k"), "--saved-bytes")
    for a, b in zip(sel["losses"], keep["losses"]):
        assert abs(a - b) <= 1e-6, (sel["losses"], keep["losses"])
    for a, b in zip(sel["peak_saved_bytes"], keep["peak_saved_bytes"]):
        assert 0 < a < b, (sel["peak_saved_bytes"], keep["peak_saved_bytes"])
    for r, (a, b) in enumerate(zip(sel_grads, _grads(tmp_path / "k", range(2)))):
        assert a.keys() == b.keys()
        _same_grads(a, b, 1e-6, f"rank {r}")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tied_worker(rank, port, out):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    stage = Whole()
    tied = {"emb": stage.emb.weight} if rank == 0 else \
        {"emb": stage.out.weight, "x": stage.out.bias}
    try:
        PipelineExecutor(stage, _loss, parallel="dp=1,pp=2", tied_parameters=tied)
        msg = ""
    except sluice.Error as e:
        msg = str(e)
    with open(f"{out}-{rank}", "w") as f:
        f.write(msg)
    dist.destroy_process_group()


def test_pipeline_distributed_tied_mismatch(tmp_path):
    # The two ends name different tied parameters: both ranks raise (no hang), saying what each
    # end ties.
    mp.spawn(_tied_worker, args=(_free_port(), str(tmp_path / "msg")), nprocs=2, join=True)
    for rank in range(2):
        msg = (tmp_path / f"msg-{rank}").read_text()
        assert "tied_parameters: this rank (" + ("first" if rank == 0 else "last") in msg, msg
        assert "'emb' [32, 16] torch.float32" in msg and "'x' [32] torch.float32" in msg, msg
        assert "allowed: the same names, shapes and dtypes on both ends" in msg, msg


# --- one process: plans with one stage, errors, profiler names --------------------------------

SPEC = {"name": "t", "layers": 2, "hidden": 16, "heads": 2, "ffn_hidden": 32, "vocab": 32,
        "max_position": 64, "tied_embeddings": False}


class Whole(torch.nn.Module):
    def __init__(self, hidden=16):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.out = torch.nn.Embedding(32, hidden), torch.nn.Linear(hidden, 32)

    def forward(self, ids, batch):
        return self.out(torch.tanh(self.emb(ids)))


def _loss(logits, batch):
    return torch.nn.functional.cross_entropy(logits.reshape(-1, 32), batch["labels"].reshape(-1),
                                             ignore_index=-100, reduction="sum")


def _data():
    return [{"input_ids": [(i * 7 + j) % 32 for j in range(5 + (i * 13) % 40)]} for i in range(40)]


def test_plan_program_and_bytes():
    planner = sluice.Planner(model=SPEC, cluster="a100-40g:2", parallel="dp=1,pp=2", max_seqlen=64)
    plan = planner.plan([10, 20, 64, 5, 7, 33, 12, 60, 41, 8, 9, 30])
    prog = plan.program(1)
    assert prog["rank"] == 1 and prog["pp"] == 1 and prog["buffer_slots"] > 0
    texts = [i["text"] for i in prog["instructions"]]
    assert texts == plan.instructions(1)
    recv = next(i for i in prog["instructions"] if i["op"] == "recv-act-start")
    mb = plan.micro_batches(0)[recv["mb"]]
    assert recv["shapes"] == [[mb["mbs"], mb["seqlen"], 16]] and recv["peer"] == 0
    again = sluice.Plan.from_bytes(plan.to_bytes())
    assert again.to_json() == plan.to_json() and again.samples == plan.samples
    assert again.makespan_ms == plan.makespan_ms
    with pytest.raises(sluice.Error, match="rank: 2 is not a rank"):
        plan.program(2)
    with pytest.raises(sluice.Error, match="not bytes written by Plan.to_bytes"):
        sluice.Plan.from_bytes(b"\x01\x00")


def test_plan_collator_shapes():
    data = _data()
    mb = {"rows": [[0, 1], [2]], "mbs": 2, "seqlen": 40, "varlen": True}
    b = PlanCollator(data, max_seqlen=64)(mb)
    assert b["input_ids"].shape == (2, 40) and b["labels"].shape == (2, 40)
    n0, n1, n2 = (len(data[i]["input_ids"]) for i in range(3))
    assert b["seq_lens"] == [[n0, n1], [n2]] and b["num_labels"] == n0 + n1 + n2 - 3
    assert b["position_ids"][0, n0].item() == 0  # varlen: positions restart per document
    assert b["labels"][0, n0 - 1].item() == -100  # no label across a document boundary
    assert b["labels"][0, 0].item() == data[0]["input_ids"][1]  # shifted: next token
    assert b["document_ids"][0, n0].item() == 2 and b["document_ids"][1, n2].item() == 0
    b = PlanCollator(data, max_seqlen=64)({**mb, "varlen": False})
    assert b["position_ids"][0, n0].item() == n0  # packed rows: positions run on
    with pytest.raises(sluice.Error, match="row 0 needs"):
        PlanCollator(data, max_seqlen=64)({**mb, "seqlen": 10})


def test_executor_one_stage_equals_plain_loop(one_process):
    data = _data()
    planner = sluice.Planner(model=SPEC, cluster="a100-40g:1", parallel="dp=1,pp=1",
                             max_seqlen=64)
    sampler = PlanningBatchSampler([len(d["input_ids"]) for d in data], planner, 256, seed=1)
    collate = PlanCollator(data, 64)
    model, ref = Whole(), Whole()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    ex = PipelineExecutor(model, _loss, opt, parallel=planner.parallel)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for planned in sampler.plans():
            batches = [collate(mb) for mb in planned.micro_batches]
            scale = 1.0 / planned.num_label_tokens()
            got = ex.run(planned.plan, batches, loss_scale=scale)["loss"]
            want = 0.0
            for b in batches:
                loss = _loss(ref(b["input_ids"], b), b) * scale
                loss.backward()
                want += loss.item()
            ref_opt.step()
            ref_opt.zero_grad()
            assert abs(got - want) < 1e-6
    for a, b in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(a, b, atol=1e-6)
    names = {e.name for e in prof.events()}
    assert {"0LOAD0", "0F0", "0B0", "STEP"} <= names, sorted(names)[:20]
    assert ex.stats["iterations"] == len(sampler.steps())


def test_executor_errors(one_process):
    data = _data()
    planner = sluice.Planner(model=SPEC, cluster="a100-40g:1", parallel="dp=1,pp=1",
                             max_seqlen=64)
    plan = planner.plan([len(d["input_ids"]) for d in data[:8]])
    batches = [PlanCollator(data, 64)(mb) for mb in plan.micro_batches(0)]
    ex = PipelineExecutor(Whole(), _loss, parallel=planner.parallel)
    with pytest.raises(sluice.Error, match=r"micro_batches: \d+ given, replica 0 of the plan has"):
        ex.run(plan, batches + batches[:1])
    bad = [{**b, "input_ids": b["input_ids"][:, :3]} for b in batches]
    with pytest.raises(sluice.Error, match=r"instruction 0 \(0LOAD0\): .*shape \[\d+, 3\], the "
                                           r"plan says"):
        ex.run(plan, bad)
    with pytest.raises(sluice.Error, match="zero=2; allowed: 0 or 1"):
        PipelineExecutor(Whole(), _loss, parallel="dp=1,pp=1,zero=2")
    with pytest.raises(sluice.Error, match=r"dp=2 x pp=1 = 2 ranks, but the process group has 1"):
        PipelineExecutor(Whole(), _loss, parallel="dp=2,pp=1")
    with pytest.raises(sluice.Error, match=r"stages: \[1\] on pipeline rank 0; allowed: exactly"):
        PipelineExecutor({1: Whole()}, _loss, parallel="dp=1,pp=1")
    two = sluice.Planner(model=SPEC, cluster="a100-40g:2", parallel="dp=1,pp=2", max_seqlen=64)
    with pytest.raises(sluice.Error, match=r"plan: dp=1 pp=2 vpp=1, but the executor was made"):
        ex.run(two.plan([5, 6, 7, 8]), batches)


def test_executor_tied_parameters_errors(one_process):
    with pytest.raises(sluice.Error, match=r"tied_parameters: 'w' is not a parameter of this "
                                           r"rank's stage 0 module"):
        PipelineExecutor(Whole(), _loss, parallel="dp=1,pp=1",
                         tied_parameters={"w": torch.nn.Parameter(torch.zeros(3))})
    with pytest.raises(TypeError, match=r"tied_parameters: expected a dict \{name: "
                                        r"nn.Parameter\}"):
        PipelineExecutor(Whole(), _loss, parallel="dp=1,pp=1", tied_parameters={"w": 3})
    m = Whole()
    # pp = 1: both ends are in the one module; nothing to reduce, accepted.
    PipelineExecutor(m, _loss, parallel="dp=1,pp=1", tied_parameters={"w": m.emb.weight})


def test_executor_without_process_group():
    with pytest.raises(sluice.Error, match="torch.distributed is not initialised"):
        PipelineExecutor(Whole(), _loss, parallel="dp=1,pp=1")


def test_pipeline_distributed_recompute_full_zb_h1(tmp_path):
    # The split backward's recorded linear layers come from the replayed forward.
    _compare(tmp_path, "--schedule", "zb-h1", "--recompute", "full")
