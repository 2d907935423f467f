"""sluice: plan and simulate distributed training of transformers on variable-length data.

Thin Python front over the C++ planner and simulator (docs/python.md)::

    import sluice
    planner = sluice.Planner(model="gpt-6.7b", cluster="a100-40g:8",
                             parallel="dp=2,pp=4,zero=1", method="dynapipe", schedule="1f1b")
    plan = planner.plan([512, 1024, 77, ...])       # one global batch of sample lengths
    plan.micro_batches(replica=0)                    # [{'rows': [[ids...], ...], 'seqlen': ..}]
    result = sluice.simulate(plan)                   # iteration time, tokens/s, peak memory

Specs are read by the same C++ readers the CLI uses; bad input raises :class:`sluice.Error`
(a ``ValueError``) whose message is sluice's own (naming the file or field and the allowed
values) and whose ``code`` is sluice's status code name.
"""

import json as _json
import os as _os

# An installed package (pip install .) carries the data files (length presets, profiled cost
# tables) in sluice/data/; the C++ side finds them through SLUICE_DATA_DIR unless it is set.
_DATA = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "data")
if not _os.environ.get("SLUICE_DATA_DIR") and _os.path.isdir(_os.path.join(_DATA, "profiles")):
    _os.environ["SLUICE_DATA_DIR"] = _DATA

from . import _sluice
from ._sluice import Error, ModelSpec, ClusterSpec, ParallelConfig, model_presets, device_presets

__version__ = _sluice.__version__

__all__ = [
    "Error", "ModelSpec", "ClusterSpec", "ParallelConfig", "Planner", "Plan", "SimResult",
    "simulate", "model_presets", "device_presets", "model", "cluster", "parallel",
]


def _json_text(d, what):
    try:
        return _json.dumps(d)
    except (TypeError, ValueError) as e:
        raise Error(f"{what}: the dict cannot be written as JSON ({e})") from None


def _spec(kind, value, what, from_text):
    """A spec from an instance, a dict, a JSON file path or a preset/flag string."""
    if isinstance(value, kind):
        return value
    if isinstance(value, dict):
        return kind._from_json_text(_json_text(value, what), what)
    if isinstance(value, _os.PathLike):
        value = _os.fspath(value)
    if isinstance(value, str):
        return from_text(value)
    raise TypeError(
        f"{what}: expected a sluice.{kind.__name__}, a dict, a JSON file path or a preset "
        f"string, got {type(value).__name__}")


def model(value):
    """ModelSpec from a preset name ('gpt-6.7b'), a JSON file path, a dict or a ModelSpec."""
    return _spec(ModelSpec, value, "model", ModelSpec.resolve)


def cluster(value):
    """ClusterSpec from 'PRESET:N' ('a100-40g:8'), a JSON file path, a dict or a ClusterSpec."""
    return _spec(ClusterSpec, value, "cluster", ClusterSpec.resolve)


def parallel(value=None, **degrees):
    """ParallelConfig from 'dp=2,pp=4', a JSON file path, a dict, keywords or a ParallelConfig."""
    if value is None:
        value = dict(degrees)
    elif degrees:
        raise TypeError("parallel: give either a value or keywords, not both")
    return _spec(ParallelConfig, value, "parallel", ParallelConfig.resolve)


def _to_dict(spec):
    return _json.loads(spec._to_json_text())


ModelSpec.to_dict = _to_dict
ClusterSpec.to_dict = _to_dict
ParallelConfig.to_dict = _to_dict
ModelSpec.from_dict = staticmethod(lambda d: _spec(ModelSpec, d, "model", ModelSpec.resolve))
ClusterSpec.from_dict = staticmethod(lambda d: _spec(ClusterSpec, d, "cluster", ClusterSpec.resolve))
ParallelConfig.from_dict = staticmethod(
    lambda d: _spec(ParallelConfig, d, "parallel", ParallelConfig.resolve))


def _ints(values, what):
    try:
        return [int(v) for v in values]
    except (TypeError, ValueError):
        raise TypeError(f"{what}: expected a sequence of integers") from None


