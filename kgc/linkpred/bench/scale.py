"""``kgc bench scale``: the whole path of link prediction measured on generated graphs of growing size.

For each size (``--entities 50000,500000,5000000``) a graph is generated (``kgc data synth-graph``) and every stage
runs as its own ``kgc …`` process, as a user runs it, started through a small launcher (:data:`LAUNCHER`) so that the
peak resident memory of a stage is that process's own (``ru_maxrss`` from ``os.wait4``), not the bench's:

=========  ==================================================================================================
synth      ``kgc data synth-graph`` (Wikidata5M's shape: 4.49 triples per entity; ``--queries`` test triples)
check      ``kgc data check --recipe R``: read and check the graph (texts cut at ``data.max_tokens`` included)
tokenise   read the graph, then tokenise every entity and relation text (the model's ``TextBank``), timed apart
           (``python -m kgc.linkpred.bench.scale tokenise``: what ``kgc train`` and every later stage do first)
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
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from kgc.errors import KGCError

TINY = "tiny"  # --model: a 2-layer, 32-wide BERT with random weights and MiniLM's tokenizer, saved in the work folder
TOKENIZER_OF_TINY = "sentence-transformers/all-MiniLM-L6-v2"
TAIL_LINES = 15  # lines of a failed stage's output kept in the result
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
OK = ("ok", "reused")


# ---------------------------------------------------------------- growth (pure)


def growth_exponent(n1: float, v1: float | None, n2: float, v2: float | None) -> float | None:
    """How a figure grows with the entities: ``log(v2 / v1) / log(n2 / n1)`` (1: linear, 0: constant, 2: quadratic);
    None when a value is missing or not positive, or the sizes are equal."""
    if v1 is None or v2 is None or v1 <= 0 or v2 <= 0 or n1 <= 0 or n2 <= 0 or n1 == n2:
        return None
    return round(math.log(v2 / v1) / math.log(n2 / n1), 2)


def add_growth(sizes: list[dict]) -> list[dict]:
    """Fill each stage row of ``sizes`` (ascending entities) with ``time_exponent`` / ``memory_exponent`` against the
    same stage at the previous size, and ``marginal_rss_bytes_per_entity`` (the peak's growth over the entities'); the
    first size, and a stage that did not complete at both sizes, get None."""
    previous: dict[str, tuple[int, dict]] = {}
    for size in sizes:
        n = size["entities"]
        for row in size["stages"]:
            before = previous.get(row["name"])
            row["time_exponent"] = row["memory_exponent"] = row["marginal_rss_bytes_per_entity"] = None
            if before is not None and row["status"] == "ok" and before[1]["status"] == "ok":
                m, old = before
                row["time_exponent"] = growth_exponent(m, old["seconds"], n, row["seconds"])
                row["memory_exponent"] = growth_exponent(m, old["peak_rss_bytes"], n, row["peak_rss_bytes"])
                if old["peak_rss_bytes"] and row["peak_rss_bytes"] and n != m:
                    row["marginal_rss_bytes_per_entity"] = round((row["peak_rss_bytes"] - old["peak_rss_bytes"])
                                                                 / (n - m), 1)
            if row["status"] in OK:
                previous[row["name"]] = (n, row)
    return sizes


# ---------------------------------------------------------------- one stage as its own process


def _files(roots: Sequence[Path]) -> dict[str, tuple[int, int, int]]:
    """Every file under ``roots``: path -> (size, mtime_ns, inode)."""
    out = {}
    for root in roots:
        if not root.exists():
            continue
        for dirpath, _, names in os.walk(root):
            for name in names:
                p = os.path.join(dirpath, name)
                try:
                    st = os.stat(p)
                except OSError:
                    continue
                out[p] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return out


def written_bytes(before: dict, after: dict) -> int:
    """Bytes of the files that are new or changed (size, time or inode: kgc replaces files by renaming) in
    ``after``."""
    return sum(v[0] for p, v in after.items() if before.get(p) != v)


def _tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


# A child's ru_maxrss starts from the memory of the process that forked it (Linux keeps the old address space's
# high-water mark across exec, and Python forks with vfork): started from the bench (torch imported, hundreds of MB),
# a stage that needs 50 MB would report the bench's peak. So each stage is started by this small launcher (a bare
# interpreter, ~10 MB), which says the child's pid, reaps it with os.wait4 and says its exit status and ru_maxrss.
LAUNCHER = r"""
import json, os, subprocess, sys
spec = json.loads(sys.argv[1])
with open(spec["log"], "w", encoding="utf-8") as fh:
    child = subprocess.Popen(spec["argv"], stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
print(child.pid, flush=True)
_, status, usage = os.wait4(child.pid, 0)
print(json.dumps({"status": status, "maxrss_kib": usage.ru_maxrss}), flush=True)
"""


class Child:
    """A stage's process as the launcher reports it: ``pid`` (the stage's own), ``poll()`` (None while it runs)."""

    def __init__(self, launcher: subprocess.Popen) -> None:
        self.launcher = launcher
        first = launcher.stdout.readline().strip()
        if not first.isdigit():
            launcher.wait()
            raise KGCError(f"the stage launcher did not start the stage: {first or launcher.stderr.read()}")
        self.pid = int(first)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.launcher.poll()

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def result(self) -> tuple[int, int]:
        """(exit code as subprocess says it: -N for signal N, peak RSS bytes), once the stage ended."""
        line = self.launcher.stdout.readline()
        self.launcher.wait()
        done = json.loads(line)
        self.returncode = os.waitstatus_to_exitcode(done["status"])
        return self.returncode, done["maxrss_kib"] * 1024


def run_process(argv: list[str], *, log: Path, env: dict | None = None, cwd: Path | None = None,
                timeout: float | None = None, max_rss: int | None = None,
                during: Callable[[Child], Any] | None = None) -> dict:
    """Run ``argv`` as its own process (its own session, output into ``log``), started by :data:`LAUNCHER` so that
    its peak RSS is its own: ``{"status", "returncode", "seconds", "peak_rss_bytes", "error", "during"}``.
    ``during(child)``: called while it runs (the server's readiness and load); then it is sent SIGTERM.
    ``timeout``: seconds, after which its whole process group is killed (status "timeout"); ``max_rss``: bytes of
    resident memory (checked every 50 ms) past which it is killed too (status "failed"), before the kernel's OOM
    killer picks a process of its own on a shared machine."""
    from kgc.training.estimate import resident_bytes

    log.parent.mkdir(parents=True, exist_ok=True)
    spec = json.dumps({"argv": [str(a) for a in argv], "log": str(log)})
    start = time.perf_counter()
    launcher = subprocess.Popen([sys.executable, "-I", "-c", LAUNCHER, spec], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    child = None
    result: dict[str, Any] = {"during": None, "error": None}
    timed_out = over = False
    try:
        child = Child(launcher)
        if during is not None:
            try:
                result["during"] = during(child)
            except Exception as exc:  # noqa: BLE001 -- reported as the stage's failure; the server is stopped below
                result["error"] = f"{type(exc).__name__}: {exc}"
            if child.poll() is None:
                child.kill_group(signal.SIGTERM)
        deadline = None if timeout is None else start + timeout
        while launcher.poll() is None:
            if deadline is not None and time.perf_counter() > deadline:
                timed_out = True
                child.kill_group()
                break
            if max_rss is not None and (resident_bytes(child.pid)[0] or 0) > max_rss:
                over = True
                child.kill_group()
                break
            time.sleep(0.05)
        code, peak = child.result()
    except BaseException:
        if child is not None and child.poll() is None:  # never leave a stage behind (Ctrl-C of the bench included)
            child.kill_group()
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        raise
    seconds = time.perf_counter() - start
    ok = code == 0 or (during is not None and code == -signal.SIGTERM)  # a server ends on our SIGTERM
    if timed_out:
        result["status"], why = "timeout", f"killed after --stage-timeout {timeout:g}s"
    elif over:
        result["status"], why = "failed", f"killed: its resident memory passed --max-memory ({max_rss / 1e9:g} GB)"
    elif result["error"] is not None:
        result["status"], why = "failed", result["error"]
    elif ok:
        result["status"], why = "ok", None
    else:
        result["status"] = "failed"
        why = (f"killed by {signal.Signals(-code).name}" + (" (out of memory?)" if code == -signal.SIGKILL else "")
               if code < 0 else f"exit {code}")
    if why is not None:
        result["error"] = why + "; its last lines:\n" + _tail(log)
    result.update(returncode=code, seconds=round(seconds, 2), peak_rss_bytes=peak)
    return result


# ---------------------------------------------------------------- inputs made by the bench


def save_tiny_bert(folder: Path) -> Path:
    """A 2-layer, 32-wide BERT with random weights (seed 0) and MiniLM's tokenizer (found offline), as the tests make
    it: no weights are downloaded."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel
    from transformers.utils import logging as hf_logging

    from kgc.encoding.backbone import resolve_backbone

    hf_logging.disable_progress_bar()  # "Writing model shards" on the bench's output

    from kgc.fileio import atomic_dir

    tokenizer = AutoTokenizer.from_pretrained(resolve_backbone(TOKENIZER_OF_TINY))
    with atomic_dir(folder) as tmp, torch.random.fork_rng():
        torch.manual_seed(0)
        config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
        BertModel(config, add_pooling_layer=False).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return folder


def write_recipe(path: Path, graph: Path, model: str, steps: int) -> Path:
    """The measured run's recipe: the default conditioner (SimKGC's bi-encoder) over ``graph``, ``steps`` optimiser
    steps, no validation (it would embed every entity once more: the index stage measures that)."""
    rec = {"name": "scale",
           "data": {"path": str(graph), "neighbor_text": False},
           "model": {"backbone": model},
           "loss": {"pre_batch": 0},
           "train": {"epochs": 1, "max_steps": steps, "batch_size": 64, "lr": 1e-3, "warmup_steps": 1,
                     "log_every": 1},
           "eval": {"validate_every_epoch": False}}
    from kgc.fileio import write_text

    write_text(path, json.dumps(rec, indent=1) + "\n")  # JSON is YAML
    return path


def sample_lines(path: Path, n: int, seed: int = 0) -> list[str]:
    """``n`` lines of a large text file at random byte offsets (the line after each offset), without reading it
    whole."""
    size = path.stat().st_size
    rng = random.Random(seed)
    out: list[str] = []
    with open(path, "rb") as fh:
        for _ in range(n * 3):
            if len(out) >= n:
                break
            fh.seek(rng.randrange(max(1, size)))
            fh.readline()
            line = fh.readline() or (fh.seek(0) or fh.readline())
            text = line.decode("utf-8", errors="replace").rstrip("\n")
            if text:
                out.append(text)
    return out


def _name_of(line: str) -> str:
    """The name field of an ``entity2text.txt`` line (``id<TAB>name<TAB>description`` or ``id<TAB>name, desc``)."""
    fields = line.split("\t")
    return fields[1] if len(fields) > 2 else fields[-1].split(", ", 1)[0]


def misspelt(name: str, rng: random.Random) -> str:
    """``name`` with one letter dropped or two neighbours swapped (always different from ``name``)."""
    letters = [i for i, c in enumerate(name) if c.isalpha()]
    if len(letters) < 3:
        return name + "x"
    i = rng.choice(letters[1:-1])
    if name[i] != name[i + 1] and name[i + 1].isalpha() and rng.random() < 0.5:
        return name[:i] + name[i + 1] + name[i] + name[i + 2:]
    return name[:i] + name[i + 1:]


def write_added(graph: Path, out: Path, n: int, seed: int = 0) -> Path:
    """``n`` new entities (``id<TAB>name<TAB>description``, as ``kgc index --add`` reads them): texts of the graph's
    entities, renamed."""
    from kgc.fileio import write_with

    rows = sample_lines(graph / "entity2text.txt", min(n, 1000), seed)

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            for i in range(n):
                fields = rows[i % len(rows)].split("\t")
                name, _, desc = (fields[1], "", fields[2]) if len(fields) > 2 else fields[-1].partition(", ")
                fh.write(f"kgc-scale-added-{i}\t{name} {i}\t{desc}\n")

    write_with(out, write)
    return out


def head_requests(graph: Path, n: int, *, typo_every: int = 4, seed: int = 0) -> list[dict]:
    """``n`` bodies of ``POST /predict``: a random entity's name as the head (every ``typo_every``-th misspelt, so the
    server says "did you mean"), a random relation by label; ``kind`` says which."""
    rng = random.Random(seed)
    names = [_name_of(line) for line in sample_lines(graph / "entity2text.txt", n, seed)]
    relations = [line.split("\t", 1)[0] for line in (graph / "relation2text.txt").read_text("utf-8").splitlines()
                 if line.strip()]
    out = []
    for i, name in enumerate(names):
        typo = typo_every > 0 and i % typo_every == typo_every - 1
        out.append({"kind": "typo" if typo else "name", "head": misspelt(name, rng) if typo else name,
                    "relation": rng.choice(relations), "inverse": rng.random() < 0.5})
    return out


# ---------------------------------------------------------------- the server stage


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _percentile_ms(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(1000 * values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))], 1)


