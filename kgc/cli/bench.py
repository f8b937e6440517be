"""``kgc bench inference|serve|train|loss|inputs|rules|structure``: the benchmarks of a recipe or a run
(``kgc bench index`` and ``scale``: :mod:`kgc.cli.scale`)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from kgc.cli.common import _echo, _int_list, bench_app


@bench_app.command("inference")
def bench_inference(dataset: str = typer.Option("wn18rr", "--dataset"),
                    conditioner: List[str] = typer.Option([], "--conditioner",
                                                          help="repeatable (default: every registered one); "
                                                               "options after a colon, e.g. "
                                                               "router:cross_attend=top,router_layers=2"),
                    limit: Optional[int] = typer.Option(None, "--limit", help="only the first N test triples"),
                    set_: List[str] = typer.Option([], "--set"),
                    out: Optional[Path] = typer.Option(None, "--out", help="write the figures as JSON"),
                    progress: bool = typer.Option(True, "--progress/--no-progress")) -> None:
    """Answer every test query (both directions) per conditioner, entity embeddings cached."""
    from kgc import api

    result = api.bench_inference(dataset=dataset, conditioners=conditioner or None, limit=limit, overrides=set_, echo=_echo, progress=progress)
    for row in result["rows"]:
        ratio, reference = next(((v, k.removeprefix("speedup_vs_")) for k, v in row.items()
                                 if k.startswith("speedup_vs_")), (None, ""))
        _echo(f"{row['conditioner']:<24} {row['queries_per_s']:>10.1f} queries/s" +
              (f"   {ratio:>7.1f}x {reference}" if ratio is not None else ""))
    if out:
        api.write_json(out, result)

@bench_app.command("serve")
def bench_serve(run_dir: Path = typer.Argument(..., help="a trained run (its index is built first if missing)"),
                clients: str = typer.Option("1,8,32", "--clients", help="concurrent clients, one row each"),
                seconds: float = typer.Option(20.0, "--seconds", min=0.1, help="per row"),
                max_requests: int = typer.Option(100_000, "--max-requests", min=1, help="per row, at most"),
                max_batch: Optional[int] = typer.Option(None, "--max-batch", min=1, help="the server's"),
                max_wait_ms: Optional[float] = typer.Option(None, "--max-wait-ms", min=0, help="the server's"),
                threads: Optional[int] = typer.Option(None, "--threads", min=1, help="the server's torch threads"),
                add: int = typer.Option(0, "--add", min=0, help="then one more row: the most clients while one more "
                                                                "adds this many entities (on a linked copy of RUN)"),
                out: Optional[Path] = typer.Option(None, "--out", help="write the figures as JSON")) -> None:
    """Start `kgc serve RUN` on 127.0.0.1, drive it with N concurrent clients, report answers/s and latency."""
    from kgc import api

    extra = ([f"--max-batch={max_batch}"] if max_batch else []) + \
        ([f"--max-wait-ms={max_wait_ms}"] if max_wait_ms is not None else []) + \
        ([f"--threads={threads}"] if threads else [])
    result = api.bench_serve(run_dir, clients=_int_list("--clients", clients), seconds=seconds,
                             max_requests=max_requests, server_args=extra, add=add, echo=_echo)
    _echo(f"server stopped (exit {result['server_exit']}); batches: {result['batching']}")
    if out:
        api.write_json(out, result)

@bench_app.command("train")
def bench_train(recipe: Path = typer.Argument(..., help="e.g. recipes/wn18rr_csr.yaml"),
                trainable_layers: int = typer.Option(2, "--trainable-layers"),
                steps: int = typer.Option(5, "--steps"), batch_size: int = typer.Option(32, "--batch-size"),
                set_: List[str] = typer.Option([], "--set"),
                full: bool = typer.Option(True, "--full/--no-full",
                                          help="--no-full: only the top-n row (a recipe's own pace), no speed-up"),
                out: Optional[Path] = typer.Option(None, "--out", help="write the figures as JSON")) -> None:
    """Training triples/s: full fine-tuning vs the top n layers over the layer cache."""
    from kgc import api

    result = api.bench_train(recipe, trainable_layers=trainable_layers, steps=steps, batch_size=batch_size, overrides=set_,
                             full=full, echo=_echo)
    if out:
        api.write_json(out, result)

@bench_app.command("loss")
def bench_loss(recipe: Path = typer.Argument(..., help="e.g. recipes/wn18rr_laptop.yaml"),
               steps: int = typer.Option(20, "--steps", min=1),
               batch_size: Optional[int] = typer.Option(None, "--batch-size", help="default: the recipe's"),
               set_: List[str] = typer.Option([], "--set"),
               out: Optional[Path] = typer.Option(None, "--out", help="write the figures as JSON")) -> None:
    """The objective alone: false-negative masks by binary search (training's) against torch.isin, s/step."""
    from kgc import api

    result = api.bench_loss(recipe, steps=steps, batch_size=batch_size, overrides=set_, echo=_echo)
    if out:
        api.write_json(out, result)

@bench_app.command("inputs")
def bench_inputs(recipe: Path = typer.Argument(..., help="e.g. recipes/wn18rr_biencoder.yaml"),
                 steps: int = typer.Option(10, "--steps", min=1),
                 batch_size: Optional[int] = typer.Option(None, "--batch-size", help="default: the recipe's"),
                 set_: List[str] = typer.Option([], "--set"),
                 out: Optional[Path] = typer.Option(None, "--out", help="write the figures as JSON")) -> None:
    """The host's share of a training step: a batch's inputs one entity at a time, as built before in the step, and
    prepared a step ahead; then steps with a tiny BERT, inputs in the step against prefetched."""
    from kgc import api

    result = api.bench_inputs(recipe, steps=steps, batch_size=batch_size, overrides=set_, echo=_echo)
    if out:
        api.write_json(out, result)

@bench_app.command("rules")
def bench_rules(recipe: Path = typer.Argument(..., help="e.g. recipes/umls_biencoder.yaml (its data: and structure: "
                                                        "sections, structure.model=rules)"),
                split: str = typer.Option("test", "--split", help="test, dev or train: whose queries are scored"),
                batch_size: int = typer.Option(64, "--batch-size", min=1),
                set_: List[str] = typer.Option([], "--set"),
                out: Optional[Path] = typer.Option(None, "--out", help="write the figures as JSON")) -> None:
    """Mined rules scoring a split's queries: per-relation tables (small graphs) against per-batch rows, s."""
    from kgc import api

    result = api.bench_rules(recipe, split=split, batch_size=batch_size, overrides=set_, echo=_echo)
    if out:
        api.write_json(out, result)

@bench_app.command("structure")
def bench_structure(recipe: Path = typer.Argument(..., help="a recipe with a structure: section, on a dataset PyKEEN "
                                                            "ships (umls, kinships, nations)"),
                    seeds: str = typer.Option("0", "--seeds", help="comma-separated seeds; the table shows the mean"),
                    run: Optional[Path] = typer.Option(None, "--run", help="a run of the recipe, evaluated: its text, "
                                                                           "structure and fused rows beside PyKEEN's"),
                    set_: List[str] = typer.Option([], "--set"),
                    out: Optional[Path] = typer.Option(None, "--out", help="write the figures as JSON"),
                    progress: bool = typer.Option(True, "--progress/--no-progress")) -> None:
    """PyKEEN alone on its own copy of the dataset (its pipeline, the recipe's structure: settings): test MRR and
    Hits@k beside kgc's structure-only and fused rows."""
    from kgc import api

    results = None if run is None else api.results(run)
    result = api.bench_structure(recipe, overrides=set_, seeds=_int_list("--seeds", seeds, minimum=0), progress=progress,
                       echo=_echo)
    _echo(api.table("structure", result, results))
    if out:
        api.write_json(out, result)
