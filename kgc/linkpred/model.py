"""The link predictor: query tower g(head | relation) = the conditioner, tail tower f(entity).

A run directory holds everything needed to rebuild it: ``backbone/`` (config + tokenizer files),
``recipe.yaml`` and the weights (``best.pt`` / ``checkpoints/last.pt``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from kgc.conditioning import build_conditioner
from kgc.data.graph import KnowledgeGraph, load_graph
from kgc.data.texts import TextBank
from kgc.encoding.backbone import TextEncoder, load_backbone, load_tokenizer, resolve_backbone
from kgc.errors import KGCError
from kgc.fileio import sha256_file
from kgc.recipe import Recipe, load_recipe


class LinkPredictor(nn.Module):
    def __init__(self, query_encoder: TextEncoder, tail_encoder: TextEncoder, bank: TextBank, conditioner: str):
        super().__init__()
        self.query_encoder = query_encoder
        self.tail_encoder = tail_encoder  # may be the same module (shared towers)
        self.bank = bank
        self.conditioner = build_conditioner(conditioner, encoder=query_encoder, special=bank.special,
                                             max_tokens=bank.max_tokens)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

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

        n = self.bank.graph.num_entities
        # sort by length so each batch pads little
        order = sorted(range(n), key=lambda e: len(self.bank.entity_ids(e)))
        out = torch.empty(n, self.tail_encoder.dim)
        starts = range(0, n, batch_size)
        for s in tqdm(starts, desc="entities", disable=not progress, leave=False):
            idx = order[s: s + batch_size]
            out[idx] = self.encode_entities(idx).float().cpu()
        return out


def build_model(recipe: Recipe, graph: KnowledgeGraph, backbone_folder: Path, *, pretrained: bool = True):
    """Return (model, tokenizer). ``pretrained=False`` builds the architecture only (weights come next)."""
    tokenizer = load_tokenizer(backbone_folder)
    bank = TextBank(graph, tokenizer, max_tokens=recipe.data.max_tokens, neighbor_text=recipe.data.neighbor_text,
                    max_neighbors=recipe.data.max_neighbors,
                    short_description_words=recipe.data.short_description_words)
    backbone = load_backbone(backbone_folder, weights=pretrained)
    query = TextEncoder(backbone, recipe.model.pooling)
    tail = query if recipe.model.shared_towers else TextEncoder(copy.deepcopy(backbone), recipe.model.pooling)
    return LinkPredictor(query, tail, bank, recipe.model.conditioner), tokenizer


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
        model.to(device).eval()
        return model, graph

    def weights_fingerprint(self) -> str:
        return sha256_file(self.weights_file())
