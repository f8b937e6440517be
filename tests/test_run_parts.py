"""A link-prediction run is a few small objects with one job each (issue 39): ``LinkPredRun`` a thin facade over a
``Predictor`` (model, structural model and α, loaded once) and an ``EntityIndex`` (the index files, freshness, the
search device); a question's options (``QueryOptions``) stated once and checked the same way from Python, the CLI,
query files and HTTP; a new run directory made by one function."""

from __future__ import annotations

import ast
import inspect
import json
import re
from pathlib import Path

import pytest

import kgc
from kgc.errors import KGCError
from tests.conftest import cli
from tests.test_api import _cache, tiny_linkpred  # noqa: F401 — _cache: every test's own layer cache (autouse)

ROOT = Path(__file__).resolve().parents[1]
TOO_FEW = "top_k=0: ask for at least 1 answer"  # the one message of a bad top_k, whoever asks


@pytest.fixture(scope="module")
def lp_run(tiny_bert, tmp_path_factory, data_home):
    out = tmp_path_factory.mktemp("parts") / "run"
    kgc.train(tiny_linkpred(tiny_bert), out, progress=False, train__max_steps=2, echo=None)
    return kgc.load(out, echo=None)


# ---------------------------------------------------------------- the facade


def test_the_run_is_a_thin_facade():
    from kgc.linkpred.answer.run import LinkPredRun

    lines, _ = inspect.getsourcelines(LinkPredRun)
    assert len(lines) < 200, f"LinkPredRun is {len(lines)} lines: hand the logic to its parts"
    tree = ast.parse(inspect.getsource(LinkPredRun))
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        body = fn.body[1:] if ast.get_docstring(fn) else fn.body
        assert len(body) <= 3, f"LinkPredRun.{fn.name} holds logic ({len(body)} statements): delegate it"


def test_the_run_keeps_only_user_verbs():
    """What a user does with a run is on it; the model, graph, tokenizer and index are on its two parts."""
    from kgc.linkpred.answer.run import LinkPredRun

    verbs = {"evaluation", "predict", "answer", "resolve", "answer_many", "answer_records", "predict_file", "index",
             "add_entities", "drop_added", "train_structure", "embed_entities", "embed_queries", "explain_inputs", "serving"}
    own = {n for n, v in vars(LinkPredRun).items() if callable(v) and not n.startswith("_")}
    assert own == verbs, (sorted(own - verbs), sorted(verbs - own))


def test_nothing_reaches_a_private_member_of_a_run_or_its_parts():
    reach = re.compile(r"\b(?:run|fork|lp_run|self\.run)\._[a-z]|\.(?:predictor|entities)\._[a-z]")
    found = [f"{f.relative_to(ROOT)}:{i}: {line.strip()}" for f in sorted((ROOT / "kgc").rglob("*.py"))
             for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1) if reach.search(line)]
    assert not found, "\n".join(found)


def test_the_faiss_device_is_decided_in_one_place(lp_run):
    callers = [f.name for f in sorted((ROOT / "kgc").rglob("*.py"))
               if f.name not in ("store.py", "types.py")  # the index store and its types take it
               and re.search(r"faiss_device\s*=", f.read_text(encoding="utf-8"))]
    assert callers == ["entities.py"]
    assert lp_run.entities.faiss_device() == ("cpu" if lp_run.device.type == "cpu" else "auto")
    assert lp_run.entities.faiss_device(deep=True) == "cpu"  # an evaluation's top K + known answers: past a GPU's 2048


def test_a_served_add_warms_a_fork_that_shares_the_predictor_not_the_index(lp_run):
    from kgc.linkpred.answer.routes import LinkPredServing

    serving = LinkPredServing(lp_run)
    lp_run.entities.searcher()
    before = lp_run.entities
    forks = []

    def warmed(fork):  # what the swap hands over, before it swaps
        assert fork.entities is not lp_run.entities and fork.entities.loaded() is None
        forks.append(fork)
        fork.entities.searcher()
        return {}, {}

    serving._warmed = warmed
    serving._swap_in()
    (fork,) = forks
    assert fork.predictor is lp_run.predictor and fork.predictor.model() is lp_run.predictor.model()
    assert lp_run.entities is fork.entities is not before
    assert lp_run.answer("virus", "causes", top_k=2).predictions


