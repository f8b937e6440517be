"""PyKEEN triples as a KG-BERT folder, so a run trained on them is self-contained and reloadable.

``kgc.train(recipe, data=...)`` accepts a PyKEEN ``TriplesFactory`` (train only, or with ``validation=`` /
``testing=`` factories) or a PyKEEN dataset instance (``pykeen.datasets.Nations()``); the triples are written
as ``train.tsv``/``dev.tsv``/``test.tsv`` + ``entity2text.txt`` + ``relation2text.txt`` inside the run
directory and the recipe's ``data.path`` points there.

Texts: an entity's text is its label with ``_`` → space, unless ``texts`` maps the label to a text; relation
texts likewise from ``relation_texts``. ``entity2text.txt`` is read as ``name, description`` (split at the first
``", "``), as for WN18RR.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from kgc.errors import KGCError
from kgc.fileio import write_text


def _label_triples(factory: Any, role: str) -> list[tuple[str, str, str]]:
    triples = getattr(factory, "triples", None)
    if triples is None or not hasattr(factory, "entity_to_id"):
        raise KGCError(f"{role}: expected a PyKEEN TriplesFactory with labels (pykeen.triples.TriplesFactory), got "
                       f"{type(factory).__name__}. kgc reads texts, so id-only (Core) factories cannot be used.")
    return [(str(h), str(r), str(t)) for h, r, t in triples]


def _check_label(label: str, what: str) -> str:
    if not label.strip() or any(c in label for c in "\t\n\r"):
        raise KGCError(f"{what} label {label!r}: empty, or holds a tab or line break (kgc writes TSV files); "
                       "relabel it in the TriplesFactory.")
    return label


def _text(label: str, texts: Mapping[str, str] | None, what: str) -> str:
    text = texts.get(label) if texts else None
    text = label.strip("_").replace("_", " ").strip() if text is None else str(text)
    text = " ".join(text.split())  # no tabs or line breaks in a TSV field
    if not text:
        raise KGCError(f"{what} {label!r}: empty text. Give it one in texts=/relation_texts=.")
    return text


def split_factories(data: Any, validation: Any = None, testing: Any = None) -> dict[str, Any]:
    """{"train": factory, "dev": factory | None, "test": factory | None} from a dataset or a factory."""
    if hasattr(data, "training") and hasattr(data, "testing"):  # a pykeen Dataset
        if validation is not None or testing is not None:
            raise KGCError("data= is a PyKEEN dataset, which has its own splits; drop validation=/testing=")
        return {"train": data.training, "dev": getattr(data, "validation", None), "test": data.testing}
    return {"train": data, "dev": validation, "test": testing}


def write_kgbert(folder: str | Path, data: Any, *, validation: Any = None, testing: Any = None,
                 texts: Mapping[str, str] | None = None,
                 relation_texts: Mapping[str, str] | None = None) -> dict[str, int]:
    """Write ``data`` (a PyKEEN dataset or TriplesFactory) as a KG-BERT folder; returns triples per split.

    Every entity and relation of the factories' label maps gets a text (not only those in triples)."""
    folder = Path(folder)
    factories = split_factories(data, validation, testing)
    splits = {s: _label_triples(f, s if s != "train" else "data") if f is not None else []
              for s, f in factories.items()}
    if not splits["train"]:
        raise KGCError("data: the training TriplesFactory has no triples")
    entities: dict[str, None] = {}
    relations: dict[str, None] = {}
    for f in factories.values():
        if f is not None:
            entities.update(dict.fromkeys(sorted(f.entity_to_id, key=f.entity_to_id.get)))
            relations.update(dict.fromkeys(sorted(f.relation_to_id, key=f.relation_to_id.get)))
    for rows in splits.values():
        for h, r, t in rows:
            entities.update(dict.fromkeys((h, t)))
            relations.update(dict.fromkeys((r,)))
    for name in (texts or {}):
        if name not in entities:
            raise KGCError(f"texts: {name!r} is not an entity label of the data")
    for name in (relation_texts or {}):
        if name not in relations:
            raise KGCError(f"relation_texts: {name!r} is not a relation label of the data")
    folder.mkdir(parents=True, exist_ok=True)
    write_text(folder / "entity2text.txt", "".join(f"{_check_label(e, 'entity')}\t{_text(e, texts, 'entity')}\n"
                                                   for e in entities))
    write_text(folder / "relation2text.txt", "".join(
        f"{_check_label(r, 'relation')}\t{_text(r, relation_texts, 'relation')}\n" for r in relations))
    for split, rows in splits.items():
        write_text(folder / f"{split}.tsv", "".join(f"{h}\t{r}\t{t}\n" for h, r, t in rows))
    return {s: len(rows) for s, rows in splits.items()}
