"""``kgc evaluate``, ``kgc similarity``, ``kgc structure``, ``kgc export``, ``kgc explain``: what a trained run
measures, adds beside itself, exports and shows."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import List, Optional

import typer

import kgc.api as kgc_api
from kgc.cli.common import ModelFlags, _echo, app
from kgc.errors import KGCError, ResultsNotSaved


EVAL_FLAGS = ModelFlags.of("options", kgc_api.command_options("evaluate")["options"][0], lenient=True)  # a task plugin's too


@app.command()
@EVAL_FLAGS
def evaluate(run_dir: Path = typer.Argument(..., help="a run directory"),
             split: Optional[str] = typer.Option(None, "--split",
                                                 help="link prediction: test (default) or dev; "
                                                      "C-STS: test (default), validation or train"),
             batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1),
             device: str = typer.Option("auto", "--device"),
             progress: bool = typer.Option(True, "--progress/--no-progress"),
             options: Optional[dict] = None) -> None:
    """Evaluate a run on a split: filtered link prediction (both directions) or C-STS similarity."""
    import kgc

    run = kgc.load(run_dir, device=device, echo=lambda m: typer.echo(m, err=True))
    split = split or "test"
    try:
        ev, unsaved = run.evaluation(split, batch_size=batch_size, progress=progress,
                                     **EVAL_FLAGS.given(options or {})), None
    except ResultsNotSaved as exc:  # the run folder refused the files: the figures are printed all the same
        ev, unsaved = exc.evaluation, exc
    for line in kgc.api.report(run, ev, split):
        if unsaved is None or not line.startswith("wrote "):
            _echo(line)
    if unsaved is not None:
        raise unsaved

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
    import kgc

    if table is None and None in (s1, s2, condition):
        raise KGCError("give --s1, --s2 and --condition, or --tsv FILE with columns sentence1, sentence2, condition")
    if table is not None and any(x is not None for x in (s1, s2, condition)):
        raise KGCError("give either --tsv FILE or --s1/--s2/--condition, not both")
    run = kgc.load(run_dir)
    rows = kgc.api.read_pairs(table) if table is not None else [{"sentence1": s1, "sentence2": s2, "condition": condition}]
    run.score(rows[:1])  # loads the model, before the clock starts
    start = time.perf_counter()
    scored = run.score(rows)
    seconds = time.perf_counter() - start
    if out is not None:
        kgc.api.write_pairs(out, scored)
        _echo(f"scored {len(scored)} rows in {seconds:.2f}s → {out}")
    elif as_json:
        _echo(json.dumps({"seconds": seconds, "rows": scored}, indent=2))
    elif table is None:
        r = scored[0]
        _echo(f"similarity {r['similarity']:.4f}   (label scale {r['predicted_label']:.2f} / 5)   "
              f"[{seconds * 1000:.0f} ms]")
    else:
        kgc.api.write_pairs(None, scored, echo=_echo)

@app.command()
def structure(run_dir: Path = typer.Argument(..., help="a link-prediction run directory"),
              set_: List[str] = typer.Option([], "--set", help="override a structure key, e.g. "
                                                               "--set structure.epochs=200"),
              progress: bool = typer.Option(True, "--progress/--no-progress")) -> None:
    """(Re)train only the structural model of a run (RUN/structure/: a PyKEEN model, or rules mined from the train
    graph with --set structure.model=rules); the text model is untouched.
    Settings: the run's `structure:` section, then --set structure.KEY=VALUE (a run without one gets defaults)."""
    import kgc

    meta = kgc.load(run_dir, echo=_echo).train_structure(set_, progress=progress)
    _echo(f"{meta['model']}: {meta['train_seconds']}s of training; `kgc evaluate {run_dir}` fuses it with the text")

@app.command()
def export(run_dir: Path = typer.Argument(..., help="a link-prediction run directory"),
           out: Path = typer.Argument(..., help="folder to write (new or empty; --force replaces an earlier export)"),
           format: str = typer.Option("sentence-transformers", "--format",
                                      help="sentence-transformers (SentenceTransformer(OUT) embeds entities) or hf "
                                           "(save_pretrained folders)"),
           force: bool = typer.Option(False, "--force", help="replace an earlier export in OUT")) -> None:
    """Write the towers as sentence-transformers / Hugging Face folders; kgc.json says how to compose them."""
    import kgc

    meta = kgc.api.export(run_dir, out, format=format, force=force)
    towers, cond, texts = meta["towers"], meta["conditioner"], meta["texts"]["entities"]
    _echo(f"exported {run_dir} ({meta['format']}) → {out}")
    _echo(f"  tail tower (entities): {out / towers['tail']}   query tower: {out / towers['query']}")
    _echo(f"  conditioner {cond['name']}: query reproducible outside kgc: {cond['reproducible_outside_kgc']}")
    _echo(f"  entities.tsv: {texts['exact']} of {texts['rows']} texts tokenise exactly as kgc's token ids")

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
    import kgc

    ex, png = kgc.api.explain(run_dir, head=head, relations=relation, inverse=inverse, sentence=sentence,
                              conditions=condition, out=out)
    if as_json:
        _echo(json.dumps({**ex.to_json(), "png": str(png)}, indent=2))
        return
    _echo(kgc.api.render(ex))
    _echo(f"wrote {png}")
