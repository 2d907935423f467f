"""The pybind11 module: specs through the C++ readers, planning, simulation, errors."""

import json
import os

import pytest

import sluice

# DynaPipe's GPT setting: GPT-6.7B on 8 A100-40GB, 2 replicas of 4 pipeline stages.
SMALL = dict(model="gpt-6.7b", cluster="a100-40g:8", parallel="dp=2,pp=4,zero=1",
             method="dynapipe", schedule="1f1b", max_seqlen=2048)
LENGTHS = [37, 2048, 200, 90, 300, 18, 64, 1480, 120, 250, 33, 77, 900, 1200, 510, 60, 700, 45,
           2000, 333, 128, 256, 1024, 77, 400, 640, 15, 1800, 95, 410]


def test_presets_dicts_and_files_round_trip(tmp_path):
    m = sluice.model("gpt-6.7b")
    assert m.name == "gpt-6.7b" and m.layers == 32 and m.kind == "decoder-only"
    d = m.to_dict()
    assert sluice.model(d) == m
    path = tmp_path / "model.json"
    path.write_text(json.dumps(d))
    assert sluice.model(str(path)) == m
    assert sluice.model(path) == m  # os.PathLike

    c = sluice.cluster("a100-40g:16")
    assert c.devices == 16
    assert sluice.cluster(c.to_dict()) == c

    p = sluice.parallel("dp=2,pp=4,zero=1")
    assert (p.dp, p.pp, p.tp, p.zero) == (2, 4, 1, 1)
    assert sluice.parallel(dp=2, pp=4, zero=1) == p
    assert sluice.parallel(p.to_dict()) == p
    assert p.layer_cut == []
    uneven = sluice.parallel("dp=2,pp=4,layer_cut=9+8+8+7")
    assert uneven.layer_cut == [9, 8, 8, 7]
    assert sluice.parallel(uneven.to_dict()) == uneven
    assert "layer_cut=9+8+8+7" in repr(uneven)
    assert p.order == "tp-cp-dp-pp"
    inner = sluice.parallel("dp=2,pp=4,order=tp-cp-pp-dp")
    assert inner.order == "tp-cp-pp-dp"
    assert sluice.parallel(inner.to_dict()) == inner
    assert sluice.parallel(dp=2, pp=4, order="tp-cp-pp-dp") == inner
    assert "gpt-tiny" in sluice.model_presets()
    assert "a100-40g" in sluice.device_presets()


def test_errors_are_sluice_errors_with_the_message(tmp_path):
    with pytest.raises(sluice.Error) as e:
        sluice.model("gpt-nope")
    assert isinstance(e.value, ValueError)
    assert "gpt-6.7b" in str(e.value)  # the message lists the presets
    assert e.value.code == "not found"

    with pytest.raises(sluice.Error, match="hidden"):
        d = sluice.model("gpt-tiny").to_dict()
        d["hidden"] = "wide"
        sluice.model(d)

    bad = tmp_path / "cluster.json"
    bad.write_text("{not json")
    with pytest.raises(sluice.Error, match="cluster.json"):
        sluice.cluster(str(bad))

    with pytest.raises(sluice.Error, match="allowed"):
        sluice.parallel("dp=2,bogus=3")

    with pytest.raises(TypeError):
        sluice.model(42)

    # An impossible configuration: 4 pipeline stages of gpt-tiny on 2 devices.
    with pytest.raises(sluice.Error, match="devices"):
        sluice.Planner(model="gpt-tiny", cluster="a100-40g:2", parallel="dp=1,pp=4")

    with pytest.raises(sluice.Error, match="1f1b"):
        sluice.Planner(**{**SMALL, "schedule": "fastest"})

    planner = sluice.Planner(**SMALL)
    with pytest.raises(sluice.Error, match="max_seqlen 2048"):
        planner.plan([100, 9000])
    with pytest.raises(sluice.Error, match="allowed: lengths >= 1"):
        planner.plan([100, 0])
    with pytest.raises(sluice.Error, match="max_seqlen"):
        sluice.Planner(**{**SMALL, "max_seqlen": 100000})
    with pytest.raises(sluice.Error, match="dynapipe"):
        sluice.Planner(**{**SMALL, "method": "magic"}).plan(LENGTHS)
    with pytest.raises(TypeError):
        planner.plan(["a", "b"])


