"""PipelineExecutor and PlanCollator: one rank of a sluice plan on the user's own nn.Modules.

A sluice plan (docs/formats.md, "Execution plan") holds one ordered instruction list per rank.
:class:`PipelineExecutor` runs this rank's list, one instruction after the other, exactly as
planned: forwards and backwards of the rank's stage modules, non-blocking point-to-point
transfers (``torch.distributed.isend``/``irecv``) of exactly the plan's shapes (no rank ever
exchanges shapes), the split backward (``backward-input`` then ``backward-weight``) where the plan
says so, data-parallel gradient reduction by the plan's buckets, and the optimizer step. Every
instruction runs inside ``torch.profiler.record_function`` named by the plan's short text
('1F0', '0SEND_F3 to=1', 'ALLREDUCE(b2) group=0,2'), so a profiler trace maps back to the plan.

The code is device-agnostic (CPU with Gloo on torch 1.13, CUDA with NCCL on torch >= 2): buffers
live on the stage modules' device and take their dtype.

Not thread safe: one executor per process, used from one thread.
"""

import fnmatch
import pickle
import time
import warnings

import torch
import torch.utils.checkpoint
import torch.distributed as dist
from torch.profiler import record_function

from . import Error, Plan

__all__ = ["PipelineExecutor", "PlanCollator", "PlannedBatch"]

_COMPUTE = ("forward", "backward", "backward-input", "backward-weight")


class PlannedBatch:
    """One planned global batch as :meth:`PlanningBatchSampler.plans` yields it.

    plan: the :class:`sluice.Plan` (every rank of the job holds the same one).
    replica: this rank's data-parallel replica.
    micro_batches: the replica's micro-batches in the plan's order (dicts as
        ``plan.micro_batches(replica)``: rows of dataset indices, mbs, seqlen, varlen, ...).
    index: the position of this plan in the epoch.
    """

    def __init__(self, plan, replica, index):
        self.plan, self.replica, self.index = plan, replica, index
        self.micro_batches = plan.micro_batches(replica)

    def num_label_tokens(self, shift=1):
        """Labels of the whole global batch (all replicas) when each sample of L tokens predicts
        L - shift of them (PlanCollator: shift 1). A loss summed over tokens and multiplied by
        1 / this gives the batch's mean token loss, so that the reduced gradients of the
        pipelined, data-parallel step equal those of one process."""
        return sum(max(n - shift, 0) for _, n in self.plan.samples)

    def __repr__(self):
        return (f"<sluice.torch.PlannedBatch {self.index}: replica {self.replica}, "
                f"{len(self.micro_batches)} micro-batches>")


class PlanCollator:
    """Builds a plan micro-batch's tensors in exactly the plan's padded shape [mbs, seqlen].

    ``collator(micro_batch)`` takes one dict of ``plan.micro_batches(replica)`` (its ``rows`` of
    dataset indices) and returns:

    input_ids (mbs, seqlen) long: each row's samples one after the other, then ``pad_token_id``.
    labels (mbs, seqlen) long: the next token of the same sample (already shifted: the model
        does not shift), ``ignore_index`` on each sample's last token and on padding.
    position_ids (mbs, seqlen) long: restart at 0 for every sample of a ``varlen`` micro-batch;
        run on along the row otherwise (sluice's packed-row rule); 0 on padding.
    document_ids (mbs, seqlen) long: 1, 2, ... per sample of a row, 0 on padding. A varlen
        micro-batch attends within a document (block-diagonal causal mask); otherwise a row
        attends across its documents.
    varlen (bool), seq_lens (list of lists), num_tokens, num_labels (ints).

    dataset: indexable by dataset index; items are dicts with ``key`` (and optional "labels":
    one per token, shifted here like input_ids) or sequences of token ids. Samples are clipped to
    ``max_seqlen`` (the sampler planned them clipped).
    """

    def __init__(self, dataset, max_seqlen, key="input_ids", pad_token_id=0, ignore_index=-100):
        self.dataset, self.max_seqlen, self.key = dataset, int(max_seqlen), key
        self.pad_token_id, self.ignore_index = pad_token_id, ignore_index

    def _sample(self, i):
        item = self.dataset[i]
        if isinstance(item, dict):
            ids, labels = item[self.key], item.get("labels")
        else:
            ids, labels = item, None
        ids = torch.as_tensor(ids, dtype=torch.long).reshape(-1)[:self.max_seqlen]
        labels = ids if labels is None else \
            torch.as_tensor(labels, dtype=torch.long).reshape(-1)[:self.max_seqlen]
        if labels.numel() != ids.numel():
            raise Error(f"dataset[{i}]: {labels.numel()} labels for {ids.numel()} tokens; "
                        f"allowed: one per token")
        return ids, labels

    def __call__(self, micro_batch):
        rows, mbs, seqlen = micro_batch["rows"], int(micro_batch["mbs"]), int(micro_batch["seqlen"])
        varlen = bool(micro_batch.get("varlen", False))
        if micro_batch.get("dec_seqlen", 0):
            raise Error(f"micro_batch: encoder-decoder (dec_seqlen {micro_batch['dec_seqlen']}); "
                        f"PlanCollator builds decoder-only rows; allowed: a decoder-only plan's "
                        f"micro-batch (use PackedSeq2SeqCollator for encoder-decoder samples)")
        if len(rows) != mbs:
            raise Error(f"micro_batch: {len(rows)} rows for mbs {mbs}; allowed: one row per mbs")
        shape = (mbs, seqlen)
        input_ids = torch.full(shape, self.pad_token_id, dtype=torch.long)
        labels = torch.full(shape, self.ignore_index, dtype=torch.long)
        positions = torch.zeros(shape, dtype=torch.long)
        documents = torch.zeros(shape, dtype=torch.long)
        seq_lens, num_labels = [], 0
        for r, row in enumerate(rows):
            at, lens = 0, []
            for d, i in enumerate(row):
                ids, lab = self._sample(i)
                n = ids.numel()
                if at + n > seqlen:
                    raise Error(f"micro_batch: row {r} needs {at + n} tokens, over the plan's "
                                f"seqlen {seqlen} (was the plan made from these lengths, clipped "
                                f"at max_seqlen {self.max_seqlen}?)")
                input_ids[r, at:at + n] = ids
                labels[r, at:at + n - 1] = lab[1:]
                positions[r, at:at + n] = torch.arange(n) + (0 if varlen else at)
                documents[r, at:at + n] = d + 1
                at += n
                num_labels += max(n - 1, 0)
                lens.append(n)
            seq_lens.append(lens)
        return {"input_ids": input_ids, "labels": labels, "position_ids": positions,
                "document_ids": documents, "varlen": varlen, "seq_lens": seq_lens,
                "num_tokens": sum(sum(x) for x in seq_lens), "num_labels": num_labels}


