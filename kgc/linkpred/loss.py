"""SimKGC's contrastive objective, whole, in one module.

Logits for query i (row) against candidate tails (columns), all cosines of unit vectors:

* in-batch block ``(B, B)``: ``cos(q_i, t_j)``; the positive ``j = i`` gets the additive margin γ
  subtracted; false negatives (same tail, or another known train tail of (h_i, r_i)) are masked;
* pre-batch block ``(B, K)``: tails of the previous k batches (a queue, filled as training goes, never
  random warm-up vectors), weighted by ``pre_batch_weight`` and false-negative masked the same way;
* self-negative column ``(B, 1)``: ``cos(q_i, e_{h_i})``, the head's own entity embedding, masked where
  the head is itself a known answer;
* entity-table block ``(B, E)`` (``table_negatives``, off by default): ``cos(q_i, t_e)`` against a table of
  every entity's tail-tower embedding, refreshed every N steps without gradient (ANCE-style; the task refreshes
  it, :meth:`SimKGCLoss.set_table`), the gold and other known answers masked as false negatives and the batch's
  own tails masked too (they are in the in-batch block, with their gradients);
* ``self_negative_weight`` w (default 1): the head's self-negative logit gets ``+ log w`` — the head counted as
  w negatives, a harder push away from the head's own text early in training (evaluation is unchanged);
* ``table_tails`` (with the table): the batch's tails are read from that table too, so no tail tower runs between
  refreshes: the in-batch block and the table block together are one softmax over every entity (the gold with its
  margin, known answers masked), and the head's self-negative is its own row of the table (no separate column,
  which would count it twice). Only the queries carry gradients — and the tail map, when the model has one
  (``table_map``, ``model.tail_map_rank``): the table's rows pass through it at every step.

* past ``table_chunk`` entities the table block is never formed whole: the loss needs of it only
  ``T_i = log Σ_{e kept} exp(s_ie)``, since ``CE([a_i, t_i], gold) = logsumexp([a_i, T_i]) − a_i[gold]`` when the gold
  is in ``a_i`` (it always is: the table masks it). ``T_i`` is accumulated chunk by chunk (``logsumexp`` of the
  chunks' ``logsumexp``), and each chunk runs under activation checkpointing, so its ``(B, chunk)`` scores are
  recomputed in the backward pass instead of kept: memory B × chunk instead of B × E, the same loss and gradients;
* ``table_sample`` n (past n entities): each step scores the queries against n rows drawn uniformly *without*
  replacement instead of the whole table, each sampled logit corrected by ``+ log(E/n)``: the sampled-softmax
  (log-Q) correction of Bengio & Senécal (2008) and Jean et al. (2015) for inclusion probability Q = n/E, so that
  ``Σ_{e ∈ S} exp(s_ie + log(E/n))`` is an unbiased (Horvitz–Thompson) estimate of the table's ``Σ_e exp(s_ie)``.
  Its log, the loss, is biased low (Jensen), less so as n grows; at n = E it is the full loss exactly. SimKGC's
  paper has no table at all (it is kgc's laptop device), so this departs from the full-table objective, not from
  the paper. With ``table_tails`` each head's own row becomes its own self-negative column (weighted, masked as
  its table row was) and leaves the sample, so a head is never lost to the draw.

Everything is scaled by the learnable ``1/τ`` (stored as ``log 1/τ``, clamped to
``[1/max_temperature, 1/min_temperature]`` after each optimiser step, as CLIP does: :meth:`SimKGCLoss.clamp_`). Loss = CE(rows) + CE(in-batch block transposed) — the
second term is SimKGC's symmetric tail → query direction.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from kgc.training.objective import Objective

MASKED = -1e4  # SimKGC's fill value: exp(-1e4 / τ) is exactly 0 in fp32


def is_known(keys: torch.Tensor, train_keys: torch.Tensor) -> torch.Tensor:
    """``torch.isin(keys, train_keys)`` for a sorted ``train_keys``, by binary search: exact, without the sort of
    every key that ``isin`` does each call."""
    if train_keys.numel() == 0:
        return torch.zeros_like(keys, dtype=torch.bool)
    at = torch.searchsorted(train_keys, keys).clamp_(max=train_keys.numel() - 1)
    return train_keys[at] == keys


def false_negative_mask(hr_keys: torch.Tensor, gold: torch.Tensor, candidates: torch.Tensor,
                        train_keys: torch.Tensor, num_entities: int) -> torch.Tensor:
    """``mask[i, j]`` is False where candidate ``j`` is a true answer of query ``i`` other than the gold.

    hr_keys (B,) = ``h * 2R + r``; gold (B,) tail ids; candidates (C,) entity ids; train_keys sorted
    (n,) of ``hr_key * E + t``. Vectorised: one broadcast comparison and one binary search per key.
    """
    same_tail = gold.unsqueeze(1) == candidates.unsqueeze(0)  # (B, C)
    keys = hr_keys.unsqueeze(1) * num_entities + candidates.unsqueeze(0)  # (B, C)
    return ~(same_tail | is_known(keys, train_keys))


def known_answer_pairs(hr_keys: torch.Tensor, train_keys: torch.Tensor,
                       num_entities: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, entities): every known train answer of each query, as pairs. The answers of ``hr`` are the run of sorted
    ``train_keys`` in ``[hr·E, (hr + 1)·E)``: two binary searches per query, no B × E lookups."""
    rows = torch.arange(hr_keys.size(0), device=hr_keys.device)
    start = torch.searchsorted(train_keys, hr_keys * num_entities)
    count = torch.searchsorted(train_keys, (hr_keys + 1) * num_entities) - start  # (B,) known answers per query
    total = int(count.sum())
    if not total:
        return rows[:0], rows[:0]
    row = torch.repeat_interleave(rows, count)  # (total,) the query each known answer belongs to
    first = torch.repeat_interleave(count.cumsum(0) - count, count)  # (total,) where its query's run starts
    at = torch.repeat_interleave(start, count) + torch.arange(total, device=hr_keys.device) - first
    return row, train_keys[at] - hr_keys[row] * num_entities


