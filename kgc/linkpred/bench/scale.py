"""``kgc bench scale``: the whole path of link prediction measured on generated graphs of growing size.

For each size (``--entities 50000,500000,5000000``) a graph is generated (``kgc data synth-graph``) and every stage
runs as its own ``kgc …`` process, as a user runs it, started through a small launcher (:data:`~kgc.linkpred.bench.workload.LAUNCHER`) so that the
peak resident memory of a stage is that process's own (``ru_maxrss`` from ``os.wait4``), not the bench's:

=========  ==================================================================================================
synth      ``kgc data synth-graph`` (Wikidata5M's shape: 4.49 triples per entity; ``--queries`` test triples)
check      ``kgc data check --recipe R``: read and check the graph (texts cut at ``data.max_tokens`` included)
tokenise   read the graph, then tokenise every entity and relation text (the model's ``TextBank``), timed apart
           (``python -m kgc.linkpred.bench.workload tokenise``: what ``kgc train`` and every later stage do first)
train      ``kgc train R`` for ``--steps`` optimiser steps: the cheapest honest run folder (a tiny random BERT by
           default, saved once in the work folder, so nothing is downloaded)
index      ``kgc index RUN``: embed every entity, build the (flat) index
evaluate   ``kgc evaluate RUN``: the test triples (``--queries``), filtered, both directions
serve      ``kgc serve RUN``: seconds until ``/health`` says ready, then ``--requests`` sequential ``POST /predict``
           with a head *by name*, every fourth one misspelt (a 404 with "did you mean" suggestions), p50/p95
add        ``kgc index RUN --add FILE``: ``--add`` new entities embedded and appended
=========  ==================================================================================================

Each stage reports wall seconds, peak RSS, the bytes it wrote (files new or changed under the work folder of that
size and under ``$KGC_CACHE_HOME``, which the bench points into the work folder: the first stage to read a graph
writes its caches) per entity, the peak RSS per entity, and, between consecutive sizes, the growth exponent of its
time and memory (``log(t₂/t₁) / log(n₂/n₁)``: 1 is linear, 0 a constant). A stage that fails (an exit code, a signal
— the kernel's OOM killer sends SIGKILL —, ``--stage-timeout`` or ``--max-memory``) is reported with the last lines
of its output, and the stages that need it are skipped; the bench itself goes on to the next size.

``--recipe R`` adds, per size, what each stage of *that* recipe would need on a graph of that size, here and on a GPU
(:func:`kgc.linkpred.bench.memory.stage_memory`; nothing is loaded).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from kgc.errors import KGCError
from kgc.linkpred.bench import workload
from kgc.linkpred.bench.workload import (OK, TINY, _files, _free_port, _tail, add_growth, drive_server, head_requests,
                                         run_process, save_tiny_bert, write_added, write_recipe, written_bytes)

TRIPLES_PER_ENTITY = 4.49  # kgc data synth-graph's default (Wikidata5M's ratio): the estimate's count without a graph


@dataclass(frozen=True)
class Stage:
    name: str
    needs: tuple[str, ...]
    what: str


STAGES: tuple[Stage, ...] = (
    Stage("synth", (), "kgc data synth-graph"),
    Stage("check", ("synth",), "kgc data check --recipe R"),
    Stage("tokenise", ("synth",), "read the graph, tokenise every text"),
    Stage("train", ("synth",), "kgc train R (a few steps)"),
    Stage("index", ("train",), "kgc index RUN"),
    Stage("evaluate", ("index",), "kgc evaluate RUN"),
    Stage("serve", ("index",), "kgc serve RUN + head-by-name requests"),
    Stage("add", ("index",), "kgc index RUN --add FILE"),
)
STAGE_NAMES = tuple(s.name for s in STAGES)


# ---------------------------------------------------------------- a size, stage by stage


class _Size:
    """One size's folder (graph, run, logs, cache) and its stages."""

    def __init__(self, bench: "_Bench", entities: int) -> None:
        self.bench, self.n = bench, entities
        self.dir = bench.work / f"n{entities}"
        self.graph, self.run = self.dir / "graph", self.dir / "run"
        self.recipe = self.dir / "recipe.yaml"
        self.rows: dict[str, dict] = {}

    def kgc(self, *args: Any) -> list[str]:
        return [sys.executable, "-m", "kgc", *map(str, args)]

    def sets(self) -> list[str]:
        return [a for kv in self.bench.overrides for a in ("--set", kv)]

    def argv(self, stage: str) -> list[str]:
        b = self.bench
        if stage == "synth":
            return self.kgc("data", "synth-graph", self.graph, "--entities", self.n, "--test-triples", b.queries,
                            "--dev-triples", b.queries, "--seed", b.seed, "--force")
        if stage == "check":
            return self.kgc("data", "check", "--recipe", self.recipe, *self.sets())
        if stage == "tokenise":
            return [sys.executable, "-m", workload.__name__, "tokenise", str(self.recipe), *self.sets()]
        if stage == "train":
            return self.kgc("train", self.recipe, "--out", self.run, "--no-progress", *self.sets())
        if stage == "index":
            return self.kgc("index", self.run, "--no-progress", *(["--type", b.index_type] if b.index_type else []))
        if stage == "evaluate":
            return self.kgc("evaluate", self.run, "--no-progress")
        if stage == "serve":
            self.port = _free_port()
            return self.kgc("serve", self.run, "--host", "127.0.0.1", "--port", self.port, "--log-level", "warning")
        if stage == "add":
            return self.kgc("index", self.run, "--add", self.dir / "added.tsv", "--no-progress")
        raise KGCError(f"unknown stage {stage}")

    def prepare(self, stage: str) -> None:
        """What a stage needs made by the bench before it starts (outside its timing)."""
        b = self.bench
        if stage in ("check", "tokenise", "train"):
            write_recipe(self.recipe, self.graph, b.model, b.steps)
        if stage == "train":
            shutil.rmtree(self.run, ignore_errors=True)
        if stage == "add":
            write_added(self.graph, self.dir / "added.tsv", b.add, b.seed)

    def reusable_graph(self) -> bool:
        """The graph of an earlier bench in the same ``--work`` (kept with ``--keep``), made with the same
        parameters."""
        try:
            meta = json.loads((self.graph / "meta.json").read_text())
        except (OSError, ValueError):
            return False
        p = meta.get("parameters") or {}
        return (meta.get("seed") == self.bench.seed and p.get("entities") == self.n
                and p.get("test_triples") == self.bench.queries and p.get("dev_triples") == self.bench.queries
                and all((self.graph / f).is_file() for f in ("entity2text.txt", "relation2text.txt", "train.tsv",
                                                             "dev.tsv", "test.tsv")))

    def run_stage(self, spec: Stage) -> dict:
        b = self.bench
        row: dict[str, Any] = {"name": spec.name, "status": "skipped", "seconds": None, "peak_rss_bytes": None,
                               "disk_bytes": None, "detail": {}, "error": None}
        missing = [need for need in spec.needs if self.rows.get(need, {}).get("status") not in OK]
        if spec.name not in b.stages:
            row["error"] = "not asked (--stages)"
            return row
        if missing:
            row["error"] = "needs " + ", ".join(f"{m} ({self.rows.get(m, {}).get('status', 'not run')})"
                                                for m in missing)
            return row
        if spec.name == "synth" and self.reusable_graph():
            row.update(status="reused", detail=self._graph_counts())
            return row
        self.prepare(spec.name)
        roots = [self.dir, b.cache]
        before = _files(roots)
        during = None
        if spec.name == "serve":
            requests = head_requests(self.graph, b.requests, seed=b.seed)
            during = lambda proc: drive_server(f"http://127.0.0.1:{self.port}", proc, requests,  # noqa: E731
                                               startup_timeout=b.stage_timeout or 3600.0,
                                               load_seconds=b.load_seconds)
        argv = self.argv(spec.name)
        b.echo(f"[{self.n:,}] {spec.name}: {' '.join(argv[2:] if argv[1] == '-m' else argv)}")
        done = run_process(argv, log=self.dir / "logs" / f"{spec.name}.log", env=b.env, cwd=self.dir,
                           timeout=b.stage_timeout, max_rss=b.max_rss, during=during)
        row.update(status=done["status"], seconds=done["seconds"], peak_rss_bytes=done["peak_rss_bytes"],
                   error=done["error"])
        row["disk_bytes"] = written_bytes(before, _files(roots))
        row["detail"] = self.detail(spec.name, done)
        return row

    def _graph_counts(self) -> dict:
        """Entities, relations and triples per split of the generated graph (its meta.json)."""
        try:
            meta = json.loads((self.graph / "meta.json").read_text())
        except (OSError, ValueError):
            return {}
        p = meta.get("parameters") or {}
        return {"entities": p.get("entities"), "relations": p.get("relations"), "triples": meta.get("triples")}

    def detail(self, stage: str, done: dict) -> dict:
        """What a stage says beyond time and memory (from its files or its last output line)."""
        if done["status"] != "ok":
            return {}
        if stage == "synth":
            return self._graph_counts()
        if stage == "tokenise":
            try:
                return json.loads(_tail(self.dir / "logs" / "tokenise.log", 1))
            except ValueError:
                return {}
        if stage == "train":
            try:
                s = json.loads((self.run / "train_summary.json").read_text())
                return {"steps": s.get("steps"), "estimate_bytes": (s.get("memory") or {}).get("estimate_bytes")}
            except (OSError, ValueError):
                return {}
        if stage == "evaluate":
            try:
                r = json.loads((self.run / "results.json").read_text())
                both = r["both"]["realistic"]
                return {"mrr": round(float(both["inverse_harmonic_mean_rank"]), 4),
                        "queries": int(r.get("kgc", {}).get("queries") or 2 * self.bench.queries),
                        "evaluation_seconds": r.get("kgc", {}).get("evaluation_seconds")}
            except (OSError, ValueError, KeyError, TypeError):
                return {}
        if stage == "serve":
            return done["during"] or {}
        if stage == "add":
            return {"added": self.bench.add}
        return {}

    def measure(self) -> dict:
        for spec in STAGES:
            row = self.run_stage(spec)
            self.rows[spec.name] = row
            row["disk_bytes_per_entity"] = None if row["disk_bytes"] is None else round(row["disk_bytes"] / self.n, 1)
            row["rss_bytes_per_entity"] = (None if row["peak_rss_bytes"] is None
                                           else round(row["peak_rss_bytes"] / self.n, 1))
            self.bench.echo(line(self.n, row))
        size = {"entities": self.n, "graph": self._graph_counts(), "stages": list(self.rows.values()),
                "failed": [r["name"] for r in self.rows.values() if r["status"] in ("failed", "timeout")]}
        if self.bench.recipe is not None:
            size["estimate"] = self.bench.estimate(self.n, size["graph"])
        return size


