"""A kind of structural model the demo package adds (its ``kgc.structures`` entry point names ``POPULARITY``):
each entity scored, under each relation direction, by the log of how often it answers that direction in the train
graph (plus ``smoothing``) — the popularity baseline a fused model should beat. ``structure: {model:
popularity}`` trains it beside the text model and fuses it as any structural model is (α chosen on dev)."""

from __future__ import annotations

import time
from typing import Literal

import numpy as np
from pydantic import Field

from kgc.fileio import write_json, write_npy
from kgc.linkpred.structure.kinds import StructureKind
from kgc.linkpred.structure.options import FusionOptions


class PopularityOptions(FusionOptions):
    model: Literal["popularity"] = Field("popularity", description="popularity (a plugin): log train answer counts")
    smoothing: float = Field(1.0, gt=0, description="added to every count before the log")


class Popularity(StructureKind):
    name = "popularity"
    Options = PopularityOptions

    def train(self, config, graph, folder, *, seed, device, progress, echo):
        both = graph.both_directions("train")  # (head, relation in 0..2R-1, answer)
        counts = np.full((2 * graph.num_relations, graph.num_entities), config.smoothing, dtype=np.float32)
        np.add.at(counts, (both[:, 1], both[:, 2]), 1.0)
        write_npy(folder / "popularity.npy", np.log(counts))
        meta = {"model": self.name, "params": config.model_dump(mode="json"), "entities": graph.num_entities,
                "relations": graph.num_relations, "trained_at": time.time()}
        write_json(folder / "meta.json", meta)
        echo(f"popularity counted over {len(both)} train directions")
        return meta

    def load(self, folder, meta, device, fix):
        import torch

        from kgc.linkpred.structure.pykeen import Structure

        class Table(Structure):
            def scores(self, heads, rels):  # (batch, entities): the relation direction's row
                return self.model[torch.as_tensor(np.asarray(rels, dtype=np.int64))]

        return Table(model=torch.from_numpy(np.load(folder / "popularity.npy")), meta=meta)


POPULARITY = Popularity()
