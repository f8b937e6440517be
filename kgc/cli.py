"""The ``kgc`` command line: parse, call the library, print. Bad input exits 2 with one clear message."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from kgc.errors import KGCError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Knowledge-graph completion with text encoders (SimKGC pipeline).")
data_app = typer.Typer(no_args_is_help=True, help="Find and fetch datasets.")
app.add_typer(data_app, name="data")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks behind the performance claims (ratios in one process).")
app.add_typer(bench_app, name="bench")


def _echo(msg: str) -> None:
    typer.echo(msg, err=False)


@app.command()
def train(recipe: Optional[Path] = typer.Argument(None, help="recipe YAML (recipes/*.yaml)"),
          out: Optional[Path] = typer.Option(None, "--out", help="run directory (default runs/<recipe>-<time>)"),
          set_: List[str] = typer.Option([], "--set", help="override a recipe key, e.g. --set train.lr=3e-5"),
          resume: Optional[Path] = typer.Option(None, "--resume", help="continue this run from its last checkpoint"),
          progress: bool = typer.Option(True, "--progress/--no-progress")) -> None:
    """Train from a recipe (link prediction or C-STS, by its `task`), or resume an interrupted run."""
    from kgc.recipe import load_recipe
    from kgc.training.loop import train as run_train

    if resume is None and recipe is None:
        raise KGCError("give a recipe (e.g. `kgc train recipes/umls_biencoder.yaml`) or --resume RUN_DIR")
    if resume is not None and (recipe is not None or set_):
        raise KGCError("--resume continues a run with its saved recipe; drop the recipe and --set arguments")
    rec = load_recipe(recipe, set_) if resume is None else None
    run_train(rec, out=out, resume=resume, progress=progress, echo=_echo)


@app.command()
def evaluate(run_dir: Path = typer.Argument(..., help="a run directory"),
             split: str = typer.Option("test", "--split", help="test or dev"),
             batch_size: Optional[int] = typer.Option(None, "--batch-size"),
             rerank: Optional[bool] = typer.Option(None, "--rerank/--no-rerank", help="SimKGC graph re-ranking"),
             device: str = typer.Option("auto", "--device"),
             progress: bool = typer.Option(True, "--progress/--no-progress")) -> None:
    """Filtered link prediction on a split, both directions; writes results.json and ranks.tsv."""
    from kgc.linkpred.evaluate import evaluate_run, format_table
    from kgc.linkpred.model import Run
    from kgc.training.common import pick_device

    if split not in ("test", "dev"):
        raise KGCError(f"--split {split!r}: choose test or dev")
    run = Run(run_dir)
    ev = evaluate_run(run, split, device=pick_device(device), batch_size=batch_size, rerank=rerank, progress=progress)
    suffix = "" if split == "test" else f".{split}"
    _echo(f"{ev.results['kgc']['dataset']} {split}: {len(ev.ranks)} queries, filtered, realistic ranks "
          f"({ev.seconds:.1f}s)")
    _echo(format_table(ev.results))
    _echo(f"wrote {run.path / f'results{suffix}.json'} and {run.path / f'ranks{suffix}.tsv'}")


@app.command()
def index(run_dir: Path = typer.Argument(..., help="a run directory"),
          device: str = typer.Option("auto", "--device"),
          progress: bool = typer.Option(True, "--progress/--no-progress")) -> None:
    """Embed every entity once and store a FAISS index in RUN_DIR/index."""
    from kgc.linkpred.index import build_index
    from kgc.linkpred.model import Run
    from kgc.training.common import pick_device

    run = Run(run_dir)
    model, _ = run.load(pick_device(device))
    meta = build_index(run, model, progress=progress)
    _echo(f"indexed {meta['entities']} entities (dim {meta['dim']}) in {meta['seconds']}s → {run.path / 'index'}")


@app.command()
def predict(run_dir: Path = typer.Argument(..., help="a run directory with a built index"),
            head: str = typer.Option(..., "--head", help="entity id or text"),
            relation: str = typer.Option(..., "--relation", help="relation name or text"),
            top_k: int = typer.Option(10, "--top-k"),
            inverse: bool = typer.Option(False, "--inverse", help="ask (?, relation, head) instead"),
            filter_known: bool = typer.Option(False, "--filter-known", help="drop answers already in the graph"),
            as_json: bool = typer.Option(False, "--json")) -> None:
    """Top-k answers to (head, relation, ?)."""
    from kgc.linkpred.index import load_index
    from kgc.linkpred.model import Run
    from kgc.linkpred.predict import predict as run_predict

    run = Run(run_dir)
    model, graph = run.load("cpu")
    idx = load_index(run, model)
    start = time.perf_counter()
    h, r, preds = run_predict(model, graph, idx, head=head, relation=relation, top_k=top_k, inverse=inverse,
                              filter_known=filter_known)
    seconds = time.perf_counter() - start
    if as_json:
        _echo(json.dumps({"head": graph.entities[h], "relation": graph.relation_label(r), "seconds": seconds,
                          "predictions": [p.__dict__ for p in preds]}, indent=2))
        return
    _echo(f"({graph.full_texts[h][:70]}, {graph.relation_text(r)}, ?)   [{seconds * 1000:.0f} ms]")
    for p in preds:
        _echo(f"{p.rank:>4}  {p.entity:<24} {p.score:7.4f}  {p.text[:80]}")


@app.command()
def compare(recipes: List[Path] = typer.Argument(..., help="recipes to compare, e.g. recipes/umls_*.yaml"),
            set_: List[str] = typer.Option([], "--set", help="the shared budget, e.g. --set train.epochs=1"),
            out: Path = typer.Option(Path("runs/compare"), "--out", help="folder for the runs and compare.md"),
            progress: bool = typer.Option(True, "--progress/--no-progress")) -> None:
    """Train + evaluate several recipes under one budget; write a markdown table (compare.md)."""
    from kgc.linkpred.compare import compare as run_compare, markdown_table

    rows = run_compare(recipes, set_, out, echo=_echo, progress=progress)
    _echo(markdown_table(rows))
    _echo(f"wrote {out / 'compare.md'}")


@bench_app.command("inference")
def bench_inference(dataset: str = typer.Option("wn18rr", "--dataset"),
                    conditioner: List[str] = typer.Option(["biencoder", "hadamard", "hypernet", "router"],
                                                          "--conditioner"),
                    limit: Optional[int] = typer.Option(None, "--limit", help="only the first N test triples"),
                    set_: List[str] = typer.Option([], "--set"),
                    out: Optional[Path] = typer.Option(None, "--out", help="write the figures as JSON"),
                    progress: bool = typer.Option(True, "--progress/--no-progress")) -> None:
    """Answer every test query (both directions) per conditioner, entity embeddings cached."""
    from kgc.bench import bench_inference as run
    from kgc.fileio import write_json

    result = run(dataset=dataset, conditioners=conditioner, limit=limit, overrides=set_, echo=_echo, progress=progress)
    for row in result["rows"]:
        ratio = row["speedup_vs_biencoder"]
        _echo(f"{row['conditioner']:<10} {row['queries_per_s']:>10.1f} queries/s" +
              (f"   {ratio:>7.1f}x the bi-encoder" if ratio is not None else ""))
    if out:
        write_json(out, result)


@bench_app.command("train")
def bench_train(recipe: Path = typer.Argument(..., help="e.g. recipes/wn18rr_csr.yaml"),
                trainable_layers: int = typer.Option(2, "--trainable-layers"),
                steps: int = typer.Option(5, "--steps"), batch_size: int = typer.Option(32, "--batch-size"),
                set_: List[str] = typer.Option([], "--set"),
                out: Optional[Path] = typer.Option(None, "--out", help="write the figures as JSON")) -> None:
    """Training triples/s: full fine-tuning vs the top n layers over the layer cache."""
    from kgc.bench import bench_train as run
    from kgc.fileio import write_json

    result = run(recipe, trainable_layers=trainable_layers, steps=steps, batch_size=batch_size, overrides=set_,
                 echo=_echo)
    if out:
        write_json(out, result)


@data_app.command("list")
def data_list() -> None:
    """Show which catalog datasets are found, and where."""
    from kgc.data.catalog import list_datasets

    for row in list_datasets():
        _echo(f"{row['name']:<10} {row['where']:<28} {row['folder']}")


@data_app.command("fetch")
def data_fetch(name: str = typer.Argument(..., help="catalog name, e.g. wn18rr"),
               dest: Optional[Path] = typer.Option(None, "--dest", help="data home (default $KGC_DATA_HOME or ./data)")) -> None:
    """Download a dataset from its public home and check its sha256 sums."""
    from kgc.data.catalog import fetch_dataset

    _echo(f"fetched into {fetch_dataset(name, dest)}")


def main() -> None:
    """Entry point: typer handles usage errors (exit 2); bad input (KGCError) exits 2 with one message."""
    try:
        app()
    except KGCError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
