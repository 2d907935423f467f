"""sluice.torch: sluice's plans inside a PyTorch user's own training loop (docs/python.md).

PlanningBatchSampler
    A ``batch_sampler`` for ``torch.utils.data.DataLoader``. It cuts each epoch's (shuffled)
    samples into global batches by a token budget, has sluice plan every global batch, and yields
    this data-parallel replica's micro-batches (lists of dataset indices), in the plan's order.
    Every rank computes the same plans from the same seed, so ranks agree without communicating.
    Planning runs ahead of the training loop in a background thread (the C++ planner releases
    the GIL).

    With ``share="store"`` rank 0 plans and the other ranks read its plans from the process
    group's store.

PipelineExecutor / PlanCollator (sluice/_pipeline.py)
    Runs a plan's per-rank instruction stream (pipeline stages, point-to-point transfers, split
    backward, bucketed data-parallel reduction) on the user's own stage modules;
    ``sampler.plans()`` yields the plans with this replica's micro-batches.

PackedCollator / PaddedCollator / PackedSeq2SeqCollator
    ``collate_fn``s: packed rows with ``cu_seqlens``, ``max_seqlen`` and per-document
    ``position_ids`` (the conventions of Hugging Face's DataCollatorWithFlattening and of
    flash-attention's varlen kernels), or padded micro-batches with an attention mask; for
    encoder-decoder models, the encoder and decoder packed separately.
"""

import queue
import random
import threading
import time

import torch
import torch.utils.data

from . import Error, Plan, Planner
from ._pipeline import PipelineExecutor, PlanCollator, PlannedBatch

__all__ = ["PlanningBatchSampler", "PackedCollator", "PaddedCollator", "PackedSeq2SeqCollator",
           "PipelineExecutor", "PlanCollator", "PlannedBatch"]


def _dist_rank_world():
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _split_micro_batch(mb):
    """Splits one micro-batch (a list of rows of sample ids) into two non-empty halves: by rows
    when it has several, else by the samples of its one row. None when it holds one sample."""
    rows = mb
    if len(rows) >= 2:
        h = len(rows) // 2
        return rows[:h], rows[h:]
    if len(rows) == 1 and len(rows[0]) >= 2:
        h = len(rows[0]) // 2
        return [rows[0][:h]], [rows[0][h:]]
    return None


def _equalize(mbs, count):
    """Splits the micro-batches of one replica (each a list of rows) until there are `count`:
    the one with the most samples is split first (ties: the first). Micro-batches that cannot be
    split any more are followed by empty ones."""
    mbs = [list(m) for m in mbs]
    while len(mbs) < count:
        order = sorted(range(len(mbs)), key=lambda i: (-sum(len(r) for r in mbs[i]), i))
        for i in order:
            halves = _split_micro_batch(mbs[i])
            if halves is not None:
                mbs[i:i + 1] = list(halves)
                break
        else:
            mbs.append([])
    return mbs


