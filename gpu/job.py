"""The GPU job's phases; gpu/run.sh runs this with the bundle's wheels on the path (read that file first).

Each phase has its own wall-clock budget and log ($OUT/<phase>.log) and writes its row of $OUT/summary.md and
$OUT/metrics.jsonl as soon as it ends, so a later failure or the lease's end loses nothing:

1. ``environment``: GPU, torch / CUDA / transformers versions, bf16 support, free memory, the measured bf16
   matrix-product rate (the ceiling a training step is compared with);
2. ``profile``: tests/test_cuda.py's step under ``set_sync_debug_mode("error")`` (said, not fatal), then
   torch.profiler over PROFILE_STEPS steady steps of recipes/wn18rr_biencoder.yaml (``train.profile_steps``): the
   top operators by GPU and CPU time, the GPU's idle share, synchronisations per step, below the summary's table;
3. ``pace``: the host's share of a step (``kgc bench inputs``), then ``--pace-steps`` steps of that recipe for each
   switch of a step (PACE_SWITCHES: prefetch, length groups, compile, on and off): triples/s and GPU busy, a row each;
4. ``wn18rr_protocol``: SimKGC's WN18RR protocol (recipes/wn18rr_biencoder.yaml, 50 epochs: full fine-tuning, batch
   1024, bf16 autocast, neighbour texts, in-batch + self negatives, margin 0.02, learnable τ, 5-hop re-ranking), or as
   many epochs as the minutes allow (``train.max_minutes`` with ``train.schedule: minutes``: the decay ends with
   whichever comes first; the status says which), then the filtered test evaluation;
and, only when named in --phases:

5. ``smoke``: the other tests marked ``cuda``, then a 20-step UMLS train → evaluate → predict → serve round trip on
   the GPU; when it fails the job stops there, leaving most of the lease for a fix and a rerun;
6. ``fb15k237_protocol``: SimKGC's FB15k-237 protocol (10 epochs, lr 1e-5, pre-batch 2), the same way;
7. ``wn18rr_biencoder``, ``wn18rr_csr`` (the router, k = 2), ``wn18rr_csr_k1``, ``fb15k237_biencoder``: a recipe for
   its share of the minutes.

Training phases share what is left after the smoke test by weight (``WEIGHTS``); each keeps a reserve for its
setup and evaluation.

``--rehearsal`` (gpu/rehearse.py passes it): each phase is bounded by its steps, not by the wall clock. A rehearsal
checks that every phase runs and reports on a CPU that may be slower, or busier, than the one the budgets were set
on, so no phase is skipped for want of time, no command is killed at its share of the minutes (only a hang, past
REHEARSAL_CAP seconds, is killed), and a training phase gets at least MIN_TRAIN_MINUTES of training (its
``train.max_steps`` or its minutes end it, as on the GPU). Nothing is copied back but the summary, the metrics and the logs (8 files at most).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
# the default: issue 50's measurements and SimKGC's WN18RR protocol with what is left; smoke and the other recipes
# run when named
PHASES = ("environment", "profile", "pace", "wn18rr_protocol")
OPTIONAL = ("smoke", "profile", "pace")
RECIPES = {
    "wn18rr_biencoder": ("recipes/wn18rr_biencoder.yaml", []),
    "wn18rr_csr": ("recipes/wn18rr_csr.yaml", []),
    "wn18rr_csr_k1": ("recipes/wn18rr_csr_k1.yaml", []),
    "fb15k237_biencoder": ("recipes/fb15k237_biencoder.yaml", []),
    # SimKGC's protocols: the papers' epochs (WN18RR 50, FB15k-237 10), or as many as the minutes allow (said)
    "wn18rr_protocol": ("recipes/wn18rr_biencoder.yaml", ["train.epochs=50"]),
    "fb15k237_protocol": ("recipes/fb15k237_biencoder.yaml", ["train.epochs=10"]),
}
PROTOCOL_EPOCHS = {"wn18rr_protocol": 50, "fb15k237_protocol": 10}
WEIGHTS = {"wn18rr_biencoder": 0.6, "wn18rr_csr": 0.4, "wn18rr_csr_k1": 0.4, "fb15k237_biencoder": 1.0,
           "wn18rr_protocol": 1.0, "fb15k237_protocol": 1.0}
PACE_RECIPE = "recipes/wn18rr_biencoder.yaml"
# the pace phase's runs: each switch of a training step against the defaults (train.prefetch auto = on a GPU,
# train.length_bucket 8, train.compile off)
PACE_SWITCHES = {
    "defaults": [],
    "prefetch off": ["train.prefetch=false"],
    "length groups off": ["train.length_bucket=0"],
    "compile on": ["train.compile=true"],
    "prefetch and length groups off": ["train.prefetch=false", "train.length_bucket=0"],
}
PACE_DEFAULT = ("defaults", "prefetch off", "length groups off", "compile on")  # --pace-switches all: every one
SYNC_TEST = "never_waits"  # tests/test_cuda.py's step under set_sync_debug_mode("error"): run by profile, not smoke
PROFILE_STEPS = 30
RESERVE_SECONDS = 100  # per training phase: process start, data and tokenisation, the test evaluation
SMOKE_SECONDS = 120  # 35 s in the rehearsal on 2 loaded CPU cores; room for five processes starting CUDA
MIN_TRAIN_MINUTES = 0.5  # a training phase with less than this left is skipped (said in the summary)
REHEARSAL_CAP = 1500.0  # seconds: in a rehearsal a command ends by its steps; this only ends a hang
COLUMNS = ("phase", "status", "GPU", "minutes", "epochs", "triples/s", "MRR", "H@1", "H@3", "H@10",
           "peak GPU memory", "GPU busy", "of bf16 peak", "seconds")


class Job:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.out, self.work, self.bundle = args, args.out, args.work, args.bundle
        self.deadline = args.started + 60 * args.minutes
        self.rows: list[dict] = []
        self.sections: list[str] = []  # pages below the table (the profile)
        self.env: dict = {}
        self.overrides = [f"model.backbone={args.backbone}"] if args.backbone else []
        self.overrides += args.set or []
        self.python = sys.executable
        self.rehearsal = bool(getattr(args, "rehearsal", False))

    def left(self) -> float:
        return self.deadline - time.time()

    def out_of_time(self, needed: float) -> bool:
        """Whether fewer than ``needed`` seconds are left: never in a rehearsal (its phases end by their steps)."""
        return not self.rehearsal and self.left() < needed

    def cap(self, seconds: float) -> float:
        """A command's time limit: ``seconds`` on the GPU; in a rehearsal at least REHEARSAL_CAP (a hang's)."""
        return max(seconds, REHEARSAL_CAP) if self.rehearsal else seconds

    # ------------------------------------------------------------------ output, written at once

    def record(self, row: dict) -> None:
        row = {"gpu": self.env.get("gpu", "—"), **row}
        self.rows.append(row)
        with (self.out / "metrics.jsonl").open("a") as f:
            f.write(json.dumps({"kind": "phase", **row}) + "\n")
        self.write_summary()

    def write_summary(self, note: str = "") -> None:
        lines = ["# kgc GPU job", "", f"{self.env.get('gpu', 'no GPU')} · torch {self.env.get('torch', '?')} "
                 f"(CUDA {self.env.get('cuda', '—')}) · transformers {self.env.get('transformers', '?')} · "
                 f"bf16 matrix product {fmt(self.env.get('bf16_tflops'), '.0f')} TFLOP/s measured · "
                 f"built from {self.env.get('built_from', '?')[:12]} · --minutes {self.args.minutes:g}"
                 + (" · a rehearsal: each phase bounded by its steps, not the clock" if self.rehearsal else ""), "",
                 "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        for r in self.rows:
            lines.append("| " + " | ".join(str(r.get(key(c), "")) for c in COLUMNS) + " |")
        for r in self.rows:
            if r.get("command"):
                lines += ["", f"`{r['phase']}`: `{r['command']}`"]
            if r.get("detail"):
                lines += ["", f"`{r['phase']}`: {r['detail']}"]
        for page in self.sections:
            lines += ["", page]
        if note:
            lines += ["", note]
        (self.out / "summary.md").write_text("\n".join(lines) + "\n")

    # ------------------------------------------------------------------ running commands

    def run(self, phase: str, cmd: list[str], *, timeout: float, env: dict | None = None) -> int:
        """``cmd`` with its output appended to the phase's log; 124 when it ran past ``timeout`` (its process
        group is killed; in a rehearsal ``timeout`` is raised to REHEARSAL_CAP)."""
        timeout = self.cap(timeout)
        log = self.out / f"{phase}.log"
        with log.open("a") as f:
            f.write(f"\n$ {' '.join(cmd)}   [timeout {timeout:.0f}s]\n")
            f.flush()
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                                    env={**os.environ, **(env or {})})
            try:
                return proc.wait(timeout=max(1.0, timeout))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                f.write(f"[killed after {timeout:.0f}s]\n")
                return 124

    def kgc(self, *args: str) -> list[str]:
        return [self.python, "-m", "kgc", *args]

    def sets(self, extra: list[str]) -> list[str]:
        return [a for s in extra + self.overrides for a in ("--set", s)]

    # ------------------------------------------------------------------ preparing the machine

    def unpack(self) -> None:
        """The datasets into $KGC_DATA_HOME, the model into a Hugging Face cache ($HF_HOME) as its id."""
        data = Path(os.environ["KGC_DATA_HOME"])
        data.mkdir(parents=True, exist_ok=True)
        for archive in sorted((self.bundle / "data").glob("*.tar.xz")):
            with tarfile.open(archive) as tar:
                tar.extractall(data, filter="data")
        hub = Path(os.environ["HF_HOME"]) / "hub" / ("models--" + MODEL_ID.replace("/", "--"))
        (hub / "refs").mkdir(parents=True, exist_ok=True)
        (hub / "refs" / "main").write_text("bundle")
        shutil.copytree(self.bundle / "minilm", hub / "snapshots" / "bundle", dirs_exist_ok=True)


def key(column: str) -> str:
    return {"GPU": "gpu", "triples/s": "triples_per_s", "MRR": "mrr", "H@1": "hits_at_1", "H@3": "hits_at_3",
            "H@10": "hits_at_10", "peak GPU memory": "peak_gpu", "GPU busy": "gpu_busy",
            "of bf16 peak": "of_peak"}.get(column, column)


def fmt(value, spec: str) -> str:
    return "—" if value is None else format(value, spec)


class GpuMonitor:
    """nvidia-smi sampled every half second while a phase runs: peak memory used (MiB) and the mean utilisation
    (the share of time a kernel ran); nothing where there is no nvidia-smi (the rehearsal)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True) if shutil.which("nvidia-smi") else None

    def _poll(self) -> None:
        while not self.stop.wait(0.5):
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used",
                                      "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=5)
                util, mem = (float(x) for x in out.stdout.splitlines()[0].split(","))
                self.samples.append((util, mem))
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                continue

    def __enter__(self) -> "GpuMonitor":
        if self.thread:
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        if self.thread:
            self.thread.join(timeout=6)

    @property
    def busy(self) -> str:
        return f"{sum(u for u, _ in self.samples) / len(self.samples):.0f}%" if self.samples else "—"

    @property
    def peak_mib(self) -> float | None:
        return max(m for _, m in self.samples) if self.samples else None


