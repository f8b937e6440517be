"""``kgc index``, ``kgc predict``, ``kgc serve``: a trained run answering questions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

import kgc.api as kgc_api
from kgc.api import QueryOptions
from kgc.cli.common import ModelFlags, _echo, _quick_exit, app
from kgc.errors import KGCError


_INDEX = kgc_api.command_options("index")["params"]
INDEX_FLAGS = ModelFlags.of("params", _INDEX[0], optional=True, helps=_INDEX[1], lenient=True)  # plugins' keys too


@app.command()
@INDEX_FLAGS
def index(run_dir: Path = typer.Argument(..., help="a run directory"),
          device: str = typer.Option("auto", "--device"),
          add: Optional[Path] = typer.Option(None, "--add", help="append new entities (TSV: id<TAB>name<TAB>"
                                                                   "description) to the index, no retraining"),
          type_: Optional[str] = typer.Option(None, "--type", help="flat (exact), ivf, hnsw, ivfpq or sq (or a "
                                                                   "plugin's); default: the existing index's type, "
                                                                   "else the recipe's index.type"),
          force: bool = typer.Option(False, "--force", help="rebuild (and re-embed) even when up to date"),
          drop_added: bool = typer.Option(False, "--drop-added",
                                          help="rebuild without the entities added by --add, removing their "
                                               "list and its copies of record in RUN/added/ (nothing else does)"),
          nproc: Optional[int] = typer.Option(None, "--nproc",
                                              help="encode the entities in N shards, one process each (GPUs: one "
                                                   "each), every finished chunk kept: a killed run resumes; "
                                                   "assembled into one index. Under torchrun: its processes"),
          progress: bool = typer.Option(True, "--progress/--no-progress"),
          params: Optional[dict] = None) -> None:
    """Embed every entity once and store a FAISS index in RUN_DIR/index (entities added before are kept);
    or, with --add, embed new entities with the trained tail tower and append them.

    The index type and its parameters are those of the existing index (a first build: the recipe's `index:`
    section; --type starts again from the recipe's), overridden by the options here. An index that is already
    fresh and of that type is kept (only nprobe / ef_search / rescore are updated, no rebuild); a different type or
    build parameter rebuilds it, reusing the stored entity embeddings.

    Several processes: `kgc index RUN --nproc 4`, or across machines `torchrun --nnodes 2 --nproc-per-node 4 … -m
    kgc index RUN` (the run folder on a filesystem every node sees); run the same command again after a kill."""
    import kgc

    params = params or {}  # the index types' keys (INDEX_FLAGS), None where not given
    if add is not None and (type_ is not None or any(v is not None for v in params.values())):
        raise KGCError("--add appends to the index as it is built; change its type or parameters in a separate "
                       f"`kgc index {run_dir} --type …` first")
    if add is not None and (nproc not in (None, 1) or kgc.api.launched()):
        raise KGCError("--add embeds its new entities in one process; run it without --nproc, outside torchrun")
    if drop_added and (add is not None or force or type_ is not None or any(v is not None for v in params.values())):
        raise KGCError("--drop-added rebuilds the index as it is, without its added entities; give it alone")
    run = kgc.load(run_dir, device=device, echo=lambda m: typer.echo(m, err=True))
    if drop_added:
        meta = run.drop_added(progress=progress)
        _echo(f"{meta['note']}: the index holds the graph's {meta['entities']} entities → {run.path / 'index'}")
        return
    if add is not None:
        meta = run.add_entities(add, progress=progress)
        if meta.get("already"):
            _echo(f"{add}: its entities are in the index already, as they are (an earlier add of this file); "
                  f"nothing was changed → {run.path / 'index'}")
            return
        if meta.get("note"):
            _echo(f"note: {meta['note']}")
        _echo(f"added {meta['added_entities']['sources'][-1]['count']} entities from {add}: the index holds "
              f"{meta['entities']} ({meta['entities'] - meta['added_entities']['count']} + "
              f"{meta['added_entities']['count']} added) → {run.path / 'index'}")
        return
    done = run.index(type=type_, force=force, progress=progress, nproc=nproc, **params)
    meta = done["meta"]
    if done["action"] == "follow":  # a torchrun rank > 0: rank 0 says what was done
        return
    for shard in done.get("shards", []):
        _echo(shard["line"])
    if done["action"] == "none":
        _echo(f"{run.path / 'index'}: {done['why']}; nothing to do (--force rebuilds it)")
    elif done["action"] == "search":
        _echo(f"{run.path / 'index'}: search parameters {done['why']}, stored in meta.json (no rebuild)")
    else:
        if done.get("note"):  # the added entities restored from their copy of record, or an edited list taken
            _echo(done["note"])
        added = meta.get("added_entities", {}).get("count", 0)
        shown = ", ".join(f"{k}={v}" for k, v in meta["index"].items() if k != "type")
        _echo(f"indexed {meta['entities']} entities{f' ({added} of them added, kept)' if added else ''} "
              f"(dim {meta['dim']}) as {meta['index']['type']}{f' ({shown})' if shown else ''} in "
              f"{meta['seconds']}s, embeddings {meta['embeddings']} → {run.path / 'index'}")

def _question_option(name: str):
    """``kgc predict``'s option for a field of :class:`QueryOptions`: its default and help are the field's."""
    field = QueryOptions.model_fields[name]
    return typer.Option(field.default, "--" + name.replace("_", "-"), help=field.description)

@app.command()
def predict(run_dir: Optional[Path] = typer.Argument(None, help="a run directory (default: the newest run "
                                                                  "under ./runs); its index is built if missing"),
            head: Optional[str] = typer.Option(None, "--head", help="entity id, name or text (an added entity too), "
                                                                    "or any free text, embedded on the fly"),
            relation: Optional[str] = typer.Option(None, "--relation", help="relation name or text"),
            input_: Optional[Path] = typer.Option(None, "--input", help="a file of questions, head<TAB>relation per "
                                                                        "line (or .jsonl objects): one load, batched"),
            output: Optional[Path] = typer.Option(None, "--output", help="with --input: write the answers here "
                                                                         "(default: stdout)"),
            format_: Optional[str] = typer.Option(None, "--format", help="with --input: jsonl (one object per "
                                                                         "question; default) or tsv (a row per "
                                                                         "answer; default for a .tsv --output)"),
            batch_size: int = typer.Option(64, "--batch-size", min=1, help="with --input: questions per forward "
                                                                           "pass"),
            top_k: int = _question_option("top_k"),
            inverse: bool = _question_option("inverse"),
            filter_known: bool = _question_option("filter_known"),
            include_head: bool = _question_option("include_head"),
            free_text: bool = _question_option("free_text"),
            server: Optional[str] = typer.Option(None, "--server",
                                                 help="ask a running `kgc serve` (e.g. http://127.0.0.1:8000) "
                                                      "instead of loading the model here: ~0.3 s instead of ~5"),
            as_json: bool = typer.Option(False, "--json"),
            progress: bool = typer.Option(True, "--progress/--no-progress", help="progress bar if the index is "
                                                                                  "built first")) -> None:
    """Top-k answers to (head, relation, ?), over the run's entities and those added with `kgc index --add`."""
    import kgc

    if input_ is None and (head is None or relation is None):
        raise KGCError("give --head and --relation, or --input FILE (head<TAB>relation per line)")
    if input_ is not None and (head is not None or relation is not None):
        raise KGCError("--input answers a file of questions; drop --head/--relation (or drop --input)")
    if input_ is None and (output is not None or format_ is not None):
        raise KGCError("--output and --format go with --input")
    options = QueryOptions.of(top_k=top_k, inverse=inverse, filter_known=filter_known, include_head=include_head,
                              free_text=free_text).model_dump()  # a bad one: the message Python and the server give
    if server is not None:
        if input_ is not None or run_dir is not None:
            raise KGCError("--server asks the run that server serves: drop RUN_DIR and --input (POST a list of "
                           "queries to the server's /predict for a batch)")
        _print_answer(kgc.api.ask_server(server, "/predict", {"head": head, "relation": relation, **options}),
                      as_json)
        _quick_exit()
        return
    run = kgc.load(run_dir, echo=lambda m: typer.echo(m, err=True))
    if input_ is not None:
        done = run.predict_file(input_, output, format=format_, batch_size=batch_size, progress=progress,
                                echo=_echo, **options)
        typer.echo(f"{done['questions']} questions answered in {done['seconds']}s ({done['per_second']}/s)"
                   f"{f' → {output}' if output is not None else ''}", err=True)
        _quick_exit()
        return
    q = run.resolve(head, relation, progress=progress, **options)
    _print_answer(run.answer_records([q], run.answer_many([q]))[0], as_json)  # the fields POST /predict answers
    _quick_exit()

def _print_answer(a: dict, as_json: bool) -> None:
    """One answer as `kgc predict` prints it (``a``: :meth:`Answers.to_json`, from this process or a server)."""
    if as_json:
        _echo(json.dumps(a, indent=2))
        return
    _echo(f"({a['head_text'][:70]}, {a['relation_text']}, ?)   [{a['seconds'] * 1000:.0f} ms]")
    width = max([24] + [len(p["entity"]) for p in a["predictions"]])  # long ids (free text's neighbours): one column
    for p in a["predictions"]:
        _echo(f"{p['rank']:>4}  {p['entity']:<{width}} {p['score']:7.4f}  {p['text'][:80]}")

_SERVE = kgc_api.command_options("serve")
SERVE_FLAGS = ModelFlags.of("options", _SERVE["options"][0])
LIMIT_FLAGS = ModelFlags.of("limits", _SERVE["limits"][0])


@app.command()
@LIMIT_FLAGS
@SERVE_FLAGS
def serve(run_dir: Path = typer.Argument(..., help="a run directory (link prediction or C-STS)"),
          options: Optional[dict] = None, limits: Optional[dict] = None) -> None:
    """Serve a trained run over HTTP: POST /predict (batched), a page at /, the OpenAPI page at /docs."""
    import kgc

    raise typer.Exit(kgc.api.serve(run_dir, limits=limits, echo=_echo, **options))
