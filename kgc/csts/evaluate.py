"""C-STS evaluation: Spearman and Pearson (scipy), pair accuracy, MSE; ``results.json`` + ``predictions.tsv``.

Each conditioner runs at its own cost (:class:`~kgc.conditioning.engine.PairEncoder`): every distinct
condition once; tri-encoders and Hyper-CL every distinct sentence once and a composition per
(sentence, condition); the router every distinct sentence up to layer t once and the top k layers per
(sentence, condition); bi-encoder and CASE the whole encoder per distinct (sentence, condition). A
(sentence, condition) shared by several rows is embedded once.

Pair accuracy (CASE): over the contrast pairs (the two conditions of one sentence pair, labels
differing), the fraction whose similarity under c_high exceeds that under c_low; an exact tie counts
one half (a condition-blind model scores 0.5, not 0).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats

from kgc.conditioning.engine import PairEncoder
from kgc.csts.data import CSTSData, CSTSSplit
from kgc.csts.loss import scale_label
from kgc.csts.model import SimilarityModel, Texts


@dataclass
class CSTSEvaluation:
    results: dict
    predictions: list[dict]
    seconds: float


def _finite(x: float) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


def similarity_metrics(pred: np.ndarray, label: np.ndarray, high: np.ndarray, low: np.ndarray) -> dict:
    """Metrics of predicted cosines ``pred`` against labels (NaN = unlabelled rows, ignored)."""
    seen = ~np.isnan(label)
    p, y = pred[seen], label[seen]
    varied = len(y) > 1 and np.ptp(p) > 0 and np.ptp(y) > 0
    diff = pred[high] - pred[low]
    wins, ties = int((diff > 0).sum()), int((diff == 0).sum())
    return {"spearman": _finite(stats.spearmanr(p, y).statistic) if varied else None,
            "pearson": _finite(stats.pearsonr(p, y).statistic) if varied else None,
            "pair_accuracy": (wins + 0.5 * ties) / len(diff) if len(diff) else None,
            "contrast_pairs": int(len(diff)), "ties": ties,
            "mse": float(np.mean((p - scale_label(torch.as_tensor(y)).numpy()) ** 2)) if len(y) else None,
            "labelled_rows": int(seen.sum())}


def sample_rows(split: CSTSSplit, max_groups: int | None, seed: int) -> np.ndarray:
    """Every row, or the rows of a fixed random sample of sentence pairs (both conditions kept)."""
    if max_groups is None or max_groups >= len(split.groups):
        return np.arange(len(split))
    pick = np.random.default_rng(seed).choice(len(split.groups), size=max_groups, replace=False)
    return np.sort(np.concatenate([split.groups[i] for i in pick]))


@torch.no_grad()
def evaluate(model: SimilarityModel, texts: Texts, data: CSTSData, split: str = "test", *, batch_size: int = 256,
             max_groups: int | None = None, seed: int = 0, progress: bool = False) -> CSTSEvaluation:
    from tqdm.auto import tqdm

    start = time.perf_counter()
    model.eval()
    sp = data.split(split)
    rows = sample_rows(sp, max_groups, seed)
    s_used = np.unique(np.concatenate([sp.s1[rows], sp.s2[rows]]))
    c_used = np.unique(sp.cond[rows])
    engine = PairEncoder(model.conditioner, [texts.sentences[i] for i in s_used],
                         [texts.conditions[j] for j in c_used], batch_size=batch_size, progress=progress, unit="pairs")
    s = np.searchsorted(s_used, np.concatenate([sp.s1[rows], sp.s2[rows]]))  # (2 rows,) local sentence ids
    c = np.searchsorted(c_used, np.concatenate([sp.cond[rows], sp.cond[rows]]))
    pairs, inverse = np.unique(np.stack([s, c], 1), axis=0, return_inverse=True)  # distinct (sentence, condition)
    order = np.argsort([len(texts.sentences[s_used[i]]) for i in pairs[:, 0]], kind="stable")  # little padding
    table = torch.empty(len(pairs), model.conditioner.out_dim)
    for k in tqdm(range(0, len(order), batch_size), desc=f"evaluate {split}", disable=not progress, leave=False):
        idx = order[k: k + batch_size]
        table[torch.as_tensor(idx)] = engine(pairs[idx, 0], pairs[idx, 1]).float().cpu()
    n = len(rows)
    inverse = torch.as_tensor(inverse.reshape(-1))
    cosine = (table[inverse[:n]] * table[inverse[n:]]).sum(-1).numpy()  # (rows,)
    label = sp.label[rows]
    position = np.full(len(sp), -1)
    position[rows] = np.arange(len(rows))  # split row → evaluated row
    high, low = (position[x] for x in sp.contrast_pairs(rows))
    seconds = time.perf_counter() - start
    results = {"split": split, "rows": int(n), **similarity_metrics(cosine, label, high, low)}
    cache = model.layer_cache
    results["kgc"] = {"dataset": data.source, "evaluation_seconds": round(seconds, 3),
                      "sentences": int(len(s_used)), "conditions": int(len(c_used)),
                      "sentence_condition_pairs": int(len(pairs)), "precision": model.precision,
                      "encoder_passes": int(sum(engine.passes.values())),
                      "encoder_passes_by_kind": dict(engine.passes),
                      "condition_enters_at_layer": model.conditioner.entry_layer,
                      "encoder_layers_per_pair": model.conditioner.encoder.num_layers - model.conditioner.entry_layer,
                      "cache_bytes": int(table.numel() * table.element_size() + engine.state_bytes
                                         + (cache.nbytes if cache is not None else 0)),
                      "sampled": bool(n < len(sp))}
    preds = [{"line": int(sp.lines[r]), "sentence1": data.sentences[sp.s1[r]], "sentence2": data.sentences[sp.s2[r]],
              "condition": data.conditions[sp.cond[r]], "label": "" if np.isnan(sp.label[r]) else float(sp.label[r]),
              "similarity": float(cos), "predicted_label": round(1 + 4 * float(np.clip(cos, 0, 1)), 4)}
             for r, cos in zip(rows.tolist(), cosine)]
    return CSTSEvaluation(results=results, predictions=preds, seconds=seconds)


def format_summary(results: dict) -> str:
    fmt = lambda v: "   n/a" if v is None else f"{v:.4f}"  # noqa: E731
    return (f"Spearman {fmt(results['spearman'])}   Pearson {fmt(results['pearson'])}   "
            f"pair accuracy {fmt(results['pair_accuracy'])} ({results['contrast_pairs']} pairs)   "
            f"MSE {fmt(results['mse'])}")


@torch.no_grad()
def condition_blind(data: CSTSData, backbone_folder, split: str = "test", *, pooling: str = "mean",
                    max_tokens: int = 128, batch_size: int = 256) -> dict:
    """The baseline that ignores the condition: cos(f(s1), f(s2)) of the untrained backbone's embeddings."""
    from kgc.data.texts import SpecialTokens
    from kgc.encoding.backbone import TextEncoder, load_backbone, load_tokenizer

    tokenizer = load_tokenizer(backbone_folder)
    encoder = TextEncoder(load_backbone(backbone_folder), pooling).eval()
    special = SpecialTokens.from_tokenizer(tokenizer)
    sp = data.split(split)
    used = np.unique(np.concatenate([sp.s1, sp.s2]))
    ids = tokenizer([data.sentences[i] for i in used], add_special_tokens=False)["input_ids"]
    table = torch.cat([encoder(**special.pad([special.wrap(t, max_tokens) for t in ids[k: k + batch_size]]))
                       for k in range(0, len(ids), batch_size)])
    a, b = table[np.searchsorted(used, sp.s1)], table[np.searchsorted(used, sp.s2)]
    cosine = (a * b).sum(-1).numpy()
    high, low = sp.contrast_pairs()
    return {"split": split, "rows": int(len(sp)), **similarity_metrics(cosine, sp.label, high, low)}