class Planner:
    """Plans global batches into validated execution plans (planner/planner.h).

    model, cluster, parallel: anything :func:`model`, :func:`cluster`, :func:`parallel` take.
    method: padding, sorted, token-budget, packing, multipack, dynapipe, hydraulis.
    schedule: gpipe, 1f1b, interleaved, zb-h1, adaptive.
    max_seqlen: the longest sample (tokens); 0 = min(2048, the model's max_position).
    cost: auto, analytic, profiled:PATH, analytic:PATH (cost/cost_factory.h).
    """

    def __init__(self, model="gpt-6.7b", cluster="a100-40g:8", parallel="dp=2,pp=4,zero=1", *,
                 method="dynapipe", schedule="1f1b", seed=0, max_seqlen=0, cost="auto",
                 search_order=True, recompute=None):
        m, c, p = globals()["model"](model), globals()["cluster"](cluster), \
            globals()["parallel"](parallel)
        self._impl = _sluice._Planner(m, c, p, str(method), str(schedule), int(seed),
                                      int(max_seqlen), str(cost), bool(search_order),
                                      "" if recompute is None else str(recompute))
        self.method = method
        self.schedule = schedule
        self.seed = seed

    model = property(lambda self: self._impl.model)
    cluster = property(lambda self: self._impl.cluster)
    parallel = property(lambda self: self._impl.parallel)
    max_seqlen = property(lambda self: self._impl.max_seqlen)
    cost_model = property(lambda self: self._impl.cost_model)
    memory_limit_bytes = property(lambda self: self._impl.memory_limit_bytes)
    dp = property(lambda self: self._impl.parallel.dp)

    def plan(self, lengths, target_lengths=None, ids=None):
        """Plans one global batch: `lengths` per sample (encoder-decoder models: input lengths,
        with `target_lengths`); sample ids are `ids`, or 0..n-1. Returns a :class:`Plan` (whose
        ``ok`` is False when the batch cannot fit memory: an outcome, not an error)."""
        return Plan(self._impl.plan(_ints(lengths, "lengths"),
                                    [] if target_lengths is None else
                                    _ints(target_lengths, "target_lengths"),
                                    [] if ids is None else _ints(ids, "ids")))

    def __repr__(self):
        p = self.parallel
        return (f"<sluice.Planner {self.model.name} on {self.cluster.name}, dp={p.dp} pp={p.pp} "
                f"tp={p.tp}, {self.method}/{self.schedule}>")