def test_plan_covers_every_sample_once_and_exports():
    planner = sluice.Planner(**SMALL)
    assert planner.dp == 2 and planner.max_seqlen == 2048
    plan = planner.plan(LENGTHS, ids=[100 + i for i in range(len(LENGTHS))])
    assert plan.ok, plan.infeasible_reason
    assert plan.sample_ids == sorted(100 + i for i in range(len(LENGTHS)))
    seen = []
    for d in range(plan.dp):
        for mb in plan.micro_batches(d):
            assert mb["mbs"] == len(mb["rows"])
            assert len(mb["stages"]) == 4 and mb["stages"][0]["forward_ms"] > 0
            assert mb["seqlen"] >= max(LENGTHS[i - 100] for i in mb["sample_ids"]) or mb["varlen"]
            seen.extend(mb["sample_ids"])
    assert sorted(seen) == plan.sample_ids
    assert plan.makespan_ms > 0 and len(plan.peak_memory_bytes) == 4
    assert max(plan.peak_memory_bytes) <= plan.memory_limit_bytes
    assert plan.num_ranks == 8
    assert len(plan.instructions(0)) > 0 and len(plan.instructions(7)) > 0
    doc = json.loads(plan.to_json())
    assert doc["format"] == "sluice-plan/1" and doc["method"] == "dynapipe"
    csv = plan.to_csv(replica=1)
    n_mb = len(plan.micro_batches(1))
    # compute_only, one line per stage: F and B once per micro-batch ("2F0,2F1,2B0,...")
    rows = csv.splitlines()
    assert len(rows) == 4
    for stage, row in enumerate(rows):
        actions = row.split(",")
        assert sorted(a for a in actions if "F" in a) == sorted(f"{stage}F{m}" for m in range(n_mb))
        assert sum("B" in a for a in actions) == n_mb
    with pytest.raises(sluice.Error, match="allowed: 0..1"):
        plan.micro_batches(2)
    plan.validate()


def test_plan_is_deterministic_and_written(tmp_path):
    a = sluice.Planner(**SMALL).plan(LENGTHS)
    b = sluice.Planner(**SMALL).plan(LENGTHS)
    assert a.to_json() == b.to_json()
    out = tmp_path / "plan.json"
    a.write(out)
    assert json.loads(out.read_text()) == json.loads(a.to_json())


def test_simulate():
    plan = sluice.Planner(**SMALL).plan(LENGTHS)
    r = sluice.simulate(plan)
    assert r.outcome == "ok"
    assert r.iteration_time_ms > 0
    assert r.real_tokens == sum(LENGTHS)
    assert r.tokens_per_second == pytest.approx(r.real_tokens / (r.iteration_time_ms / 1e3),
                                                rel=1e-6)
    assert len(r.peak_memory_bytes) == 8 and min(r.peak_memory_bytes) > 0
    assert 0 <= r.bubble_fraction < 1
    assert not r.memory_exceeded
    with pytest.raises(sluice.Error, match="closed-form"):
        sluice.simulate(plan, collectives="magic")
    with pytest.raises(TypeError):
        sluice.simulate("plan.json")


def test_out_of_memory_is_an_outcome():
    # A 20,000 MB budget holds the model states and a few 2048-token micro-batches in flight,
    # not 8 of them under 1F1B with padding.
    planner = sluice.Planner(**{**SMALL, "parallel": {"dp": 2, "pp": 4, "zero": 1,
                                                      "memory_limit_mb": 20000},
                                "method": "padding"})
    assert planner.plan([2048] * 4).ok
    plan = planner.plan([2048] * 16)
    assert not plan.ok
    assert plan.outcome == "out-of-memory" and "does not fit" in plan.infeasible_reason
    with pytest.raises(sluice.Error, match="could not be planned"):
        plan.to_json()
    with pytest.raises(sluice.Error, match="could not be planned"):
        sluice.simulate(plan)


def test_planning_releases_the_gil():
    import threading
    import time
    planner = sluice.Planner(**SMALL)
    lengths = LENGTHS * 20
    ticks = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    t = threading.Thread(target=tick)
    t.start()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.3:
        planner.plan(lengths)
    elapsed = time.perf_counter() - t0
    stop.set()
    t.join()
    # The ticking thread ran throughout (with the GIL held it would stall for each plan).
    assert len(ticks) > 0.2 * elapsed / 0.001
