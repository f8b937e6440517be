"""``kgc compare``: train and evaluate several recipes under one budget, and tabulate them.

The same ``--set`` overrides (the budget: epochs, max_steps, batch size, …) apply to every recipe.
The table is the toolkit's version of the papers' KGC tables: conditioner, MRR, H@1, H@3, H@10,
trainable and total parameters, training triples/s, evaluation wall time and cache bytes.
"""

from __future__ import annotations

from pathlib import Path

from kgc.fileio import write_json, write_text
from kgc.linkpred.evaluate import evaluate_run
from kgc.linkpred.model import Run
from kgc.linkpred.train import train
from kgc.recipe import load_recipe

COLUMNS = ["recipe", "conditioner", "MRR", "H@1", "H@3", "H@10", "trainable params", "total params",
           "train triples/s", "eval seconds", "cache bytes"]


def _fmt_int(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e3 else str(n)


def compare(recipes: list[Path], overrides: list[str], out: Path, *, echo=print, progress: bool = False) -> list[dict]:
    import json

    rows = []
    out.mkdir(parents=True, exist_ok=True)
    for path in recipes:
        recipe = load_recipe(path, overrides)
        run_dir = out / recipe.name
        if (run_dir / "train_summary.json").is_file():
            echo(f"{recipe.name}: already trained in {run_dir}, reusing it")
        else:
            if (run_dir / "checkpoints" / "last.pt").is_file():
                train(resume=run_dir, progress=progress, echo=echo)
            else:
                train(recipe, out=run_dir, progress=progress, echo=echo)
        run = Run(run_dir)
        ev = evaluate_run(run, "test", progress=progress)
        summary = json.loads((run_dir / "train_summary.json").read_text())
        both = ev.results["both"]["realistic"]
        rows.append({"recipe": recipe.name, "conditioner": _describe(run.recipe), "MRR": both["inverse_harmonic_mean_rank"],
                     "H@1": both["hits_at_1"], "H@3": both["hits_at_3"], "H@10": both["hits_at_10"],
                     "trainable params": summary["trainable_params"], "total params": summary["total_params"],
                     "train triples/s": summary["triples_per_s"], "eval seconds": ev.results["kgc"]["evaluation_seconds"],
                     "cache bytes": ev.results["kgc"]["cache_bytes"]})
        echo(f"{recipe.name}: test MRR {both['inverse_harmonic_mean_rank']:.4f}")
    table = markdown_table(rows)
    write_text(out / "compare.md", table + "\n")
    write_json(out / "compare.json", {"overrides": overrides, "rows": rows})
    return rows


def _describe(recipe) -> str:
    m = recipe.model
    extra = {"hypernet": f" ({m.hypernet_form}, K={m.rank or 'H/12'})",
             "router": f" (k={m.router_layers}, {m.scorer}, {m.weighting})"}.get(m.conditioner, "")
    layers = recipe.encoder.trainable_layers
    return m.conditioner + extra + ("" if layers == "all" else f", top {layers} layers")


def markdown_table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        cells = [r["recipe"], r["conditioner"]] + [f"{r[k]:.4f}" for k in ("MRR", "H@1", "H@3", "H@10")] + [
            _fmt_int(r["trainable params"]), _fmt_int(r["total params"]), f"{r['train triples/s']:.1f}",
            f"{r['eval seconds']:.1f}", f"{r['cache bytes'] / 2**20:.1f} MiB"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
