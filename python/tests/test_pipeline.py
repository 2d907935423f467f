"""PipelineExecutor: plans run on user stage modules. Multi-process tests (names with
"distributed") run examples/python/train_pipeline.py on Gloo and compare its losses with the
same model trained in one process on the same micro-batches; the others run in this process."""

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

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


def _compare(tmp_path, *args):
    pipe = _example(tmp_path, "pipe", *args)
    ref = _example(tmp_path, "ref", "--reference", *args)
    assert len(pipe["losses"]) == len(ref["losses"]) == 3
    for a, b in zip(pipe["losses"], ref["losses"]):
        assert abs(a - b) <= 1e-5, (pipe["losses"], ref["losses"])
    assert ref["losses"][-1] < ref["losses"][0]  # it trains
    assert pipe["tokens_per_second"] > 0
    return pipe


def test_pipeline_distributed_1f1b_matches_one_process(tmp_path):
    _compare(tmp_path)  # the example as shipped: 2 processes, dp 1, pp 2, 1F1B, dynapipe


def test_pipeline_distributed_dp2_split_backward_store(tmp_path):
    # 4 processes: 2 replicas of 2 stages; zb-h1 splits every backward into I and W; gradients
    # are all-reduced by the plan's buckets; rank 0 plans and shares its plans via the store.
    _compare(tmp_path, "--dp", "2", "--schedule", "zb-h1", "--share", "store")


def test_pipeline_distributed_recompute_full_gpipe(tmp_path):
    _compare(tmp_path, "--schedule", "gpipe", "--recompute", "full", "--method", "packing")


# --- one process: plans with one stage, errors, profiler names --------------------------------

SPEC = {"name": "t", "layers": 2, "hidden": 16, "heads": 2, "ffn_hidden": 32, "vocab": 32,
        "max_position": 64, "tied_embeddings": False}


@pytest.fixture
def one_process(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


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


def test_executor_without_process_group():
    with pytest.raises(sluice.Error, match="torch.distributed is not initialised"):
        PipelineExecutor(Whole(), _loss, parallel="dp=1,pp=1")


def test_pipeline_distributed_recompute_full_zb_h1(tmp_path):
    # The split backward's recorded linear layers come from the replayed forward.
    _compare(tmp_path, "--schedule", "zb-h1", "--recompute", "full")