# ---------------------------------------------------------------- the question's options, once


def test_query_options_are_stated_once():
    from kgc.cli.answer import predict
    from kgc.linkpred.answer.query import QueryOptions
    from kgc.linkpred.answer.routes import PredictQuery

    assert kgc.api.QueryOptions is QueryOptions and issubclass(PredictQuery, QueryOptions)
    params = inspect.signature(predict).parameters
    for name, field in QueryOptions.model_fields.items():  # kgc predict's options are the model's fields
        assert params[name].default.default == field.default, name
        assert params[name].default.help == field.description, name
    assert QueryOptions().top_k == 10
    tens = [f"{f.relative_to(ROOT)}:{i}" for f in sorted((ROOT / "kgc").rglob("*.py"))
            for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
            if re.search(r"""top_k\b["']?\s*[:=][^,)\n]*\b10\b""", line)]
    assert tens == ["kgc/linkpred/answer/query.py:" + tens[0].split(":")[1]] and len(tens) == 1, tens


def test_query_options_checked_alike():
    from kgc.linkpred.answer.query import QueryOptions

    with pytest.raises(KGCError, match=re.escape(TOO_FEW)):
        QueryOptions.of(top_k=0)
    with pytest.raises(KGCError, match=r"top_k must be int, got '2'"):
        QueryOptions.of({"top_k": "2"})
    with pytest.raises(KGCError, match=r"inverse must be bool, got 1"):
        QueryOptions.of(inverse=1)
    with pytest.raises(KGCError, match=r"unknown option 'topk'; a query takes top_k, inverse"):
        QueryOptions.of(topk=3)
    assert QueryOptions.of(QueryOptions(top_k=3), inverse=True).model_dump() == {
        "top_k": 3, "inverse": True, "filter_known": False, "include_head": False, "free_text": False}


def test_a_bad_top_k_is_one_message_in_python_cli_files_and_http(lp_run, tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from tests.test_serve import ready

    with pytest.raises(KGCError, match=re.escape(TOO_FEW)):
        lp_run.predict("virus", "causes", top_k=0)
    with pytest.raises(KGCError, match="unknown option 'inverted'"):
        lp_run.answer("virus", "causes", inverted=True)
    res = cli("predict", lp_run.path, "--head", "virus", "--relation", "causes", "--top-k", "0", check=False)
    assert res.exit_code == 2 and TOO_FEW in res.stderr
    res = cli("predict", "--server", "http://127.0.0.1:9", "--head", "virus", "--relation", "causes", "--top-k", "0",
              check=False)  # said before any server is asked
    assert res.exit_code == 2 and TOO_FEW in res.stderr
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"head": "virus", "relation": "causes", "top_k": 0}\n')
    with pytest.raises(KGCError, match=re.escape(f"{questions}:1: {TOO_FEW}")):
        lp_run.predict_file(questions)
    questions.write_text('{"head": "virus", "relation": "causes"}\n')
    with pytest.raises(KGCError, match=re.escape(TOO_FEW)):  # a bad default is the default's, not line 1's
        lp_run.predict_file(questions, top_k=0)
    with TestClient(kgc.api.app(lp_run), raise_server_exceptions=False) as c:
        ready(c)
        r = c.post("/predict", json={"head": "virus", "relation": "causes", "top_k": 0})
        assert r.status_code == 422 and TOO_FEW in r.json()["detail"][0]["msg"]
        r = c.post("/predict", json={"head": "virus", "relation": "causes", "top_k": 1001})
        assert r.status_code == 422 and "at most 1000" in r.json()["detail"][0]["msg"]
        schema = c.get("/openapi.json").json()["components"]["schemas"]["PredictQuery"]["properties"]
        assert schema["top_k"]["default"] == 10 and schema["top_k"]["minimum"] == 1  # what the page starts from
        r = c.post("/predict", json={"head": "virus", "relation": "causes"})
        assert len(r.json()["predictions"]) == 10


# ---------------------------------------------------------------- the structural model and α, once


