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
                  help="Knowledge-graph completion with text encoders (SimKGC pipeline), "
                       "and conditional sentence similarity (C-STS) on the same conditioning core.")
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
          nproc: Optional[int] = typer.Option(None, "--nproc", min=1,
                                              help="data-parallel processes (launches torchrun --nproc-per-node "
                                                   "N; train.batch_size is the global batch)"),
          progress: bool = typer.Option(True, "--progress/--no-progress")) -> None:
    """Train from a recipe (link prediction or C-STS, by its `task`), or resume an interrupted run.

    Multi-process: `kgc train RECIPE --nproc 2`, or `torchrun --nproc-per-node 2 -m kgc train RECIPE`."""
    from kgc.recipe import load_recipe
    from kgc.training import distributed as dist
    from kgc.training.loop import train as run_train

    if nproc is not None and nproc > 1 and not dist.launched():
        argv, skip = [], False
        for arg in sys.argv[1:]:  # the same command without --nproc, under torchrun
            if skip or arg == "--nproc" or arg.startswith("--nproc="):
                skip = arg == "--nproc"
                continue
            argv.append(arg)
        raise typer.Exit(dist.launch(nproc, argv))
    if resume is None and recipe is None:
        raise KGCError("give a recipe (e.g. `kgc train recipes/umls_biencoder.yaml`) or --resume RUN_DIR")
    if resume is not None and (recipe is not None or set_):
        raise KGCError("--resume continues a run with its saved recipe; drop the recipe and --set arguments")
    rec = load_recipe(recipe, set_) if resume is None else None
    run_train(rec, out=out, resume=resume, progress=progress, echo=_echo)


@app.command()
def evaluate(run_dir: Path = typer.Argument(..., help="a run directory"),
             split: Optional[str] = typer.Option(None, "--split",
                                                 help="link prediction: test (default) or dev; "
                                                      "C-STS: test (default), validation or train"),
             batch_size: Optional[int] = typer.Option(None, "--batch-size"),
             rerank: Optional[bool] = typer.Option(None, "--rerank/--no-rerank", help="SimKGC graph re-ranking"),
             device: str = typer.Option("auto", "--device"),
             progress: bool = typer.Option(True, "--progress/--no-progress")) -> None:
    """Evaluate a run on a split: filtered link prediction (both directions) or C-STS similarity."""
    from kgc.training.common import pick_device
    from kgc.training.run import open_run

    run = open_run(run_dir)
    split = split or "test"
    suffix = "" if split == "test" else f".{split}"
    if run.recipe.task == "csts":
        from kgc.csts.evaluate import evaluate_run as evaluate_csts, format_summary

        if split not in ("test", "validation", "train"):
            raise KGCError(f"--split {split!r}: a C-STS run has test, validation and train")
        if rerank is not None:
            raise KGCError("--rerank is link prediction's graph re-ranking; a C-STS run has none")
        ev = evaluate_csts(run, split, device=pick_device(device), batch_size=batch_size, progress=progress)
        r = ev.results
        _echo(f"{r['kgc']['dataset']} {split}: {r['rows']} rows ({r['labelled_rows']} labelled), {ev.seconds:.1f}s")
        _echo(format_summary(r))
        if not r["labelled_rows"]:
            _echo("no labels in this split (the public C-STS test set): predictions only")
        _echo(f"wrote {run.path / f'results{suffix}.json'} and {run.path / f'predictions{suffix}.tsv'}")
        return
    from kgc.linkpred.evaluate import evaluate_run, format_table

    if split not in ("test", "dev"):
        raise KGCError(f"--split {split!r}: choose test or dev")
    ev = evaluate_run(run, split, device=pick_device(device), batch_size=batch_size, rerank=rerank, progress=progress)
    _echo(f"{ev.results['kgc']['dataset']} {split}: {len(ev.ranks)} queries, filtered, realistic ranks "
          f"({ev.seconds:.1f}s)")
    _echo(format_table(ev.results))
    _echo(f"wrote {run.path / f'results{suffix}.json'} and {run.path / f'ranks{suffix}.tsv'}")