class PlanningBatchSampler(torch.utils.data.Sampler):
    """Yields this replica's planned micro-batches (lists of dataset indices).

    lengths: tokens of every dataset sample (``len(dataset[i]["input_ids"])``); for an
        encoder-decoder model (t5-*), the encoder (input) tokens.
    planner: a :class:`sluice.Planner`, or a dict of its keyword arguments. Its parallel
        configuration's ``dp`` is the number of data-parallel replicas.
    tokens_per_batch: the global batch's token budget (all replicas together), >= max_seqlen;
        an encoder-decoder sample counts its input and target tokens.
    target_lengths: encoder-decoder models only, and needed there: the decoder (target) tokens
        of every sample (``len(dataset[i]["labels"])``). Input and target are each clipped at
        (or, long='drop', dropped above) max_seqlen.
    rank, world_size: this process and all of them; default: torch.distributed's when it is
        initialised, else 0 and 1. world_size must be a multiple of dp; the ranks
        ``r * world_size/dp .. (r+1) * world_size/dp - 1`` make replica r (with pp > 1: one rank
        per pipeline stage, as in sluice's rank order) and get the same micro-batches.
    seed, shuffle: the epoch's order is ``random.Random(seed * 1000003 + epoch)``'s shuffle of
        the samples (or their index order).
    long: 'clip' (samples longer than the planner's max_seqlen are planned as max_seqlen tokens;
        the collator's max_seqlen truncates them) or 'drop' (left out; ``dropped`` lists them).
    drop_last: leave out the epoch's last global batch (which the budget did not fill).
    equalize: every replica yields the same number of micro-batches per global batch (the most
        any replica has): a replica with fewer splits its largest micro-batches (a split half
        uses less memory than the plan's micro-batch), then adds empty ones. Needed whenever the
        loop synchronises per micro-batch; turn it off only with gradient accumulation per
        global batch (``steps()`` then differs between replicas).
    prefetch: global batches planned ahead of the loop by the background thread (0: plan in the
        loop's thread).
    share: 'seed' (every rank plans the same batches itself from the seed: no communication) or
        'store' (rank 0 plans; every other rank reads rank 0's plans from ``store``: one planner
        per job, and plans identical even where planning is not deterministic, e.g. a time
        limit). Keys are ``sluice/<name>/<epoch>/<batch>``; the last reader deletes a key.
    store: a ``torch.distributed.Store`` for share='store'; default: the default process
        group's store (torch.distributed must be initialised). name: the key prefix's name, for
        several samplers on one store.

    An out-of-memory plan is split in two (by order) and each half planned, recursively, so
    every sample of the epoch lands exactly once; a batch of dp samples that still cannot fit
    raises :class:`sluice.Error` with the planner's reason.
    """

    def __init__(self, lengths, planner, tokens_per_batch, *, target_lengths=None, rank=None,
                 world_size=None, seed=0, shuffle=True, long="clip", drop_last=False,
                 equalize=True, prefetch=2, share="seed", store=None, name="sampler"):
        if isinstance(planner, dict):
            planner = Planner(**planner)
        if not isinstance(planner, Planner):
            raise TypeError(f"planner: expected a sluice.Planner or a dict of its arguments, got "
                            f"{type(planner).__name__}")
        self.planner = planner
        self.dp = planner.dp
        self.max_seqlen = planner.max_seqlen
        if long not in ("clip", "drop"):
            raise Error(f"long: '{long}' is not allowed; allowed: clip, drop")
        tokens_per_batch = int(tokens_per_batch)
        if tokens_per_batch < self.max_seqlen:
            raise Error(f"tokens_per_batch: {tokens_per_batch} is less than max_seqlen "
                        f"{self.max_seqlen}; allowed: >= {self.max_seqlen}")
        self.tokens_per_batch = tokens_per_batch
        if rank is None or world_size is None:
            d_rank, d_world = _dist_rank_world()
            rank = d_rank if rank is None else rank
            world_size = d_world if world_size is None else world_size
        rank, world_size = int(rank), int(world_size)
        if world_size < 1 or not 0 <= rank < world_size:
            raise Error(f"rank: {rank} is not a rank of world_size {world_size}; allowed: "
                        f"0..world_size-1")
        if world_size % self.dp != 0:
            raise Error(f"world_size: {world_size} is not a multiple of the planner's dp "
                        f"{self.dp}; allowed: dp x (ranks per replica)")
        self.rank, self.world_size = rank, world_size
        self.replica = rank // (world_size // self.dp)
        self.seed, self.shuffle = int(seed), bool(shuffle)
        self.drop_last, self.equalize = bool(drop_last), bool(equalize)
        self.prefetch = int(prefetch)
        self.long = long
        if share not in ("seed", "store"):
            raise Error(f"share: '{share}' is not allowed; allowed: seed, store")
        self.share, self.name = share, str(name)
        if share == "store" and store is None and world_size > 1:
            if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
                raise Error("share: 'store' needs a store: pass store=..., or initialise "
                            "torch.distributed first (its default group's store is used)")
            store = torch.distributed.distributed_c10d._get_default_store()
        self.store = store

        lengths = list(lengths)
        enc_dec = bool(planner.model.is_encoder_decoder)
        if enc_dec and target_lengths is None:
            raise Error(f"target_lengths: model '{planner.model.name}' is encoder-decoder; give "
                        f"one target (decoder) length per sample, beside lengths (the inputs)")
        if not enc_dec and target_lengths is not None:
            raise Error(f"target_lengths: model '{planner.model.name}' is decoder-only; give "
                        f"none (a decoder-only sample has one length)")
        targets = None if target_lengths is None else [int(t) for t in target_lengths]
        if targets is not None and len(targets) != len(lengths):
            raise Error(f"target_lengths: {len(targets)} values for {len(lengths)} lengths; "
                        f"allowed: one per sample")
        self.lengths = []
        self.target_lengths = None if targets is None else []
        self.dropped = []  # dataset indices left out (long='drop')
        self._kept = []
        for i, n in enumerate(lengths):
            n = int(n)
            if n < 1:
                raise Error(f"lengths[{i}]: {n} tokens; allowed: >= 1")
            t = None if targets is None else targets[i]
            if t is not None and t < 1:
                raise Error(f"target_lengths[{i}]: {t} tokens; allowed: >= 1")
            if n > self.max_seqlen or (t is not None and t > self.max_seqlen):
                if long == "drop":
                    self.dropped.append(i)
                    self.lengths.append(n)
                    if t is not None:
                        self.target_lengths.append(t)
                    continue
                n, t = min(n, self.max_seqlen), None if t is None else min(t, self.max_seqlen)
            self.lengths.append(n)
            if t is not None:
                self.target_lengths.append(t)
            self._kept.append(i)
        if len(self._kept) < self.dp:
            raise Error(f"lengths: {len(self._kept)} usable samples for dp {self.dp} replicas; "
                        f"allowed: at least dp")
        self.epoch = 0
        self._cache = None  # (epoch, [per global batch: (counts per replica, own micro-batches)])
        self.stats = {"batches_planned": 0, "planning_seconds": 0.0, "wait_seconds": 0.0,
                      "plans_split": 0}

    # --- the epoch's global batches -----------------------------------------------------------

    def set_epoch(self, epoch):
        """Sets the epoch whose order the next iteration follows (call it on every rank)."""
        self.epoch = int(epoch)

    def global_batches(self, epoch=None):
        """The epoch's global batches: lists of dataset indices, cut in order by the budget."""
        epoch = self.epoch if epoch is None else int(epoch)
        order = list(self._kept)
        if self.shuffle:
            random.Random(self.seed * 1000003 + epoch).shuffle(order)
        batches, cur, tokens = [], [], 0
        for i in order:
            n = self.lengths[i] + (self.target_lengths[i] if self.target_lengths else 0)
            if cur and tokens + n > self.tokens_per_batch:
                batches.append(cur)
                cur, tokens = [], 0
            cur.append(i)
            tokens += n
        if cur:
            if self.drop_last and batches:
                pass
            elif len(cur) < self.dp and batches:
                batches[-1].extend(cur)  # too few to give every replica one: joins the previous
            else:
                batches.append(cur)
        return batches

    def _plan(self, batch):
        """Plans `batch` (dataset indices); returns a list of plans covering it in order."""
        targets = None if self.target_lengths is None else \
            [self.target_lengths[i] for i in batch]
        plan = self.planner.plan([self.lengths[i] for i in batch], targets, ids=batch)
        if plan.ok:
            return [plan]
        if len(batch) < 2 * self.dp:
            raise Error(f"a global batch of {len(batch)} samples cannot be planned even split: "
                        f"{plan.infeasible_reason}")
        self.stats["plans_split"] += 1
        h = len(batch) // 2
        return self._plan(batch[:h]) + self._plan(batch[h:])

    def _shared_plans(self, epoch, index, batch):
        """share='store': rank 0 plans `batch` and puts the plans (or its error) under the
        batch's key; every other rank reads them. share='seed': plans `batch` here."""
        if self.share == "seed" or self.world_size == 1:
            return self._plan(batch)
        key = f"sluice/{self.name}/{epoch}/{index}"
        if self.rank == 0:
            try:
                plans = self._plan(batch)
            except Error as e:
                self.store.set(key, b"E" + str(e).encode())
                raise
            parts = [p.to_bytes() for p in plans]
            self.store.set(key, b"P" + b"".join(len(x).to_bytes(8, "little") + x for x in parts))
            return plans
        data = bytes(self.store.get(key))
        if self.store.add(key + "/read", 1) >= self.world_size - 1:
            self.store.delete_key(key)
            self.store.delete_key(key + "/read")
        if data[:1] == b"E":
            raise Error(f"rank 0 could not plan global batch {index}: {data[1:].decode()}")
        plans, at = [], 1
        while at < len(data):
            n = int.from_bytes(data[at:at + 8], "little")
            plans.append(Plan.from_bytes(data[at + 8:at + 8 + n]))
            at += 8 + n
        return plans

    def _plan_global_batch(self, epoch, index, batch):
        """One global batch -> [(micro-batch counts per replica, own micro-batches, plan)]: one
        entry per plan (more than one when the batch had to be split to fit memory)."""
        t0 = time.perf_counter()
        out = []
        for plan in self._shared_plans(epoch, index, batch):
            per_replica = [[mb["rows"] for mb in plan.micro_batches(d)] for d in range(self.dp)]
            own = per_replica[self.replica]
            counts = [len(m) for m in per_replica]
            if self.equalize:
                own = _equalize(own, max(counts))
                counts = [max(counts)] * self.dp
            out.append((counts, own, plan))
        self.stats["batches_planned"] += 1
        self.stats["planning_seconds"] += time.perf_counter() - t0
        return out

    def _epoch_plans(self):
        if self._cache is None or self._cache[0] != self.epoch:
            plans = []
            for i, b in enumerate(self.global_batches()):
                plans.extend(self._plan_global_batch(self.epoch, i, b))
            self._cache = (self.epoch, plans)
        return self._cache[1]

    # --- what the loop sees -------------------------------------------------------------------

    def steps(self):
        """Micro-batches this replica yields per planned global batch, in order (the same on
        every rank with equalize). Plans the whole epoch (cached)."""
        return [counts[self.replica] for counts, _, _ in self._epoch_plans()]

    def __len__(self):
        """Micro-batches this rank yields in the current epoch; equal on every rank with
        equalize. Plans the whole epoch the first time (cached for the iteration)."""
        return sum(self.steps())

    def _flat(self, mb):
        return [i for row in mb for i in row]

    def __iter__(self):
        for _, own, _ in self._entries():
            for mb in own:
                yield self._flat(mb)

    def plans(self):
        """The epoch's plans, for :class:`PipelineExecutor`: yields a :class:`PlannedBatch` per
        plan (plan, replica, this replica's micro-batches in the plan's order), planned ahead
        like ``__iter__``. The micro-batches are the plan's own (``equalize`` does not apply:
        the executor runs the plan as it is). Call ``set_epoch`` first, as for ``__iter__``."""
        for k, (_, _, plan) in enumerate(self._entries()):
            yield PlannedBatch(plan, self.replica, k)

    def _entries(self):
        if self._cache is not None and self._cache[0] == self.epoch:
            yield from self._cache[1]
            return
        batches = self.global_batches()
        epoch = self.epoch
        if self.prefetch <= 0:
            plans = []
            for i, b in enumerate(batches):
                t0 = time.perf_counter()
                entries = self._plan_global_batch(epoch, i, b)
                self.stats["wait_seconds"] += time.perf_counter() - t0  # the loop waited
                for entry in entries:
                    plans.append(entry)
                    yield entry
            self._cache = (epoch, plans)
            return
        yield from self._iter_ahead(batches, epoch)

    def _iter_ahead(self, batches, epoch):
        q = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()
        done = object()

        def put(item):
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    pass
            return False

        def work():
            try:
                for i, b in enumerate(batches):
                    if not put(self._plan_global_batch(epoch, i, b)):
                        return
                put(done)
            except BaseException as e:  # handed to the loop's thread
                put(e)

        thread = threading.Thread(target=work, name="sluice-planner", daemon=True)
        thread.start()
        plans = []
        try:
            while True:
                t0 = time.perf_counter()
                item = q.get()
                self.stats["wait_seconds"] += time.perf_counter() - t0
                if item is done:
                    break
                if isinstance(item, BaseException):
                    raise item
                plans.extend(item)
                yield from item
            self._cache = (epoch, plans)
        finally:
            stop.set()
            thread.join()


