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
def score(model, tokenizer, rows: list[dict], *, batch_size: int = 64) -> list[dict]:
    """Each row with ``similarity`` (cosine) and ``predicted_label`` (1 + 4 · clip(cosine, 0, 1))."""
    tok = lambda key: tokenizer([r[key] for r in rows], add_special_tokens=False)["input_ids"]  # noqa: E731
    s1, s2, cond = tok("sentence1"), tok("sentence2"), tok("condition")
    cosine = torch.cat([model.similarity(s1[k: k + batch_size], s2[k: k + batch_size], cond[k: k + batch_size]).cpu()
                        for k in range(0, len(rows), batch_size)]).numpy()
    return [{**r, "similarity": float(c), "predicted_label": round(1 + 4 * float(np.clip(c, 0, 1)), 4)}
            for r, c in zip(rows, cosine)]


def write_scores(path: Path | None, rows: list[dict], echo=print) -> None:
    """TSV of the scored rows to ``path`` (atomically) or, with ``path`` None, through ``echo``."""
    fields = FIELDS + (["label"] if any("label" in r for r in rows) else [])
    if path is None:
        echo(tsv_text(rows, fields).rstrip("\n"))
    else:
        write_tsv(path, rows, fields)