class _Run:
    """What a forward left for its backward (one micro-batch on one stage)."""

    __slots__ = ("inputs", "outputs", "grad_outputs", "replay", "rng", "split", "tape",
                 "tape_grads")

    def __init__(self):
        self.inputs, self.outputs, self.grad_outputs = [], [], None
        self.replay, self.rng, self.split = False, None, False
        self.tape, self.tape_grads = [], None  # split backward: [(linear, input, output)]


def _tape_linears(module):
    """The nn.Linear layers of `module` whose weight gradient backward-weight computes from a
    recorded input and output gradient (dW = g^T x, db = sum g). A layer whose weight or bias is
    also a parameter elsewhere (tied) is left to autograd."""
    counts = {}
    for m in module.modules():
        for q in m.parameters(recurse=False):
            counts[id(q)] = counts.get(id(q), 0) + 1
    out = []
    for m in module.modules():
        if type(m) is torch.nn.Linear and m.weight.requires_grad and counts[id(m.weight)] == 1 \
                and (m.bias is None or (m.bias.requires_grad and counts[id(m.bias)] == 1)):
            out.append(m)
    return out


def _as_list(x):
    return list(x) if isinstance(x, (tuple, list)) else [x]


def _shape_text(s):
    return "[" + ", ".join(str(int(d)) for d in s) + "]"


