"""Inductive evaluation (``kgc evaluate RUN --entities-from FOLDER``): rank the triples of a folder whose entities
the run never saw, over that folder's entities (:mod:`kgc.data.inductive` says which), with the run's towers.

A text model is inductive by construction: an entity is its text, so the same tail tower embeds entities it was
never trained on and the same query tower asks about them. The graph built here replaces the run's own for one
evaluation (a model whose TextBank is over it); the results go to ``results.inductive[.split].json`` in the same
layout as every evaluation, with ``kgc.inductive`` saying what was ranked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from kgc.data.graph import KnowledgeGraph


def inductive_graph(folder: str | Path, known: KnowledgeGraph, *, split: str = "test", candidates: str = "split",
                    long_text: bool = False, warn: Callable[[str], None] | None = None) -> tuple[KnowledgeGraph, dict]:
    """(the folder's graph over its candidate entities with the run's relation ids, ``kgc.inductive`` info);
    ``warn`` hears when some evaluated entities were in fact trained on, or relations are worded differently."""
    from kgc.data.inductive import read_inductive_folder

    graph, info = read_inductive_folder(folder, known, split=split, candidates=candidates, long_text=long_text)
    if info["seen_in_training"] and warn is not None:
        warn(f"warning: {info['seen_in_training']} of the {info['split_entities']} {split} entities of {folder} "
             f"occur in the run's training triples (e.g. {', '.join(info['seen_examples'])}): this is not an "
             "inductive evaluation for them")
    if info["relation_texts_differ"] and warn is not None:
        warn(f"note: {folder} words relation(s) {', '.join(info['relation_texts_differ'])} differently; the run's "
             "own relation texts are used (the model was trained on them)")
    return graph, info