def false_negative_mask_all(hr_keys: torch.Tensor, gold: torch.Tensor, train_keys: torch.Tensor,
                            num_entities: int) -> torch.Tensor:
    """:func:`false_negative_mask` with every entity as the candidates (``candidates = arange(E)``), built from
    each query's known answers (:func:`known_answer_pairs`) instead of B × E lookups: a (B, E) mask of ones gets
    them and the gold set to False. The same mask; with it the laptop recipe's objective takes 74 instead of 246 ms
    per step of 64 (``kgc bench loss recipes/wn18rr_laptop.yaml``)."""
    b = hr_keys.size(0)
    keep = torch.ones(b, num_entities, dtype=torch.bool, device=hr_keys.device)
    keep[torch.arange(b, device=hr_keys.device), gold] = False
    row, ent = known_answer_pairs(hr_keys, train_keys, num_entities)
    keep[row, ent] = False
    return keep


def _chunk_logsumexp(query: torch.Tensor, table: torch.Tensor, inv_t: torch.Tensor, start: int, end: int,
                     ids: torch.Tensor | None, rows: torch.Tensor, cols: torch.Tensor, every: torch.Tensor,
                     shift: float) -> torch.Tensor:
    """(B,) ``logsumexp_e`` over candidates ``[start, end)`` (table rows, or rows ``ids[start:end]``) of
    ``cos(q, t_e)/τ + shift``, with the pairs (rows, cols) and the columns ``every`` (all rows) masked; columns
    counted from 0, not ``start``. Run under checkpointing: nothing here is kept for the backward pass."""
    block = table[start:end] if ids is None else table[ids[start:end]]  # (c, d)
    logits = (query @ block.to(query.dtype).t()) * inv_t + shift  # (B, c)
    if rows.numel():
        logits = logits.index_put((rows, cols), torch.tensor(MASKED, dtype=logits.dtype, device=logits.device))
    if every.numel():
        logits = logits.index_fill(1, every, MASKED)
    return torch.logsumexp(logits, 1)


