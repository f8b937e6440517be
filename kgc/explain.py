"""``kgc explain``: look at what a condition selects.

* CSR (``router``, or ``biencoder`` with ``router_layers``): the router weight w of every token of a
  sentence (an entity's text, or a C-STS sentence) under each condition, averaged over the router layers
  (one layer for k = 1; the query–key scorer uses one w for all of them). Each row sums to 1 over the
  sentence's tokens ([CLS] and [SEP] hold 0 when the router routes over words only). The heatmap (conditions ×
  tokens) is the CSR paper's Figures 5–7. Beside it: the share of w on special tokens, and how much w moves
  between conditions — the total-variation distance of each condition's row from the mean row,
  ½ Σ_i |w_c,i − w̄_i| — with a warning when no condition moves :data:`BLIND` of the mass (condition-blind
  routing).
* Hyper-CL (``hypernet``): the singular values of W_c per condition — how many directions of the
  sentence embedding each condition keeps (rank ≤ K for the low-rank form), with an effective rank
  exp(entropy of σ / Σσ).

Which of the two a run shows, and the numbers, come from its conditioner (``cond.explain_kind``,
``cond.explain(...)``); this module names and renders them. A conditioner with nothing to show refuses
with a KGCError that says what it is and which conditioners can be explained.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from kgc.errors import KGCError

BLIND = 0.01  # routing is condition-blind when no condition's w is further than this (total variation) from the mean


@dataclass
class Explanation:
    kind: str  # "tokens" or "spectrum"
    conditions: list[str]
    values: np.ndarray  # router: (conditions, tokens) w; hypernet: (conditions, H) singular values, descending
    tokens: list[str] = field(default_factory=list)  # router: the sentence's tokens as the encoder sees them
    layers: list[int] = field(default_factory=list)  # router: the layers w was read in
    special: list[bool] = field(default_factory=list)  # router: which of ``tokens`` are the tokenizer's special ones

    def special_share(self) -> np.ndarray | None:
        """Router: the mass of w on special tokens ([CLS], [SEP]), per condition (conditions,); None when the
        explanation does not say which tokens are special."""
        return self.values[:, np.asarray(self.special, dtype=bool)].sum(1) if self.special else None

    def spread(self) -> np.ndarray:
        """Router: each condition's total-variation distance from the mean row, ½ Σ_i |w_c,i − w̄_i| (conditions,):
        the share of w that moves with the condition (0: every condition weighs the tokens alike)."""
        return 0.5 * np.abs(self.values - self.values.mean(0, keepdims=True)).sum(1)

    def condition_blind(self) -> bool | None:
        """Router: True when no condition moves :data:`BLIND` of w (None with fewer than 2 conditions)."""
        return None if len(self.values) < 2 else bool(self.spread().max() < BLIND)

    def effective_ranks(self) -> np.ndarray:
        p = self.values / self.values.sum(1, keepdims=True).clip(min=1e-12)
        return np.exp(-(p * np.log(p.clip(min=1e-12))).sum(1))

    def to_json(self) -> dict:
        out = {"kind": self.kind, "conditions": self.conditions}
        if self.kind == "tokens":
            out.update(tokens=self.tokens, layers=self.layers,
                       weights={c: [round(float(x), 6) for x in row] for c, row in zip(self.conditions, self.values)},
                       special_share=None if self.special_share() is None else
                       dict(zip(self.conditions, (round(float(x), 6) for x in self.special_share()))),
                       spread=dict(zip(self.conditions, (round(float(x), 6) for x in self.spread()))),
                       condition_blind=self.condition_blind())
        else:
            out.update(singular_values={c: [round(float(x), 6) for x in row] for c, row in
                                        zip(self.conditions, self.values)},
                       effective_rank=dict(zip(self.conditions, map(float, self.effective_ranks()))))
        return out


def check_explainable(cond) -> str:
    """The kind of :class:`Explanation` ``cond`` gives ("tokens" or "spectrum"), or its KGCError refusal."""
    kind = cond.explain_kind
    if kind is None:
        raise cond.not_explainable()
    return kind


def explain_conditioner(cond, conditions: Sequence[Sequence[int]], names: list[str], *,
                        sentence: Sequence[int] | None = None, tokenizer=None) -> Explanation:
    """What each of ``conditions`` (token ids, no special tokens) selects, named ``names``: the weight of each token
    of ``sentence`` (the router kind; ``tokenizer`` turns its ids into tokens) or the spectrum of W_c."""
    check_explainable(cond)
    got = cond.explain(conditions, sentence)
    tokens = tokenizer.convert_ids_to_tokens(list(got.token_ids)) if got.token_ids else []
    specials = set(getattr(tokenizer, "all_special_ids", ()) or ())
    return Explanation(got.kind, names, got.values.numpy(), tokens=tokens, layers=list(got.layers),
                       special=[i in specials for i in got.token_ids])


def explain(inputs) -> tuple[Explanation, str]:
    """``kgc explain`` on what a run hands it (:class:`kgc.training.run.ExplainInputs`): the explanation and a title
    for its heatmap. The router kind weighs a sentence's tokens, so it needs one (``inputs.sentence_hint`` says how
    to give it)."""
    cond = inputs.conditioner
    kind = check_explainable(cond)
    if kind == "tokens" and inputs.sentence is None:
        raise KGCError(inputs.sentence_hint)
    ex = explain_conditioner(cond, inputs.conditions, list(inputs.names), sentence=inputs.sentence,
                             tokenizer=inputs.tokenizer)
    if kind == "tokens":
        return ex, f"router weight w per token: {inputs.subject[:60]}"
    return ex, f"singular values of W_c: {type(cond).describe(cond.export_spec()['options'])}"


def render_text(ex: Explanation, max_columns: int = 12) -> str:
    if ex.kind == "spectrum":
        lines = ["condition".ljust(28) + "eff. rank   σ1..σ8"]
        for name, sv, er in zip(ex.conditions, ex.values, ex.effective_ranks()):
            lines.append(f"{name[:27]:<28}{er:9.2f}   " + " ".join(f"{x:.3g}" for x in sv[:8]))
        return "\n".join(lines)
    blocks, share, spread = [], ex.special_share(), ex.spread()
    for start in range(0, len(ex.conditions), max_columns):  # a few conditions per block keeps lines short
        names = ex.conditions[start: start + max_columns]
        head = "token".ljust(18) + "".join(f"{'R' + str(start + j + 1):>8}" for j in range(len(names))) + "Δ".rjust(8)
        rows = [f"{tok[:17]:<18}" + "".join(f"{ex.values[start + j, i]:8.3f}" for j in range(len(names)))
                + f"{np.ptp(ex.values[:, i]):8.3f}" for i, tok in enumerate(ex.tokens)]
        total = "(sum)".ljust(18) + "".join(f"{ex.values[start + j].sum():8.3f}" for j in range(len(names)))
        moved = "(moved)".ljust(18) + "".join(f"{spread[start + j]:8.3f}" for j in range(len(names)))
        blocks.append("\n".join([head] + rows + [total, moved]))
    legend = "  ".join(f"R{j + 1} = {name}" for j, name in enumerate(ex.conditions))
    layers = ", ".join(map(str, ex.layers))
    lines = [legend, f"w per token (rows sum to 1), router layer(s) {layers}; Δ: max − min of a token's w across "
                     "conditions; (moved): the share of w a condition moves away from the mean row (total variation)",
             ("w on special tokens: n/a" if share is None else
              f"w on special tokens: {share.mean():.3f} (min {share.min():.3f}, max {share.max():.3f})")
             + f"; moved by the condition: mean {spread.mean():.3f}, max {spread.max():.3f}"]
    if ex.condition_blind():
        lines.append(f"warning: the routing is condition-blind here: no condition moves {BLIND:.0%} of w (every "
                     "condition weighs these tokens alike; whatever conditions this run comes from elsewhere, e.g. "
                     "cross-attention)")
    return "\n\n".join(blocks) + "\n" + "\n".join(lines)


WIDTH_INCHES = 8.0  # the heatmap's width: ~800 px on a documentation page, its 9–11 pt text read at that size
CELL_INCHES = 0.3  # a token's column at least this wide: a long sentence wraps onto several rows of tokens


def plot(ex: Explanation, path: Path, title: str) -> Path:
    """The heatmap PNG (written atomically), 8 inches wide whatever the sentence's length: a router's tokens wrap onto
    as many rows of heatmap as they need (each the conditions × a run of tokens, one colour scale for all), so the
    figure reads at a page's width."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kgc.fileio import write_with

    values = ex.values if ex.kind == "tokens" else np.log10(np.clip(ex.values, 1e-6, None))
    if ex.kind == "spectrum":
        keep = max(8, int((ex.values > 1e-4 * ex.values.max()).sum(1).max()))
        values = values[:, :keep]
    rows, cols = values.shape
    names = [c if len(c) <= 32 else c[:31] + "…" for c in ex.conditions]
    label_inches = 0.3 + 0.068 * max((len(n) for n in names), default=4)  # the conditions' names, 9 pt
    if ex.kind == "tokens":  # wrap the tokens: as few rows as fit, then as even as possible
        fit = max(6, int((WIDTH_INCHES - label_inches - 1.0) / CELL_INCHES))
        panels = -(-cols // fit)
        per = -(-cols // panels)
    else:
        panels, per = 1, cols
    row_inches = 0.3 * rows + (1.15 if ex.kind == "tokens" else 0.55)  # the cells, then the token labels under them
    heading = textwrap.wrap(title, 90) or [""]
    fig, axes = plt.subplots(panels, 1, squeeze=False, layout="constrained",
                             figsize=(WIDTH_INCHES, 0.3 + 0.2 * len(heading) + panels * row_inches))
    cmap = plt.get_cmap("Reds" if ex.kind == "tokens" else "viridis").with_extremes(bad="white")  # empty cells
    low, high = float(np.nanmin(values)), float(np.nanmax(values))
    for p, ax in enumerate(axes[:, 0]):
        part = np.full((rows, per), np.nan)
        chunk = values[:, p * per:(p + 1) * per]
        part[:, :chunk.shape[1]] = chunk
        im = ax.imshow(part, aspect="auto", cmap=cmap, vmin=low, vmax=high, interpolation="nearest")
        ax.set_yticks(range(rows), names, fontsize=9)
        if ex.kind == "tokens":
            tokens = ex.tokens[p * per:(p + 1) * per]
            ax.set_xticks(range(len(tokens)), tokens, rotation=55, ha="right", rotation_mode="anchor", fontsize=10)
        else:
            ax.set_xlabel("singular value index", fontsize=10)
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
    fig.colorbar(im, ax=axes[:, 0].tolist(), label="router weight w" if ex.kind == "tokens" else "log10 σ of W_c",
                 fraction=0.03, pad=0.02, aspect=max(10, 12 * panels))
    fig.suptitle("\n".join(heading), fontsize=11)
    write_with(path, lambda tmp: fig.savefig(tmp, format="png", dpi=150))
    plt.close(fig)
    return path