ENVIRONMENT = r"""
import json, os, platform, sys, time
import torch, transformers
info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "transformers": transformers.__version__, "cpus": os.cpu_count(), "gpu": None}
if torch.cuda.is_available():
    props = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info()
    info.update(gpu=props.name, capability=f"{props.major}.{props.minor}", multiprocessors=props.multi_processor_count,
                bf16=torch.cuda.is_bf16_supported(), free_gib=round(free / 2**30, 1), total_gib=round(total / 2**30, 1))
    n = 8192
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        a @ b
    end.record()
    torch.cuda.synchronize()
    info["bf16_tflops"] = round(10 * 2 * n ** 3 / (start.elapsed_time(end) / 1000) / 1e12, 1)
from importlib.metadata import PackageNotFoundError, version
for name in ("pydantic", "pykeen", "fastapi", "uvicorn", "filelock", "faiss-cpu", "faiss-gpu-cu12"):
    try:
        info[name] = version(name)
    except PackageNotFoundError:
        info[name] = None
import kgc  # noqa: F401  (the package imports with what the machine and the bundle hold)
from kgc.encoding.backbone import TextEncoder, load_backbone, load_tokenizer, resolve_backbone
folder = resolve_backbone("sentence-transformers/all-MiniLM-L6-v2")  # the bundle's copy, through the HF cache
device = "cuda" if torch.cuda.is_available() else "cpu"
encoder = TextEncoder(load_backbone(folder)).to(device).eval()
batch = load_tokenizer(folder)(["dog, a domesticated carnivorous mammal"], return_tensors="pt").to(device)
with torch.no_grad():
    vector = encoder(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
info["model"] = f"{folder} ({next(encoder.parameters()).dtype}, {vector.shape[-1]}-dim on {device})"
print("ENV " + json.dumps(info))
"""