def test_alpha_is_chosen_once_and_again_after_retraining(tiny_bert, tmp_path, monkeypatch, data_home):
    from kgc.linkpred.structure import kinds
    from kgc.linkpred.structure import pykeen as structure
    from kgc.linkpred.answer.run import LinkPredRun
    from tests.test_structure import STRUCTURE, train_fused

    fused, _ = train_fused(tiny_bert, tmp_path, STRUCTURE)
    calls, loads = [], []
    choose, load = structure.choose_alpha, kinds.load_structure
    monkeypatch.setattr(structure, "choose_alpha", lambda *a, **k: calls.append(1) or choose(*a, **k))
    monkeypatch.setattr(kinds, "load_structure", lambda *a, **k: loads.append(a[1:]) or load(*a, **k))
    run = LinkPredRun(fused, device="cpu", echo=None)
    ev = run.evaluation()
    top = run.predict("acquired_abnormality", "location_of", top_k=3)
    run.evaluation("dev")
    assert len(calls) == 1 and len(top) == 3
    assert loads == [(run.device,)]  # one load, on the run's device
    assert ev.results["kgc"]["structure"]["alpha"] == run.predictor.alpha_choice()["alpha"]
    run.train_structure(structure__epochs=1, progress=False)
    run.predict("acquired_abnormality", "location_of", top_k=3)
    assert len(calls) == 2 and len(loads) == 2  # the retrained model is loaded, and α chosen for it


# ---------------------------------------------------------------- a new run directory


def test_a_run_directory_is_made_by_one_function(tmp_path, monkeypatch):
    from kgc.training.run import RunDir

    made = RunDir.create(tmp_path / "new")
    assert made.is_dir() and not (made / "recipe.yaml").exists()
    (made / "recipe.yaml").write_text("task: linkpred\n")
    with pytest.raises(KGCError, match="stopped before its first checkpoint"):
        RunDir.create(made)
    (made / "metrics.jsonl").write_text("{}\n")
    (made / "checkpoints").mkdir()
    RunDir.create(made, restart=True)  # its leftovers go; its recipe stays
    assert sorted(p.name for p in made.iterdir() if not p.name.startswith(".")) == ["recipe.yaml"]
    (made / "best.pt").write_bytes(b"")
    with pytest.raises(KGCError, match="already holds a run"):
        RunDir.create(made)
    RunDir.discard(tmp_path / "new", existed=True, made=("recipe.yaml",))
    assert (tmp_path / "new" / "best.pt").exists() and not (tmp_path / "new" / "recipe.yaml").exists()
    RunDir.discard(tmp_path / "new", existed=False, made=())
    assert not (tmp_path / "new").exists()


def test_train_with_data_creates_its_folder_through_run_dir(tiny_bert, tmp_path, monkeypatch):
    import numpy as np
    from pykeen.triples import TriplesFactory

    from kgc.training.run import RunDir
    from tests.conftest import TOY_TEST, TOY_TRAIN

    created = []
    real = RunDir.create
    monkeypatch.setattr(RunDir, "create", staticmethod(lambda path, *a, **k: created.append(Path(path)) or
                                                       real(path, *a, **k)))
    tf = TriplesFactory.from_labeled_triples(np.array(TOY_TRAIN + TOY_TEST, dtype=str))
    run = kgc.train(tiny_linkpred(tiny_bert, batch_size=4), tmp_path / "run", data=tf, progress=False, echo=None)
    assert created == [tmp_path / "run", tmp_path / "run"]  # the API (for its triples), then the training loop
    assert (run.path / "data" / "train.tsv").is_file() and (run.path / "recipe.yaml").is_file()
    assert json.loads((run.path / "train_summary.json").read_text())


def test_a_true_self_loop_is_shown_marked_known():
    """The head is left out of its own answers, unless the graph has (head, relation, head): then it is an answer
    like any known one (shown, marked known; left out by filter_known)."""
    from kgc.linkpred.answer.topk import Query
    from kgc.linkpred.answer.query import QueryOptions

    def left_out(known, **options):
        return Query("e", 3, 0, [], QueryOptions.of(**options)).excluded(set(known))

    assert left_out({5}) == {3}  # not an answer of its own: left out as before
    assert left_out({3, 5}) == set()  # a self-loop of the graph: shown
    assert left_out({3, 5}, filter_known=True) == {3, 5}
    assert left_out({5}, include_head=True) == set()
    assert Query("free text", None, 0, [], QueryOptions()).excluded({5}) == set()
