"""``kgc explain``: look at what a condition selects.

* CSR (``router``, or ``biencoder`` with ``router_layers``): the router weight w of every token of a
  sentence (an entity's text, or a C-STS sentence) under each condition, averaged over the router layers
  (one layer for k = 1; the query–key scorer uses one w for all of them). Each row sums to 1 over the
  sentence's tokens, [CLS] and [SEP] included. The heatmap (conditions × tokens) is the CSR paper's
  Figures 5–7.
* Hyper-CL (``hypernet``): the singular values of W_c per condition — how many directions of the
  sentence embedding each condition keeps (rank ≤ K for the low-rank form), with an effective rank
  exp(entropy of σ / Σσ).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from kgc.errors import KGCError

@dataclass
class Explanation:
    kind: str  # "router" or "hypernet"
    conditions: list[str]
    values: np.ndarray  # router: (conditions, tokens) w; hypernet: (conditions, H) singular values, descending
    tokens: list[str] = field(default_factory=list)  # router: the sentence's tokens as the encoder sees them
    layers: list[int] = field(default_factory=list)  # router: the layers w was read in

    def effective_ranks(self) -> np.ndarray:
        p = self.values / self.values.sum(1, keepdims=True).clip(min=1e-12)
        return np.exp(-(p * np.log(p.clip(min=1e-12))).sum(1))

    def to_json(self) -> dict:
        out = {"kind": self.kind, "conditions": self.conditions}
        if self.kind == "router":
            out.update(tokens=self.tokens, layers=self.layers,
                       weights={c: [round(float(x), 6) for x in row] for c, row in zip(self.conditions, self.values)})
        else:
            out.update(singular_values={c: [round(float(x), 6) for x in row] for c, row in
                                        zip(self.conditions, self.values)},
                       effective_rank=dict(zip(self.conditions, map(float, self.effective_ranks()))))
        return out


def check_explainable(cond) -> str:
    if cond.name == "hypernet":
        return "hypernet"
    if cond.name == "router" or (cond.name == "biencoder" and getattr(cond, "k", 0)):
        return "router"
    raise KGCError(f"kgc explain shows CSR's token weights (model.conditioner=router, or biencoder with "
                   f"model.router_layers > 0) and Hyper-CL's W_c (hypernet); this run's conditioner is {cond.name}"
                   + (" without router_layers" if cond.name == "biencoder" else ""))


@torch.no_grad()
def router_weights(cond, sentence: Sequence[int], conditions: Sequence[Sequence[int]], tokenizer,
                   names: list[str]) -> Explanation:
    """w of each token of ``sentence`` (token ids, no special tokens) under each of ``conditions``."""
    n = len(conditions)
    index = torch.arange(n, device=cond.device)
    if cond.name == "router":
        ids = cond.special.wrap(sentence, cond.max_tokens)[0]
        _, route = cond.route(cond.encode_sentences([sentence] * n), cond.encode_conditions(conditions), index)
        rows = torch.arange(n)
        width = len(ids)
    else:  # CSR inside the bi-encoder: the sentence's part of each [CLS] s [SEP] c [SEP]
        _, route = cond.route([sentence] * n, list(conditions), index)
        rows = route.order.cpu() if route.order is not None else torch.arange(n)
        width = int(route.score_cols[rows[0]].sum())
        ids = cond.special.pair[0] + cond.special.truncate_pair(sentence, conditions[0], cond.max_tokens)[0]
        widths = {int(route.score_cols[int(i)].sum()) for i in rows}
        if len(widths) > 1:  # a long condition cut the sentence shorter in some pairs: show the common part
            width = min(widths)
            ids = ids[:width]
    layers = sorted(route.seen)
    w = torch.stack([route.seen[i] for i in layers]).mean(0).float().cpu()[rows][:, :width]  # (conditions, tokens)
    w = w / w.sum(1, keepdim=True).clamp_min(1e-12)
    return Explanation("router", names, w.numpy(), tokens=tokenizer.convert_ids_to_tokens(ids), layers=layers)


@torch.no_grad()
def hypernet_spectra(cond, conditions: Sequence[Sequence[int]], names: list[str]) -> Explanation:
    """Singular values of W_c (H × H) for each condition, descending."""
    mats = cond.matrices(cond.encode_conditions(conditions))  # (conditions, H, H)
    return Explanation("hypernet", names, torch.linalg.svdvals(mats.float()).cpu().numpy())


def render_text(ex: Explanation, max_columns: int = 12) -> str:
    if ex.kind == "hypernet":
        lines = ["condition".ljust(28) + "eff. rank   σ1..σ8"]
        for name, sv, er in zip(ex.conditions, ex.values, ex.effective_ranks()):
            lines.append(f"{name[:27]:<28}{er:9.2f}   " + " ".join(f"{x:.3g}" for x in sv[:8]))
        return "\n".join(lines)
    blocks = []
    for start in range(0, len(ex.conditions), max_columns):  # a few conditions per block keeps lines short
        names = ex.conditions[start: start + max_columns]
        head = "token".ljust(18) + "".join(f"{'R' + str(start + j + 1):>8}" for j in range(len(names)))
        rows = [f"{tok[:17]:<18}" + "".join(f"{ex.values[start + j, i]:8.3f}" for j in range(len(names)))
                for i, tok in enumerate(ex.tokens)]
        total = "(sum)".ljust(18) + "".join(f"{ex.values[start + j].sum():8.3f}" for j in range(len(names)))
        blocks.append("\n".join([head] + rows + [total]))
    legend = "  ".join(f"R{j + 1} = {name}" for j, name in enumerate(ex.conditions))
    layers = ", ".join(map(str, ex.layers))
    return "\n\n".join(blocks) + f"\n{legend}\nw per token (rows sum to 1), router layer(s) {layers}"


def plot(ex: Explanation, path: Path, title: str) -> Path:
    """The heatmap PNG (written atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kgc.fileio import write_with

    values = ex.values if ex.kind == "router" else np.log10(np.clip(ex.values, 1e-6, None))
    if ex.kind == "hypernet":
        keep = max(8, int((ex.values > 1e-4 * ex.values.max()).sum(1).max()))
        values = values[:, :keep]
    rows, cols = values.shape
    fig, ax = plt.subplots(figsize=(min(3 + 0.42 * cols, 30), min(1.6 + 0.32 * rows, 30)))
    im = ax.imshow(values, aspect="auto", cmap="Reds" if ex.kind == "router" else "viridis")
    ax.set_yticks(range(rows), [c[:40] for c in ex.conditions], fontsize=8)
    if ex.kind == "router":
        ax.set_xticks(range(cols), ex.tokens, rotation=60, ha="right", fontsize=8)
        fig.colorbar(im, ax=ax, label="router weight w")
    else:
        ax.set_xlabel("singular value index")
        fig.colorbar(im, ax=ax, label="log10 σ of W_c")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    write_with(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
    return path