def environment(job: Job) -> bool:
    start = time.time()
    log = job.out / "environment.log"
    log.write_text(Path(job.args.install_log).read_text() if job.args.install_log else "")
    if shutil.which("nvidia-smi"):
        job.run("environment", ["nvidia-smi"], timeout=30)
    rc = job.run("environment", [job.python, "-c", ENVIRONMENT], timeout=120)
    found = [line for line in log.read_text().splitlines() if line.startswith("ENV ")]
    if found:
        job.env.update(json.loads(found[-1][4:]))
    manifest = json.loads((job.bundle / "manifest.json").read_text())
    job.env["built_from"] = manifest.get("built_from", "?")
    job.env["gpu"] = job.env.get("gpu") or "no GPU"
    ok = rc == 0 and bool(found)
    shown = ("model", "python", "capability", "multiprocessors", "bf16", "free_gib", "total_gib", "cpus", "pydantic",
             "pykeen", "fastapi", "faiss-cpu", "faiss-gpu-cu12")
    detail = ", ".join(f"{k} {job.env.get(k)}" for k in shown if k in job.env)
    job.record({"phase": "environment", "status": "ok" if ok else f"failed ({rc})",
                "seconds": round(time.time() - start), "detail": detail})
    return ok


def first_query(dataset: str) -> tuple[str, str]:
    """A (head, relation) of the dataset's first training triple, to ask the smoke run."""
    head, relation, _ = (Path(os.environ["KGC_DATA_HOME"]) / dataset / "train.tsv").read_text().split("\n")[0] \
        .split("\t")
    return head, relation


