"""Inductive data: make a split whose test entities never occur in train, and read such a folder against a run.

SimKGC's Wikidata5M-inductive protocol: the entity sets of train, valid and test are disjoint, so every test
triple has *both* ends unseen in training; ranking is over the entities of the evaluated split only (SimKGC's
``EntityDict(inductive_test_path=...)`` keeps the entities occurring in the test triples), and the filter
removes the other known answers found in the folder's train + valid + test triples.

:func:`inductive_split` builds such a split from any transductive dataset (``kgc data inductive-split``);
:func:`read_inductive_folder` reads a KG-BERT folder (``entity2text.txt``, ``relation2text.txt``, ``test.tsv``,
optionally ``dev.tsv``/``train.tsv``) into a :class:`KnowledgeGraph` whose relation ids are a run's own.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from kgc.data.catalog import find_dataset
from kgc.data.formats import read_graph
from kgc.data.formats.kgbert import TEXT_FILES
from kgc.data.formats.triples import SPLIT_FILES
from kgc.data.graph import KnowledgeGraph
from kgc.errors import KGCError
from kgc.fileio import atomic_dir, write_json, write_text

CANDIDATES = ("split", "all")


def inductive_split(source: str | Path, out: str | Path, *, held_out: int, seed: int = 0) -> dict:
    """Hold ``held_out`` entities out of training and write a KG-BERT folder to ``out``.

    Held-out entities are the endpoints of randomly drawn triples (so that triples *among* them exist);
    ``test.tsv`` = every triple of the source (any split) with both ends held out, ``train.tsv``/``dev.tsv``
    = the source's train/dev triples with neither end held out; triples with exactly one held-out end are
    dropped (train and test entities stay disjoint, as in Wikidata5M-inductive). Entity and relation texts
    are copied unchanged. Returns the summary also written to ``out/split.json``.
    """
    folder, _ = find_dataset(str(source))
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):  # a file too: iterdir() would raise
        raise KGCError(f"{out} already exists and is not empty (or is a file). Choose a new folder (or delete "
                       "that one).")
    graph = read_graph(folder)
    if not 2 <= held_out < graph.num_entities:
        raise KGCError(f"--held-out {held_out}: give between 2 and {graph.num_entities - 1} entities "
                       f"({folder} has {graph.num_entities})")
    triples = np.unique(np.concatenate([graph.splits[s] for s in SPLIT_FILES]), axis=0)
    held: dict[int, None] = {}
    for i in np.random.default_rng(seed).permutation(len(triples)):
        h, _, t = (int(x) for x in triples[i])
        if h != t:
            held.setdefault(h)
            held.setdefault(t)
        if len(held) >= held_out:
            break
    mask = np.zeros(graph.num_entities, dtype=bool)
    mask[list(held)[:held_out]] = True

    def among(t: np.ndarray, both: bool) -> np.ndarray:
        h, tl = mask[t[:, 0]], mask[t[:, 2]]
        return t[h & tl] if both else t[~h & ~tl]

    splits = {"train": among(graph.splits["train"], False), "dev": among(graph.splits["dev"], False),
              "test": among(triples, True)}
    if not len(splits["test"]):
        raise KGCError(f"--held-out {held_out} --seed {seed}: no triple has both ends held out; hold out more "
                       "entities")
    with atomic_dir(out) as tmp:  # the folder appears complete or not at all
        for name in TEXT_FILES:
            if (folder / name).is_file():
                shutil.copyfile(folder / name, tmp / name)
        for name, t in splits.items():
            write_text(tmp / f"{name}.tsv", "".join(f"{graph.entities[h]}\t{graph.relations[r]}\t{graph.entities[e]}\n"
                                                    for h, r, e in t))
        write_text(tmp / "held_out_entities.txt", "".join(graph.entities[e] + "\n" for e in np.flatnonzero(mask)))
        summary = {"source": str(folder), "seed": seed, "held_out_entities": int(mask.sum()),
                   "triples": {s: int(len(t)) for s, t in splits.items()},
                   # one end held out, or a source test triple between seen entities
                   "dropped_triples": int(len(triples) - len(np.unique(np.concatenate(list(splits.values())),
                                                                       axis=0))),
                   "protocol": "test triples have both ends held out; train/dev never touch a held-out entity"}
        write_json(tmp / "split.json", summary)
    from kgc.data.catalog import data_homes

    named = any(out.resolve().parent == home.resolve() for _, home in data_homes())
    # how a recipe names it: by its name where a data home holds it, else by its path
    return {**summary, "recipe_key": f"data.dataset: {out.name}" if named else f"data.path: {out}"}


def read_inductive_folder(folder: str | Path, known: KnowledgeGraph, *, split: str = "test",
                          candidates: str = "split", long_text: bool = False) -> tuple[KnowledgeGraph, dict]:
    """The folder's graph with ``known``'s relation ids (mapped by label) and the candidate entities only.

    ``candidates="split"`` (SimKGC's choice): the entities occurring in the ``split`` triples; ``"all"``: every
    entity of the folder. Triples of the folder's other splits are kept where both ends are candidates: they
    filter known answers and give neighbour names (the run's TextBank rules). Relation *texts* are the run's
    (what the model was trained on). Returns (graph, metadata for ``results.json``'s ``kgc.inductive``).
    """
    folder = Path(folder)
    if candidates not in CANDIDATES:
        raise KGCError(f"--candidates {candidates!r}: choose {' or '.join(CANDIDATES)}")
    if not folder.is_dir():
        raise KGCError(f"--entities-from {folder}: no such folder. Give a KG-BERT folder with entity2text.txt, "
                       "relation2text.txt and test.tsv (e.g. one made by `kgc data inductive-split`).")
    if not (folder / "entity2text.txt").is_file():
        raise KGCError(f"{folder}: no entity2text.txt. An inductive folder brings the texts of its entities "
                       "(id<TAB>text per line), since the run has never seen them.")
    g = read_graph(folder, long_text=long_text, optional_splits=tuple(s for s in SPLIT_FILES if s != split))
    if not len(g.splits[split]):
        raise KGCError(f"{folder}: the {split} split has no triples")
    unknown = [r for r in g.relations if r not in known.relation_index]
    if unknown:
        raise KGCError(f"{folder}: relation(s) {', '.join(map(repr, unknown))} are not relations of the run "
                       f"(it knows {', '.join(known.relations)}). New entities can be evaluated without "
                       "retraining, new relations cannot: use the run's relation labels in the triples.")
    rel_map = np.array([known.relation_index[r] for r in g.relations], dtype=np.int64)
    differ = [r for i, r in enumerate(g.relations) if g.relation_texts[i] != known.relation_texts[rel_map[i]]]
    evaluated = np.unique(g.splits[split][:, [0, 2]])
    pick = evaluated if candidates == "split" else np.arange(g.num_entities)
    new_id = np.full(g.num_entities, -1, dtype=np.int64)
    new_id[pick] = np.arange(len(pick))
    splits = {}
    for s, t in g.splits.items():
        t = t[(new_id[t[:, 0]] >= 0) & (new_id[t[:, 2]] >= 0)]
        splits[s] = np.stack([new_id[t[:, 0]], rel_map[t[:, 1]], new_id[t[:, 2]]], axis=1).astype(np.int64)
    graph = KnowledgeGraph(entities=[g.entities[i] for i in pick], names=[g.names[i] for i in pick],
                           descriptions=[g.descriptions[i] for i in pick], relations=list(known.relations),
                           relation_texts=list(known.relation_texts), splits=splits, source=str(folder))
    trained = {known.entities[i] for i in np.unique(known.splits["train"][:, [0, 2]])}
    seen = [g.entities[i] for i in evaluated if g.entities[i] in trained]
    info = {"folder": str(folder.resolve()), "split": split, "candidates": candidates,
            "entities": graph.num_entities, "folder_entities": g.num_entities,
            "split_entities": int(len(evaluated)), "seen_in_training": len(seen), "seen_examples": seen[:5],
            "filter_triples": {s: int(len(t)) for s, t in splits.items()},
            "relation_texts": "run", "relation_texts_differ": differ}
    return graph, info