def _tokens_of(feature, key):
    if isinstance(feature, dict):
        ids = feature[key]
        labels = feature.get("labels")
    else:
        ids, labels = feature, None
    ids = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
    if labels is not None:
        labels = torch.as_tensor(labels, dtype=torch.long).reshape(-1)
        if labels.numel() != ids.numel():
            raise Error(f"labels: {labels.numel()} labels for {ids.numel()} tokens; allowed: one "
                        f"per token")
    return ids, labels


class PackedCollator:
    """Packs a micro-batch's samples into one row (batch dimension 1), with no padding:

    input_ids, labels, position_ids: (1, total tokens) long. position_ids restart at 0 for
        every sample; labels are the sample's ``labels`` (or its input_ids) with the first token
        of every sample set to ``ignore_index``, so a causal model's shifted loss never predicts
        across a sample boundary (Hugging Face's DataCollatorWithFlattening convention).
    cu_seqlens: (samples + 1,) int32 cumulative lengths from 0 (flash-attention varlen), also as
        cu_seq_lens_q / cu_seq_lens_k; max_seqlen: the longest sample (int), also as
        max_length_q / max_length_k; seq_lens: (samples,) long; num_samples, num_tokens: ints.

    Features are dicts with ``key`` (default "input_ids") and optional "labels", or plain
    sequences / 1-D tensors of token ids. Samples longer than ``max_seqlen`` are truncated (the
    sampler planned them clipped). An empty micro-batch gives zero-length tensors.
    """

    def __init__(self, key="input_ids", ignore_index=-100, max_seqlen=None):
        self.key, self.ignore_index, self.max_seqlen = key, ignore_index, max_seqlen

    def __call__(self, features):
        ids_list, labels_list, lens = [], [], []
        for f in features:
            ids, labels = _tokens_of(f, self.key)
            if self.max_seqlen is not None:
                ids = ids[:self.max_seqlen]
                labels = None if labels is None else labels[:self.max_seqlen]
            labels = ids.clone() if labels is None else labels.clone()
            if labels.numel():
                labels[0] = self.ignore_index
            ids_list.append(ids)
            labels_list.append(labels)
            lens.append(ids.numel())
        seq_lens = torch.tensor(lens, dtype=torch.long)
        cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
        if lens:
            cu[1:] = torch.cumsum(seq_lens, 0).to(torch.int32)
        cat = (lambda xs: torch.cat(xs)) if lens else (lambda xs: torch.zeros(0, dtype=torch.long))
        positions = [torch.arange(n, dtype=torch.long) for n in lens]
        max_len = max(lens) if lens else 0
        return {
            "input_ids": cat(ids_list).unsqueeze(0),
            "labels": cat(labels_list).unsqueeze(0),
            "position_ids": cat(positions).unsqueeze(0),
            "cu_seqlens": cu, "cu_seq_lens_q": cu, "cu_seq_lens_k": cu,
            "max_seqlen": max_len, "max_length_q": max_len, "max_length_k": max_len,
            "seq_lens": seq_lens,
            "num_samples": len(lens), "num_tokens": int(sum(lens)),
        }