@app.command()
def similarity(run_dir: Path = typer.Argument(..., help="a C-STS run directory"),
               s1: Optional[str] = typer.Option(None, "--s1", help="first sentence"),
               s2: Optional[str] = typer.Option(None, "--s2", help="second sentence"),
               condition: Optional[str] = typer.Option(None, "--condition", help='e.g. "The colour of the car."'),
               table: Optional[Path] = typer.Option(None, "--tsv",
                                                    help="many rows: a .tsv or .csv with columns sentence1, "
                                                         "sentence2, condition (label optional)"),
               out: Optional[Path] = typer.Option(None, "--out", help="write the scored rows here (TSV)"),
               as_json: bool = typer.Option(False, "--json")) -> None:
    """Similarity of two sentences under a condition: cosine, and on the 1-5 label scale."""
    from kgc.csts.predict import read_queries, score, write_scores
    from kgc.csts.model import CSTSRun

    if table is None and None in (s1, s2, condition):
        raise KGCError("give --s1, --s2 and --condition, or --tsv FILE with columns sentence1, sentence2, condition")
    if table is not None and any(x is not None for x in (s1, s2, condition)):
        raise KGCError("give either --tsv FILE or --s1/--s2/--condition, not both")
    run = CSTSRun(run_dir)
    model, tokenizer = run.load("cpu")
    rows = read_queries(table) if table is not None else [{"sentence1": s1, "sentence2": s2, "condition": condition}]
    start = time.perf_counter()
    scored = score(model, tokenizer, rows)
    seconds = time.perf_counter() - start
    if out is not None:
        write_scores(out, scored)
        _echo(f"scored {len(scored)} rows in {seconds:.2f}s → {out}")
    elif as_json:
        _echo(json.dumps({"seconds": seconds, "rows": scored}, indent=2))
    elif table is None:
        r = scored[0]
        _echo(f"similarity {r['similarity']:.4f}   (label scale {r['predicted_label']:.2f} / 5)   "
              f"[{seconds * 1000:.0f} ms]")
    else:
        write_scores(None, scored, echo=_echo)


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
def explain(run_dir: Path = typer.Argument(..., help="a router, biencoder+router_layers or hypernet run"),
            head: Optional[str] = typer.Option(None, "--head", help="link prediction: entity id or text"),
            relation: List[str] = typer.Option([], "--relation", help="relation name or text (repeatable; "
                                                                      "default: every relation)"),
            inverse: bool = typer.Option(False, "--inverse", help="the inverse direction of the relations"),
            sentence: Optional[str] = typer.Option(None, "--sentence", help="C-STS: the sentence"),
            condition: List[str] = typer.Option([], "--condition", help="C-STS: a condition (repeatable)"),
            out: Optional[Path] = typer.Option(None, "--out", help="heatmap PNG (default RUN/explain.png)"),
            as_json: bool = typer.Option(False, "--json")) -> None:
    """What a condition selects: CSR's weight per token under each condition, or Hyper-CL's W_c spectra."""
    from kgc.explain import check_explainable, hypernet_spectra, plot, render_text, router_weights
    from kgc.training.run import open_run

    run = open_run(run_dir)
    if run.recipe.task == "linkpred":
        if sentence is not None or condition:
            raise KGCError("--sentence/--condition are for C-STS runs; for link prediction give --head and --relation")
        from kgc.encoding.backbone import load_tokenizer

        model, graph = run.load("cpu")
        tokenizer = load_tokenizer(run.backbone)
        kind = check_explainable(model.conditioner)
        rels = [graph.find_relation(r) for r in relation] if relation else list(range(graph.num_relations))
        rels = [r + graph.num_relations if inverse else r for r in rels]
        names = [graph.relation_label(r) for r in rels]
        conds = [model.bank.relation_ids[r] for r in rels]
        if kind == "router":
            if head is None:
                raise KGCError("give --head (an entity id or text): the router weighs the tokens of its text")
            h = graph.find_entity(head)
            sent, title = model.bank.entity_ids(h), f"{graph.entities[h]}, {graph.full_texts[h]}"
    else:
        if head is not None or relation or inverse:
            raise KGCError("--head/--relation/--inverse are for link-prediction runs; for C-STS give --sentence and "
                           "--condition")
        from kgc.csts.model import CSTSRun

        model, tokenizer = CSTSRun(run_dir).load("cpu")
        kind = check_explainable(model.conditioner)
        if not condition:
            raise KGCError('give at least one --condition, e.g. --condition "The colour of the car."')
        names = list(condition)
        conds = tokenizer(names, add_special_tokens=False)["input_ids"]
        if kind == "router":
            if sentence is None:
                raise KGCError("give --sentence: the router weighs its tokens")
            sent, title = tokenizer(sentence, add_special_tokens=False)["input_ids"], sentence
    cond = model.conditioner
    if kind == "router":
        ex = router_weights(cond, sent, conds, tokenizer, names)
        title = f"router weight w per token: {title[:60]}"
    else:
        ex = hypernet_spectra(cond, conds, names)
        title = f"singular values of W_c ({cond.form}, K = {cond.rank})"
    png = plot(ex, out or run.path / "explain.png", title)
    if as_json:
        _echo(json.dumps({**ex.to_json(), "png": str(png)}, indent=2))
        return
    _echo(render_text(ex))
    _echo(f"wrote {png}")