class PipelineExecutor:
    """Runs this rank's instruction stream of a sluice plan on the user's stage modules.

    stages: this rank's stage modules: a dict {virtual stage: nn.Module}, or one nn.Module (the
        rank's one stage, vpp = 1). Virtual stage s runs on pipeline rank s % pp.
        Stage 0 is called ``module(input_ids, batch)``, every other stage ``module(x, batch)`` with
        x the activation received from the stage before (a tensor, or a tuple when the plan's
        boundary has several tensors); a stage that is not the last returns the activation the
        plan's shapes describe ([mbs, seqlen, hidden] for decoder-only models: plan with a model
        spec of your model's hidden size). The last stage's output goes to
        ``loss_fn(output, batch)``, which returns a scalar loss.
    loss_fn: see above. ``run``'s ``loss_scale`` multiplies it before the backward.
    optimizer: steps at the plan's optimizer-step (after the gradient reductions), then zeroes
        the gradients (set to None). None: the executor only reduces; the caller steps.
    parallel: the planner's :class:`sluice.ParallelConfig` (or anything ``sluice.parallel``
        takes); every plan run must have its dp and pp. tp must be 1, ZeRO 0 or 1.
    ranks: the torch.distributed rank of each plan rank (plan rank = dp_index * pp + pp_index);
        default: the identity over the default process group (world size = dp * pp).
    grad_reduction: 'sum' (default; use loss_scale = 1 / labels of the global batch, see
        PlannedBatch.num_label_tokens) or 'mean' (divide by dp after the sum).
    device, dtype: of received buffers; default: the stage modules' first parameter's.
    input_key: the batch key stage 0 reads (``batch[input_key]``), checked against the plan's
        load-input shape.
    recompute: None (default: each micro-batch as the plan says, its 'rc') or 'none',
        'selective', 'full' for every micro-batch (memory then differs from the plan's; the math
        does not).
    recompute_modules: the submodules a 'selective' micro-batch recomputes (Megatron's selective
        recompute: the attention core, whose activations grow with seqlen^2). Each marked
        submodule's forward runs under ``torch.utils.checkpoint`` (non-reentrant), so what it
        saves for backward is dropped and recomputed in the backward. None (default): the
        submodules with a true attribute ``sluice_recompute`` (e.g. a class attribute of your
        attention-core module); a list of names or fnmatch patterns of ``named_modules()``
        (``["blocks.*.core"]``); or a callable ``(stage index, stage module) -> submodules``.
        A stage that marks nothing recomputes its 'selective' micro-batches 'full' (a
        RuntimeWarning says so once).
    tied_parameters: {name: parameter} of this rank's end of parameters tied across stages
        (Megatron's embedding group: the first stage's input embedding is the last stage's
        output projection). The rank running stage 0 and the rank running the last stage give
        the same names and shapes; other ranks give none. The constructor copies the first
        stage's values to the last stage's, and every step all-reduces (sums) the tied
        gradients between the two ranks of each replica after the data-parallel reduction, so
        both copies step identically.

    Creating an executor creates the data-parallel process groups (a collective call: every
    rank creates its executor at the same point of the program).
    """

    def __init__(self, stages, loss_fn, optimizer=None, *, parallel, ranks=None,
                 grad_reduction="sum", device=None, dtype=None, input_key="input_ids",
                 recompute=None, recompute_modules=None, tied_parameters=None):
        from . import parallel as _parallel
        if not (dist.is_available() and dist.is_initialized()):
            raise Error("PipelineExecutor: torch.distributed is not initialised; call "
                        "torch.distributed.init_process_group first")
        p = _parallel(parallel)
        if p.tp != 1:
            raise Error(f"parallel: tp={p.tp}; allowed: tp=1 (PipelineExecutor runs no tensor "
                        f"parallelism)")
        if p.zero > 1:
            raise Error(f"parallel: zero={p.zero}; allowed: 0 or 1 (PipelineExecutor all-reduces "
                        f"gradients; ZeRO-2/3 reduce-scatter and all-gather are not supported)")
        if grad_reduction not in ("sum", "mean"):
            raise Error(f"grad_reduction: '{grad_reduction}' is not allowed; allowed: sum, mean")
        if recompute not in (None, "none", "selective", "full"):
            raise Error(f"recompute: '{recompute}' is not allowed; allowed: None (the plan's), "
                        f"none, selective, full")
        if not (recompute_modules is None or callable(recompute_modules) or
                (isinstance(recompute_modules, (list, tuple)) and
                 all(isinstance(x, str) for x in recompute_modules))):
            raise TypeError("recompute_modules: expected None, a list of module names or "
                            "patterns, or a callable (stage, module) -> submodules")
        self.dp, self.pp, self.vpp = p.dp, p.pp, p.vpp
        n = self.dp * self.pp
        world = dist.get_world_size()
        if ranks is None:
            if world != n:
                raise Error(f"parallel: dp={self.dp} x pp={self.pp} = {n} ranks, but the process "
                            f"group has {world}; allowed: equal, or pass ranks=[...] ({n} ranks)")
            ranks = list(range(n))
        ranks = [int(r) for r in ranks]
        if len(ranks) != n or len(set(ranks)) != n or not all(0 <= r < world for r in ranks):
            raise Error(f"ranks: {ranks} is not {n} distinct ranks of the process group (world "
                        f"size {world})")
        me = dist.get_rank()
        if me not in ranks:
            raise Error(f"ranks: this process (rank {me}) is not in {ranks}")
        self.ranks = ranks
        self.plan_rank = ranks.index(me)
        self.dp_index, self.pp_index = divmod(self.plan_rank, self.pp)
        if isinstance(stages, torch.nn.Module):
            if self.vpp != 1:
                raise Error(f"stages: one module for vpp={self.vpp}; allowed: a dict "
                            f"{{virtual stage: module}} with the rank's {self.vpp} stages")
            stages = {self.pp_index: stages}
        if not isinstance(stages, dict) or not stages:
            raise TypeError("stages: expected an nn.Module or a dict {virtual stage: nn.Module}")
        num_stages = self.pp * self.vpp
        mine = [s for s in range(num_stages) if s % self.pp == self.pp_index]
        if sorted(int(s) for s in stages) != mine:
            raise Error(f"stages: {sorted(stages)} on pipeline rank {self.pp_index}; allowed: "
                        f"exactly its virtual stages {mine} (stage s runs on rank s % pp)")
        self.stages = {int(s): m for s, m in stages.items()}
        self.num_stages = num_stages
        self.loss_fn, self.optimizer = loss_fn, optimizer
        self.grad_reduction, self.input_key = grad_reduction, input_key
        first = next((q for m in self.stages.values() for q in m.parameters()), None)
        self.device = torch.device(device) if device is not None else \
            (first.device if first is not None else torch.device("cpu"))
        self.dtype = dtype if dtype is not None else \
            (first.dtype if first is not None and first.is_floating_point() else torch.float32)
        # Every rank creates every data-parallel group, in the same order (torch's rule).
        self.dp_group, self.dp_members = None, [ranks[d * self.pp + self.pp_index]
                                                for d in range(self.dp)]
        if self.dp > 1:
            for q in range(self.pp):
                g = dist.new_group([ranks[d * self.pp + q] for d in range(self.dp)])
                if q == self.pp_index:
                    self.dp_group = g
        self.recompute, self.recompute_modules = recompute, recompute_modules
        self._tape_cache, self._marked_cache, self._warned_unmarked = {}, {}, set()
        self._init_tied(tied_parameters)
        self.iteration = 0
        self.stats = {"iterations": 0, "seconds": 0.0, "compute_seconds": 0.0,
                      "wait_seconds": 0.0, "instructions": 0}

    # --- the plan -----------------------------------------------------------------------------

    def _check_plan(self, plan, micro_batches):
        if not isinstance(plan, Plan):
            raise TypeError(f"plan: expected a sluice.Plan, got {type(plan).__name__}")
        if not plan.ok:
            raise Error(f"plan: the batch could not be planned ({plan.outcome}): "
                        f"{plan.infeasible_reason}")
        if (plan.dp, plan.pp, plan.vpp) != (self.dp, self.pp, self.vpp):
            raise Error(f"plan: dp={plan.dp} pp={plan.pp} vpp={plan.vpp}, but the executor was "
                        f"made for dp={self.dp} pp={self.pp} vpp={self.vpp}")
        program = plan.program(self.plan_rank)
        mbs = plan.micro_batches(self.dp_index)
        if any(mb.get("dec_seqlen", 0) for mb in mbs):
            raise Error("plan: an encoder-decoder plan (its micro-batches have a dec_seqlen); "
                        "PipelineExecutor runs decoder-only plans (stage 0 loads one input "
                        "tensor, PlanCollator builds decoder-only rows). Train encoder-decoder "
                        "models with PlanningBatchSampler(target_lengths=...) and "
                        "PackedSeq2SeqCollator in your own loop")
        count = len(mbs)
        if len(micro_batches) != count:
            raise Error(f"micro_batches: {len(micro_batches)} given, replica {self.dp_index} of "
                        f"the plan has {count}; allowed: one batch per plan micro-batch, in the "
                        f"plan's order")
        for i, ins in enumerate(program["instructions"]):
            if ins["op"] in ("reduce-scatter-grad", "all-gather-params"):
                raise Error(f"plan: rank {self.plan_rank}, instruction {i} ({ins['text']}): "
                            f"ZeRO-2/3 collectives are not supported by PipelineExecutor; plan "
                            f"with zero 0 or 1")
        return program

    def _params(self, stage):
        return [q for q in self.stages[stage].parameters() if q.requires_grad]

    def _linears(self, stage):
        if stage not in self._tape_cache:
            self._tape_cache[stage] = _tape_linears(self.stages[stage])
        return self._tape_cache[stage]

    def _marked(self, stage):
        """The outermost submodules of `stage` that a 'selective' micro-batch checkpoints."""
        if stage in self._marked_cache:
            return self._marked_cache[stage]
        module, how = self.stages[stage], self.recompute_modules
        named = list(module.named_modules())
        if how is None:
            picked = [m for _, m in named if getattr(m, "sluice_recompute", False)]
        elif callable(how):
            picked = list(how(stage, module) or [])
            mine = {id(m) for _, m in named}
            for m in picked:
                if not isinstance(m, torch.nn.Module) or id(m) not in mine:
                    raise Error(f"recompute_modules: the callable returned {type(m).__name__} "
                                f"for stage {stage}; allowed: submodules of that stage's module")
        else:
            picked = [m for name, m in named
                      if any(fnmatch.fnmatchcase(name, pat) for pat in how)]
        ids = {id(m) for m in picked}
        # Outermost only: a marked module inside another marked one is recomputed with it.
        inner = set()
        for m in picked:
            for sub in m.modules():
                if sub is not m and id(sub) in ids:
                    inner.add(id(sub))
        out, seen = [], set()
        for m in picked:
            if id(m) not in inner and id(m) not in seen:
                seen.add(id(m))
                out.append(m)
        self._marked_cache[stage] = out
        return out

    def _rc(self, stage, ins):
        """The recompute mode of one forward: the plan's (or the executor's override), with
        'selective' on a stage that marks nothing run as 'full'."""
        rc = self.recompute if self.recompute is not None else (ins.get("rc") or "none")
        if rc == "selective" and not self._marked(stage):
            if stage not in self._warned_unmarked:
                self._warned_unmarked.add(stage)
                how = ("recompute_modules matches no submodule" if self.recompute_modules
                       is not None else "no submodule has sluice_recompute = True")
                warnings.warn(f"sluice.torch.PipelineExecutor: stage {stage} marks nothing to "
                              f"recompute selectively ({how}), so its 'selective' micro-batches "
                              f"recompute 'full' (the whole stage forward again in the "
                              f"backward). Mark the attention core: a class attribute "
                              f"sluice_recompute = True on its module, or PipelineExecutor("
                              f"recompute_modules=['blocks.*.attn_core'] or a callable).",
                              RuntimeWarning, stacklevel=4)
            rc = "full"
        return rc

    # --- tied parameters (the embedding group) ------------------------------------------------

    def _init_tied(self, tied):
        """Checks this rank's tied parameters, makes the first/last-stage groups (collective
        over every rank when pp > 1), checks both ends agree and copies the first stage's
        values to the last stage's."""
        tied = dict(tied or {})
        for name, q in tied.items():
            if not isinstance(name, str) or not isinstance(q, torch.nn.Parameter):
                raise TypeError("tied_parameters: expected a dict {name: nn.Parameter}, got "
                                f"{type(name).__name__}: {type(q).__name__}")
        self.tied, self.tied_group, self.tied_members = {}, None, []
        first, last = 0, self.num_stages - 1
        ends = [s for s in sorted({first, last}) if s in self.stages]
        if tied and not ends:
            raise Error(f"tied_parameters: {sorted(tied)} on pipeline rank {self.pp_index}, "
                        f"which runs neither the first stage nor the last; allowed: only the "
                        f"ranks of stage {first} and stage {last} tie parameters")
        own = {id(q) for s in ends for q in self.stages[s].parameters()}
        for name, q in tied.items():
            if id(q) not in own:
                raise Error(f"tied_parameters: '{name}' is not a parameter of this rank's "
                            f"stage {' or '.join(str(s) for s in ends)} module")
            if not q.requires_grad:
                raise Error(f"tied_parameters: '{name}' does not require a gradient")
        self.tied = {k: tied[k] for k in sorted(tied)}
        if self.pp == 1:
            return  # both ends in one module: the user ties them there
        for d in range(self.dp):  # every rank creates every group, in order (torch's rule)
            pair = [self.ranks[d * self.pp], self.ranks[d * self.pp + self.pp - 1]]
            g = dist.new_group(pair)
            if d == self.dp_index:
                self.tied_group, self.tied_members = g, pair
        if self.pp_index not in (0, self.pp - 1):
            return
        mine = {k: (list(q.shape), str(q.dtype)) for k, q in self.tied.items()}
        other = _exchange(mine, self.tied_group, self.tied_members, self.device)
        if other != mine:
            me, peer = ("first", "last") if self.pp_index == 0 else ("last", "first")
            raise Error(f"tied_parameters: this rank ({me} stage) ties {_tied_text(mine)}, the "
                        f"{peer} stage's rank ties {_tied_text(other)}; allowed: the same names, "
                        f"shapes and dtypes on both ends")
        with torch.no_grad():
            for q in self.tied.values():
                buf = q.detach().clone()
                dist.broadcast(buf, src=self.tied_members[0], group=self.tied_group)
                q.copy_(buf)

    def _reduce_tied(self):
        """Sums the tied parameters' gradients between the first and last stage's ranks."""
        if not self.tied or self.tied_group is None:
            return
        params = list(self.tied.values())
        flat = torch.cat([q.grad.reshape(-1) if q.grad is not None else
                          torch.zeros(q.numel(), dtype=q.dtype, device=q.device) for q in params])
        dist.all_reduce(flat, group=self.tied_group)
        at = 0
        with torch.no_grad():
            for q in params:
                g = flat.narrow(0, at, q.numel()).view_as(q)
                if q.grad is None:
                    q.grad = g.clone()
                else:
                    q.grad.copy_(g)
                at += q.numel()

    def _name(self, ins):
        text, op = ins["text"], ins["op"]
        if "peer" in ins:
            peer = self.ranks[ins["peer"]]
            return f"{text} {'to' if op.startswith('send') else 'from'}={peer}"
        if "bucket" in ins and self.dp > 1:
            return f"{text} group={','.join(str(r) for r in self.dp_members)}"
        return text

    # --- one iteration ------------------------------------------------------------------------

    def run(self, plan, micro_batches, loss_scale=1.0):
        """Runs this rank's program of `plan` once (one training step).

        micro_batches: one batch per micro-batch of this rank's replica, in the plan's order
            (``PlanCollator(dataset, ...)(mb)`` for each ``mb`` of ``plan.micro_batches(r)``);
            every rank of the replica passes the same list.
        loss_scale: multiplies every micro-batch's loss before its backward.

        Returns a dict: loss (the sum of scaled micro-batch losses on the rank running the last
        stage, else None), instructions, seconds, compute_seconds, wait_seconds. Errors name the
        rank and the instruction ("rank 1, instruction 17 (1RECV_F3.wait): ...").
        """
        program = self._check_plan(plan, micro_batches)
        instructions = program["instructions"]
        st = _State(self, plan, program, micro_batches, float(loss_scale))
        t0 = time.perf_counter()
        for i, ins in enumerate(instructions):
            try:
                with record_function(self._name(ins)):
                    t = time.perf_counter()
                    st.execute(ins)
                    dt = time.perf_counter() - t
            except Error as e:
                raise Error(f"rank {self.plan_rank}, iteration {self.iteration}, instruction {i} "
                            f"({ins['text']}): {e}") from None
            if ins["op"] in _COMPUTE:
                st.compute += dt
            elif ins["op"].endswith("-finish") or ins["op"] == "optimizer-step":
                st.wait += dt
        if st.runs or st.transfers or st.collectives:
            raise Error(f"rank {self.plan_rank}: the program ended with {len(st.runs)} stage "
                        f"runs, {len(st.transfers)} transfers and {len(st.collectives)} "
                        f"reductions outstanding")
        seconds = time.perf_counter() - t0
        self.iteration += 1
        s = self.stats
        s["iterations"] += 1
        s["seconds"] += seconds
        s["compute_seconds"] += st.compute
        s["wait_seconds"] += st.wait
        s["instructions"] += len(instructions)
        loss = None if st.loss is None else float(st.loss)
        return {"loss": loss, "instructions": len(instructions), "seconds": seconds,
                "compute_seconds": st.compute, "wait_seconds": st.wait}