def smoke(job: Job) -> bool:
    """The cuda tests, then train → evaluate → predict → serve on UMLS; False stops the job."""
    start = time.time()
    budget = job.args.smoke_seconds
    steps: list[tuple[str, int]] = []

    def left() -> float:
        return budget - (time.time() - start)

    tests = [job.python, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", "-k", f"not {SYNC_TEST}",
             "tests/test_cuda.py"]
    steps.append(("cuda tests", job.run("smoke", tests, timeout=left())))
    run = job.work / "runs" / "smoke"
    if steps[-1][1] == 0:
        train = job.kgc("train", "recipes/umls_biencoder.yaml", "--out", str(run), "--no-progress",
                        *job.sets(["train.max_steps=20", "train.log_every=5", "train.epochs=1"]))
        steps.append(("train 20 steps", job.run("smoke", train, timeout=left())))
    if steps[-1][1] == 0:
        steps.append(("evaluate", job.run("smoke", job.kgc("evaluate", str(run), "--no-progress"),
                                          timeout=left())))
    if steps[-1][1] == 0:
        head, relation = first_query("UMLS")
        steps.append(("predict", job.run("smoke", job.kgc("predict", str(run), "--head", head, "--relation",
                                                          relation, "--no-progress"), timeout=left())))
    if steps[-1][1] == 0:
        steps.append(("serve", serve_round_trip(job, run, job.cap(left()))))
    failed = [name for name, rc in steps if rc != 0]
    results = read_json(run / "results.json")
    job.record({"phase": "smoke", "status": "ok" if not failed else f"failed at {failed[0]}",
                **metrics_of(results), "seconds": round(time.time() - start),
                "detail": "; ".join(f"{name}: {'ok' if rc == 0 else 'timed out' if rc == 124 else f'exit {rc}'}"
                                    for name, rc in steps)})
    return not failed