class PaddedCollator:
    """Pads a micro-batch's samples to its longest (rounded up to ``pad_to_multiple_of``):

    input_ids (B, T) long, padded with ``pad_token_id``; attention_mask (B, T) long, 1 on real
    tokens; labels (B, T) long, the sample's ``labels`` (or input_ids) and ``ignore_index`` on
    padding; position_ids (B, T): 0..len-1, then 0 on padding; seq_lens (B,); num_samples,
    num_tokens (real tokens). Truncation and features as in :class:`PackedCollator`.
    """

    def __init__(self, key="input_ids", pad_token_id=0, ignore_index=-100, max_seqlen=None,
                 pad_to_multiple_of=None):
        self.key, self.pad_token_id, self.ignore_index = key, pad_token_id, ignore_index
        self.max_seqlen, self.pad_to_multiple_of = max_seqlen, pad_to_multiple_of

    def __call__(self, features):
        rows = []
        for f in features:
            ids, labels = _tokens_of(f, self.key)
            if self.max_seqlen is not None:
                ids = ids[:self.max_seqlen]
                labels = None if labels is None else labels[:self.max_seqlen]
            rows.append((ids, ids if labels is None else labels))
        width = max((ids.numel() for ids, _ in rows), default=0)
        m = self.pad_to_multiple_of
        if m:
            width = -(-width // m) * m
        b = len(rows)
        input_ids = torch.full((b, width), self.pad_token_id, dtype=torch.long)
        labels = torch.full((b, width), self.ignore_index, dtype=torch.long)
        mask = torch.zeros((b, width), dtype=torch.long)
        positions = torch.zeros((b, width), dtype=torch.long)
        for r, (ids, lab) in enumerate(rows):
            n = ids.numel()
            input_ids[r, :n] = ids
            labels[r, :n] = lab
            mask[r, :n] = 1
            positions[r, :n] = torch.arange(n)
        lens = [ids.numel() for ids, _ in rows]
        return {"input_ids": input_ids, "attention_mask": mask, "labels": labels,
                "position_ids": positions, "seq_lens": torch.tensor(lens, dtype=torch.long),
                "num_samples": b, "num_tokens": int(sum(lens))}


class PackedSeq2SeqCollator:
    """Packs an encoder-decoder micro-batch: the encoder inputs into one row and the decoder
    targets into another, each with its own ``cu_seqlens``, ``max_seqlen`` and per-sample
    ``position_ids`` (so flash-attention's varlen kernels run the encoder's self-attention, the
    decoder's causal self-attention and the decoder-to-encoder cross-attention per sample):

    input_ids (1, E) long: the samples' encoder tokens; encoder_position_ids (1, E): restart at
        0 per sample; encoder_cu_seqlens (samples + 1,) int32 from 0; encoder_max_seqlen (int);
        encoder_seq_lens (samples,) long.
    labels (1, D) long: the samples' targets (per sample, unshifted: decoder position i
        predicts labels[i]). decoder_input_ids (1, D): the feature's ``decoder_input_ids``, or
        its targets shifted right by one within the sample, starting with
        ``decoder_start_token_id`` (T5's convention), so no position sees the next sample.
        decoder_position_ids, decoder_cu_seqlens, decoder_max_seqlen, decoder_seq_lens: as the
        encoder's.
    cu_seq_lens_q / cu_seq_lens_k, max_length_q / max_length_k: the cross-attention's (queries:
        the decoder; keys: the encoder), in Hugging Face's names.
    num_samples; num_tokens (encoder + decoder), num_encoder_tokens, num_decoder_tokens.

    Features are dicts with ``key`` (the encoder tokens, default "input_ids") and
    ``target_key`` (default "labels"), optionally "decoder_input_ids" (one per target). Inputs
    and targets longer than ``max_seqlen`` are truncated (the sampler planned them clipped).
    """

    def __init__(self, key="input_ids", target_key="labels", decoder_start_token_id=0,
                 max_seqlen=None):
        self.key, self.target_key = key, target_key
        self.decoder_start_token_id, self.max_seqlen = int(decoder_start_token_id), max_seqlen

    def _sample(self, k, f):
        if not isinstance(f, dict) or self.key not in f or self.target_key not in f:
            raise Error(f"features[{k}]: expected a dict with '{self.key}' (encoder tokens) and "
                        f"'{self.target_key}' (decoder targets)")
        ids = torch.as_tensor(f[self.key], dtype=torch.long).reshape(-1)
        target = torch.as_tensor(f[self.target_key], dtype=torch.long).reshape(-1)
        dec = f.get("decoder_input_ids")
        if dec is not None:
            dec = torch.as_tensor(dec, dtype=torch.long).reshape(-1)
            if dec.numel() != target.numel():
                raise Error(f"features[{k}]: {dec.numel()} decoder_input_ids for "
                            f"{target.numel()} '{self.target_key}'; allowed: one per target")
        if self.max_seqlen is not None:
            ids, target = ids[:self.max_seqlen], target[:self.max_seqlen]
            dec = None if dec is None else dec[:self.max_seqlen]
        if dec is None:
            dec = torch.cat([torch.tensor([self.decoder_start_token_id]), target[:-1]]) \
                if target.numel() else target.clone()
        return ids, target, dec

    @staticmethod
    def _pack(parts):
        lens = [p.numel() for p in parts]
        cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
        if lens:
            cu[1:] = torch.cumsum(torch.tensor(lens, dtype=torch.long), 0).to(torch.int32)
        row = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)
        positions = torch.cat([torch.arange(n, dtype=torch.long) for n in lens]) if lens else \
            torch.zeros(0, dtype=torch.long)
        return (row.unsqueeze(0), positions.unsqueeze(0), cu, max(lens, default=0),
                torch.tensor(lens, dtype=torch.long))

    def __call__(self, features):
        samples = [self._sample(k, f) for k, f in enumerate(features)]
        enc, enc_pos, enc_cu, enc_max, enc_lens = self._pack([s[0] for s in samples])
        labels, dec_pos, dec_cu, dec_max, dec_lens = self._pack([s[1] for s in samples])
        dec_ids = self._pack([s[2] for s in samples])[0]
        e, d = int(enc_lens.sum()), int(dec_lens.sum())
        return {
            "input_ids": enc, "encoder_position_ids": enc_pos, "encoder_cu_seqlens": enc_cu,
            "encoder_max_seqlen": enc_max, "encoder_seq_lens": enc_lens,
            "labels": labels, "decoder_input_ids": dec_ids, "decoder_position_ids": dec_pos,
            "decoder_cu_seqlens": dec_cu, "decoder_max_seqlen": dec_max,
            "decoder_seq_lens": dec_lens,
            "cu_seq_lens_q": dec_cu, "cu_seq_lens_k": enc_cu,
            "max_length_q": dec_max, "max_length_k": enc_max,
            "num_samples": len(samples), "num_tokens": e + d,
            "num_encoder_tokens": e, "num_decoder_tokens": d,
        }
