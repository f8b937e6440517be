"""The GPU job's phases; gpu/run.sh runs this with the bundle's wheels on the path (read that file first).

Each phase has its own wall-clock budget and log ($OUT/<phase>.log) and writes its row of $OUT/summary.md and
$OUT/metrics.jsonl as soon as it ends, so a later failure or the lease's end loses nothing:

1. ``environment``: GPU, torch / CUDA / transformers versions, bf16 support, free memory, the measured bf16
   matrix-product rate (the ceiling a training step is compared with);
2. ``smoke``: the tests marked ``cuda``, then a 20-step UMLS train → evaluate → predict → serve round trip on the
   GPU; when it fails the job stops there, leaving most of the lease for a fix and a rerun;
3. ``wn18rr_biencoder``: recipes/wn18rr_biencoder.yaml (SimKGC's protocol: full fine-tuning, batch 1024, bf16
   autocast, neighbour texts, in-batch + self negatives, margin 0.02, learnable τ, 5-hop re-ranking) for its
   minutes (``train.max_minutes`` with ``train.schedule: minutes``: the decay ends with the minutes), then the
   filtered test evaluation;
4. ``wn18rr_csr``: recipes/wn18rr_csr.yaml, the router that tied the bi-encoder on the CPU (k = 2, cross-attention in
   the top 2 layers);
and, only when named in --phases:

5. ``wn18rr_csr_k1``: recipes/wn18rr_csr_k1.yaml (the router with k = 1, as the CSR paper has it);
6. ``fb15k237_biencoder``: recipes/fb15k237_biencoder.yaml, SimKGC's FB15k-237 protocol (lr 1e-5, pre-batch 2);
7. ``pace``: the host's share of a step (``kgc bench inputs``) and ``--pace-steps`` steps of
   recipes/wn18rr_biencoder.yaml without evaluation: the steady triples/s and how busy the GPU was (a minute).

Training phases share what is left after the smoke test by weight (``WEIGHTS``); each keeps a reserve for its
setup and evaluation. Nothing is copied back but the summary, the metrics and the logs (8 files at most).
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
PHASES = ("environment", "smoke", "wn18rr_biencoder", "wn18rr_csr")  # the default; RECIPES has two more
OPTIONAL = ("pace",)
RECIPES = {
    "wn18rr_biencoder": ("recipes/wn18rr_biencoder.yaml", []),
    "wn18rr_csr": ("recipes/wn18rr_csr.yaml", []),
    "wn18rr_csr_k1": ("recipes/wn18rr_csr_k1.yaml", []),
    "fb15k237_biencoder": ("recipes/fb15k237_biencoder.yaml", []),
}
WEIGHTS = {"wn18rr_biencoder": 0.6, "wn18rr_csr": 0.4, "wn18rr_csr_k1": 0.4, "fb15k237_biencoder": 1.0}
RESERVE_SECONDS = 100  # per training phase: process start, data and tokenisation, the test evaluation
SMOKE_SECONDS = 120  # 35 s in the rehearsal on 2 loaded CPU cores; room for five processes starting CUDA
MIN_TRAIN_MINUTES = 0.5  # a training phase with less than this left is skipped (said in the summary)
COLUMNS = ("phase", "status", "GPU", "minutes", "epochs", "triples/s", "MRR", "H@1", "H@3", "H@10",
           "peak GPU memory", "GPU busy", "of bf16 peak", "seconds")


class Job:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.out, self.work, self.bundle = args, args.out, args.work, args.bundle
        self.deadline = args.started + 60 * args.minutes
        self.rows: list[dict] = []
        self.env: dict = {}
        self.overrides = [f"model.backbone={args.backbone}"] if args.backbone else []
        self.overrides += args.set or []
        self.python = sys.executable

    def left(self) -> float:
        return self.deadline - time.time()

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
                 f"built from {self.env.get('built_from', '?')[:12]} · --minutes {self.args.minutes:g}", "",
                 "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        for r in self.rows:
            lines.append("| " + " | ".join(str(r.get(key(c), "")) for c in COLUMNS) + " |")
        for r in self.rows:
            if r.get("command"):
                lines += ["", f"`{r['phase']}`: `{r['command']}`"]
            if r.get("detail"):
                lines += ["", f"`{r['phase']}`: {r['detail']}"]
        if note:
            lines += ["", note]
        (self.out / "summary.md").write_text("\n".join(lines) + "\n")

    # ------------------------------------------------------------------ running commands

    def run(self, phase: str, cmd: list[str], *, timeout: float, env: dict | None = None) -> int:
        """``cmd`` with its output appended to the phase's log; 124 when it ran past ``timeout`` (its process
        group is killed)."""
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

    tests = [job.python, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", "tests/test_cuda.py"]
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
        steps.append(("serve", serve_round_trip(job, run, left())))
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
    job.record({"phase": phase, "status": "ok" if rc == 0 else "timed out" if rc == 124 else f"failed ({rc})",
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


def steady_rate(rows: list[dict], skip: int = 20) -> float | None:
    """Triples/s between the first logged step past ``skip`` and the last (start-up and warm-up left out)."""
    rows = [r for r in rows if "seen" in r and "train_seconds" in r]
    later = [r for r in rows if r.get("step", 0) >= skip]
    if len(later) < 2 or later[-1]["train_seconds"] <= later[0]["train_seconds"]:
        return None
    return (later[-1]["seen"] - later[0]["seen"]) / (later[-1]["train_seconds"] - later[0]["train_seconds"])


def pace(job: Job) -> None:
    """The host's ms per step building inputs (``kgc bench inputs``), then a short training without evaluation."""
    start = time.time()
    recipe, steps = "recipes/wn18rr_biencoder.yaml", job.args.pace_steps
    bench = job.work / "inputs.json"
    rc = job.run("pace", job.kgc("bench", "inputs", recipe, "--steps", "10", "--out", str(bench),
                                 *job.sets([])), timeout=max(30.0, min(120.0, job.left() - 60)))
    inputs = read_json(bench) or {}
    run = job.work / "runs" / "pace"
    changes = [f"train.max_steps={steps}", "train.log_every=10", "eval.validate_every_epoch=false",
               "train.check_memory=false", f"train.checkpoint_every={10 * steps}", *job.args.train_set]
    with GpuMonitor() as training:
        if rc == 0:
            rc = job.run("pace", job.kgc("train", recipe, "--out", str(run), "--no-progress", *job.sets(changes)),
                         timeout=max(30.0, job.left() - 5))
    rows = read_lines(run / "metrics.jsonl")
    rate = steady_rate(rows)
    ms = inputs.get("ms_per_step", {})
    job.record({"phase": "pace", "status": "ok" if rc == 0 else "timed out" if rc == 124 else f"failed ({rc})",
                "triples_per_s": round(rate) if rate else "", "gpu_busy": training.busy,
                "seconds": round(time.time() - start),
                "detail": f"{steps} steps of {recipe}, triples/s from step 20 on; the host building a step's inputs: "
                          + ", ".join(f"{k} {v:.1f} ms" for k, v in ms.items()),
                "inputs": inputs or None})


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
    parser.add_argument("--pace-steps", type=int, default=120, help="the pace phase's training steps")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    job = Job(args)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = [p for p in phases if p not in PHASES and p not in RECIPES and p not in OPTIONAL]
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
    if "pace" in phases:
        pace(job)
    training = [p for p in phases if p in RECIPES]
    for i, phase in enumerate(training):
        weights = sum(WEIGHTS[p] for p in training[i:])
        share = (job.left() - RESERVE_SECONDS * (len(training) - i)) * WEIGHTS[phase] / weights
        minutes = share / 60
        if minutes < MIN_TRAIN_MINUTES:
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