def serve_round_trip(job: Job, run: Path, budget: float) -> int:
    """``kgc serve`` on the GPU: ready on /health, one POST /predict answered with predictions, a clean stop."""
    import httpx

    port = 8765
    log = (job.out / "smoke.log").open("a")
    log.write(f"\n$ kgc serve {run} --port {port}\n")
    log.flush()
    proc = subprocess.Popen(job.kgc("serve", str(run), "--port", str(port), "--log-level", "warning"), cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    start, rc = time.time(), 1
    try:
        url = f"http://127.0.0.1:{port}"
        while time.time() - start < budget and proc.poll() is None:
            try:
                if httpx.get(f"{url}/health", timeout=2).json().get("status") == "ready":
                    break
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)
        head, relation = first_query("UMLS")
        reply = httpx.post(f"{url}/predict", json={"head": head, "relation": relation, "top_k": 5}, timeout=30)
        answers = reply.json()
        log.write(f"POST /predict -> {reply.status_code}: {json.dumps(answers)[:400]}\n")
        rc = 0 if reply.status_code == 200 and len(answers["predictions"]) == 5 else 1
    except Exception as exc:  # noqa: BLE001 — written to the log, the phase fails
        log.write(f"serve round trip failed: {type(exc).__name__}: {exc}\n")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            stopped = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stopped = proc.wait()
        log.write(f"kgc serve exited {stopped}\n")
        log.close()
    return rc if stopped == 0 else (rc or 1)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def metrics_of(results: dict | None) -> dict:
    """MRR and Hits@k (both directions, realistic ranks) from a results.json in PyKEEN's layout."""
    if not results:
        return {}
    both = results.get("both", {}).get("realistic", {})
    out = {"mrr": both.get("inverse_harmonic_mean_rank")}
    out.update({f"hits_at_{k}": both.get(f"hits_at_{k}") for k in (1, 3, 10)})
    return {k: round(v, 4) for k, v in out.items() if v is not None}


def flops_per_triple(summary: dict, recipe: dict) -> float | None:
    """Training FLOPs per triple-direction, counted: 6 × non-embedding parameters per token (forward 2, backward
    4) over the recipe's max_tokens per sequence (an upper bound: batches are padded to their longest, not to the
    cap), three sequences per example (query, tail, and the head for its self-negative; duplicates in a batch
    are encoded once, so again an upper bound)."""
    params = summary.get("trainable_params")
    if not params:
        return None
    vocab_hidden = 30522 * 384 + 512 * 384 + 2 * 384  # MiniLM's embedding tables, which cost no FLOPs per token
    tokens = (recipe.get("data") or {}).get("max_tokens", 50)
    towers = 1 if (recipe.get("model") or {}).get("shared_towers", True) else 2
    per_tower = params / towers - vocab_hidden
    return 6 * per_tower * tokens * 3


