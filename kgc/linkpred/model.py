"""The link predictor: query tower g(head | relation) = the conditioner, tail tower f(entity).

The model's TextBank holds the texts of the graph it was built over. A bank over more entities (the run's graph
plus entities added with ``kgc index --add``) is passed to the encoding methods (``bank=``), never swapped in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from kgc.conditioning.base import build_conditioner
from kgc.conditioning.engine import PairEncoder
from kgc.data.graph import KnowledgeGraph
from kgc.data.texts import TextBank
from kgc.encoding.backbone import TextEncoder, load_tokenizer
from kgc.errors import KGCError
from kgc.recipe import Recipe
from kgc.training.setup import TaskModel, build_encoders, conditioner_options


class TailMap(nn.Module):
    """``model.tail_map_rank`` r: t' = normalise(t + U (Vᵀ t)) on the tail tower's unit vectors, U, V (dim, r);
    U starts at zero (the map starts as the identity, as LoRA's B does), V ~ N(0, 1/dim). It lets the tail side
    learn when the tail tower does not (``loss.table_tails``): the loss maps the whole frozen table at every step,
    O(entities · dim · r)."""

    def __init__(self, dim: int, rank: int) -> None:
        super().__init__()
        self.u = nn.Parameter(torch.zeros(dim, rank))
        self.v = nn.Parameter(torch.randn(dim, rank) / dim ** 0.5)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        """(n, dim) unit vectors → (n, dim) unit vectors."""
        mapped = t + (t @ self.v.to(t.dtype)) @ self.u.t().to(t.dtype)
        return F.normalize(mapped, dim=-1)

    def matrix(self) -> torch.Tensor:
        """(dim, dim) the linear part, I + U Vᵀ (before the normalisation)."""
        return torch.eye(self.u.size(0)) + self.u.detach().cpu() @ self.v.detach().cpu().t()


class LinkPredictor(TaskModel):
    def __init__(self, query_encoder: TextEncoder, tail_encoder: TextEncoder, bank: TextBank, conditioner: str,
                 tail_map_rank: int | None = None, **options) -> None:
        super().__init__()
        self.query_encoder = query_encoder
        self.tail_encoder = tail_encoder  # may be the same module (shared towers)
        self.tail_map = TailMap(tail_encoder.dim, tail_map_rank) if tail_map_rank else None
        self.bank = bank
        self.conditioner = build_conditioner(conditioner, encoder=query_encoder, special=bank.special,
                                             max_tokens=bank.max_tokens, **options)
        if self.conditioner.out_dim != tail_encoder.dim:
            raise KGCError(f"model.conditioner={conditioner} gives {self.conditioner.out_dim}-dimensional queries "
                           f"but entities are {tail_encoder.dim}-dimensional; for link prediction leave "
                           "model.case_dim unset (it defaults to the encoder width)")

    @property
    def encoders(self) -> list[TextEncoder]:
        return list(dict.fromkeys([self.query_encoder, self.tail_encoder]))

    @property
    def tokenizer_hash(self) -> str:
        return self.bank.tokenizer_hash

    def layer_cache_texts(self, recipe: Recipe, examples: int | None) -> list:
        """What the layer cache stores over a run of ``examples`` training examples (None: evaluation only), as
        :class:`~kgc.training.cache_plan.CachedTexts`: every entity's text; one query-tower sequence per example, at
        most one per train direction (the same head, relation and left-out neighbour make the same sequence), and
        dev's and test's; where the tail tower runs in training (not ``loss.table_tails``), the tails and heads
        whose text loses a neighbour name (2 per example, at most 2 per direction, in the share of entities whose
        text has neighbour names); the relations' texts where the conditioner encodes them apart. Tokens with the
        special ones, at most ``data.max_tokens``: an entity's evaluation text exactly, a query at the mean entity
        text's length (a bi-encoder's: plus the relation's, in one sequence)."""
        import numpy as np

        from kgc.training.cache_plan import CachedTexts

        bank, graph = self.bank, self.bank.graph
        cap, one, pair, n = bank.max_tokens, bank.special.n_single, bank.special.n_pair, graph.num_entities
        base = getattr(bank.base, "lengths", None)  # "name: description" tokens, no specials
        base = np.fromiter(map(len, bank.base), dtype=np.int64, count=n) if base is None else np.asarray(base)
        if hasattr(bank, "eval_lengths"):  # computed on the bank's arrays, no list per entity
            own = np.asarray(bank.eval_lengths(), dtype=np.int64)
        else:  # a bank of lists: the texts with neighbour names appended read one by one
            own = base.copy()
            for e in (e for e in range(n) if bank.short[e] and bank.neighbors[e]):
                own[e] = len(bank.entity_ids(e))
        entity = np.minimum(own + one, cap)  # (E,) tokens each entity's text is stored at (special tokens in)
        grown = own != base  # (E,) texts with neighbour names: one more sequence per name left out in training
        rel = np.fromiter(map(len, bank.relation_ids), dtype=np.int64)
        rel_mean = float(rel.mean()) if rel.size else 0.0
        if self.conditioner.enters_at == "input":  # the head's and the relation's tokens in one sequence
            query = np.minimum(entity - one + rel_mean + pair, cap)
        else:
            query = entity
        seen = min(int(examples or 0), 2 * len(graph.splits["train"]))  # training examples, at most every direction
        queries = seen + 2 * sum(len(graph.splits.get(s, ())) for s in ("dev", "test"))
        mean = lambda x: float(x.mean()) if x.size else 0.0  # noqa: E731
        out = [CachedTexts("entity texts", n, mean(entity)), CachedTexts("query sequences", queries, mean(query))]
        if seen and grown.any() and not getattr(getattr(recipe, "loss", None), "table_tails", False):
            out.append(CachedTexts("tail sequences", int(round(2 * seen * grown.mean())), mean(entity[grown])))
        if self.conditioner.encodes_conditions:
            out.append(CachedTexts("relation texts", len(rel), mean(np.minimum(rel + one, cap))))
        return out

    def encode_queries(self, heads: Sequence[int], rels: Sequence[int],
                       excludes: Sequence[int | None] | None = None, *, bank: TextBank | None = None) -> torch.Tensor:
        """(batch, dim): head texts (neighbour ``excludes`` left out) under their relations; ``bank``: the texts
        to read the heads from (default the model's own)."""
        bank = bank or self.bank
        excludes = excludes if excludes is not None else [None] * len(heads)
        return self.encode_query_tokens(bank.entity_batch(heads, excludes), rels)

    def encode_query_tokens(self, sentences: Sequence[Sequence[int]], rels: Sequence[int]) -> torch.Tensor:
        """(batch, dim): head texts given as token ids (no special tokens; an entity's text, or free text) under their
        relations."""
        return self.conditioner([list(s) for s in sentences], [self.bank.relation_ids[int(r)] for r in rels])

    def prepare_queries(self, heads: Sequence[int], rels: Sequence[int], excludes: Sequence[int] | None = None):
        """The query tower's inputs for a training step, built on the host (:meth:`Conditioner.prepare`): head texts
        (neighbour ``excludes`` left out) under their relations, as arrays; read by
        ``conditioner.forward_prepared``."""
        from kgc.data.ragged import Ragged

        if getattr(self, "_relation_rows", None) is None or len(self._relation_rows) != len(self.bank.relation_ids):
            self._relation_rows = Ragged.from_lists(self.bank.relation_ids)
        return self.conditioner.prepare(self.bank.entity_batch(heads, excludes),
                                        self._relation_rows.take(np.asarray(rels, dtype=np.int64)))

    def prepare_entities(self, entities: Sequence[int], excludes: Sequence[int | None] | None = None):
        """The tail tower's inputs for ``entities``, built on the host: distinct rows in length groups, pinned
        (:func:`kgc.encoding.inputs.build_inputs`); read by :meth:`encode_prepared_entities`."""
        from kgc.encoding.inputs import build_inputs

        enc = self.tail_encoder
        return build_inputs(self.bank.entity_inputs(entities, excludes), bucket=enc.group_bucket(),
                            cap=enc.length_cap).pin(self.device)

    def encode_prepared_entities(self, inputs) -> torch.Tensor:
        """(batch, dim) the tail tower, then the tail map, over :meth:`prepare_entities`'s inputs."""
        return self.map_table(self.tail_encoder.encode_inputs(inputs), grad=True)

    def encode_entities(self, entities: Sequence[int], excludes: Sequence[int | None] | None = None, *,
                        bank: TextBank | None = None) -> torch.Tensor:
        """(batch, dim) tail-tower embeddings; identical texts in the batch are encoded once."""
        return self.encode_tail_inputs((bank or self.bank).entity_inputs(entities, excludes))

    def encode_tail_inputs(self, batch: dict[str, torch.Tensor], *, mapped: bool = True) -> torch.Tensor:
        """(batch, dim) the tail tower over tokenised inputs (``input_ids``, ``attention_mask``), then the tail map
        (``mapped=False``: the tower's own outputs)."""
        vectors = self.tail_encoder.encode_unique(batch)  # moved to the device by encode_unique
        return self.map_table(vectors, grad=True) if mapped else vectors

    def map_table(self, table: torch.Tensor, *, grad: bool = False) -> torch.Tensor:
        """The tail tower's (n, dim) outputs through the tail map (``model.tail_map_rank``; unchanged without)."""
        if self.tail_map is None:
            return table
        with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
            return self.tail_map(table.to(self.tail_map.u.device)).to(table.device, table.dtype)

    @torch.no_grad()
    def entity_table(self, batch_size: int = 256, progress: bool = False, *, mapped: bool = True) -> torch.Tensor:
        """(entities, dim) for every entity, evaluation-time texts (all neighbours); ``mapped=False``: the tail
        tower's own outputs, before the tail map."""
        from tqdm.auto import tqdm

        out = torch.empty(self.bank.graph.num_entities, self.tail_encoder.dim)
        for idx in tqdm(self.bank.length_batches(batch_size), desc="entities", disable=not progress, leave=False):
            out[idx] = self.encode_tail_inputs(self.bank.entity_inputs(idx), mapped=mapped).float().cpu()
        return out


class QueryEngine(PairEncoder):
    """Answers (head, relation) query vectors for evaluation, at the conditioner's own cost.

    Input-level conditioners (bi-encoder, CASE) run the whole encoder per query. Conditioners that meet
    the condition later get every entity's sentence state (up to their layer) and every relation's state
    computed once; per query only ``combine`` runs — the top k layers for the router, one cheap
    composition for the tri-encoders and Hyper-CL. With shared towers a pooled conditioner's sentence
    table *is* the entity table, so cached entity embeddings are borrowed instead of recomputed.
    """

    def __init__(self, model: "LinkPredictor", *, batch_size: int = 256, progress: bool = False,
                 entity_table: torch.Tensor | None = None, heads: Sequence[int] | None = None) -> None:
        """``heads``: the entities whose states to compute now (the others when a query first asks for one); None:
        every entity's, as a service wants them. A shared sentence table covers every entity whatever ``heads``."""
        self.model = model
        bank, cond = model.bank, model.conditioner
        self.shares_entity_table = (cond.enters_at == "pooled" and model.query_encoder is model.tail_encoder
                                    and model.tail_map is None)  # a tail map makes entities ≠ sentence states
        super().__init__(cond, bank.texts, bank.relation_ids,
                         batch_size=batch_size, progress=progress,
                         sentence_table=entity_table if self.shares_entity_table else None,
                         only=None if self.shares_entity_table else heads)

    @property
    def entity_table(self) -> torch.Tensor | None:
        return self.sentences[self.row] if self.shares_entity_table else None


def build_model(recipe: Recipe, graph: KnowledgeGraph, backbone_folder: Path, *, pretrained: bool = True):
    """Return (model, tokenizer). ``pretrained=False`` builds the architecture only (weights come next)."""
    tokenizer = load_tokenizer(backbone_folder)
    bank = TextBank(graph, tokenizer, max_tokens=recipe.data.max_tokens, neighbor_text=recipe.data.neighbor_text,
                    max_neighbors=recipe.data.max_neighbors,
                    short_description_words=recipe.data.short_description_words)
    query, tail = build_encoders(recipe, backbone_folder, pretrained=pretrained, shared=recipe.model.shared_towers)
    model = LinkPredictor(query, tail, bank, recipe.model.conditioner, tail_map_rank=recipe.model.tail_map_rank,
                          **conditioner_options(recipe))
    return model, tokenizer
