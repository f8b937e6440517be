"""The ``kgc`` command line: parse, call the library, print. Bad input exits 2 with one clear message."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from kgc.api import QueryOptions
from kgc.errors import KGCError, ResultsNotSaved

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Knowledge-graph completion with text encoders (SimKGC pipeline), "
                       "and conditional sentence similarity (C-STS) on the same conditioning core.")
data_app = typer.Typer(no_args_is_help=True, help="Find and fetch datasets.")
app.add_typer(data_app, name="data")
recipe_app = typer.Typer(no_args_is_help=True, help="What a recipe may say.")
app.add_typer(recipe_app, name="recipe")
recipes_app = typer.Typer(no_args_is_help=True, help="The shipped recipes: families (a root and the recipes that "
                                                     "extend it), and whole copies to edit.")
app.add_typer(recipes_app, name="recipes")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks behind the performance claims (ratios in one process).")
app.add_typer(bench_app, name="bench")


def _echo(msg: str) -> None:
    """A line on stdout; "warning: …" lines in yellow, "error: …" in red (where the terminal shows colour)."""
    colour = {"warning:": typer.colors.YELLOW, "error:": typer.colors.RED}.get(msg.split(" ", 1)[0])
    typer.secho(msg, fg=colour, err=False)


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
def evaluate(run_dir: Path = typer.Argument(..., help="a run directory"),
             split: Optional[str] = typer.Option(None, "--split",
                                                 help="link prediction: test (default) or dev; "
                                                      "C-STS: test (default), validation or train"),
             batch_size: Optional[int] = typer.Option(None, "--batch-size"),
             rerank: Optional[bool] = typer.Option(None, "--rerank/--no-rerank", help="SimKGC graph re-ranking"),
             device: str = typer.Option("auto", "--device"),
             entities_from: Optional[Path] = typer.Option(
                 None, "--entities-from", help="inductive: rank the test triples of this KG-BERT folder over its "
                                               "entities, unseen in training (kgc data inductive-split makes one)"),
             candidates: Optional[str] = typer.Option(None, "--candidates",
                                            help="with --entities-from: split (the entities of the evaluated "
                                                 "split's triples, SimKGC's protocol) or all (every entity of "
                                                 "the folder)"),
             use_index: bool = typer.Option(False, "--use-index",
                                            help="rank within the top --top-k of the run's FAISS index (its type, "
                                                 "e.g. hnsw), re-scored exactly: what a deployed search returns"),
             top_k: Optional[int] = typer.Option(None, "--top-k", help="with --use-index: candidates retrieved per "
                                                                      "query (default 100)"),
             text_only: bool = typer.Option(False, "--text-only",
                                            help="a run with a structural model: rank by its text model alone (its "
                                                 "re-ranking applies), into results.text.json"),
             progress: bool = typer.Option(True, "--progress/--no-progress")) -> None:
    """Evaluate a run on a split: filtered link prediction (both directions) or C-STS similarity."""
    import kgc

    run = kgc.load(run_dir, device=device, echo=lambda m: typer.echo(m, err=True))
    options = {"rerank": rerank, "entities_from": entities_from, "candidates": candidates,
               "use_index": use_index or None, "top_k": top_k, "text_only": text_only or None}
    split = split or "test"
    try:
        ev, unsaved = run.evaluation(split, batch_size=batch_size, progress=progress,
                                     **{k: v for k, v in options.items() if v is not None}), None
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
def index(run_dir: Path = typer.Argument(..., help="a run directory"),
          device: str = typer.Option("auto", "--device"),
          add: Optional[Path] = typer.Option(None, "--add", help="append new entities (TSV: id<TAB>name<TAB>"
                                                                   "description) to the index, no retraining"),
          type_: Optional[str] = typer.Option(None, "--type", help="flat (exact), ivf, hnsw or ivfpq; default: "
                                                                   "the existing index's type, else the recipe's "
                                                                   "index.type"),
          nlist: Optional[int] = typer.Option(None, "--nlist", help="ivf, ivfpq: cells (default 4·√entities)"),
          nprobe: Optional[int] = typer.Option(None, "--nprobe", help="ivf, ivfpq: cells visited per query"),
          hnsw_m: Optional[int] = typer.Option(None, "--hnsw-m", help="hnsw: links per node"),
          ef_search: Optional[int] = typer.Option(None, "--ef-search", help="hnsw: search beam width"),
          ef_construction: Optional[int] = typer.Option(None, "--ef-construction", help="hnsw: build beam width"),
          pq_bytes: Optional[int] = typer.Option(None, "--pq-bytes", help="ivfpq: bytes per vector (divides dim)"),
          rescore: Optional[int] = typer.Option(None, "--rescore", help="ivfpq: re-score the top k × rescore "
                                                                        "exactly (1: off; no rebuild)"),
          train_size: Optional[int] = typer.Option(None, "--train-size", help="ivf, ivfpq: k-means sample"),
          force: bool = typer.Option(False, "--force", help="rebuild (and re-embed) even when up to date"),
          nproc: Optional[int] = typer.Option(None, "--nproc",
                                              help="encode the entities in N shards, one process each (GPUs: one "
                                                   "each), every finished chunk kept: a killed run resumes; "
                                                   "assembled into one index. Under torchrun: its processes"),
          progress: bool = typer.Option(True, "--progress/--no-progress")) -> None:
    """Embed every entity once and store a FAISS index in RUN_DIR/index (entities added before are kept);
    or, with --add, embed new entities with the trained tail tower and append them.

    The index type and its parameters are those of the existing index (a first build: the recipe's `index:`
    section; --type starts again from the recipe's), overridden by the options here. An index that is already
    fresh and of that type is kept (only nprobe / ef_search / rescore are updated, no rebuild); a different type or
    build parameter rebuilds it, reusing the stored entity embeddings.

    Several processes: `kgc index RUN --nproc 4`, or across machines `torchrun --nnodes 2 --nproc-per-node 4 … -m
    kgc index RUN` (the run folder on a filesystem every node sees); run the same command again after a kill."""
    import kgc

    params = {"nlist": nlist, "nprobe": nprobe, "hnsw_m": hnsw_m, "ef_search": ef_search,
              "ef_construction": ef_construction, "pq_bytes": pq_bytes, "train_size": train_size, "rescore": rescore}
    if add is not None and (type_ is not None or any(v is not None for v in params.values())):
        raise KGCError("--add appends to the index as it is built; change its type or parameters in a separate "
                       f"`kgc index {run_dir} --type …` first")
    if add is not None and (nproc not in (None, 1) or kgc.api.launched()):
        raise KGCError("--add embeds its new entities in one process; run it without --nproc, outside torchrun")
    run = kgc.load(run_dir, device=device, echo=lambda m: typer.echo(m, err=True))
    if add is not None:
        meta = run.add_entities(add, progress=progress)
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
    for p in a["predictions"]:
        _echo(f"{p['rank']:>4}  {p['entity']:<24} {p['score']:7.4f}  {p['text'][:80]}")


@app.command()
def serve(run_dir: Path = typer.Argument(..., help="a run directory (link prediction or C-STS)"),
          host: str = typer.Option("127.0.0.1", "--host", help="interface to listen on (127.0.0.1: this machine "
                                                                "only)"),
          port: int = typer.Option(8000, "--port", min=0, max=65535),
          device: str = typer.Option("auto", "--device"),
          max_batch: int = typer.Option(64, "--max-batch", min=1, help="queries answered in one forward pass"),
          max_wait_ms: float = typer.Option(5.0, "--max-wait-ms", min=0,
                                            help="how long a query waits for others to share its batch"),
          threads: Optional[int] = typer.Option(None, "--threads", min=1,
                                                help="torch threads for the model (default: torch's, every core)"),
          max_body_mb: float = typer.Option(8.0, "--max-body-mb", min=0.001,
                                            help="largest request body taken (MiB; larger: 413)"),
          body_timeout: float = typer.Option(30.0, "--body-timeout", min=0.1,
                                             help="seconds a whole request body may take to arrive (then 408)"),
          head_timeout: float = typer.Option(10.0, "--head-timeout", min=0.1,
                                             help="seconds for a request's line and headers, from the connection "
                                                  "or the previous reply (then 408, closed)"),
          max_connections: int = typer.Option(1024, "--max-connections", min=1,
                                              help="connections open at once (more: 503, closed)"),
          per_client: int = typer.Option(64, "--per-client", min=1,
                                         help="connections open at once from one address (more: 503, closed)"),
          max_requests: int = typer.Option(256, "--max-requests", min=1,
                                           help="requests answered at once (more: 503)"),
          keep_alive: float = typer.Option(5.0, "--keep-alive", min=0.1,
                                           help="seconds a connection that sends nothing is kept open"),
          send_timeout: float = typer.Option(30.0, "--send-timeout", min=0.1,
                                             help="seconds a client may take nothing of its reply (then dropped)"),
          log_level: str = typer.Option("info", "--log-level")) -> None:
    """Serve a trained run over HTTP: POST /predict (batched), a page at /, the OpenAPI page at /docs."""
    import kgc

    limits = dict(max_body=int(max_body_mb * (1 << 20)), body_timeout=body_timeout, head_timeout=head_timeout,
                  max_connections=max_connections, per_client=per_client, max_requests=max_requests,
                  keep_alive=keep_alive, send_timeout=send_timeout)
    raise typer.Exit(kgc.api.serve(run_dir, host=host, port=port, device=device, max_batch=max_batch,
                                   max_wait_ms=max_wait_ms, log_level=log_level, threads=threads, limits=limits,
                                   echo=_echo))


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


@app.command()
def compare(recipes: List[Path] = typer.Argument(..., help="recipes of one task, e.g. recipes/umls_*.yaml"),
            set_: List[str] = typer.Option([], "--set", help="the shared budget, e.g. --set train.epochs=1"),
            out: Path = typer.Option(Path("runs/compare"), "--out", help="folder for the runs and compare.md"),
            progress: bool = typer.Option(True, "--progress/--no-progress")) -> None:
    """Train + evaluate several recipes under one budget; write a markdown table (compare.md)."""
    import kgc

    rows = kgc.api.compare(recipes, set_, out, echo=_echo, progress=progress)
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


def _int_list(option: str, text: str, *, minimum: int = 1) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < minimum:
        kind, example = ("positive integers", "8,16,32") if minimum == 1 else (f"integers >= {minimum}", "0,1,2")
        raise KGCError(f"{option} {text!r}: expected {kind} separated by commas, e.g. {option} {example}")
    return values


@bench_app.command("index")
def bench_index(entities: int = typer.Option(1_000_000, "--entities", min=1),
                dim: int = typer.Option(384, "--dim", min=1),
                queries: int = typer.Option(1000, "--queries", min=1),
                types: str = typer.Option("flat,ivf,hnsw,ivfpq", "--types", help="comma-separated index types"),
                nprobe: str = typer.Option("8,16,32,64,128", "--nprobe", help="ivf, ivfpq: the values to sweep"),
                ef_search: str = typer.Option("16,32,64,128", "--ef-search", help="hnsw: the values to sweep"),
                rescore: str = typer.Option("1,10", "--rescore", help="ivfpq: the exact re-scoring factors to sweep "
                                                                      "(1: plain PQ scores)"),
                nlist: Optional[int] = typer.Option(None, "--nlist", help="ivf, ivfpq (default 4·√entities)"),
                hnsw_m: Optional[int] = typer.Option(None, "--hnsw-m"),
                ef_construction: Optional[int] = typer.Option(None, "--ef-construction"),
                pq_bytes: Optional[int] = typer.Option(None, "--pq-bytes"),
                train_size: Optional[int] = typer.Option(None, "--train-size"),
                clusters: int = typer.Option(2000, "--clusters", min=1, help="Gaussian clusters in the synthetic set"),
                seed: int = typer.Option(0, "--seed"),
                threads: Optional[int] = typer.Option(None, "--threads", min=1, help="FAISS threads (default: "
                                                                                       "every core)"),
                repeats: int = typer.Option(3, "--repeats", min=1, help="searches per setting; the fastest counts"),
                out: Optional[Path] = typer.Option(None, "--out", help="write the figures as JSON")) -> None:
    """Index types on synthetic clustered unit vectors: build time, size, queries/s, recall@10 vs exact."""
    from kgc import api

    result = api.bench_index(entities=entities, dim=dim, queries=queries, types=[t.strip() for t in types.split(",") if t.strip()],
                 nprobe=_int_list("--nprobe", nprobe), ef_search=_int_list("--ef-search", ef_search),
                 rescore=_int_list("--rescore", rescore),
                 build={"nlist": nlist, "hnsw_m": hnsw_m, "ef_construction": ef_construction, "pq_bytes": pq_bytes,
                        "train_size": train_size},
                 clusters=clusters, seed=seed, threads=threads, repeats=repeats, echo=_echo)
    _echo(api.table("index", result))
    best = result["fastest_at_recall_0.95"]
    if best is not None:
        params = ", ".join(f"{k}={v}" for k, v in best["params"].items() if k != "type")
        _echo(f"fastest at recall@{result['k']} >= 0.95: {best['type']} ({params}), {best['speedup_vs_flat']}× flat")
    small = result["smallest_at_recall_0.95"]
    if small is not None:
        params = ", ".join(f"{k}={v}" for k, v in small["params"].items() if k != "type")
        k = result["k"]
        _echo(f"least RAM at recall@{k} >= 0.95: {small['type']} ({params}), {small['bytes_per_entity']:,.0f} bytes "
              f"per entity, recall {small[f'recall_at_{k}']}, {small['speedup_vs_flat']}× flat")
    if out:
        api.write_json(out, result)


@bench_app.command("scale")
def bench_scale(recipe_file: Optional[Path] = typer.Argument(None, help="the same as --recipe (e.g. "
                                                                        "recipes/wikidata5m_biencoder.yaml)"),
                entities: str = typer.Option("50000,500000", "--entities",
                                             help="comma-separated sizes, e.g. 50000,500000,5000000"),
                work: Optional[Path] = typer.Option(None, "--work", help="folder for the graphs, runs and logs "
                                                                         "(default: a temporary one)"),
                keep: bool = typer.Option(False, "--keep", help="keep each size's graph, run and logs (a later bench "
                                                                "in the same --work reuses the graphs)"),
                queries: int = typer.Option(1000, "--queries", min=1, help="test (and dev) triples of the generated "
                                                                           "graphs: evaluated in both directions"),
                requests: int = typer.Option(200, "--requests", min=1, help="head-by-name requests to the server, "
                                                                            "every fourth misspelt (did you mean)"),
                add: int = typer.Option(10_000, "--add", min=1, help="entities added at the end (kgc index --add)"),
                model: str = typer.Option("tiny", "--model", help="tiny: a random 2-layer, 32-wide BERT made in the "
                                                                  "work folder; else a model name or folder"),
                steps: int = typer.Option(2, "--steps", min=1, help="training steps (the run folder's cost)"),
                stages: Optional[str] = typer.Option(None, "--stages", help="only these stages, comma-separated "
                                                                            "(default: all)"),
                set_: List[str] = typer.Option([], "--set", help="a key of the measured run's recipe, e.g. --set "
                                                                 "data.neighbor_text=true"),
                recipe: Optional[Path] = typer.Option(None, "--recipe", help="also say what each stage of this "
                                                                             "recipe would need at each size, here "
                                                                             "and on a GPU"),
                recipe_set: List[str] = typer.Option([], "--recipe-set", help="a key of --recipe, e.g. "
                                                                              "--recipe-set train.batch_size=256"),
                stage_timeout: Optional[float] = typer.Option(None, "--stage-timeout", min=1,
                                                              help="seconds a stage may take before it is killed"),
                index_type: Optional[str] = typer.Option(None, "--index-type", help="kgc index --type: flat "
                                                                                   "(default), ivf, hnsw or ivfpq"),
                max_memory: Optional[float] = typer.Option(None, "--max-memory", min=0.1,
                                                           help="GB of resident memory past which a stage is "
                                                                "killed (and reported), before the OOM killer acts"),
                seed: int = typer.Option(0, "--seed"),
                plot: Optional[Path] = typer.Option(None, "--plot", help="a PNG of time and memory per stage"),
                out: Optional[Path] = typer.Option(None, "--json", "--out", help="write the figures as JSON")) -> None:
    """The whole path at each size: generate a graph, then check, tokenise, train a few steps, index, evaluate,
    serve (head by name) and add entities, each stage its own process: wall time, peak RSS, bytes per entity, growth."""
    from kgc import api

    if recipe_file is not None and recipe is not None and recipe_file != recipe:
        raise KGCError(f"two recipes: {recipe_file} and --recipe {recipe}; give one")
    recipe = recipe or recipe_file
    result = api.bench_scale(entities=_int_list("--entities", entities), work=work, keep=keep, queries=queries,
                             requests=requests, add=add, model=model, steps=steps,
                             stages=[s.strip() for s in stages.split(",") if s.strip()] if stages else None,
                             overrides=set_, recipe=recipe, recipe_overrides=recipe_set, stage_timeout=stage_timeout,
                             max_memory_gb=max_memory, index_type=index_type, seed=seed, plot=plot, echo=_echo)
    if any(r["status"] != "skipped" for s in result["sizes"] for r in s["stages"]):
        _echo(api.table("scale", result))
    failed = {s["entities"]: s["failed"] for s in result["sizes"] if s["failed"]}
    for n, names in failed.items():
        _echo(f"warning: at {n:,} entities {', '.join(names)} did not complete (see the notes)")
    if out:
        api.write_json(out, result)


@data_app.command("list")
def data_list() -> None:
    """Show which catalog datasets are found, and where."""
    from kgc import api

    rows = api.datasets()
    width = max(len(row["name"]) for row in rows)
    for row in rows:
        _echo(f"{row['name']:<{width}} {row['where']:<28} {row['folder']}")


@data_app.command("check")
def data_check(path: Optional[str] = typer.Argument(None, help="a dataset folder or catalog name (default: the "
                                                                "recipe's data)"),
               recipe: Optional[Path] = typer.Option(None, "--recipe", help="read the data with this recipe's "
                                                                            "settings (data.*, the backbone's tokenizer)"),
               set_: List[str] = typer.Option([], "--set",
                                              help="override a recipe key, e.g. --set data.long_text=true"),
               strict: bool = typer.Option(False, "--strict", help="leakage is an error: dev/test triples in train "
                                                                   "(exactly or reversed under an inverse relation), "
                                                                   "duplicates, self-loops")
               ) -> None:
    """Check a dataset as `kgc train` reads it, for its task (the recipe's; else the folder's: csts_train.csv is
    C-STS). Link prediction: counts, unseen entities and relations, empty or shared texts, texts cut at
    data.max_tokens, leakage (dev/test triples in train exactly or reversed under an inverse relation, duplicates,
    self-loops), the files found and the fallbacks taken; C-STS: rows, labels and sentence pairs per split, pairs
    not asked under two conditions, texts cut. Exit 2 on an error (--strict: on leakage too)."""
    from kgc import api

    if path is None and recipe is None:
        raise KGCError("give a dataset folder or name (`kgc data check data/examples/capitals`), or --recipe RECIPE")
    report = api.check_data(path, str(recipe) if recipe is not None else None, set_)
    if strict and hasattr(report, "strict"):  # link prediction's report; C-STS has no leakage findings
        report = report.strict()
    for _level, line in report.lines():
        _echo(line)
    if report.errors:
        raise KGCError(f"{report.folder}: {len(report.errors)} error(s) above; " + (
            "--strict counts leakage as an error (`kgc train` warns of leakage and stops on the others)" if strict
            else "`kgc train` stops on them too"))


@recipe_app.command("keys")
def recipe_keys(task: Optional[str] = typer.Option(None, "--task", help="only the keys this task reads "
                                                                         "(linkpred, csts)"),
                grep: Optional[str] = typer.Argument(None, help="only keys containing this text, e.g. train.")) -> None:
    """Every recipe key with its type, default and what it does (from the recipe schema)."""
    from kgc import api

    rows = [r for r in api.recipe_keys(task) if grep is None or grep in r["key"]]
    if not rows:
        raise KGCError(f"no recipe key contains {grep!r}; `kgc recipe keys` lists them all")
    width = max(len(r["key"]) for r in rows)
    for r in rows:
        whose = f"[{r['for']}] " if r.get("for") else ""
        _echo(f"{r['key']:<{width}}  {r['type']:<18} default {r['default']:<10}  {whose}{r['description']}".rstrip())


recipes_app.command("keys")(recipe_keys)  # `kgc recipes keys` is `kgc recipe keys`


@recipes_app.command("list")
def recipes_list(as_json: bool = typer.Option(False, "--json", help="print one JSON list: each family's root with "
                                                                    "its variants")) -> None:
    """Every shipped recipe by family: a root (every setting written out) with its about line, then the recipes
    that extend it, indented under the one they start from (each writes only the keys it changes). The folder is
    the recipes/ beside kgc, or $KGC_RECIPES."""
    from kgc import api

    families = api.recipe_families()
    if as_json:
        typer.echo(json.dumps(families, indent=2, ensure_ascii=False))
        return
    rows = [(f["name"], f["about"]) for f in families]
    rows += [("  " * v["depth"] + v["name"], v["about"]) for f in families for v in f["variants"]]
    width = max(len(name) for name, _ in rows) if rows else 0
    for i, family in enumerate(families):
        if i:
            _echo("")
        _echo(f"{family['name']:<{width}}  {family['about']}".rstrip())
        for v in family["variants"]:
            _echo(f"{'  ' * v['depth'] + v['name']:<{width}}  {v['about']}".rstrip())


@recipes_app.command("copy")
def recipes_copy(name: str = typer.Argument(..., help="a recipe: its name (wn18rr_csr), file name or path"),
                 dest: Path = typer.Argument(..., help="the file to write, or a folder (DEST/NAME.yaml)"),
                 force: bool = typer.Option(False, "--force", help="replace DEST when it exists"),
                 full: bool = typer.Option(False, "--full", help="every key the recipe reads, defaults included "
                                                                "(as kgc train resolves it)")) -> None:
    """Write a recipe whole, its `extends` chain merged in, to DEST: a file to edit and `kgc train DEST`."""
    from kgc import api

    written = api.copy_recipe(name, dest, force=force, full=full)
    what = ("every key it reads, defaults included" if full else
            "the keys that family sets, the others at their defaults (--full writes every key)")
    _echo(f"wrote {written} (recipe {name} with its `extends` chain merged in: {what}; a relative data.path made "
          f"absolute); train it: kgc train {written}")


@data_app.command("fetch")
def data_fetch(name: str = typer.Argument(..., help="catalog name, e.g. wn18rr or csts"),
               dest: Optional[Path] = typer.Option(None, "--dest", help="data home (default $KGC_DATA_HOME or ./data)"),
               password: Optional[str] = typer.Option(None, "--password",
                                                      help="csts: the password its authors give on request"),
               source: Optional[str] = typer.Option(None, "--from", help="csts: a local csts.tar.enc; wikidata5m: "
                                                                         "a folder of its archives (no download)"),
               yes: bool = typer.Option(False, "--yes", "-y", help="agree to a large download (wikidata5m, "
                                                                  "~1.3 GB) without being asked")) -> None:
    """Download a dataset from its public home (sha256 checked; csts decrypted and its columns checked;
    wikidata5m converted to the KG-BERT layout)."""
    from kgc import api

    ask = (lambda question: typer.confirm(question, default=False)) if sys.stdin.isatty() else None
    _echo(f"fetched into {api.fetch_dataset(name, dest, password=password, source=source, yes=yes, ask=ask, echo=_echo)}")


@data_app.command("inductive-split")
def data_inductive_split(source: str = typer.Argument(..., help="catalog name or KG-BERT folder, e.g. wn18rr"),
                         out: Path = typer.Argument(..., help="new folder for the split"),
                         held_out: int = typer.Option(..., "--held-out", min=2, help="entities kept out of train"),
                         seed: int = typer.Option(0, "--seed")) -> None:
    """Hold entities out of training: test = triples among them (both ends unseen), train/dev = the rest."""
    from kgc import api

    summary = api.inductive_split(source, out, held_out=held_out, seed=seed)
    t = summary["triples"]
    _echo(f"held out {summary['held_out_entities']} entities: train {t['train']}, dev {t['dev']}, test {t['test']} "
          f"triples ({summary['dropped_triples']} dropped: one end held out, or a test triple of seen "
          f"entities) → {out}")
    from kgc.data.catalog import data_homes

    named = any(Path(out).resolve().parent == home.resolve() for _, home in data_homes())
    _echo(f"train on it ({f'data.dataset: {Path(out).name}' if named else f'data.path: {out}'}), then "
          f"`kgc evaluate RUN --entities-from {out}`")


@data_app.command("synth-csts")
def data_synth_csts(out: Path = typer.Argument(..., help="folder for csts_{train,validation,test}.csv"),
                    seed: int = typer.Option(0, "--seed"),
                    train_pairs: int = typer.Option(2000, "--train-pairs", min=1),
                    validation_pairs: int = typer.Option(300, "--validation-pairs", min=1),
                    test_pairs: int = typer.Option(500, "--test-pairs", min=1)) -> None:
    """Generate the synthetic conditional-similarity set in the official C-STS layout (deterministic)."""
    from kgc import api

    api.synth_csts(out, seed=seed, train_pairs=train_pairs, validation_pairs=validation_pairs, test_pairs=test_pairs)
    _echo(f"wrote {2 * train_pairs} + {2 * validation_pairs} + {2 * test_pairs} rows to {out}/csts_*.csv")


@data_app.command("synth-routing")
def data_synth_routing(out: Path = typer.Argument(..., help="folder for the KG-BERT layout (data.path)"),
                       slots: int = typer.Option(3, "--slots", help="words per head = relations (2 to 4)"),
                       heads: int = typer.Option(96, "--heads", min=1),
                       seed: int = typer.Option(0, "--seed")) -> None:
    """Generate a graph where the relation decides which word of the head answers it (a router must route)."""
    from kgc import api

    counts = api.synth_routing(out, slots=slots, heads=heads, seed=seed)
    _echo(f"wrote {heads} heads × {slots} relations: train {counts['train']}, dev {counts['dev']}, test "
          f"{counts['test']} triples → {out}")
    _echo(f"train on it with data.path: {out} and data.neighbor_text: false (neighbours would name the answers)")


@data_app.command("synth-graph")
def data_synth_graph(out: Path = typer.Argument(..., help="new folder for the KG-BERT layout (data.path)"),
                     entities: int = typer.Option(..., "--entities", min=10, help="entities (unique names)"),
                     relations: Optional[int] = typer.Option(None, "--relations", min=1,
                                                             help="relations (default: entities / 100, at least 10, "
                                                                  "at most Wikidata5M's 822)"),
                     triples: Optional[int] = typer.Option(None, "--triples", min=1,
                                                           help="distinct triples, all splits (default: 4.49 × "
                                                                "entities, Wikidata5M's ratio)"),
                     dev_triples: int = typer.Option(5000, "--dev-triples", min=0, help="dev triples, at most"),
                     test_triples: int = typer.Option(5000, "--test-triples", min=0, help="test triples, at most"),
                     dev_fraction: float = typer.Option(0.1, "--dev-fraction", min=0.0, max=0.5,
                                                        help="dev holds at most this share of the triples"),
                     test_fraction: float = typer.Option(0.1, "--test-fraction", min=0.0, max=0.5,
                                                         help="test holds at most this share of the triples"),
                     seed: int = typer.Option(0, "--seed"),
                     force: bool = typer.Option(False, "--force", help="replace OUT when it is not empty")) -> None:
    """Generate a graph of any size: power-law degrees, names and descriptions from word lists, dev and test
    entities all seen in train (deterministic in the seed; written whole or not at all)."""
    from kgc import api
    from kgc.fileio import human_bytes

    s = api.synth_graph(out, entities=entities, relations=relations, triples=triples, dev_triples=dev_triples,
                        test_triples=test_triples, dev_fraction=dev_fraction, test_fraction=test_fraction, seed=seed,
                        force=force)
    t = s["triples"]
    _echo(f"wrote {s['entities']:,} entities, {s['relations']:,} relations, triples train {t['train']:,} / dev "
          f"{t['dev']:,} / test {t['test']:,} in {s['seconds']:.2f} s ({human_bytes(s['bytes'])}) → {out}")


_ENTRY = False  # set by main(): the process is the `kgc` command itself (not a test calling `app`)


def _quick_exit() -> None:
    """End a finished read-only command now: flush, then leave without the interpreter's teardown of torch and
    transformers (~0.7 s of a `kgc predict` on 2 cores). Nothing is pending: every file kgc writes was written
    atomically and closed, and the run's lock released, before this is called. Only from the real entry point."""
    if _ENTRY:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def main() -> None:
    """Entry point: typer handles usage errors (exit 2); bad input (KGCError) exits 2 with one message."""
    global _ENTRY
    _ENTRY = True
    try:
        app()
    except KGCError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