class _Bench:
    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)

    def estimate(self, entities: int, graph: dict) -> dict:
        """What each stage of ``--recipe`` would need at this size, here and on a GPU (kgc.linkpred.bench.memory)."""
        try:
            from kgc.linkpred.bench.memory import stage_memory, stage_table
        except ImportError as exc:  # the estimator is not there: say so, measure the rest
            return {"error": f"no stage estimate: {exc}"}
        from kgc.recipe import load_recipe

        recipe = load_recipe(self.recipe, list(self.recipe_overrides))
        triples = graph.get("triples")
        train = triples.get("train") if isinstance(triples, dict) else None
        train = train or round(TRIPLES_PER_ENTITY * entities)  # what synth-graph would make
        try:
            stages = stage_memory(recipe, entities=entities, triples=int(train), relations=graph.get("relations"))
        except Exception as exc:  # noqa: BLE001 -- the measured rows stand; say why the estimate is missing
            self.echo(f"warning: [{entities:,}] no estimate for {self.recipe}: {type(exc).__name__}: {exc}")
            return {"error": f"{type(exc).__name__}: {exc}"}
        table = stage_table(stages)
        self.echo(f"[{entities:,}] {self.recipe}: what each stage needs at this size")
        for row in table.splitlines():
            self.echo("    " + row)
        return {"recipe": str(self.recipe), "stages": [s.record() for s in stages], "table": table}


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2 ** 20:,.0f}"