def train_phase(job: Job, phase: str, minutes: float) -> None:
    recipe, extra = RECIPES[phase]
    start = time.time()
    run = job.work / "runs" / phase
    # no validation during training (an epoch of WN18RR is 170 steps of 1024): the schedule decays to 0 with the
    # minutes and the final weights are evaluated
    # the memory estimate is printed but not enforced: it is calibrated on CPUs only, and a false refusal would cost
    # the rare lease; train_summary.json's "memory" (estimate vs peak) is what calibrates it on a GPU
    changes = [*extra, f"train.max_minutes={minutes:.2f}", "train.schedule=minutes", "eval.validate_every_epoch=false",
               "train.check_memory=false", *job.args.train_set]
    train = job.kgc("train", recipe, "--out", str(run), "--no-progress", *job.sets(changes))
    command = f"kgc train {recipe} " + " ".join(f"--set {s}" for s in changes)
    with GpuMonitor() as training:
        rc = job.run(phase, train, timeout=60 * minutes + RESERVE_SECONDS + 60)
    evaluation = GpuMonitor()
    if rc == 0:
        with evaluation:
            rc = job.run(phase, job.kgc("evaluate", str(run), "--no-progress"),
                         timeout=max(60.0, job.left() - 5))
    summary, results = read_json(run / "train_summary.json") or {}, read_json(run / "results.json")
    saved = read_yaml(run / "recipe.yaml")
    rate = summary.get("triples_per_s")
    per = flops_per_triple(summary, saved) if rate else None
    peak = job.env.get("bf16_tflops")
    for row in read_lines(run / "metrics.jsonl"):
        with (job.out / "metrics.jsonl").open("a") as f:
            f.write(json.dumps({"kind": "curve", "phase": phase, **row}) + "\n")
    peaks = [p for p in (training.peak_mib, evaluation.peak_mib) if p is not None]
    torch_peak = summary.get("peak_gpu_bytes")
    status = outcome(rc)
    wanted, done = PROTOCOL_EPOCHS.get(phase), summary.get("epochs")
    if wanted and rc == 0 and done is not None:  # the papers' epochs, or as many as the minutes allowed
        ran_out = summary.get("train_seconds_without_validation", 0) >= 0.95 * 60 * minutes
        status += f" ({done:g} of {wanted} epochs" + (")" if done >= wanted - 1e-6 else ": the minutes ran out)"
                                                      if ran_out else ": stopped by train.max_steps)")
    job.record({"phase": phase, "status": status,
                "minutes": round(summary.get("train_seconds_without_validation", 0) / 60, 2) or "",
                "epochs": summary.get("epochs", ""), "triples_per_s": round(rate) if rate else "",
                **metrics_of(results),
                "peak_gpu": (f"{max(peaks) / 1024:.1f} GiB (smi)" if peaks else "") +
                            (f" {torch_peak / 2 ** 30:.1f} GiB (torch)" if torch_peak else ""),
                "gpu_busy": training.busy,
                "of_peak": f"{rate * per / (peak * 1e12):.1%}" if rate and per and peak else "",
                "seconds": round(time.time() - start), "command": command,
                "tflops": round(rate * per / 1e12, 1) if rate and per else None,
                "flops_per_triple": per, "results": results and results.get("kgc")})


def outcome(rc: int) -> str:
    """A phase's status from its command's exit code (124: killed at its timeout)."""
    return "ok" if rc == 0 else "timed out" if rc == 124 else f"failed ({rc})"


def steady_rate(rows: list[dict], skip: int = 20) -> float | None:
    """Triples/s between the first logged step past ``skip`` and the last (start-up and warm-up left out)."""
    rows = [r for r in rows if "seen" in r and "train_seconds" in r]
    later = [r for r in rows if r.get("step", 0) >= skip]
    if len(later) < 2 or later[-1]["train_seconds"] <= later[0]["train_seconds"]:
        return None
    return (later[-1]["seen"] - later[0]["seen"]) / (later[-1]["train_seconds"] - later[0]["train_seconds"])