def drive_server(url: str, proc: Any, requests: list[dict], *, startup_timeout: float,
                 load_seconds: float) -> dict:
    """Wait until ``url``'s ``/health`` says ready (``ready_seconds``; the peak RSS then), send the first name and the
    first typo (timed apart: lazy structures are built there), then ``requests`` one at a time for at most
    ``load_seconds``: latencies of answers by name (200) and of typos (a 404 with suggestions, or a 200 when the
    misspelling is embedded as free text)."""
    import httpx

    from kgc.training.estimate import resident_bytes

    # kgc.bench.wait_ready does the same for `kgc bench serve`, but the tasks' floor may not import the tools' (the
    # layer contract in pyproject.toml): the loop is written out here
    from kgc.training.routes import wait_ready

    out: dict[str, Any] = {"ready_seconds": round(wait_ready(url, proc, startup_timeout), 2),
                           "rss_at_ready_bytes": resident_bytes(proc.pid)[1]}
    latencies: dict[str, list[float]] = {"name": [], "typo": []}
    suggested, errors = 0, {}
    with httpx.Client(base_url=url, timeout=120) as client:
        def ask(req: dict) -> tuple[float, int, dict]:
            body = {k: req[k] for k in ("head", "relation", "inverse")}
            t = time.perf_counter()
            r = client.post("/predict", json=body)
            return time.perf_counter() - t, r.status_code, (r.json() if r.content else {})

        for kind in ("name", "typo"):  # the first of each, timed apart
            first = next((q for q in requests if q["kind"] == kind), None)
            if first is not None:
                out[f"first_{kind}_ms"] = round(1000 * ask(first)[0], 1)
        deadline = time.perf_counter() + load_seconds
        for req in requests:
            if time.perf_counter() > deadline:
                break
            seconds, code, body = ask(req)
            if code == 200 or (req["kind"] == "typo" and code == 404 and body.get("suggestions")):
                latencies[req["kind"]].append(seconds)
                suggested += code == 404
            else:
                errors[str(code)] = errors.get(str(code), 0) + 1
    for kind, values in latencies.items():
        out[f"{kind}_requests"] = len(values)
        out[f"{kind}_p50_ms"] = _percentile_ms(values, 50)
        out[f"{kind}_p95_ms"] = _percentile_ms(values, 95)
    out.update(did_you_mean=suggested, errors=sum(errors.values()), error_kinds=errors)
    return out


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
            return [sys.executable, "-m", __name__, "tokenise", str(self.recipe), *self.sets()]
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


