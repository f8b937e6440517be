"""Top-k answers to (head, relation, ?): by cosine from a run's FAISS index, or by the fused text + structure
score over every entity (:func:`kgc.linkpred.structure.pykeen.predict_fused`); and the query files of
``kgc predict --input`` (:func:`predict_file`). A question's options are :class:`kgc.linkpred.answer.query.QueryOptions`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from kgc.data.graph import KnowledgeGraph
from kgc.errors import KGCError
from kgc.linkpred.answer.query import QueryOptions

if TYPE_CHECKING:
    import pandas as pd

    from kgc.linkpred.index.types import SearchIndex


@dataclass
class Prediction:
    rank: int
    entity: str     # entity id
    text: str       # its full text ("name: description")
    score: float    # cosine (or the fused score)
    known: bool = False  # (head, relation, entity) is a triple of the graph (train, dev or test)
    name: str = ""  # its short name


PREDICTION_COLUMNS = ["rank", "entity", "name", "text", "score", "known"]


@dataclass
class Query:
    """One resolved question: head entity id ``h`` (None: free text ``head`` with token ids ``tokens``) under
    relation id ``r`` (an inverse id for (?, relation, head)), with its answering options."""
    head: str
    h: int | None
    r: int
    tokens: list
    options: QueryOptions

    @property
    def top_k(self) -> int:
        return self.options.top_k

    def excluded(self, known: set[int]) -> set[int]:
        """Entity ids left out of the answers: the head (unless ``include_head``, or the graph has it as an answer:
        a true self-loop is shown, marked known), and ``known`` with ``filter_known``."""
        out = set(known) if self.options.filter_known else set()
        if self.h is not None and not self.options.include_head and self.h not in known:
            out.add(self.h)
        return out


@dataclass
class Answers:
    """:meth:`LinkPredRun.answer`: the query as it was resolved and its ranked answers (what ``kgc predict``
    prints)."""
    run: Path
    head: str                # entity id (the text given was resolved to it)
    relation: str            # relation label; ``inverse`` answers (?, relation, head)
    head_text: str           # the head's full text
    relation_text: str       # the relation's text, "inverse …" for the inverse direction
    predictions: list        # Prediction: rank, entity, text, score, known, name
    seconds: float           # answering, index loading excluded

    def to_json(self) -> dict:
        """What ``kgc predict --json`` prints and ``kgc serve`` answers for one query."""
        return {"head": self.head, "relation": self.relation, "head_text": self.head_text,
                "relation_text": self.relation_text, "seconds": round(self.seconds, 6),
                "predictions": [dict(p.__dict__) for p in self.predictions]}

    def frame(self) -> "pd.DataFrame":
        import pandas as pd

        return pd.DataFrame([{c: getattr(p, c) for c in PREDICTION_COLUMNS} for p in self.predictions],
                            columns=PREDICTION_COLUMNS)


def known_answers(graph: KnowledgeGraph, head: int, relation: int) -> np.ndarray:
    """Entity ids already known as answers of (head, relation) in train + dev + test (none for an added head)."""
    if head >= graph.num_entities:
        return np.empty(0, dtype=np.int64)
    return graph.all_answers[graph.hr_keys(np.array([head]), np.array([relation]))].indices


def _prediction(rank: int, e: int, score: float, graph: KnowledgeGraph, known: set[int]) -> Prediction:
    return Prediction(rank, graph.entities[e], graph.full_texts[e], score, e in known, graph.names[e])


def search_many(query_vectors: np.ndarray, index: "SearchIndex", graph: KnowledgeGraph, *, top_ks: list[int],
                excludes: list[set[int]], knowns: list[set[int]]) -> list[list[Prediction]]:
    """The index's top ``top_ks[i]`` entities for each of (queries, dim) vectors in one index search (as deep as
    the deepest query needs), leaving out the ids in ``excludes[i]``; ``knowns[i]`` marks answers the graph has.
    ``graph`` names the index's rows (the run's graph with its added entities)."""
    from kgc.linkpred.index.types import search_index

    k = min(index.ntotal, max(t + len(x) for t, x in zip(top_ks, excludes)))
    scores, ids = search_index(index, query_vectors, k)
    answers = []
    for row_scores, row_ids, top_k, exclude, known in zip(scores, ids, top_ks, excludes, knowns):
        out: list[Prediction] = []
        for s, e in zip(row_scores, row_ids):
            if len(out) == top_k:
                break
            if e < 0 or int(e) in exclude:
                continue
            out.append(_prediction(len(out) + 1, int(e), float(s), graph, known))
        answers.append(out)
    return answers


def rank_scores(scores: torch.Tensor, graph: KnowledgeGraph, *, top_k: int,
                exclude: set[int] = frozenset(), known: set[int] = frozenset()) -> list[Prediction]:
    """The top ``top_k`` of dense (entities,) scores (fused), leaving out ``exclude``."""
    scores = scores.clone()
    if exclude:
        scores[torch.as_tensor(sorted(exclude))] = float("-inf")
    order = torch.argsort(scores, descending=True)[:top_k]
    return [_prediction(i + 1, e, float(scores[e]), graph, known)
            for i, e in enumerate(order.tolist()) if torch.isfinite(scores[e])]


# ---------------------------------------------------------------- kgc predict --input


@dataclass
class QueryLine:
    """One question of a query file: where it stands, and what it asks."""
    line: int
    head: str
    relation: str
    options: dict  # the line's own QueryOptions keys (JSONL only), over the file's defaults


def read_query_file(path: str | Path) -> list[QueryLine]:
    """Questions from ``path``: TSV lines ``head<TAB>relation`` (blank lines and ``#`` comments skipped), or, for
    a ``.jsonl`` file, one object per line with ``head``, ``relation`` and any :class:`QueryOptions` (``top_k``,
    ``inverse``, ``filter_known``, ``include_head``, ``free_text``). A bad line is one KGCError naming it."""
    import json

    from kgc.data.formats.lines import text_lines

    path = Path(path)
    if not path.is_file():
        raise KGCError(f"{path}: no such file. Give one question per line: head<TAB>relation (or a .jsonl file of "
                       '{"head": …, "relation": …} objects).')
    jsonl = path.suffix.lower() in (".jsonl", ".ndjson")
    out = []
    for lineno, line in text_lines(path):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if jsonl:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise KGCError(f"{path}:{lineno}: not JSON ({exc.msg}): {line[:80]!r}") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("head"), str) or \
                    not isinstance(obj.get("relation"), str):
                raise KGCError(f'{path}:{lineno}: expected {{"head": "…", "relation": "…"}}, got {line[:80]!r}')
            options = {k: v for k, v in obj.items() if k not in ("head", "relation")}
            extra = sorted(set(options) - set(QueryOptions.model_fields))
            if extra:
                raise KGCError(f"{path}:{lineno}: unknown key(s) {', '.join(extra)}; a line may give head, relation, "
                               f"{', '.join(QueryOptions.model_fields)}")
            try:
                QueryOptions.of(options)
            except KGCError as exc:
                raise KGCError(f"{path}:{lineno}: {exc}") from None
            out.append(QueryLine(lineno, obj["head"], obj["relation"], options))
            continue
        parts = line.rstrip("\r\n").split("\t")
        if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
            raise KGCError(f"{path}:{lineno}: expected head<TAB>relation, got {len(parts)} field(s): {line[:80]!r}. "
                           "Separate the head and the relation with one tab.")
        out.append(QueryLine(lineno, parts[0].strip(), parts[1].strip(), {}))
    if not out:
        raise KGCError(f"{path}: no questions. Give one per line: head<TAB>relation.")
    return out


ANSWER_COLUMNS = ["line", "head", "relation", "rank", "entity", "name", "score", "known"]


def answer_rows(q: QueryLine, a: Answers) -> list[dict]:
    """``kgc predict --input … --format tsv``: one row per answer."""
    return [{"line": q.line, "head": a.head, "relation": a.relation, "rank": p.rank, "entity": p.entity,
             "name": p.name, "score": round(p.score, 6), "known": int(p.known)} for p in a.predictions]


def answer_records(run, queries: Sequence[Query], answers: Sequence[Answers]) -> list[dict]:
    """Each answer of ``run`` (a :class:`~kgc.linkpred.answer.run.LinkPredRun`) as ``kgc predict --json`` prints it
    and ``POST /predict`` answers it — one record, the same fields: the run, :meth:`Answers.to_json`, each
    prediction's ``known_split`` (the split of the graph that holds the triple, "train", "dev" or "test"; None for
    an answer not known) and, for a free-text head, its ``nearest`` entities by embedding (found for all of them in
    one pass)."""
    texts = list(dict.fromkeys(q.head for q in queries if q.h is None))
    nearest = dict(zip(texts, run.predictor.nearest_entities(texts, run.entities))) if texts else {}
    graph, seen = run.predictor.graph(), run.entities.searcher()[1]  # the run's graph; the index's (added entities)
    out = []
    for q, a in zip(queries, answers):
        rec = {"run": str(run.path), **a.to_json()}
        splits = known_splits(graph, seen, q, [p["entity"] for p in rec["predictions"]])
        for p, split in zip(rec["predictions"], splits):
            p["known_split"] = split if p["known"] else None
        if q.h is None:
            rec["nearest"] = nearest.get(q.head, [])
        out.append(rec)
    return out


def known_splits(graph: KnowledgeGraph, full: KnowledgeGraph, q: Query, entities: list[str]) -> list[str]:
    """For each answer entity (id, of ``full``: the graph with added entities) of ``q``, the split of ``graph``
    that holds (head, relation, entity): "dev" or "test" when a held-out split does, else "train"."""
    out = ["train"] * len(entities)
    if q.h is None or q.h >= graph.num_entities:
        return out
    rows = np.array([full.entity_index.get(e, graph.num_entities) for e in entities], dtype=np.int64)
    keys = graph.hr_keys(np.array([q.h]), np.array([q.r]))[0] * graph.num_entities + rows
    for split, held in graph.held_out_keys.items():
        if len(held):
            at = np.searchsorted(held, keys).clip(max=len(held) - 1)
            for i in np.flatnonzero((rows < graph.num_entities) & (held[at] == keys)):
                out[i] = split
    return out


def predict_file(run, path: str | Path, out: str | Path | None = None, *, format: str | None = None,
                 batch_size: int = 64, progress: bool = False, echo=None, **options) -> dict:
    """:meth:`kgc.linkpred.answer.run.LinkPredRun.predict_file` for ``run``: every question of the file resolved
    first (a bad one stops it, naming its line), then answered ``batch_size`` at a time; ``options``: the
    file's default :class:`QueryOptions`, each JSONL line's own over them."""
    import json
    import time

    from tqdm.auto import tqdm

    from kgc.fileio import tsv_text, write_text

    fmt = format or ("tsv" if out is not None and Path(out).suffix.lower() == ".tsv" else "jsonl")
    if fmt not in ("jsonl", "tsv"):
        raise KGCError(f"--format {fmt}: choose jsonl or tsv")
    if batch_size < 1:
        raise KGCError(f"--batch-size {batch_size}: at least 1")
    defaults = QueryOptions.of(options)  # a bad default is said as such, not as the first line's
    lines = read_query_file(path)
    queries = []
    for q in lines:
        try:
            queries.append(run.resolve(q.head, q.relation, progress=progress, note=False,
                                       **QueryOptions.of(defaults, **q.options).model_dump()))
        except KGCError as exc:
            raise KGCError(f"{path}:{q.line}: {exc}") from None
    start, records, rows = time.perf_counter(), [], []
    for s in tqdm(range(0, len(queries), batch_size), desc="questions", unit="batch", disable=not progress,
                  leave=False):
        batch = queries[s: s + batch_size]
        answers = run.answer_many(batch)
        full = run.answer_records(batch, answers) if fmt == "jsonl" else [None] * len(batch)
        for q, a, rec in zip(lines[s: s + batch_size], answers, full):
            if fmt == "jsonl":  # the fields of kgc predict --json and POST /predict, after the question's line
                records.append(json.dumps({"line": q.line, **rec}, ensure_ascii=False) + "\n")
            rows += answer_rows(q, a)  # one per answer: the TSV's rows, and the count
    seconds = time.perf_counter() - start
    text = "".join(records) if fmt == "jsonl" else tsv_text(rows, ANSWER_COLUMNS)
    if out is not None:
        write_text(out, text)
    elif echo is not None and text.strip():
        echo(text.rstrip("\n"))
    return {"questions": len(queries), "answers": len(rows), "seconds": round(seconds, 3),
            "per_second": round(len(queries) / max(seconds, 1e-9), 1), "format": fmt}
