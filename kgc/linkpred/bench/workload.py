"""What ``kgc bench scale`` (:mod:`kgc.linkpred.bench.scale`) drives and feeds, apart from how it walks the sizes:
a stage run as its own process, its peak memory that process's own (:func:`run_process`, :class:`Child`), the bytes
it wrote; the inputs the bench makes (a tiny random BERT, a recipe, entities to add, head-by-name requests with
typos); the server stage's client (:func:`drive_server`); the tokenise stage's own process (``python -m
kgc.linkpred.bench.workload tokenise RECIPE``: :func:`_tokenise`); and the growth exponent between two sizes."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from kgc.errors import KGCError

TINY = "tiny"  # --model: a 2-layer, 32-wide BERT with random weights and MiniLM's tokenizer, saved in the work folder
TOKENIZER_OF_TINY = "sentence-transformers/all-MiniLM-L6-v2"
TAIL_LINES = 15  # lines of a failed stage's output kept in the result
OK = ("ok", "reused")  # the statuses of a stage that has its figures


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
            # memory first: a stage past both limits at one look is reported for the one that names a fix
            if max_rss is not None and (resident_bytes(child.pid)[0] or 0) > max_rss:
                over = True
                child.kill_group()
                break
            if deadline is not None and time.perf_counter() > deadline:
                timed_out = True
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


# ---------------------------------------------------------------- the tokenise stage's process


def _tokenise(recipe_path: str, overrides: list[str]) -> dict:
    """Read the recipe's graph, then build the model as ``kgc train`` does first (its text bank: every entity and
    relation text tokenised once): seconds and resident memory after each step; ``tokenise_seconds`` is the text
    bank's alone (timed around its construction inside :func:`kgc.linkpred.model.build_model`)."""
    from kgc.training.estimate import resident_bytes

    t0 = time.perf_counter()
    from kgc.data.formats import load_graph
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
        print("usage: python -m kgc.linkpred.bench.workload tokenise RECIPE [--set KEY=VALUE ...]", file=sys.stderr)
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


def added_entities_request(run: Any, n: int, seed: int = 0) -> tuple[str, dict, str]:
    """(path, body, what it does) of the write ``kgc bench serve --add N`` makes while the clients query: ``n``
    entities to add, with texts as long as the graph's (an entity's name and description, renamed)."""
    import numpy as np

    graph = run.predictor.graph()
    rows = np.random.default_rng(seed).integers(0, graph.num_entities, n)
    entities = [{"id": f"kgc-bench-added-{i}", "name": f"{graph.names[e]} {i}"[:1000],
                 "description": (graph.descriptions[e] or "")[:10_000]} for i, e in enumerate(rows.tolist())]
    return "/entities", {"entities": entities}, f"adding {n} entities"