def short_train(job: Job, phase: str, run: Path, steps: int, extra: list[str], monitor: "GpuMonitor",
                budget: float) -> int:
    """``steps`` steps of PACE_RECIPE without evaluation or checkpoints, into ``run``, logged every 10 steps."""
    changes = [*job.args.train_set, f"train.max_steps={steps}", "train.log_every=10", "eval.validate_every_epoch=false",
               "train.check_memory=false", f"train.checkpoint_every={10 * steps}", *extra]
    with monitor:
        return job.run(phase, job.kgc("train", PACE_RECIPE, "--out", str(run), "--no-progress", *job.sets(changes)),
                       timeout=budget)


def profile(job: Job) -> None:
    """torch.profiler over PROFILE_STEPS steady steps of PACE_RECIPE (``train.profile_steps``): the page it writes
    (top operators by GPU and CPU time, the GPU's idle share, synchronisations per step) goes into the summary."""
    from kgc.profiling import PROFILE_WARMUP

    start = time.time()
    sync = job.run("profile", [job.python, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", "-k", SYNC_TEST,
                               "tests/test_cuda.py"], timeout=max(30.0, min(120.0, job.left() - 90)))
    run = job.work / "runs" / "profile"
    steps = PROFILE_WARMUP + PROFILE_STEPS + 2
    monitor = GpuMonitor()
    rc = short_train(job, "profile", run, steps, [f"train.profile_steps={PROFILE_STEPS}"], monitor,
                     budget=max(30.0, min(240.0, job.left() - 60)))
    page = (run / "profile.md").read_text() if (run / "profile.md").is_file() else ""
    if page:
        job.sections.append(page.replace("# ", "## ", 1))
    rate = steady_rate(read_lines(run / "metrics.jsonl"), skip=PROFILE_WARMUP)
    job.record({"phase": "profile", "status": ("ok" if page else "no profile.md") if rc == 0 else outcome(rc),
                "triples_per_s": round(rate) if rate else "",
                "gpu_busy": monitor.busy, "seconds": round(time.time() - start),
                "detail": f"{PROFILE_STEPS} steps of {PACE_RECIPE} after {PROFILE_WARMUP} of warm-up "
                          "(train.profile_steps; every 10th step is logged, and reads its loss back): the page "
                          "below the table; a step under "
                          "set_sync_debug_mode('error') (tests/test_cuda.py): "
                          + ("skipped (no GPU)" if job.env.get("gpu") in (None, "no GPU") else
                             {0: "passed", 124: "timed out"}.get(sync, f"failed ({sync})")),
                "sync_test": sync, "profile": page or None})


def pace(job: Job) -> None:
    """The host's share of a step (``kgc bench inputs``: its inputs built three ways, steps with a tiny BERT), then
    ``--pace-steps`` steps of PACE_RECIPE for each of PACE_SWITCHES: the steady triples/s from step 20 on and how
    busy the GPU was, a row each."""
    start = time.time()
    bench = job.work / "inputs.json"
    rc = job.run("pace", job.kgc("bench", "inputs", PACE_RECIPE, "--steps", "10", "--out", str(bench),
                                 *job.sets(job.args.train_set)), timeout=max(30.0, min(150.0, job.left() - 60)))
    inputs = read_json(bench) or {}
    ms = inputs.get("ms_per_step", {})
    step = inputs.get("step_ms", {})
    job.record({"phase": "pace: host", "status": "ok" if rc == 0 else f"failed ({rc})",
                "seconds": round(time.time() - start),
                "detail": "kgc bench inputs, a step's inputs: " + ", ".join(f"{k} {v:.1f} ms" for k, v in ms.items())
                          + "; a step with a tiny BERT, outside the model: " +
                          ", ".join(f"{k} {v.get('outside_model', 0):.1f} ms" for k, v in step.items()),
                "inputs": inputs or None})
    chosen = job.args.pace_switches
    names = list(PACE_SWITCHES) if chosen == "all" else [n for n in chosen.split(",") if n] if chosen else PACE_DEFAULT
    for name in names:
        if job.out_of_time(40):
            job.record({"phase": f"pace: {name}", "status": f"skipped ({job.left():.0f}s left)"})
            continue
        begun = time.time()
        run = job.work / "runs" / f"pace-{len(job.rows)}"
        monitor = GpuMonitor()
        rc = short_train(job, "pace", run, job.args.pace_steps, PACE_SWITCHES[name], monitor,
                         budget=max(30.0, min(300.0, job.left() - 30)))
        rate = steady_rate(read_lines(run / "metrics.jsonl"))
        job.record({"phase": f"pace: {name}", "status": outcome(rc), "triples_per_s": round(rate) if rate else "",
                    "gpu_busy": monitor.busy,
                    "seconds": round(time.time() - begun),
                    "command": " ".join([f"kgc train {PACE_RECIPE} --set train.max_steps={job.args.pace_steps}",
                                         *(f"--set {x}" for x in PACE_SWITCHES[name])])})