def failure(error: str | None, width: int = 200) -> str:
    """One line of why a stage failed: the reason, and the last ``error:`` line of its output (else its last line)."""
    if not error:
        return ""
    reason, _, tail = error.partition("; its last lines:\n")
    lines = [x.strip() for x in tail.splitlines() if x.strip()]
    last = next((x for x in reversed(lines) if x.startswith("error:")), lines[-1] if lines else "")
    text = f"{reason.splitlines()[0]}: {last}" if last else reason.splitlines()[0]
    return text if len(text) <= width else text[: width - 1] + "…"


def _note(row: dict) -> str:
    d = row.get("detail") or {}
    if row["status"] not in OK:
        return failure(row.get("error"))
    if row["name"] == "tokenise" and "read_seconds" in d:
        bank = (f"text bank {d['tokenise_seconds']} s ({_mib(d.get('rss_after_tokenise_bytes'))} MiB)"
                if d.get("tokenise_seconds") is not None else f"model with its text bank {d.get('build_model_seconds')} s")
        return f"read {d['read_seconds']} s ({_mib(d.get('rss_after_read_bytes'))} MiB), {bank}"
    if row["name"] == "serve" and "ready_seconds" in d:
        return (f"ready {d['ready_seconds']} s; by name p50 {d.get('name_p50_ms')} ms, p95 {d.get('name_p95_ms')} ms; "
                f"typo p50 {d.get('typo_p50_ms')} ms ({d.get('did_you_mean')} did you mean); first "
                f"{d.get('first_name_ms')} / {d.get('first_typo_ms')} ms; errors {d.get('errors')}")
    if row["name"] == "evaluate" and "mrr" in d:
        return f"{d['queries']:,} queries, MRR {d['mrr']}"
    if row["name"] == "add" and "added" in d:
        return f"{d['added']:,} entities added"
    if row["name"] == "synth" and d:
        t = d.get("triples") or {}
        train = t.get("train") if isinstance(t, dict) else None
        return f"{d.get('relations')} relations, {train:,} train triples" if train else ""
    return ""