# ---------------------------------------------------------------- the tokenise stage's process


def _tokenise(recipe_path: str, overrides: list[str]) -> dict:
    """Read the recipe's graph, then build the model as ``kgc train`` does first (its text bank: every entity and
    relation text tokenised once): seconds and resident memory after each step; ``tokenise_seconds`` is the text
    bank's alone (timed around its construction inside :func:`kgc.linkpred.model.build_model`)."""
    from kgc.training.estimate import resident_bytes

    t0 = time.perf_counter()
    from kgc.data.graph import load_graph
    from kgc.encoding.backbone import resolve_backbone
    from kgc.linkpred import model as models
    from kgc.recipe import load_recipe

    recipe = load_recipe(Path(recipe_path), overrides)
    folder = resolve_backbone(recipe.model.backbone)
    out: dict[str, Any] = {"imports_seconds": round(time.perf_counter() - t0, 2),
                           "rss_before_read_bytes": resident_bytes()[0]}
    t1 = time.perf_counter()
    graph = load_graph(recipe.data.dataset, path=recipe.data.path, long_text=recipe.data.long_text)
    out.update(read_seconds=round(time.perf_counter() - t1, 2), rss_after_read_bytes=resident_bytes()[0],
               entities=graph.num_entities)
    bank_class = models.TextBank
    init = bank_class.__init__

    def timed_init(self, *args: Any, **kwargs: Any) -> None:
        t = time.perf_counter()
        init(self, *args, **kwargs)
        out.update(tokenise_seconds=round(time.perf_counter() - t, 2), rss_after_tokenise_bytes=resident_bytes()[0])

    bank_class.__init__ = timed_init  # the class itself: however build_model makes its bank
    try:
        t2 = time.perf_counter()
        models.build_model(recipe, graph, folder)
    finally:
        bank_class.__init__ = init
    out.update(build_model_seconds=round(time.perf_counter() - t2, 2), rss_after_model_bytes=resident_bytes()[0])
    return out


def _main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "tokenise":
        print("usage: python -m kgc.linkpred.bench.scale tokenise RECIPE [--set KEY=VALUE ...]", file=sys.stderr)
        return 2
    overrides = [argv[i + 1] for i in range(2, len(argv) - 1) if argv[i] == "--set"]
    try:
        print(json.dumps(_tokenise(argv[1], overrides)), flush=True)
    except KGCError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