def read_yaml(path: Path) -> dict:
    import yaml

    try:
        return yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}


def read_lines(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--started", type=float, default=time.time())
    parser.add_argument("--install-log", default="")
    parser.add_argument("--minutes", type=float, default=9.0, help="the whole job's wall clock, install included")
    parser.add_argument("--phases", default=",".join(PHASES), help="comma-separated, in order")
    parser.add_argument("--smoke-seconds", type=float, default=SMOKE_SECONDS)
    parser.add_argument("--backbone", default="", help="model.backbone for every run (the rehearsal's tiny BERT)")
    parser.add_argument("--set", action="append", help="a recipe override for every run (the rehearsal's)")
    parser.add_argument("--train-set", action="append", default=[], help="a recipe override for the training phases")
    parser.add_argument("--rehearsal", action="store_true",
                        help="phases bounded by their steps, not the clock (gpu/rehearse.py on a CPU)")
    parser.add_argument("--pace-steps", type=int, default=60, help="the pace phase's training steps per switch")
    parser.add_argument("--pace-switches", default="", help="comma-separated names of PACE_SWITCHES, or all "
                                                            "(default PACE_DEFAULT)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    job = Job(args)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = [p for p in phases if p not in PHASES and p not in RECIPES and p not in OPTIONAL]
    unknown += [f"pace switch {n}" for n in args.pace_switches.split(",") if n and n != "all" and n not in PACE_SWITCHES]
    if unknown:
        print(f"gpu/job.py: unknown phase {unknown[0]!r}; phases: {', '.join([*PHASES, *RECIPES, *OPTIONAL])}",
              file=sys.stderr)
        return 2
    job.unpack()
    if "environment" in phases and not environment(job):
        job.write_summary("**Stopped: the environment phase failed** (environment.log).")
        return print_summary(job, 1)
    if "smoke" in phases and not smoke(job):
        job.write_summary("**Stopped after the smoke phase failed**: smoke.log says where; the training phases "
                          "did not run.")
        return print_summary(job, 1)
    if "profile" in phases:
        profile(job)
    if "pace" in phases:
        pace(job)
    training = [p for p in phases if p in RECIPES]
    for i, phase in enumerate(training):
        weights = sum(WEIGHTS[p] for p in training[i:])
        share = (job.left() - RESERVE_SECONDS * (len(training) - i)) * WEIGHTS[phase] / weights
        minutes = share / 60
        if job.rehearsal:
            minutes = max(minutes, MIN_TRAIN_MINUTES)
        elif minutes < MIN_TRAIN_MINUTES:
            job.record({"phase": phase, "status": f"skipped ({job.left():.0f}s left)"})
            continue
        train_phase(job, phase, minutes)
    failed = [r["phase"] for r in job.rows if not str(r.get("status", "")).startswith(("ok", "skipped"))]
    return print_summary(job, 1 if failed else 0)


def print_summary(job: Job, code: int) -> int:
    print((job.out / "summary.md").read_text())
    return code


if __name__ == "__main__":
    sys.exit(main())
