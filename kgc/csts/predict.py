"""``kgc similarity``: score sentence pairs under conditions with a trained C-STS run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from kgc.csts.data import read_rows
from kgc.fileio import tsv_text, write_tsv

FIELDS = ["sentence1", "sentence2", "condition", "similarity", "predicted_label"]


def read_queries(path: Path) -> list[dict]:
    """Rows of a .tsv (tab) or .csv file with columns sentence1, sentence2, condition (label optional)."""
    delimiter = "," if Path(path).suffix.lower() == ".csv" else "\t"
    return [{"sentence1": s1, "sentence2": s2, "condition": c, **({} if np.isnan(y) else {"label": y})}
            for s1, s2, c, y, _ in read_rows(path, "queries", delimiter=delimiter, need_label=False)]


@torch.no_grad()
def similarities(model, tokenizer, s1: list[str], s2: list[str], condition: list[str], *,
                 batch_size: int = 64) -> np.ndarray:
    """cos(g(s1 | c), g(s2 | c)) per row, float32."""
    tok = lambda texts: tokenizer(texts, add_special_tokens=False)["input_ids"]  # noqa: E731
    s1, s2, condition = tok(s1), tok(s2), tok(condition)
    if not s1:
        return np.empty(0, dtype=np.float32)
    return torch.cat([model.similarity(s1[k: k + batch_size], s2[k: k + batch_size], condition[k: k + batch_size]).cpu()
                      for k in range(0, len(s1), batch_size)]).float().numpy()


def label_scale(cosine: float) -> float:
    """The 1-5 C-STS label scale: 1 + 4 · clip(cosine, 0, 1)."""
    return round(1 + 4 * float(np.clip(cosine, 0, 1)), 4)


def score(model, tokenizer, rows: list[dict], *, batch_size: int = 64) -> list[dict]:
    """Each row with ``similarity`` (cosine) and ``predicted_label`` (:func:`label_scale`)."""
    cosine = similarities(model, tokenizer, *([r[k] for r in rows] for k in ("sentence1", "sentence2", "condition")),
                          batch_size=batch_size)
    return [{**r, "similarity": float(c), "predicted_label": label_scale(c)} for r, c in zip(rows, cosine)]


def write_scores(path: Path | None, rows: list[dict], echo=print) -> None:
    """TSV of the scored rows to ``path`` (atomically) or, with ``path`` None, through ``echo``."""
    fields = FIELDS + (["label"] if any("label" in r for r in rows) else [])
    if path is None:
        echo(tsv_text(rows, fields).rstrip("\n"))
    else:
        write_tsv(path, rows, fields)
