"""A synthetic graph where the condition decides which token of the head matters (``kgc data synth-routing``).

Each head entity is a phrase of one word per *slot*, always in slot order::

    h017    red goat beach          (colour, animal, place)

and relation r_i ("colour", "animal", "place", …) links the head to the entity named by its i-th word::

    h017  has_colour  w_red        h017  has_animal  w_goat        h017  in_place  w_beach

So the answer to (head, r_i, ?) is fixed by one token of the head's text, and which token depends only on the
relation: a router that conditions should put more of w on the i-th word under r_i than under the other relations,
and a weighting blind to the relation cannot (``tests/test_router_routes.py``). Every slot word is a single
WordPiece token of BERT's uncased vocabulary, so token position i + 1 (after [CLS]) is slot i.

Written in the KG-BERT layout (entity2text.txt, relation2text.txt, train/dev/test.tsv) that ``data.path`` reads.
Deterministic in ``seed``; every tail entity and every head occurs in train, dev and test hold other triples of
heads seen in train.
"""

from __future__ import annotations

import random
from pathlib import Path

from kgc.errors import KGCError
from kgc.fileio import write_text

# slot → (relation id, relation text, words); every word a single token of bert-base-uncased's vocabulary
SLOTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("has_colour", "colour", ("red", "blue", "green", "yellow", "black", "white", "brown", "pink")),
    ("has_animal", "animal", ("dog", "cat", "horse", "goat", "rabbit", "duck", "owl", "sheep")),
    ("in_place", "place", ("park", "river", "city", "forest", "beach", "garden", "farm", "lake")),
    ("made_of", "material", ("wood", "glass", "stone", "paper", "steel", "wool", "silk", "clay")),
)


def routing_graph(*, slots: int = 3, heads: int = 96, seed: int = 0) -> dict[str, object]:
    """The graph as data: ``entities`` (id → text), ``relations`` (id → text), ``train``/``dev``/``test`` triples
    and ``positions`` (relation id → the token position its answer sits at, [CLS] being 0)."""
    if not 2 <= slots <= len(SLOTS):
        raise KGCError(f"synth-routing: slots={slots}: choose 2..{len(SLOTS)} (with one relation nothing is "
                       "routed, and every head's one triple would be needed in train)")
    pools = [words for _, _, words in SLOTS[:slots]]
    combos = 1
    for p in pools:
        combos *= len(p)
    if not 1 <= heads <= combos:
        raise KGCError(f"synth-routing: heads={heads}: choose 1..{combos} (distinct phrases of {slots} slots)")
    rng = random.Random(seed)
    phrases: list[tuple[str, ...]] = []
    seen: set[tuple[str, ...]] = set()
    while len(phrases) < heads:
        phrase = tuple(rng.choice(p) for p in pools)
        if phrase not in seen:
            seen.add(phrase)
            phrases.append(phrase)
    entities = {f"h{i:03d}": " ".join(p) for i, p in enumerate(phrases)}
    entities.update({f"w_{w}": w for p in pools for w in p})
    relations = {rid: text for rid, text, _ in SLOTS[:slots]}
    triples = [(f"h{i:03d}", SLOTS[s][0], f"w_{p[s]}") for i, p in enumerate(phrases) for s in range(slots)]
    rng.shuffle(triples)
    # dev and test: about 10 % each, only triples whose head keeps another triple in train (no unseen entity)
    held = max(1, len(triples) // 10)
    train, dev, test = [], [], []
    kept: dict[str, int] = {}
    for t in triples:
        kept[t[0]] = kept.get(t[0], 0) + 1
    for t in triples:
        if len(test) < held and kept[t[0]] > 1:
            test.append(t)
            kept[t[0]] -= 1
        elif len(dev) < held and kept[t[0]] > 1:
            dev.append(t)
            kept[t[0]] -= 1
        else:
            train.append(t)
    tails = {t[2] for t in train}
    missing = sorted(e for e in entities if e.startswith("w_") and e not in tails)
    train += [t for t in dev + test if t[2] in missing]  # a word only dev/test would name moves to train
    dev = [t for t in dev if t[2] not in missing]
    test = [t for t in test if t[2] not in missing]
    return {"entities": entities, "relations": relations, "train": train, "dev": dev, "test": test,
            "positions": {rid: s + 1 for s, (rid, _, _) in enumerate(SLOTS[:slots])}}


def write_routing_graph(out: str | Path, *, slots: int = 3, heads: int = 96, seed: int = 0,
                        graph: dict[str, object] | None = None) -> Path:
    """Write :func:`routing_graph` (or ``graph``, one it returned) to ``out`` in the KG-BERT layout; returns the
    folder."""
    graph = graph if graph is not None else routing_graph(slots=slots, heads=heads, seed=seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "entity2text.txt", "".join(f"{k}\t{v}\n" for k, v in graph["entities"].items()))
    write_text(out / "relation2text.txt", "".join(f"{k}\t{v}\n" for k, v in graph["relations"].items()))
    for split in ("train", "dev", "test"):
        write_text(out / f"{split}.tsv", "".join("\t".join(t) + "\n" for t in graph[split]))
    return out
