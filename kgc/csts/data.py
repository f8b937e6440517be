"""C-STS data: the official CSV layout, the catalog entry ``csts``, the generated ``synth-csts`` set.

A folder holds ``csts_train.csv``, ``csts_validation.csv`` and (optionally) ``csts_test.csv`` with the
columns ``sentence1,sentence2,condition,label`` (label 1–5; the public test split has label −1:
predictions only). Lookup: ``data.path`` → ``$KGC_DATA_HOME/CSTS`` → ``./data/CSTS``;
``kgc data fetch csts --password …`` decrypts the authors' archive into the first data home.

Every sentence pair appears under two conditions; rows are grouped by the exact (sentence1,
sentence2) strings (as the C-STS code's batch sampler does, not by adjacency). Within a group, each
ordered (higher label, lower label) pair of rows is a *contrast pair*: the contrastive term and the
pair accuracy are computed over them.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from kgc.errors import KGCError

SPLITS = ("train", "validation", "test")
COLUMNS = ("sentence1", "sentence2", "condition", "label")
SYNTH = "synth-csts"


def split_file(folder: Path, split: str) -> Path:
    return Path(folder) / f"csts_{split}.csv"


@dataclass
class CSTSSplit:
    """Rows of one split as indices into the dataset's sentence and condition tables."""

    s1: np.ndarray  # (rows,) int
    s2: np.ndarray  # (rows,) int
    cond: np.ndarray  # (rows,) int
    label: np.ndarray  # (rows,) float; NaN = unlabelled (the public test split)
    lines: np.ndarray  # (rows,) line of each row in its file

    def __len__(self) -> int:
        return len(self.s1)

    @property
    def labelled(self) -> np.ndarray:
        return ~np.isnan(self.label)

    @cached_property
    def groups(self) -> list[np.ndarray]:
        """Row indices of each sentence pair, in order of first appearance."""
        where: dict[tuple[int, int], list[int]] = {}
        for i, key in enumerate(zip(self.s1.tolist(), self.s2.tolist())):
            where.setdefault(key, []).append(i)
        return [np.asarray(rows) for rows in where.values()]

    @cached_property
    def _contrast(self) -> tuple[np.ndarray, np.ndarray]:
        high, low = [], []
        for group in self.groups:
            for i in group.tolist():
                for j in group.tolist():
                    if self.label[i] > self.label[j]:  # False for NaN
                        high.append(i)
                        low.append(j)
        return np.asarray(high, dtype=np.int64), np.asarray(low, dtype=np.int64)

    def contrast_pairs(self, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(high, low): rows of one sentence pair with label[high] > label[low], both among ``rows`` (default all)."""
        high, low = self._contrast
        if rows is None:
            return high, low
        keep = np.isin(high, rows) & np.isin(low, rows)
        return high[keep], low[keep]


@dataclass
class CSTSData:
    sentences: list[str]
    conditions: list[str]
    splits: dict[str, CSTSSplit]
    source: str = ""

    def split(self, name: str) -> CSTSSplit:
        if name not in self.splits:
            raise KGCError(f"{self.source}: no {name} split (csts_{name}.csv). Splits here: {', '.join(self.splits)}")
        return self.splits[name]


def read_rows(path: Path, split: str, *, delimiter: str = ",",
              need_label: bool = True) -> list[tuple[str, str, str, float, int]]:
    """(sentence1, sentence2, condition, label or NaN, line) per row; one clear error for a bad row.

    ``need_label=False`` (sentences to score) makes the label column optional.
    """
    path = Path(path)
    try:
        fh = open(path, newline="", encoding="utf-8")
    except OSError as exc:
        raise KGCError(f"{path}: cannot read ({exc.strerror})") from None
    rows = []
    with fh:
        reader = csv.reader(fh, delimiter=delimiter)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise KGCError(f"{path}: empty file; expected a header {','.join(COLUMNS)}") from None
        except (csv.Error, UnicodeDecodeError) as exc:
            raise KGCError(f"{path}:1: not a readable CSV ({exc})") from None
        missing = [c for c in COLUMNS if c not in header and (need_label or c != "label")]
        if missing:
            raise KGCError(f"{path}:1: header {delimiter.join(header)} lacks {', '.join(missing)}; the official "
                           f"C-STS layout is {','.join(COLUMNS)}")
        at = {c: header.index(c) for c in COLUMNS if c in header}
        while True:
            try:
                row = next(reader)
            except StopIteration:
                break
            except (csv.Error, UnicodeDecodeError) as exc:
                raise KGCError(f"{path}:{reader.line_num}: malformed CSV ({exc})") from None
            line = reader.line_num
            if not any(cell.strip() for cell in row):
                continue  # a blank line
            if len(row) != len(header):
                raise KGCError(f"{path}:{line}: {len(row)} fields, expected {len(header)} ({','.join(header)}); "
                               "quote fields that contain commas")
            s1, s2, cond, raw = (row[at[c]].strip() if c in at else "-1" for c in COLUMNS)
            for name, text in (("sentence1", s1), ("sentence2", s2), ("condition", cond)):
                if not text:
                    raise KGCError(f"{path}:{line}: empty {name}; every row needs two sentences and a condition")
            if not raw and not need_label:
                raw = "-1"
            try:
                value = float(raw)
            except ValueError:
                raise KGCError(f"{path}:{line}: label {raw!r} is not a number (expected 1-5)") from None
            if value == -1:
                if split not in ("test", "queries"):
                    raise KGCError(f"{path}:{line}: label -1 (unlabelled) belongs in the test split only; "
                                   f"{split} rows need a label 1-5")
                value = float("nan")
            elif not 1 <= value <= 5:
                raise KGCError(f"{path}:{line}: label {raw} outside 1-5 (C-STS labels are 1-5; -1 marks an "
                               "unlabelled test row)")
            rows.append((s1, s2, cond, value, line))
    if not rows:
        raise KGCError(f"{path}: no rows under the header")
    return rows


def read_csts(folder: Path, source: str = "") -> CSTSData:
    """Read a folder in the official layout; train and validation are required, test is optional."""
    folder = Path(folder)
    sentences: dict[str, int] = {}
    conditions: dict[str, int] = {}
    splits = {}
    for split in SPLITS:
        path = split_file(folder, split)
        if not path.is_file():
            if split == "test":
                continue
            raise KGCError(f"{path} not found; a C-STS folder holds csts_train.csv, csts_validation.csv "
                           "(and csts_test.csv)")
        rows = read_rows(path, split)
        idx = lambda table, text: table.setdefault(text, len(table))  # noqa: E731
        splits[split] = CSTSSplit(
            s1=np.array([idx(sentences, r[0]) for r in rows]), s2=np.array([idx(sentences, r[1]) for r in rows]),
            cond=np.array([idx(conditions, r[2]) for r in rows]), label=np.array([r[3] for r in rows]),
            lines=np.array([r[4] for r in rows]))
    return CSTSData(sentences=list(sentences), conditions=list(conditions), splits=splits,
                    source=source or str(folder))


def find_csts(dataset: str, path: str | None = None, synth=None) -> Path:
    """The folder of a C-STS dataset: ``data.path``, the generated set, or the catalog name ``csts``."""
    if path is not None:
        folder = Path(path).expanduser()
        if not split_file(folder, "train").is_file():
            raise KGCError(f"data.path {folder}: no csts_train.csv there. A C-STS folder holds csts_train.csv, "
                           "csts_validation.csv and csts_test.csv (sentence1,sentence2,condition,label).")
        return folder
    if dataset.lower() == SYNTH:
        from kgc.csts.synth import synthetic_folder

        from kgc.csts.recipe import SynthConfig

        return synthetic_folder(**(synth or SynthConfig()).model_dump())
    from kgc.data.catalog import find_dataset

    folder, _ = find_dataset(dataset, task="csts")
    return folder


def load_csts(dataset: str, path: str | None = None, synth=None) -> CSTSData:
    folder = find_csts(dataset, path, synth)
    return read_csts(folder, source=f"{dataset} ({folder})" if path is None else str(folder))


@dataclass
class CSTSReport:
    """The counts and findings of a C-STS folder; ``lines()`` is what ``kgc data check`` prints (the same shape
    as :class:`kgc.data.check.DataReport`)."""

    folder: str
    files: list[str]
    rows: dict[str, int]  # split -> rows
    labelled: dict[str, int]  # split -> rows with a label 1-5
    pairs: dict[str, int]  # split -> sentence pairs
    sentences: int
    conditions: int
    findings: list[tuple[str, str]]  # (level, text): "error" | "warning" | "note"

    def of(self, level: str) -> list[str]:
        return [text for lv, text in self.findings if lv == level]

    @property
    def errors(self) -> list[str]:
        return self.of("error")

    def lines(self) -> list[tuple[str, str]]:
        splits = list(self.rows)
        out = [("", f"data: {self.folder} (C-STS CSV: {','.join(COLUMNS)}; {', '.join(self.files)})"),
               ("", f"  {'sentences':<10}{self.sentences:>10,}   {'conditions':<10}{self.conditions:>8,}"),
               ("", f"  {'':<10}" + " ".join(f"{s:>10}" for s in splits))]
        for name, table in (("rows", self.rows), ("labelled", self.labelled), ("pairs", self.pairs)):
            out.append(("", f"  {name:<10}" + " ".join(f"{table[s]:>10,}" for s in splits)))
        for level in ("error", "warning", "note"):
            out += [(level, f"{level}: {text}") for text in self.of(level)]
        if not self.errors and not self.of("warning"):
            out.append(("", "no problems found"))
        return out


def check_csts(data: CSTSData, folder: Path, token_lengths: "dict[str, list[int]] | None" = None,
               max_tokens: int | None = None) -> CSTSReport:
    """The report of a C-STS folder that was read (:func:`read_csts` stops at an unreadable row): rows, labelled
    rows and sentence pairs per split; warnings for sentence pairs not under exactly two conditions (C-STS asks
    every pair twice: the contrastive term and the pair accuracy compare the two), pairs whose two rows share a
    label (nothing to contrast), evaluation pairs that also occur in train, and texts (``token_lengths``:
    "sentence" / "condition" → tokens with specials) longer than ``max_tokens``; a note for a missing test split."""
    findings: list[tuple[str, str]] = []
    pairs = {name: len(split.groups) for name, split in data.splits.items()}
    for name, split in data.splits.items():
        odd = [g for g in split.groups if len(g) != 2]
        if odd:
            first = split.lines[odd[0][0]]
            findings.append(("warning", f"{split_file(folder, name).name}: {len(odd)} sentence pair(s) not under "
                                        f"exactly two conditions (first at line {first}); C-STS asks each pair twice"))
        if name == "train":
            flat = [g for g in split.groups if len(g) == 2 and split.label[g[0]] == split.label[g[1]]]
            if flat:
                findings.append(("warning", f"{split_file(folder, name).name}: {len(flat)} sentence pair(s) with the "
                                            "same label under both conditions: nothing for the contrastive term"))
    if "train" in data.splits:
        train = data.splits["train"]
        seen = set(zip(train.s1.tolist(), train.s2.tolist()))
        for name in ("validation", "test"):
            if name in data.splits:
                s = data.splits[name]
                both = {k for k in zip(s.s1.tolist(), s.s2.tolist()) if k in seen}
                if both:
                    findings.append(("warning", f"{name}: {len(both)} sentence pair(s) also in train"))
    for what, lengths in (token_lengths or {}).items():
        cut = sum(n > max_tokens for n in lengths) if max_tokens else 0
        if cut:
            findings.append(("warning", f"{cut} {what}(s) ({cut / len(lengths):.1%}) are longer than "
                                        f"data.max_tokens={max_tokens} tokens and will be cut"))
    if "test" not in data.splits:
        findings.append(("note", "no csts_test.csv: `kgc evaluate` takes --split validation"))
    return CSTSReport(folder=str(folder), files=[split_file(folder, s).name for s in data.splits],
                      rows={n: len(s) for n, s in data.splits.items()},
                      labelled={n: int(s.labelled.sum()) for n, s in data.splits.items()}, pairs=pairs,
                      sentences=len(data.sentences), conditions=len(data.conditions), findings=findings)