class Plan:
    """One planned global batch: micro-batches per replica, per-rank instruction streams,
    predicted costs. Accessors other than ``ok``/``outcome``/``infeasible_reason`` raise
    :class:`Error` on a plan that is not ok."""

    def __init__(self, impl):
        self._impl = impl

    ok = property(lambda self: self._impl.ok)
    outcome = property(lambda self: self._impl.outcome)
    infeasible_reason = property(lambda self: self._impl.infeasible_reason)
    method = property(lambda self: self._impl.method)
    dp = property(lambda self: self._impl.dp)
    pp = property(lambda self: self._impl.pp)
    makespan_ms = property(lambda self: self._impl.makespan_ms)
    given_order_makespan_ms = property(lambda self: self._impl.given_order_makespan_ms)
    bubble_fraction = property(lambda self: self._impl.bubble_fraction)
    planning_time_ms = property(lambda self: self._impl.planning_time_ms)
    peak_memory_bytes = property(lambda self: self._impl.peak_memory_bytes)
    memory_limit_bytes = property(lambda self: self._impl.memory_limit_bytes)
    cost_model = property(lambda self: self._impl.cost_model)
    sample_ids = property(lambda self: self._impl.sample_ids)
    dropped = property(lambda self: self._impl.dropped)
    num_ranks = property(lambda self: self._impl.num_ranks)

    def micro_batches(self, replica=0):
        """The replica's micro-batches in execution order: dicts with rows (sample ids per row),
        sample_ids, mbs, seqlen, dec_seqlen, varlen, recompute, stages (predicted cost per
        virtual stage: forward_ms, backward_input_ms, backward_weight_ms, stored_bytes,
        peak_bytes)."""
        return self._impl.micro_batches(int(replica))

    def schedule(self, replica=0):
        return self._impl.schedule(int(replica))

    def instructions(self, rank):
        """The rank's instruction stream as text, one instruction per entry."""
        return self._impl.instructions(int(rank))

    def program(self, rank):
        """The rank's program as data: {rank, dp, pp, buffer_slots, instructions}, each
        instruction a dict with the plan file's field names (op, mb, stage, peer, tag, bucket,
        shapes, in, out, bytes, rc, ns; absent fields left out) plus ``text``, its short name
        ('1F0', '0SEND_F3', 'ALLREDUCE(b2)'). What :class:`sluice.torch.PipelineExecutor`
        runs."""
        return self._impl.program(int(rank))

    vpp = property(lambda self: self._impl.vpp)
    tp = property(lambda self: self._impl.tp)
    zero = property(lambda self: self._impl.zero)
    model = property(lambda self: self._impl.model)
    samples = property(lambda self: self._impl.samples)  # [(id, tokens)] the batch was planned from

    def to_bytes(self):
        """The plan as MessagePack bytes with the planner's figures, for :meth:`from_bytes` on
        another process (PlanningBatchSampler's rank-0 planning sends plans this way)."""
        head = _json.dumps({
            "makespan_ms": self.makespan_ms,
            "given_order_makespan_ms": self.given_order_makespan_ms,
            "bubble_fraction": self.bubble_fraction, "planning_time_ms": self.planning_time_ms,
            "peak_memory_bytes": self.peak_memory_bytes, "samples": self.samples}).encode()
        return len(head).to_bytes(4, "little") + head + self._impl.to_msgpack()

    @staticmethod
    def from_bytes(data):
        """The plan :meth:`to_bytes` wrote. Raises :class:`Error` on bytes that are not one."""
        data = bytes(data)
        n = int.from_bytes(data[:4], "little") if len(data) >= 4 else -1
        try:
            head = _json.loads(data[4:4 + n]) if 0 <= n <= len(data) - 4 else None
        except ValueError:
            head = None
        if not isinstance(head, dict):
            raise Error("Plan.from_bytes: not bytes written by Plan.to_bytes")
        return Plan(_sluice._plan_from_msgpack(
            data[4 + n:], head["makespan_ms"], head["given_order_makespan_ms"],
            head["bubble_fraction"], head["planning_time_ms"], head["peak_memory_bytes"],
            [tuple(s) for s in head["samples"]]))

    def to_json(self, indent=None):
        """The plan as sluice-plan/1 JSON text (what `sluice plan --out` writes)."""
        return self._impl.to_json(-1 if indent is None else int(indent))

    def to_csv(self, replica=0, comms=False):
        """One replica's pipeline order as torch.distributed.pipelining CSV (compute_only, or
        compute_comms with `comms`), as `sluice plan csv` writes it."""
        return self._impl.to_csv(int(replica), bool(comms))

    def write(self, path):
        """Writes the plan file (JSON, or MessagePack for a .msgpack path)."""
        self._impl.write(_os.fspath(path))

    def validate(self):
        self._impl.validate()

    def __repr__(self):
        if not self.ok:
            return f"<sluice.Plan {self.outcome}: {self.infeasible_reason}>"
        return (f"<sluice.Plan {self.method}, dp={self.dp} pp={self.pp}, "
                f"makespan {self.makespan_ms:.1f} ms>")


class SimResult(dict):
    """The simulator's figures of one plan (sim/simulator.h), as a dict with attribute access:
    outcome, iteration_time_ms, tokens_per_second, real_tokens, padded_tokens, mfu,
    peak_memory_bytes (per rank), bubble_fraction (mean over ranks of bubble / iteration time),
    bubble_fraction_per_rank, memory_exceeded, memory_limit_bytes, stage_imbalance,
    replica_imbalance, problem."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def simulate(plan, collectives="stepwise"):
    """Simulates a plan (discrete events: streams, links, memory); returns a :class:`SimResult`."""
    if not isinstance(plan, Plan):
        raise TypeError(f"simulate: expected a sluice.Plan, got {type(plan).__name__}")
    return SimResult(plan._impl.simulate(str(collectives)))
