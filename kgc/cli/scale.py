"""``kgc bench index`` and ``kgc bench scale``: index types and the whole path, at sizes of your choosing."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from kgc.cli.common import _echo, _int_list, bench_app
from kgc.errors import KGCError


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