class _State:
    """One iteration's buffers, pending transfers and reductions (PipelineExecutor.run)."""

    def __init__(self, ex, plan, program, micro_batches, loss_scale):
        self.ex, self.plan, self.batches, self.loss_scale = ex, plan, micro_batches, loss_scale
        self.slots = [None] * int(program["buffer_slots"])
        self.runs, self.transfers, self.collectives = {}, {}, []
        self.loss = None
        self.compute = self.wait = 0.0
        self.split = {(i["mb"], i["stage"]) for i in program["instructions"]
                      if i["op"] == "backward-input"}
        self.last = ex.num_stages - 1
        # Buckets of each stage in issue order, with their bytes (the plan cuts a stage's
        # gradient into buckets; here each gets a share of the flat gradient by its bytes).
        self.buckets = {}
        for i in program["instructions"]:
            if i["op"] == "all-reduce-grad":
                self.buckets.setdefault(i["stage"], []).append((i["bucket"], i.get("bytes", 0)))
        self.flat = {}

    # slots
    def read(self, slots):
        out = []
        for s in slots:
            if self.slots[s] is None:
                raise Error(f"slot {s} is empty")
            out.extend(self.slots[s])
        return out

    def write(self, ins, tensors):
        (s,) = ins["out"]
        if self.slots[s] is not None:
            raise Error(f"output slot {s} is still in use")
        self.slots[s] = list(tensors)

    @staticmethod
    def check_shapes(tensors, shapes, what):
        if len(tensors) != len(shapes):
            raise Error(f"{what}: {len(tensors)} tensors, the plan says {len(shapes)}")
        for k, (t, s) in enumerate(zip(tensors, shapes)):
            if list(t.shape) != list(s):
                raise Error(f"{what}: tensor {k} has shape {_shape_text(t.shape)}, the plan says "
                            f"{_shape_text(s)}")

    def execute(self, ins):
        op = ins["op"]
        if op == "load-input":
            self.load(ins)
        elif op == "forward":
            self.forward(ins)
        elif op in ("backward", "backward-input"):
            self.backward(ins)
        elif op == "backward-weight":
            self.backward_weight(ins)
        elif op in ("send-act-start", "send-grad-start"):
            self.send(ins)
        elif op in ("recv-act-start", "recv-grad-start"):
            self.recv(ins)
        elif op.endswith("-finish"):
            self.finish(ins)
        elif op == "free-buffer":
            self.slots[ins["in"][0]] = None
        elif op == "all-reduce-grad":
            self.all_reduce(ins)
        elif op == "optimizer-step":
            self.step()
        else:
            raise Error(f"op '{op}' is not supported by PipelineExecutor")

    def batch(self, mb):
        if not 0 <= mb < len(self.batches):
            raise Error(f"micro-batch {mb} is not in the replica's {len(self.batches)}")
        return self.batches[mb]

    def load(self, ins):
        b = self.batch(ins["mb"])
        tensors = []
        if ins["stage"] == 0:
            tensors.append(b[self.ex.input_key] if isinstance(b, dict) else b)
        if ins["stage"] == self.last:
            tensors.append(b.get("labels") if isinstance(b, dict) else None)
            if tensors[-1] is None:  # the loss function reads the batch; only the shape counts
                tensors[-1] = torch.empty(ins["shapes"][-1], dtype=torch.long)
        self.check_shapes(tensors, ins["shapes"], f"micro-batch {ins['mb']}'s "
                          f"'{self.ex.input_key if ins['stage'] == 0 else 'labels'}' (build "
                          f"batches with PlanCollator for the plan's padded shape)")
        self.write(ins, tensors)

    def call_stage(self, stage, inputs, b, tape=None, selective=False):
        x = inputs[0] if len(inputs) == 1 else tuple(inputs)
        hooks, marked = [], self.ex._marked(stage) if selective else []
        if tape is not None and torch.is_grad_enabled():  # split backward: record the linears
            def record(m, args, output):
                if torch.is_tensor(output) and output.requires_grad:
                    tape.append((m, args[0].detach(), output))
            # A linear layer inside a checkpointed submodule is left to autograd (the tape
            # would keep its input, which the checkpoint drops).
            inside = {id(s) for m in marked for s in m.modules()}
            hooks = [m.register_forward_hook(record) for m in self.ex._linears(stage)
                     if id(m) not in inside]
        patched = [_checkpoint_forward(m) for m in marked] if torch.is_grad_enabled() else []
        try:
            out = self.ex.stages[stage](x, b)
        finally:
            for h in hooks:
                h.remove()
            for undo in patched:
                undo()
        if stage == self.last:
            loss = self.ex.loss_fn(out, b)
            if not torch.is_tensor(loss) or loss.numel() != 1:
                raise Error("loss_fn: must return a scalar tensor")
            return [loss.reshape(()) * self.loss_scale]
        return _as_list(out)

    def forward(self, ins):
        stage, mb = ins["stage"], ins["mb"]
        if stage not in self.ex.stages:
            raise Error(f"stage {stage} does not run on pipeline rank {self.ex.pp_index}")
        tensors = self.read(ins.get("in", []))
        if stage == self.last:
            tensors = tensors[:-1]  # the labels: the loss function reads them from the batch
        run = _Run()
        run.inputs = tensors if stage == 0 else \
            [t.detach().requires_grad_(t.is_floating_point()) for t in tensors]
        rc = self.ex._rc(stage, ins)
        run.replay = rc == "full"
        run.split = (mb, stage) in self.split
        b = self.batch(mb)
        if run.replay:  # recompute 'full': no graph now, the backward replays the forward
            run.rng = _rng_state(self.ex.device)
            with torch.no_grad():
                outputs = self.call_stage(stage, run.inputs, b)
        else:  # 'selective': the marked submodules run under torch.utils.checkpoint
            outputs = self.call_stage(stage, run.inputs, b, run.tape if run.split else None,
                                      selective=rc == "selective")
        if stage == self.last:
            v = outputs[0].detach()
            self.loss = v if self.loss is None else self.loss + v
        else:
            self.check_shapes(outputs, ins.get("shapes", []), "stage outputs")
            self.write(ins, [o.detach() for o in outputs])
        run.outputs = outputs
        if (mb, stage) in self.runs:
            raise Error("the micro-batch already ran forward on this stage")
        self.runs[(mb, stage)] = run

    def backward(self, ins):
        stage, mb = ins["stage"], ins["mb"]
        run = self.runs.get((mb, stage))
        if run is None:
            raise Error("backward before its forward")
        if run.replay:
            with torch.random.fork_rng(devices=_rng_devices(self.ex.device)):
                _set_rng_state(self.ex.device, run.rng)
                run.outputs = self.call_stage(stage, run.inputs, self.batch(mb),
                                              run.tape if run.split else None)
            run.replay = False
        if stage == self.last:
            run.grad_outputs = [torch.ones_like(run.outputs[0])]
        else:
            grads = self.read([ins["in"][-1]])
            self.check_shapes(grads, [list(o.shape) for o in run.outputs], "output gradients")
            run.grad_outputs = grads
        leaves = [t for t in run.inputs if t.requires_grad] if stage > 0 else []
        outs = [(o, g) for o, g in zip(run.outputs, run.grad_outputs) if o.requires_grad]
        if ins["op"] == "backward":
            if outs:
                torch.autograd.backward([o for o, _ in outs], [g for _, g in outs])
            input_grads = [t.grad for t in leaves]
            del self.runs[(mb, stage)]
        else:
            # backward-input, one pass that releases the graph: the input leaves' gradients,
            # the output gradients of the recorded linear layers (their weight gradients wait
            # for backward-weight; autograd skips those branches) and the other parameters'
            # gradients, added to .grad now (the C++ runtime's WeightGradTape rule).
            taped = {id(q) for m, _, _ in run.tape for q in m.parameters(recurse=False)}
            others = [q for q in self.ex._params(stage) if id(q) not in taped]
            targets = leaves + [o for _, _, o in run.tape] + others
            grads = [None] * len(targets)
            if outs and targets:
                grads = list(torch.autograd.grad([o for o, _ in outs], targets,
                                                 [g for _, g in outs], allow_unused=True))
            input_grads = grads[:len(leaves)]
            run.tape_grads = grads[len(leaves):len(leaves) + len(run.tape)]
            _accumulate(others, grads[len(leaves) + len(run.tape):])
            run.outputs, run.inputs = [], []  # the graph is gone
        if stage > 0:
            input_grads = [torch.zeros_like(t) if g is None else g
                           for t, g in zip(leaves, input_grads)]
            self.check_shapes(input_grads, ins.get("shapes", []), "input gradients")
            self.write(ins, input_grads)

    def backward_weight(self, ins):
        key = (ins["mb"], ins["stage"])
        run = self.runs.pop(key, None)
        if run is None or run.grad_outputs is None:
            raise Error("backward-weight before its backward-input")
        with torch.no_grad():
            for (m, x, _), g in zip(run.tape, run.tape_grads):
                if g is None:
                    continue
                g2, x2 = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])
                dw = g2.t().mm(x2)
                _accumulate([m.weight], [dw])
                if m.bias is not None:
                    _accumulate([m.bias], [g2.sum(0)])
        run.tape, run.tape_grads = [], None

    def send(self, ins):
        tensors = self.read(ins["in"])
        self.check_shapes(tensors, ins["shapes"], "sent tensors")
        flat = tensors[0].detach().contiguous() if len(tensors) == 1 else \
            torch.cat([t.detach().reshape(-1) for t in tensors])
        work = dist.isend(flat, dst=self.ex.ranks[ins["peer"]], tag=ins["tag"])
        self.post(ins, work, flat)

    def recv(self, ins):
        sizes = [1] * len(ins["shapes"])
        for k, s in enumerate(ins["shapes"]):
            for d in s:
                sizes[k] *= int(d)
        flat = torch.empty(sum(sizes), dtype=self.ex.dtype, device=self.ex.device)
        views, at = [], 0
        for n, s in zip(sizes, ins["shapes"]):
            views.append(flat.narrow(0, at, n).view(*s))
            at += n
        self.write(ins, views)
        work = dist.irecv(flat, src=self.ex.ranks[ins["peer"]], tag=ins["tag"])
        self.post(ins, work, flat)

    def post(self, ins, work, flat):
        key = (ins["op"].startswith("send"), ins["tag"])
        if key in self.transfers:
            raise Error(f"tag {ins['tag']} is already in flight")
        self.transfers[key] = (work, flat)

    def finish(self, ins):
        key = (ins["op"].startswith("send"), ins["tag"])
        entry = self.transfers.pop(key, None)
        if entry is None:
            raise Error("finish without a posted start")
        try:
            entry[0].wait()
        except RuntimeError as e:
            what = "send to" if key[0] else "receive from"
            peer = self.ex.ranks[ins["peer"]]
            raise Error(f"{what} rank {peer} failed (rank {peer} died?): {e}") from None

    def all_reduce(self, ins):
        stage = ins["stage"]
        if stage not in self.ex.stages:
            raise Error(f"bucket {ins['bucket']} reduces stage {stage}, which does not run here")
        params = self.ex._params(stage)
        if stage not in self.flat:  # the stage's first bucket: its gradients are final now
            parts = [q.grad.reshape(-1) if q.grad is not None else
                     torch.zeros(q.numel(), dtype=q.dtype, device=q.device) for q in params]
            flat = torch.cat(parts) if parts else torch.zeros(0, device=self.ex.device)
            self.flat[stage] = (flat, _bucket_ranges([b for _, b in self.buckets[stage]],
                                                     flat.numel()))
        flat, ranges = self.flat[stage]
        ids = [b for b, _ in self.buckets[stage]]
        begin, end = ranges[ids.index(ins["bucket"])]
        if end > begin and self.ex.dp > 1:
            work = dist.all_reduce(flat.narrow(0, begin, end - begin), group=self.ex.dp_group,
                                   async_op=True)
            self.collectives.append(work)

    def step(self):
        for work in self.collectives:
            work.wait()
        self.collectives = []
        with torch.no_grad():
            for stage, (flat, _) in self.flat.items():
                if self.ex.grad_reduction == "mean" and self.ex.dp > 1:
                    flat.div_(self.ex.dp)
                at = 0
                for q in self.ex._params(stage):
                    g = flat.narrow(0, at, q.numel()).view_as(q)
                    if q.grad is None:
                        q.grad = g.clone()
                    else:
                        q.grad.copy_(g)
                    at += q.numel()
        self.flat = {}
        self.ex._reduce_tied()  # after the data-parallel sums: first + last stage's shares
        if self.ex.optimizer is not None:
            self.ex.optimizer.step()
            self.ex.optimizer.zero_grad(set_to_none=True)