class SimKGCLoss(Objective):
    def __init__(self, *, temperature: float = 0.05, learn_temperature: bool = True, margin: float = 0.02,
                 in_batch: bool = True, pre_batch: int = 0, pre_batch_weight: float = 0.5,
                 self_negative: bool = True, mask_false_negatives: bool = True, symmetric: bool = True,
                 min_temperature: float = 0.01, max_temperature: float = 1.0,
                 table_negatives: int | None = None, table_tails: bool = False,
                 self_negative_weight: float = 1.0, table_chunk: int = 65536,
                 table_sample: int | None = None) -> None:
        super().__init__()
        self.log_inv_t = nn.Parameter(torch.tensor(math.log(1.0 / temperature)), requires_grad=learn_temperature)
        self.log_inv_t_range = (math.log(1.0 / max_temperature), math.log(1.0 / min_temperature))
        self.clamp_()
        self.margin, self.in_batch, self.pre_batch = margin, in_batch, pre_batch
        self.pre_batch_weight, self.self_negative = pre_batch_weight, self_negative
        self.mask_false_negatives, self.symmetric = mask_false_negatives, symmetric
        self.queue: list[tuple[torch.Tensor, torch.Tensor]] = []  # (tail vectors (B, d), tail ids (B,))
        self.table_negatives = table_negatives  # refresh interval in steps (the task refreshes); None: no table
        self.table: torch.Tensor | None = None  # (E, d) every entity's tail-tower embedding, no gradient
        self._probing = False  # inside probing(): a missing table is a stand-in of its shape
        self.table_tails = table_tails  # the batch's tails come from the table (no tail tower in the step)
        self.log_self_weight = math.log(self_negative_weight)  # the head counts as w negatives: its logit + log w
        self.table_chunk = table_chunk  # past this many table columns: the table's logsumexp in chunks
        self.table_sample = table_sample  # past this many entities: n rows drawn per step (None: the whole table)
        self._table_map: tuple = (None,)  # model.tail_map (kept out of this module's parameters and state_dict)

    @property
    def table_map(self) -> "nn.Module | None":
        """The model's tail map (``model.tail_map_rank``): the table's rows pass through it, with gradients, at every
        step. Held by reference, not as a submodule: it belongs to the model, and the loss's state stays τ."""
        return self._table_map[0]

    def set_table_map(self, module: "nn.Module | None") -> None:
        """Hold ``module`` as the table's map (a plain attribute assignment would register it as a submodule)."""
        self._table_map = (module,)

    @property
    def inv_t(self) -> torch.Tensor:
        return self.log_inv_t.exp()

    @torch.no_grad()
    def clamp_(self) -> None:
        """Keep τ in [min_temperature, max_temperature]: called after every optimiser step, as CLIP clamps its
        logit scale. (Clamping inside the forward pass instead, as this module once did, zeroes the gradient at
        the bound, so a temperature pushed there could never move back.)"""
        self.log_inv_t.clamp_(*self.log_inv_t_range)

    @property
    def temperature(self) -> float:
        return float(1.0 / self.inv_t.detach())

    def forward(self, query: torch.Tensor, tail: torch.Tensor | None, head: torch.Tensor | None, *,
                heads: torch.Tensor, rels: torch.Tensor, tails: torch.Tensor, train_keys: torch.Tensor,
                num_entities: int, num_relations2: int) -> torch.Tensor:
        """query, tail, head: (B, d) unit vectors; heads, rels, tails: (B,) ids; returns the scalar loss.

        Under ``torchrun`` these are this rank's B/N rows of the global batch: queries and tails are gathered
        from every rank with gradients, so row i is scored against the global batch's tails (and column j
        against its queries), and the loss is the mean over this rank's rows — its average over ranks, which
        DDP's gradient averaging takes, is the single-process loss of the global batch.

        With ``table_tails`` pass ``tail=None, head=None``: both come from the table.
        """
        from kgc.training import distributed as dist

        table = self.table
        if table is None and self.table_negatives and self._probing:  # Objective.probing
            table = F.normalize(torch.randn(num_entities, query.size(1), generator=torch.Generator().manual_seed(0)),
                                dim=-1).to(query.device)  # (E, d): the table's shape, for the probe's timing
        if table is not None and self.table_map is not None:
            table = self.table_map(table.to(query.dtype))  # (E, d): the tail map learns through every row
        whole = table is None or self._whole_table(table.size(0))  # else chunked or sampled: _table_logsumexp
        if self.table_tails:
            if table is None:
                raise RuntimeError("loss.table_tails: the entity table must be set before the first step")
            tail, head = table[tails].to(query.dtype), None  # (b, d); the head is a table row
            if not whole and self.self_negative:  # the head's row as its own column (see the module docstring)
                head = table[heads].to(query.dtype)
        b = query.size(0)
        inv_t = self.inv_t
        hr = heads * num_relations2 + rels  # (b,)
        tail_all, query_all = dist.gather_with_grad(tail), dist.gather_with_grad(query)  # (B, d)
        tails_all, hr_all = dist.gather(tails), dist.gather(hr)  # (B,)
        own = torch.arange(b, device=query.device) + dist.rank() * b  # column of each local row's positive
        # (b, B), built where the vectors are (an index made on the host would be copied over, and waited for)
        positive = own.unsqueeze(1) == torch.arange(tail_all.size(0), device=query.device).unsqueeze(0)
        rows = self._in_batch(query, tail_all, positive, inv_t, hr, tails, tails_all, train_keys, num_entities)
        blocks = [rows]  # (b, B) queries → global tails
        if self.pre_batch and self.queue:
            old_vec = torch.cat([v for v, _ in self.queue])  # (K, d)
            old_ids = torch.cat([i for _, i in self.queue])  # (K,)
            pre = (query @ old_vec.t()) * inv_t * self.pre_batch_weight  # (b, K)
            if self.mask_false_negatives:
                pre = pre.masked_fill(~false_negative_mask(hr, tails, old_ids, train_keys, num_entities), MASKED)
            blocks.append(pre)
        if table is not None and not whole:  # (b, 1): log Σ over the table's kept rows, never (b, E) at once
            blocks.append(self._table_logsumexp(query, table, inv_t, hr=hr, tails=tails, heads=heads,
                                                tails_all=tails_all, train_keys=train_keys,
                                                num_entities=num_entities).unsqueeze(1))
        elif table is not None:
            tab = (query @ table.to(query.dtype).t()) * inv_t  # (b, E): gradient reaches the table's map only
            keep = false_negative_mask_all(hr, tails, train_keys, num_entities)  # gold and known answers out
            keep[:, tails_all] = False  # the batch's tails score in the in-batch block, with their gradients
            if self.table_tails and self.self_negative and self.log_self_weight:  # the head's own row, weighted
                tab = tab.index_put((torch.arange(b, device=query.device), heads),
                                    tab[torch.arange(b, device=query.device), heads] + self.log_self_weight)
            blocks.append(tab.masked_fill(~keep, MASKED))
        if self.self_negative and head is not None:
            self_logit = (query * head).sum(-1) * inv_t + self.log_self_weight  # (b,)
            head_is_answer = is_known(hr * num_entities + heads, train_keys)  # (b,)
            if self.table_tails:  # the head's table row, masked as the whole table masks it
                head_is_answer = head_is_answer | (heads == tails) | torch.isin(heads, tails_all)
            blocks.append(self_logit.masked_fill(head_is_answer, MASKED).unsqueeze(1))
        all_logits = torch.cat(blocks, dim=1)  # (b, B + K + 1)
        loss = F.cross_entropy(all_logits, own)
        if self.symmetric:  # tail -> query: one process reads it off the same block, ranks score their own tails
            cols = rows.t() if not dist.active() else self._in_batch(
                tail, query_all, positive, inv_t, hr_all, tails_all, tails, train_keys, num_entities, transposed=True)
            loss = loss + F.cross_entropy(cols, own)
        if self.pre_batch and self.training:
            self.queue.append((tail_all.detach(), tails_all.detach()))  # the global batch's tails
            self.queue = self.queue[-self.pre_batch:]
        return loss

    def _whole_table(self, entities: int) -> bool:
        """Whether the table block is formed whole, (b, E) at once: a table of at most ``table_chunk`` entities
        that is not sampled (``table_sample`` unset, or not below E)."""
        return entities <= self.table_chunk and (self.table_sample is None or self.table_sample >= entities)

    def _table_logsumexp(self, query: torch.Tensor, table: torch.Tensor, inv_t: torch.Tensor, *, hr: torch.Tensor,
                         tails: torch.Tensor, heads: torch.Tensor, tails_all: torch.Tensor, train_keys: torch.Tensor,
                         num_entities: int) -> torch.Tensor:
        """(b,) ``T_i = log Σ_{e ∈ C, kept} exp(cos(q_i, t_e)/τ + log(E/|C|))`` over the candidates C (every entity,
        or ``table_sample`` drawn uniformly without replacement), in chunks of ``table_chunk`` columns.

        Masked (the whole table's mask): the gold, the query's known train answers, the batch's tails (they score in
        the in-batch block) and, with ``table_tails`` and the self-negative, the query's own head (its own column)."""
        from torch.utils.checkpoint import checkpoint

        e, b, device = table.size(0), query.size(0), query.device
        ids, shift = None, 0.0
        if self.table_sample is not None and self.table_sample <= e:  # n = E: every row, in a random draw
            drawn = torch.zeros(e, dtype=torch.bool, device=device)
            drawn[torch.randperm(e, device=device)[: self.table_sample]] = True  # uniform, no repeats
            ids = drawn.nonzero().squeeze(1)  # (n,) sorted, without a sort (torch's is slow on a CPU)
            shift = math.log(e / self.table_sample)  # − log Q, Q = n/E the inclusion probability of every row
        own = torch.arange(b, device=device)
        known_rows, known_ents = known_answer_pairs(hr, train_keys, num_entities)
        rows, cols = [own, known_rows], [tails, known_ents]  # (row, entity) pairs to mask
        if self.table_tails and self.self_negative:
            rows.append(own)
            cols.append(heads)
        rows, cols, every = torch.cat(rows), torch.cat(cols), torch.unique(tails_all)  # every: masked in all rows
        if ids is not None:  # entity id → its column among the sampled ids (entities not drawn dropped)
            def column(ents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                at = torch.searchsorted(ids, ents).clamp_(max=ids.numel() - 1)
                return at, ids[at] == ents

            cols, hit = column(cols)
            rows, cols = rows[hit], cols[hit]
            every, hit = column(every)
            every = every[hit]
        width = e if ids is None else ids.numel()
        step = max(1, self.table_chunk)
        grad = torch.is_grad_enabled() and (query.requires_grad or table.requires_grad or inv_t.requires_grad)
        parts = []
        for start in range(0, width, step):
            end = min(start + step, width)
            here, also = (cols >= start) & (cols < end), (every >= start) & (every < end)
            args = (query, table, inv_t, start, end, ids, rows[here], cols[here] - start, every[also] - start, shift)
            parts.append(checkpoint(_chunk_logsumexp, *args, use_reentrant=False) if grad
                         else _chunk_logsumexp(*args))
        return torch.logsumexp(torch.stack(parts, 1), 1)  # (b,)

    def _in_batch(self, a: torch.Tensor, b_all: torch.Tensor, positive: torch.Tensor, inv_t: torch.Tensor,
                  hr: torch.Tensor, gold: torch.Tensor, candidates: torch.Tensor, train_keys: torch.Tensor,
                  num_entities: int, *, transposed: bool = False) -> torch.Tensor:
        """The in-batch block (b, B): local rows ``a`` against the global batch ``b_all``, margin on the positive,
        scaled by 1/τ, false negatives masked. Rows are queries (``hr``, ``gold`` their own, ``candidates`` the
        global tails); ``transposed``: rows are this rank's tails against the global queries (``hr``/``gold``
        the global queries', ``candidates`` the local tails), the mask read column-wise."""
        logits = (a @ b_all.t() - positive * self.margin) * inv_t
        keep = positive
        if self.in_batch:
            if self.mask_false_negatives:
                mask = false_negative_mask(hr, gold, candidates, train_keys, num_entities)
                keep = positive | (mask.t() if transposed else mask)
            else:
                keep = torch.ones_like(positive)
        return logits.masked_fill(~keep, MASKED)

    @contextlib.contextmanager
    def probing(self):
        """Objective.probing: a forward before the first step's table (``table_negatives``) scores a random stand-in
        of the table's shape, (entities, d): the precision probe's step costs what a step costs."""
        self._probing = True
        try:
            yield
        finally:
            self._probing = False

    @torch.no_grad()
    def set_table(self, table: torch.Tensor | None) -> None:
        """The entity table (E, d), unit rows, detached (or None)."""
        self.table = None if table is None else table.detach()

    # the queue and the table are training state: they travel in checkpoints so a resumed run sees the same
    # negatives
    def queue_state(self) -> list[tuple[np.ndarray, np.ndarray]]:
        return [(v.cpu().numpy(), i.cpu().numpy()) for v, i in self.queue]

    def load_queue_state(self, state: list, device: torch.device) -> None:
        self.queue = [(torch.as_tensor(v, device=device), torch.as_tensor(i, device=device)) for v, i in state]

    def training_state(self) -> dict:
        return {"queue": self.queue_state(), "table": None if self.table is None else self.table.cpu().numpy()}

    # what the training loop asks of an objective (kgc.training.objective)
    def after_step(self) -> None:
        self.clamp_()  # τ back within [min_temperature, max_temperature]

    def figures(self) -> dict[str, float]:
        return {"tau": self.temperature}  # SimKGC's learnt temperature

    def extra_state(self) -> dict | list:
        return self.training_state() if self.table_negatives else self.queue_state()

    def load_extra_state(self, state: dict | list | None, device: torch.device) -> None:
        self.load_training_state(state, device)

    def load_training_state(self, state: dict | list | None, device: torch.device) -> None:
        """``state`` from :meth:`training_state` (a bare queue list: a checkpoint from before the table)."""
        state = state if isinstance(state, dict) else {"queue": state or [], "table": None}
        self.load_queue_state(state["queue"], device)
        self.set_table(None if state["table"] is None else torch.as_tensor(state["table"], device=device))
