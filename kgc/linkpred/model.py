"""The link predictor: query tower g(head | relation) = the conditioner, tail tower f(entity).

A run directory holds everything needed to rebuild it: ``backbone/`` (config + tokenizer files),
``recipe.yaml`` and the weights (``best.pt`` / ``checkpoints/last.pt``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import nn

from kgc.conditioning.base import build_conditioner, conditioner_class
from kgc.data.graph import KnowledgeGraph, load_graph
from kgc.data.texts import TextBank
from kgc.encoding.backbone import TextEncoder, load_backbone, load_tokenizer, resolve_backbone
from kgc.errors import KGCError
from kgc.fileio import sha256_file
from kgc.recipe import Recipe, load_recipe


class LinkPredictor(nn.Module):
    def __init__(self, query_encoder: TextEncoder, tail_encoder: TextEncoder, bank: TextBank, conditioner: str,
                 **options) -> None:
        super().__init__()
        self.query_encoder = query_encoder
        self.tail_encoder = tail_encoder  # may be the same module (shared towers)
        self.bank = bank
        self.conditioner = build_conditioner(conditioner, encoder=query_encoder, special=bank.special,
                                             max_tokens=bank.max_tokens, **options)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def layer_cache(self):
        return self.query_encoder.cache

    def save_cache(self) -> None:
        if self.layer_cache is not None:
            self.layer_cache.save()

    def encode_queries(self, heads: Sequence[int], rels: Sequence[int],
                       excludes: Sequence[int | None] | None = None) -> torch.Tensor:
        """(batch, dim): head texts (neighbour ``excludes`` left out) under their relations."""
        excludes = excludes if excludes is not None else [None] * len(heads)
        sentences = [self.bank.entity_ids(int(h), x) for h, x in zip(heads, excludes)]
        conditions = [self.bank.relation_ids[int(r)] for r in rels]
        return self.conditioner(sentences, conditions)

    def encode_entities(self, entities: Sequence[int], excludes: Sequence[int | None] | None = None) -> torch.Tensor:
        """(batch, dim) tail-tower embeddings; identical texts in the batch are encoded once."""
        batch = {k: v.to(self.device) for k, v in self.bank.entity_inputs(entities, excludes).items()}
        return self.tail_encoder.encode_unique(batch)

    @torch.no_grad()
    def entity_table(self, batch_size: int = 256, progress: bool = False) -> torch.Tensor:
        """(entities, dim) for every entity, evaluation-time texts (all neighbours)."""
        from tqdm.auto import tqdm

        out = torch.empty(self.bank.graph.num_entities, self.tail_encoder.dim)
        for idx in tqdm(self.bank.length_batches(batch_size), desc="entities", disable=not progress, leave=False):
            out[idx] = self.encode_entities(idx).float().cpu()
        return out


class QueryEngine:
    """Answers (head, relation) query vectors for evaluation, at the conditioner's own cost.

    Input-level conditioners (bi-encoder) run the whole encoder per query. Conditioners that meet the
    condition later get every entity's sentence state (up to their layer) and every relation's state
    computed once; per query only ``combine`` runs — the top k layers for the router, one cheap
    composition for the tri-encoders and Hyper-CL.
    """

    def __init__(self, model: "LinkPredictor", *, batch_size: int = 256, progress: bool = False,
                 entity_table: torch.Tensor | None = None) -> None:
        from tqdm.auto import tqdm

        self.model, self.cond = model, model.conditioner
        graph, bank = model.bank.graph, model.bank
        self.passes = {"sentences": 0, "conditions": 0, "queries_full": 0, "queries_top_layers": 0}
        self.sentences = self.conditions = None
        self.borrowed = False  # True when the sentence table is the caller's entity table (not extra memory)
        if self.cond.enters_at == "input":
            return
        n = graph.num_entities
        self.conditions = self.cond.encode_conditions(bank.relation_ids)  # every relation incl. inverses
        self.passes["conditions"] = len(bank.relation_ids)
        if entity_table is not None and self.shares_entity_table:  # cached entity embeddings are h_s
            self.sentences, self.row, self.borrowed = entity_table.to(self.cond.device), torch.arange(n), True
            return
        batches = bank.length_batches(batch_size)
        chunks = [self.cond.encode_sentences([bank.entity_ids(e) for e in idx])
                  for idx in tqdm(batches, desc="sentence states", disable=not progress, leave=False)]
        self.sentences = self.cond.cat_states(chunks)  # rows in length order
        self.row = torch.empty(n, dtype=torch.long)  # entity id → row of self.sentences
        self.row[torch.tensor([e for idx in batches for e in idx])] = torch.arange(n)
        self.passes["sentences"] = n

    @property
    def shares_entity_table(self) -> bool:
        """Pooled conditioners with shared towers: the sentence table *is* the entity table."""
        return self.cond.enters_at == "pooled" and self.model.query_encoder is self.model.tail_encoder

    @property
    def entity_table(self) -> torch.Tensor | None:
        return self.sentences[self.row] if self.shares_entity_table else None

    @property
    def state_bytes(self) -> int:
        def size(x):
            if isinstance(x, torch.Tensor):
                return x.numel() * x.element_size()
            if isinstance(x, (tuple, list)):
                return sum(size(v) for v in x)
            return 0
        return (0 if self.borrowed else size(self.sentences)) + size(self.conditions)

    def __call__(self, heads, rels) -> torch.Tensor:
        if self.sentences is None:
            self.passes["queries_full"] += len(heads)
            return self.model.encode_queries(heads, rels)
        if self.cond.enters_at == "layer":
            self.passes["queries_top_layers"] += len(heads)
        index = self.row[torch.as_tensor(np.asarray(heads))]
        return self.cond.combine(self.cond.take(self.sentences, index), self.conditions,
                                 torch.as_tensor(np.asarray(rels), device=self.cond.device))


def build_model(recipe: Recipe, graph: KnowledgeGraph, backbone_folder: Path, *, pretrained: bool = True):
    """Return (model, tokenizer). ``pretrained=False`` builds the architecture only (weights come next)."""
    tokenizer = load_tokenizer(backbone_folder)
    bank = TextBank(graph, tokenizer, max_tokens=recipe.data.max_tokens, neighbor_text=recipe.data.neighbor_text,
                    max_neighbors=recipe.data.max_neighbors,
                    short_description_words=recipe.data.short_description_words)
    backbone = load_backbone(backbone_folder, weights=pretrained)
    query = TextEncoder(backbone, recipe.model.pooling)
    tail = query if recipe.model.shared_towers else TextEncoder(copy.deepcopy(backbone), recipe.model.pooling)
    cls = conditioner_class(recipe.model.conditioner)
    options = {k: getattr(recipe.model, k) for k in cls.options}
    model = LinkPredictor(query, tail, bank, recipe.model.conditioner, **options)
    return model, tokenizer


def setup_layer_cache(model: LinkPredictor, recipe: Recipe) -> None:
    """Freeze the layers below T - n in both towers and attach one cache of their outputs.

    Frozen lower layers are identical in both towers (the same pretrained weights, never updated), so
    one cache, keyed by exact token sequence, serves the query and the tail tower. The cache sits at
    min(T - n, t_condition): the router must see the states entering its own layer.
    """
    n = recipe.encoder.trainable_layers
    if n == "all":
        return
    from kgc.encoding.cache import LayerCache, lower_weights_hash
    from kgc.encoding.layers import check_bert_family, frozen_below

    encoders = list(dict.fromkeys([model.query_encoder, model.tail_encoder]))
    for enc in encoders:
        check_bert_family(enc.backbone, "encoder.trainable_layers")
        t = enc.frozen_layers = frozen_below(enc.backbone, n)
        enc.train(enc.training)
    layer = min(t, model.conditioner.entry_layer) if model.conditioner.enters_at == "layer" else t
    if layer == 0 or not recipe.encoder.cache:
        return
    cache = LayerCache(layer=layer, model_hash=lower_weights_hash(model.query_encoder.backbone, layer),
                       tokenizer_hash=model.bank.tokenizer_hash, hidden=model.query_encoder.dim)
    for enc in encoders:
        enc.cache = cache


def save_backbone_files(folder: Path, recipe: Recipe, tokenizer) -> None:
    """Copy config + tokenizer into the run (weights live in checkpoints), so a run needs nothing else."""
    from transformers import AutoConfig

    source = resolve_backbone(recipe.model.backbone)
    folder.mkdir(parents=True, exist_ok=True)
    AutoConfig.from_pretrained(str(source)).save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))


class Run:
    """A run directory: resolved recipe, backbone files, checkpoints, results."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not (self.path / "recipe.yaml").is_file():
            raise KGCError(f"{self.path}: not a run directory (no recipe.yaml). Train one with `kgc train RECIPE`.")
        self.recipe = load_recipe(self.path / "recipe.yaml")

    backbone = property(lambda self: self.path / "backbone")
    best = property(lambda self: self.path / "best.pt")
    last = property(lambda self: self.path / "checkpoints" / "last.pt")

    def weights_file(self) -> Path:
        for f in (self.best, self.last):
            if f.is_file():
                return f
        raise KGCError(f"{self.path}: no weights yet (best.pt or checkpoints/last.pt). "
                       f"Finish training or resume it: `kgc train --resume {self.path}`.")

    def graph(self) -> KnowledgeGraph:
        d = self.recipe.data
        return load_graph(d.dataset, path=d.path, long_text=d.long_text)

    def load(self, device: str | torch.device = "cpu") -> tuple[LinkPredictor, KnowledgeGraph]:
        graph = self.graph()
        model, _ = build_model(self.recipe, graph, self.backbone, pretrained=False)
        state = torch.load(self.weights_file(), map_location="cpu", weights_only=False)
        model.load_state_dict(state["model"])
        setup_layer_cache(model, self.recipe)
        model.to(device).eval()
        return model, graph

    def weights_fingerprint(self) -> str:
        return sha256_file(self.weights_file())