def _checkpoint_forward(module):
    """Makes `module`'s forward run under non-reentrant torch.utils.checkpoint (its saved
    tensors are dropped and recomputed, with the same RNG state, when the backward needs them);
    returns the function that undoes it."""
    had = "forward" in module.__dict__
    original = module.forward

    def forward(*args, **kwargs):
        return torch.utils.checkpoint.checkpoint(original, *args, use_reentrant=False, **kwargs)

    module.forward = forward

    def undo():
        if had:
            module.forward = original
        else:
            del module.forward
    return undo


def _exchange(obj, group, members, device):
    """Swaps a picklable object with the other member of a two-rank group (a collective of the
    two); returns the other's."""
    data = pickle.dumps(obj)
    n = torch.tensor([len(data)], dtype=torch.long, device=device)
    sizes = [torch.zeros_like(n) for _ in members]
    dist.all_gather(sizes, n, group=group)
    width = int(max(int(x) for x in sizes))
    buf = torch.zeros(width, dtype=torch.uint8, device=device)
    buf[:len(data)] = torch.tensor(list(data), dtype=torch.uint8, device=device)
    bufs = [torch.zeros_like(buf) for _ in members]
    dist.all_gather(bufs, buf, group=group)
    other = 1 - members.index(dist.get_rank())
    return pickle.loads(bytes(bufs[other][:int(sizes[other])].cpu().tolist()))


