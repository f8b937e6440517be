"""``kgc train``, ``kgc compare``, ``kgc tune``, ``kgc curves``: runs made from recipes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from kgc.cli.common import _echo, app
from kgc.errors import KGCError


@app.command()
def train(recipe: Optional[Path] = typer.Argument(None, help="recipe YAML (recipes/*.yaml)"),
          out: Optional[Path] = typer.Option(None, "--out", help="run directory (default runs/<recipe>-<time>)"),
          set_: List[str] = typer.Option([], "--set", help="override a recipe key, e.g. --set train.lr=3e-5"),
          resume: Optional[Path] = typer.Option(None, "--resume", help="continue this run from its last checkpoint"),
          nproc: Optional[int] = typer.Option(None, "--nproc", min=1,
                                              help="data-parallel processes (launches torchrun --nproc-per-node "
                                                   "N; train.batch_size is the global batch)"),
          progress: bool = typer.Option(True, "--progress/--no-progress"),
          memory_check: bool = typer.Option(True, "--memory-check/--no-memory-check",
                                            help="refuse a run whose estimated memory per step exceeds what the "
                                                 "machine has free (train.check_memory)")) -> None:
    """Train from a recipe (link prediction or C-STS, by its `task`), or resume an interrupted run.

    Multi-process: `kgc train RECIPE --nproc 2`, or `torchrun --nproc-per-node 2 -m kgc train RECIPE`."""
    import kgc
    from kgc import api

    if nproc is not None and nproc > 1 and not api.launched():
        argv, skip = [], False
        for arg in sys.argv[1:]:  # the same command without --nproc, under torchrun
            if skip or arg == "--nproc" or arg.startswith("--nproc="):
                skip = arg == "--nproc"
                continue
            argv.append(arg)
        raise typer.Exit(api.launch(nproc, argv))
    if resume is None and recipe is None:
        raise KGCError("give a recipe (e.g. `kgc train recipes/umls_biencoder.yaml`) or --resume RUN_DIR")
    if resume is not None and (recipe is not None or set_):
        raise KGCError("--resume continues a run with its saved recipe; drop the recipe and --set arguments")
    if resume is not None:
        kgc.resume(resume, progress=progress, echo=_echo, check_memory=memory_check)
    else:
        kgc.train(recipe, out, overrides=list(set_) + ([] if memory_check else ["train.check_memory=false"]),
                  progress=progress, echo=_echo)

@app.command()
def compare(recipes: List[Path] = typer.Argument(..., help="recipes of one task, e.g. recipes/umls_*.yaml"),
            set_: List[str] = typer.Option([], "--set", help="the shared budget, e.g. --set train.epochs=1"),
            out: Path = typer.Option(Path("runs/compare"), "--out", help="folder for the runs and compare.md"),
            progress: bool = typer.Option(True, "--progress/--no-progress")) -> None:
    """Train + evaluate several recipes under one budget; write a markdown table (compare.md)."""
    import kgc

    kgc.api.compare(recipes, set_, out, echo=_echo, progress=progress)
    _echo((out / "compare.md").read_text(encoding="utf-8").rstrip("\n"))
    _echo(f"wrote {out / 'compare.md'}")

@app.command()
def tune(recipe: Path = typer.Argument(..., help="a recipe with a tune: section (or none: its conditioner's space)"),
         trials: Optional[int] = typer.Option(None, "--trials", min=1, help="finished trials the study holds at "
                                              "the end (default tune.trials)"),
         out: Optional[Path] = typer.Option(None, "--out", help="the study folder (default runs/tune-<name>); run "
                                            "again to continue its study"),
         timeout_minutes: Optional[float] = typer.Option(None, "--timeout-minutes", help="start no trial after this"),
         jobs: int = typer.Option(1, "--jobs", min=1, help="worker processes on this machine, on one study"),
         storage: Optional[str] = typer.Option(None, "--storage", help="an Optuna storage URL (default "
                                               "sqlite:///STUDY/study.db); workers on other machines join with it"),
         set_: List[str] = typer.Option([], "--set", help="a recipe key for every trial"),
         study_name: Optional[str] = typer.Option(None, "--study-name", help="the study's name in its storage "
                                                  "(default: the recipe's name and a hash of its space, budget, "
                                                  "pruner and --set values)"),
         metric: Optional[str] = typer.Option(None, "--metric", help="the dev figure to optimise, in its "
                                              "direction (default tune.metric, else dev MRR / dev Spearman): "
                                              "dev_hits_at_10, hits@1, dev_head_above_gold, dev_pearson, …"),
         sampler: Optional[str] = typer.Option(None, "--sampler", help="tpe, random, grid (choices and stepped "
                                               "ranges) or cmaes (two or more ranges); default tune.sampler (tpe)"),
         worker: bool = typer.Option(False, "--worker", hidden=True)) -> None:
    """Search a recipe's hyperparameters with Optuna (TPE by default, pruning on the dev curve); write best.yaml,
    the trials table and plots."""
    import kgc

    kgc.api.tune(recipe, out=out, trials=trials, timeout_minutes=timeout_minutes, jobs=jobs, storage=storage,
                 overrides=set_, echo=_echo, worker=worker, study_name=study_name, metric=metric, sampler=sampler)

@app.command()
def curves(runs: List[Path] = typer.Argument(..., help="run directories of one task (finished or still training)"),
           out: Path = typer.Option(Path("curves.png"), "--out", help="the PNG to write")) -> None:
    """Validation curves of several runs in one figure: by examples seen and by minutes of training, each run's
    best validation starred; prints each run's best (and its last, when later)."""
    import kgc

    result = kgc.api.curves(runs, out, echo=_echo)
    metric = result["metric"]
    for name, rec in result["best"].items():
        if rec is not None:
            minutes = f", {rec['train_seconds'] / 60:.1f} min" if "train_seconds" in rec else ""
            seen = f", {rec['seen']:,} seen" if "seen" in rec else ""
            last = result["last"][name]
            then = "" if last is rec else f"   (last: {last[metric]:.4f} at step {last['step']})"
            _echo(f"{name}: best {metric} {rec[metric]:.4f} at step {rec['step']}{seen}{minutes}{then}")
    _echo(f"wrote {out}")