def line(entities: int, row: dict) -> str:
    """The line printed as a stage ends."""
    if row["status"] == "skipped":
        return f"[{entities:,}] {row['name']}: skipped ({row['error']})"
    if row["status"] == "reused":
        return f"[{entities:,}] {row['name']}: reused the graph of an earlier bench"
    head = (f"[{entities:,}] {row['name']}: {row['status']} in {row['seconds']} s, peak RSS "
            f"{_mib(row['peak_rss_bytes'])} MiB, wrote {_mib(row['disk_bytes'])} MiB")
    if row["status"] != "ok":
        return head + "\n" + "\n".join("    " + x for x in (row["error"] or "").splitlines())
    note = _note(row)
    return head + (f"; {note}" if note else "")


def bench_scale(*, entities: Sequence[int] = (50_000, 500_000), work: str | Path | None = None, keep: bool = False,
                queries: int = 1000, requests: int = 200, add: int = 10_000, model: str = TINY, steps: int = 2,
                stages: Sequence[str] | None = None, overrides: Sequence[str] = (), recipe: str | Path | None = None,
                recipe_overrides: Sequence[str] = (), stage_timeout: float | None = None,
                max_memory_gb: float | None = None, index_type: str | None = None,
                load_seconds: float = 120.0, seed: int = 0, plot: str | Path | None = None, echo=print) -> dict:
    """``kgc bench scale``: every stage of the path at each size of ``entities`` (see the module's docstring), each as
    its own process. ``queries``: test (and dev) triples of the generated graphs (evaluated in both directions);
    ``requests``: head-by-name requests to the server, a quarter of them misspelt; ``add``: entities added at the end;
    ``model``: ``tiny`` (a random 2-layer BERT made in the work folder) or a model name or folder; ``steps``: training
    steps; ``stages``: a subset to run (the others are skipped, and so are the stages that need them; ``["none"]``: only the
    estimate of ``recipe``, from the counts a generated graph of each size would have); ``overrides``:
    ``--set`` keys for the measured run's recipe; ``recipe``: also estimate that recipe's stages at each size
    (``recipe_overrides``: its ``--set``). ``stage_timeout`` (seconds) and ``max_memory_gb`` (resident GB): a stage
    past either is killed and reported as such. ``index_type``: ``kgc index --type`` (default: the recipe's, flat;
    at millions of entities an exact search alone takes ~0.1 s a query on 2 cores, an approximate one does not).
    ``work``: the folder (default a temporary one, removed after unless
    ``keep``; a kept graph of the same size and seed is reused). ``plot``: a PNG of time and memory per stage."""
    sizes = sorted({int(n) for n in entities})
    if not sizes or sizes[0] < 10:
        raise KGCError("--entities: give one or more sizes of at least 10, e.g. --entities 50000,500000")
    asked = [] if list(stages or []) == ["none"] else list(stages) if stages else list(STAGE_NAMES)
    unknown = [s for s in asked if s not in STAGE_NAMES]
    if unknown:
        raise KGCError(f"--stages {','.join(unknown)}: unknown stage. Stages: {', '.join(STAGE_NAMES)} (or none: "
                       "only the estimate of --recipe)")
    if not asked and recipe is None:
        raise KGCError("--stages none measures nothing: give --recipe R to print what its stages would need")
    if min(queries, requests, steps) < 1 or add < 1:
        raise KGCError("--queries, --requests, --add and --steps must be at least 1")
    if recipe is not None:
        from kgc.recipe import load_recipe

        if not Path(recipe).is_file():
            raise KGCError(f"--recipe {recipe}: no such file")
        load_recipe(Path(recipe), list(recipe_overrides))  # a bad recipe stops here, not after the first size
    temporary = work is None
    root = Path(tempfile.mkdtemp(prefix="kgc-bench-scale-")) if temporary else Path(work)
    root.mkdir(parents=True, exist_ok=True)
    root = root.resolve()
    cache = root / "cache"
    env = {**os.environ, "KGC_CACHE_HOME": str(cache), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("KGC_DEVICE_FORCE", None)
    bench = _Bench(work=root, cache=cache, env=env, queries=queries, requests=requests, add=add, steps=steps,
                   stages=asked, overrides=list(overrides), recipe=None if recipe is None else Path(recipe),
                   recipe_overrides=list(recipe_overrides), stage_timeout=stage_timeout, load_seconds=load_seconds,
                   max_rss=None if max_memory_gb is None else int(max_memory_gb * 1e9), index_type=index_type,
                   seed=seed, echo=echo, model=None)
    started = time.perf_counter()
    try:
        needs_model = set(asked) & {"check", "tokenise", "train"}
        bench.model = str(save_tiny_bert(root / "tiny-bert")) if model == TINY and needs_model else model
        out_sizes = []
        for n in sizes:
            size = _Size(bench, n)
            size.dir.mkdir(parents=True, exist_ok=True)
            out_sizes.append(size.measure())
            if not keep:  # the graph and the run of this size (gigabytes at millions of entities)
                shutil.rmtree(size.dir, ignore_errors=True)
    finally:
        if temporary and not keep:
            shutil.rmtree(root, ignore_errors=True)
    add_growth(out_sizes)
    result = {"sizes": out_sizes, "model": model, "index_type": index_type, "steps": steps, "queries": queries, "requests": requests,
              "add": add, "overrides": list(overrides), "recipe": None if recipe is None else str(recipe),
              "work": str(root) if keep or not temporary else None, "cpus": _cpus(),
              "memory_bytes": _total_memory(), "seconds": round(time.perf_counter() - started, 1),
              "stages": [{"name": s.name, "needs": list(s.needs), "what": s.what} for s in STAGES]}
    if plot is not None:
        result["plot"] = str(plot_scale(result, Path(plot)))
    return result


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _total_memory() -> int | None:
    try:
        for row in Path("/proc/meminfo").read_text().splitlines():
            if row.startswith("MemTotal:"):
                return int(row.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


# ---------------------------------------------------------------- table and plot


def _fmt(v: float | None, spec: str = ",.0f") -> str:
    return "–" if v is None else format(v, spec)


def scale_table(result: dict) -> str:
    """The stages of every size as a markdown table: wall time, peak RSS, bytes written and peak RSS per entity, and
    the growth exponents against the previous size."""
    lines = ["| entities | stage | status | wall (s) | peak RSS (MiB) | disk bytes / entity | RSS bytes / entity | "
             "time growth | memory growth | notes |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for size in result["sizes"]:
        for r in size["stages"]:
            peak = None if r["peak_rss_bytes"] is None else r["peak_rss_bytes"] / 2 ** 20
            note = _note(r).replace("|", "/") if r["status"] != "skipped" else (r["error"] or "")
            lines.append(f"| {size['entities']:,} | {r['name']} | {r['status']} | {_fmt(r['seconds'], ',.1f')} | "
                         f"{_fmt(peak)} | {_fmt(r['disk_bytes_per_entity'])} | {_fmt(r['rss_bytes_per_entity'])} | "
                         f"{_fmt(r.get('time_exponent'), '.2f')} | {_fmt(r.get('memory_exponent'), '.2f')} | "
                         f"{note} |")
    return "\n".join(lines)


def plot_scale(result: dict, path: Path) -> Path:
    """Wall time and peak RSS of each stage against the entities, log-log (one line per stage), as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in STAGE_NAMES:
        pts = [(s["entities"], r["seconds"], r["peak_rss_bytes"], (r.get("detail") or {}).get("ready_seconds"))
               for s in result["sizes"] for r in s["stages"] if r["name"] == name and r["status"] == "ok"]
        if not pts:
            continue
        n, t, m, ready = zip(*pts)
        label = name
        if name == "serve" and all(x is not None for x in ready):  # its wall time holds the load: the start instead
            t, label = ready, "serve (until ready)"
        line_t, = ax_t.plot(n, t, marker="o", label=label)
        ax_m.plot(n, [x / 2 ** 30 for x in m], marker="o", label=name, color=line_t.get_color())
    for ax, label in ((ax_t, "wall time (s)"), (ax_m, "peak resident memory (GiB)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("entities")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    ax_m.axhline(16, color="grey", linestyle="--", linewidth=1)
    ax_m.text(ax_m.get_xlim()[0], 16, " 16 GB", va="bottom", color="grey", fontsize=8)
    ax_t.legend(fontsize=7, ncol=2, loc="upper left")
    fig.suptitle(f"kgc bench scale ({result.get('model')}, {result.get('cpus')} CPUs)", fontsize=10)
    fig.tight_layout()
    from kgc.fileio import write_with

    try:
        write_with(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    finally:
        plt.close(fig)
    return path