@app.command()
def compare(recipes: List[Path] = typer.Argument(..., help="recipes of one task, e.g. recipes/umls_*.yaml"),
            set_: List[str] = typer.Option([], "--set", help="the shared budget, e.g. --set train.epochs=1"),
            out: Path = typer.Option(Path("runs/compare"), "--out", help="folder for the runs and compare.md"),
            progress: bool = typer.Option(True, "--progress/--no-progress")) -> None:
    """Train + evaluate several recipes under one budget; write a markdown table (compare.md)."""
    from kgc.compare import compare as run_compare, markdown_table
    from kgc.recipe import load_recipe

    rows = run_compare(recipes, set_, out, echo=_echo, progress=progress)
    _echo(markdown_table(rows, load_recipe(recipes[0], set_).task))
    _echo(f"wrote {out / 'compare.md'}")


@bench_app.command("inference")
def bench_inference(dataset: str = typer.Option("wn18rr", "--dataset"),
                    conditioner: List[str] = typer.Option(["biencoder", "hadamard", "hypernet", "router"],
                                                          "--conditioner",
                                                          help="repeatable; options after a colon, e.g. "
                                                               "router:cross_attend=top,router_layers=2"),
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
        _echo(f"{row['conditioner']:<24} {row['queries_per_s']:>10.1f} queries/s" +
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
        _echo(f"{row['name']:<11} {row['where']:<28} {row['folder']}")


@data_app.command("fetch")
def data_fetch(name: str = typer.Argument(..., help="catalog name, e.g. wn18rr or csts"),
               dest: Optional[Path] = typer.Option(None, "--dest", help="data home (default $KGC_DATA_HOME or ./data)"),
               password: Optional[str] = typer.Option(None, "--password",
                                                      help="csts: the password its authors give on request"),
               source: Optional[str] = typer.Option(None, "--from", help="csts: a local csts.tar.enc instead of "
                                                                         "downloading it")) -> None:
    """Download a dataset from its public home (sha256 checked; csts decrypted and its columns checked)."""
    from kgc.data.catalog import fetch_dataset

    _echo(f"fetched into {fetch_dataset(name, dest, password=password, source=source)}")


@data_app.command("synth-csts")
def data_synth_csts(out: Path = typer.Argument(..., help="folder for csts_{train,validation,test}.csv"),
                    seed: int = typer.Option(0, "--seed"),
                    train_pairs: int = typer.Option(2000, "--train-pairs", min=1),
                    validation_pairs: int = typer.Option(300, "--validation-pairs", min=1),
                    test_pairs: int = typer.Option(500, "--test-pairs", min=1)) -> None:
    """Generate the synthetic conditional-similarity set in the official C-STS layout (deterministic)."""
    from kgc.csts.synth import write_synthetic

    write_synthetic(out, seed=seed, train_pairs=train_pairs, validation_pairs=validation_pairs, test_pairs=test_pairs)
    _echo(f"wrote {2 * train_pairs} + {2 * validation_pairs} + {2 * test_pairs} rows to {out}/csts_*.csv")


def main() -> None:
    """Entry point: typer handles usage errors (exit 2); bad input (KGCError) exits 2 with one message."""
    try:
        app()
    except KGCError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