def _tied_text(spec):
    if not spec:
        return "nothing"
    return ", ".join(f"'{k}' {_shape_text(s)} {d}" for k, (s, d) in sorted(spec.items()))


def _accumulate(params, grads):
    """Adds each gradient into its parameter's .grad (None: nothing)."""
    with torch.no_grad():
        for q, g in zip(params, grads):
            if g is None:
                continue
            if q.grad is None:
                q.grad = g.detach().to(q.dtype).clone()
            else:
                q.grad.add_(g)


def _bucket_ranges(bucket_bytes, elements):
    """[begin, end) of a stage's flat gradient of `elements` values per bucket, cut in proportion
    to the plan's bucket bytes (runtime/layout.h's BucketRanges rule): every value once."""
    total = sum(max(int(b), 0) for b in bucket_bytes)
    out, acc = [], 0
    for k, b in enumerate(bucket_bytes):
        begin = out[-1][1] if out else 0
        acc += max(int(b), 0)
        end = elements if k == len(bucket_bytes) - 1 or total == 0 else elements * acc // total
        out.append((begin, max(begin, end)))
    return out


def _rng_devices(device):
    """fork_rng's CUDA device indices for a stage on `device`."""
    if device.type != "cuda":
        return []
    return [device.index if device.index is not None else torch.cuda.current_device()]


def _rng_state(device):
    cpu = torch.get_rng_state()
    return (cpu, torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def _set_rng_state(device, state):
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)
