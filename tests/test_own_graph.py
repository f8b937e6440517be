"""A user's own graph: the text formats, `kgc data check`, no silent fallbacks, unreadable files, lean runs, answers
without the head itself, free-text heads, thread counts, the recipe-key reference — and a property-based test that
random malformed datasets and recipes end in a KGCError or a run, never another exception or a half-written run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from kgc.data.formats import read_graph
from kgc.errors import KGCError
from tests.conftest import ROOT, cli as kgc, write_toy

EXAMPLE = ROOT / "data" / "examples" / "capitals"


def small_recipe(path: Path, backbone: Path, data: Path, **train) -> Path:
    t = {"epochs": 2, "batch_size": 16, "lr": 1e-3, "warmup_steps": 1, "log_every": 1, "num_threads": 1, **train}
    path.write_text(f"name: {path.stem}\n"
                    f"data: {{path: {data}, max_tokens: 32, neighbor_text: false}}\n"
                    f"model: {{backbone: {backbone}, conditioner: biencoder}}\n"
                    "loss: {pre_batch: 0}\n"
                    f"train: {json.dumps(t)}\n"
                    "eval: {batch_size: 64}\n")
    return path


# ---------------------------------------------------------------- formats and checks


def test_the_worked_example_reads_and_checks_clean():
    g = read_graph(EXAMPLE)
    assert (g.num_entities, g.num_relations) == (64, 5)
    assert [len(g.splits[s]) for s in ("train", "dev", "test")] == [67, 7, 9]
    i = g.entity_index["washington_dc"]  # three fields: a name may hold ", "
    assert g.names[i] == "Washington, D.C." and g.descriptions[i].startswith("a federal district")
    assert g.notes == [] and g.layout == "KG-BERT"
    res = kgc("data", "check", EXAMPLE)
    assert "entities          64" in res.stdout and "no problems found" in res.stdout


def test_two_and_three_field_entity_lines(tmp_path):
    folder = write_toy(tmp_path / "TOY")
    lines = (folder / "entity2text.txt").read_text().splitlines()
    lines[0] = "e_dog\tDog, domestic\ta domesticated carnivorous mammal\textra words"
    (folder / "entity2text.txt").write_text("\n".join(lines) + "\n")
    g = read_graph(folder)
    dog, cat = g.entity_index["e_dog"], g.entity_index["e_cat"]
    assert (g.names[dog], g.descriptions[dog]) == ("Dog, domestic", "a domesticated carnivorous mammal extra words")
    assert (g.names[cat], g.descriptions[cat]) == ("cat", "feline mammal usually having thick soft fur")  # KG-BERT
    assert any('split at the first ", "' in n for n in g.notes)


def test_missing_entity_texts_beside_relation_texts_is_an_error(tmp_path):
    folder = write_toy(tmp_path / "TOY")
    (folder / "entity2text.txt").unlink()
    with pytest.raises(KGCError, match=r"relation2text\.txt but no entity2text\.txt.*Add it, or remove"):
        read_graph(folder)


def test_fallbacks_are_said(tmp_path):
    folder = write_toy(tmp_path / "TOY")
    (folder / "relation2text.txt").unlink()
    g = read_graph(folder)
    assert g.relation_texts == ["hypernym", "has part"]
    res = kgc("data", "check", folder)
    assert "note: no relation2text.txt: relation texts are the relation labels" in res.stdout
    labels = tmp_path / "LABELS"  # a PyKEEN label TSV
    labels.mkdir()
    for s in ("train", "dev", "test"):
        shutil.copy(folder / f"{s}.tsv", labels / f"{s}.txt")
    assert "note: no entity2text.txt: a PyKEEN label TSV" in kgc("data", "check", labels).stdout



def test_an_unread_long_text_file_is_said(data_home):
    out = kgc("data", "check", "umls").stdout  # UMLS: names in entity2text.txt, descriptions in entity2textlong.txt
    assert "note: entity2textlong.txt is not read (data.long_text: false)" in out
    assert "entity2textlong.txt is not read" not in kgc("data", "check", "umls", "--set", "data.long_text=true").stdout


def test_relation_only_in_test_stops_check_and_train(tmp_path, tiny_bert, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = write_toy(tmp_path / "TOY")
    with open(folder / "test.tsv", "a") as fh:
        fh.write("e_dog\t_likes\te_cat\n")
    res = kgc("data", "check", folder, check=False)
    assert res.exit_code == 2 and "error: 1 relation(s) of test occur in no train triple (_likes; 1 test" in res.stdout
    lines = len((folder / "test.tsv").read_text().splitlines())
    assert f"the first at test.tsv:{lines})" in res.stdout  # the line to look at
    assert "data.allow_unseen_relations" in res.stdout
    recipe = small_recipe(tmp_path / "r.yaml", tiny_bert, folder, max_steps=1)
    res = kgc("train", recipe, "--out", tmp_path / "run", "--no-progress", check=False)
    assert res.exit_code == 2 and "_likes" in res.stderr and not (tmp_path / "run").exists()
    res = kgc("data", "check", folder, "--set", "data.allow_unseen_relations=true")
    assert "warning: 1 relation(s) of test" in res.stdout and "ranked from their text alone" in res.stdout


def test_entity_only_in_dev_duplicate_texts_and_long_texts_are_warnings(tmp_path):
    folder = write_toy(tmp_path / "TOY")
    with open(folder / "entity2text.txt", "a") as fh:
        fh.write("e_wolf\twolf, a wild carnivorous mammal " + "with a very long description " * 10 + "\n")
        fh.write("e_dog2\tdog, a domesticated carnivorous mammal\n")  # the same text as e_dog
    with open(folder / "dev.tsv", "a") as fh:
        fh.write("e_wolf\t_hypernym\te_animal\n")
    out = kgc("data", "check", folder).stdout
    assert "warning: 1 entities of dev occur in no train triple (e_wolf)" in out
    assert "warning: 2 entities share their text with another (1 texts; e.g. 'dog: a domesticated carnivorous " \
           "mammal': e_dog, e_dog2)" in out
    assert "warning: 1 entity text(s) (12.5%) are longer than data.max_tokens=50" in out


@pytest.mark.parametrize("damage,message", [
    ("latin1", r"entity2text\.txt:3: not UTF-8 text \(byte 0xe9 at column 21\)\. Save the file as UTF-8"),
    ("nul", r"train\.tsv:2: a NUL byte: this is a binary file"),
    ("folder", r"dev\.tsv: a folder where a text file belongs"),
    ("empty-texts", r"entity2text\.txt: empty \(no entities\)"),
    ("empty-name", r"entity2text\.txt:2: empty name for 'e_cat'"),
    ("empty-field", r"train\.tsv:1: an empty field"),
    ("empty-train", r"train\.tsv: no triples"),
])
def test_unreadable_files_name_the_file_line_and_fix(tmp_path, damage, message):
    folder = write_toy(tmp_path / "TOY")
    if damage == "latin1":
        lines = (folder / "entity2text.txt").read_text().splitlines(keepends=True)
        lines[2] = "e_animal\tanimal, caf\u00e9 organism\n"
        (folder / "entity2text.txt").write_bytes("".join(lines).encode("latin-1"))
    elif damage == "nul":
        (folder / "train.tsv").write_bytes(b"e_dog\t_hypernym\te_animal\n\x00\x01\x02binary\n")
    elif damage == "folder":
        (folder / "dev.tsv").unlink()
        (folder / "dev.tsv").mkdir()
    elif damage == "empty-texts":
        (folder / "entity2text.txt").write_text("\n\n")
    elif damage == "empty-name":
        text = (folder / "entity2text.txt").read_text().replace("e_cat\tcat, feline", "e_cat\t\tfeline")
        (folder / "entity2text.txt").write_text(text)
    elif damage == "empty-field":
        (folder / "train.tsv").write_text("e_dog\t\te_animal\n")
    elif damage == "empty-train":
        (folder / "train.tsv").write_text("")
    with pytest.raises(KGCError, match=message):
        read_graph(folder)
    res = kgc("data", "check", folder, check=False)  # the CLI: exit 2, the one message, no traceback
    assert res.exit_code == 2 and "Traceback" not in res.stderr and res.stderr.startswith("error: ")


def test_the_api_raises_kgcerror_for_a_non_utf8_file(tmp_path, tiny_bert):
    import kgc as api

    folder = write_toy(tmp_path / "TOY")
    (folder / "relation2text.txt").write_bytes("_hypernym\thypernym\n_has_part\tha\xdf part\n".encode("cp1252"))
    recipe = small_recipe(tmp_path / "r.yaml", tiny_bert, folder, max_steps=1)
    with pytest.raises(KGCError, match=r"relation2text\.txt:2: not UTF-8"):
        api.train(recipe, tmp_path / "run", progress=False, echo=None)
    assert not (tmp_path / "run").exists()


def test_dataset_name_comes_from_the_data_used(tmp_path):
    from kgc.recipe import load_recipe

    r = load_recipe(None, [f"data.path={EXAMPLE}"])
    assert r.data.dataset == "capitals"
    r = load_recipe(ROOT / "recipes" / "umls_biencoder.yaml", [f"data.path={EXAMPLE}/"])  # says umls: not used
    assert r.data.dataset == "capitals" and "dataset: capitals" in r.to_yaml()
    assert load_recipe(ROOT / "recipes" / "umls_biencoder.yaml").data.dataset == "umls"


# ---------------------------------------------------------------- a trained run on the example


@pytest.fixture(scope="module")
def capitals(tiny_bert, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("capitals")
    recipe = small_recipe(tmp / "capitals.yaml", tiny_bert, EXAMPLE, epochs=3)
    res = kgc("train", recipe, "--out", tmp / "run", "--no-progress")
    return tmp / "run", res


def test_train_prints_the_data_summary_and_what_to_run_next(capitals):
    run, res = capitals
    assert f"data: {EXAMPLE} (KG-BERT; train.tsv, dev.tsv, test.tsv, entity2text.txt, relation2text.txt)" in res.stdout
    assert "entities          64   relations      5" in res.stdout
    assert f"next: kgc evaluate {run}    (then: kgc predict {run} --head … --relation …)" in res.stdout
    assert "dataset: capitals" in (run / "recipe.yaml").read_text()


def test_the_export_names_the_data_used(capitals, tmp_path):
    run, _ = capitals
    kgc("export", run, tmp_path / "out", "--format", "hf")
    meta = json.loads((tmp_path / "out" / "kgc.json").read_text())
    assert meta["dataset"] == "capitals" and "umls" not in (tmp_path / "out" / "README.md").read_text().lower()


def test_a_finished_run_keeps_the_best_model_only(capitals, tiny_bert, tmp_path):
    run, _ = capitals
    assert (run / "best.pt").is_file() and not (run / "checkpoints").exists()
    res = kgc("train", "--resume", run, check=False)
    assert res.exit_code == 2 and "kept best.pt only (train.keep: best)" in res.stderr
    kept = small_recipe(tmp_path / "k.yaml", tiny_bert, EXAMPLE, max_steps=2, keep="all")
    kgc("train", kept, "--out", tmp_path / "kept", "--no-progress")
    assert (tmp_path / "kept" / "checkpoints" / "last.pt").is_file()


def test_checkpoints_leave_frozen_weights_to_the_backbone_folder(tiny_bert, tmp_path, monkeypatch):
    """encoder.trainable_layers: 1 of 2 layers: the embeddings and layer 0 are frozen; best.pt and last.pt hold only
    what trains, backbone/ the pretrained rest; the loaded run has exactly the weights training ended with."""
    from kgc.linkpred.answer.run import LinkPredRun
    from kgc.recipe import load_recipe
    from kgc.training import loop

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    recipe = load_recipe(small_recipe(tmp_path / "r.yaml", tiny_bert, EXAMPLE, max_steps=3, keep="all"),
                         ["encoder.trainable_layers=1"])
    ended = {}
    real = loop._finish

    def grab(s, *args, **kwargs):
        ended.update({k: v.detach().clone() for k, v in s.model.state_dict().items()})
        return real(s, *args, **kwargs)

    monkeypatch.setattr(loop, "_finish", grab)
    run = loop.train(recipe, out=tmp_path / "run", progress=False, echo=lambda m: None)
    best = torch.load(run / "best.pt", weights_only=False)
    last = torch.load(run / "checkpoints" / "last.pt", weights_only=False)
    assert (run / "backbone" / "model.safetensors").is_file()
    for state in (best, last):
        frozen = set(state["frozen_keys"])
        assert any("embeddings.word_embeddings" in k for k in frozen) and any(".layer.0." in k for k in frozen)
        assert not frozen & set(state["model"]) and any(".layer.1." in k for k in state["model"])
        assert frozen | set(state["model"]) == set(ended)
    loaded = LinkPredRun(run, echo=None).predictor.model().state_dict()
    for k, v in ended.items():
        assert torch.equal(loaded[k].cpu(), v.cpu()), k


def test_an_interrupted_lean_run_resumes_to_the_uninterrupted_result(tiny_bert, tmp_path, monkeypatch):
    """The defaults (train.keep: best) with frozen layers (lean checkpoints): a run stopped after its step-3
    checkpoint and resumed ends with the same best.pt, bit for bit, and the same logged losses."""
    from kgc.recipe import load_recipe
    from kgc.training import loop, session

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path / "cache"))
    recipe = load_recipe(small_recipe(tmp_path / "r.yaml", tiny_bert, EXAMPLE, max_steps=6, checkpoint_every=1),
                         ["encoder.trainable_layers=1", "eval.validate_every_steps=2"])
    full = loop.train(recipe, out=tmp_path / "full", progress=False, echo=lambda m: None)
    real, snapshot = session.save_checkpoint, tmp_path / "snap"

    def save_and_snapshot(path, state):
        real(path, state)
        if path.name == "last.pt" and state["step"] == 3 and not snapshot.exists():
            shutil.copytree(path.parent.parent, snapshot)

    monkeypatch.setattr(session, "save_checkpoint", save_and_snapshot)
    loop.train(recipe, out=tmp_path / "other", progress=False, echo=lambda m: None)
    monkeypatch.setattr(session, "save_checkpoint", real)
    assert torch.load(snapshot / "checkpoints" / "last.pt", weights_only=False)["frozen_keys"]  # lean
    loop.train(resume=snapshot, progress=False, echo=lambda m: None)
    for run in (full, snapshot):
        assert not (run / "checkpoints").exists() and (run / "train_summary.json").is_file()
    a, b = (torch.load(r / "best.pt", weights_only=False) for r in (full, snapshot))
    assert a["step"] == b["step"] and a["frozen_keys"] == b["frozen_keys"] and a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    losses = lambda r: [(x["step"], x["loss"]) for x in map(json.loads, (r / "metrics.jsonl").read_text().splitlines())
                        if "loss" in x]  # noqa: E731
    assert losses(full) == losses(snapshot) and len(losses(full)) == 6


# ---------------------------------------------------------------- answers


def test_predict_leaves_the_head_out_unless_asked(capitals):
    run, _ = capitals
    ask = ("predict", run, "--head", "Lisbon", "--relation", "capital of", "--top-k", "64", "--json", "--no-progress")
    answers = json.loads(kgc(*ask).stdout)
    assert answers["head"] == "lisbon" and "lisbon" not in [p["entity"] for p in answers["predictions"]]
    assert len(answers["predictions"]) == 63
    everything = json.loads(kgc(*ask, "--include-head").stdout)["predictions"]
    assert "lisbon" in [p["entity"] for p in everything] and len(everything) == 64
    kept = [p for p in everything if p["entity"] != "lisbon"]
    assert [p["entity"] for p in kept] == [p["entity"] for p in answers["predictions"]]


def test_free_text_heads_are_embedded_on_the_fly(capitals):
    """With no neighbour text, an entity's query text is "name: description": the same string given as free text
    gets the entity's own query embedding and answers."""
    import kgc as api

    run_dir, _ = capitals
    run = api.load(run_dir, echo=None)
    graph = run.predictor.graph()
    text = graph.full_texts[graph.entity_index["lisbon"]] + " "  # not an entity's text any more (a space)
    free = run.embed_queries([text, "a port city on a river"], "capital of")
    own = run.embed_queries(["lisbon"], "capital of")
    np.testing.assert_allclose(free[0], own[0], rtol=0, atol=1e-6)
    assert np.isfinite(free).all() and not np.allclose(free[1], own[0])
    res = kgc("predict", run_dir, "--head", text, "--relation", "capital of", "--top-k", "5", "--json",
              "--no-progress")
    assert "is not an entity of" in res.stderr and "embedded as free text" in res.stderr
    free_answers = json.loads(res.stdout)
    assert free_answers["head"] == "(free text)"
    with_head = json.loads(kgc("predict", run_dir, "--head", "lisbon", "--relation", "capital of", "--top-k", "5",
                               "--json", "--include-head", "--no-progress").stdout)
    assert [p["entity"] for p in free_answers["predictions"]] == [p["entity"] for p in with_head["predictions"]]


def test_a_near_miss_head_asks_did_you_mean_unless_free_text(capitals):
    import kgc as api
    from kgc.errors import UnknownName

    run_dir, _ = capitals
    said: list[str] = []
    run = api.load(run_dir, echo=said.append)
    with pytest.raises(UnknownName) as info:
        run.answer("Lisbn", "capital of")
    e = info.value
    assert (e.kind, e.name, e.suggestions[0], e.valid) == ("head", "Lisbn", "Lisbon", None)
    assert str(e) == (f"'Lisbn' is not an entity of {run.path}; did you mean: {', '.join(e.suggestions)}? "
                      "(--free-text, or free_text=True, embeds it as text)")
    with pytest.raises(UnknownName):
        run.embed_queries(["Lisbn"], "capital of")
    assert run.predictor.resolve_head("Lisbn", run.predictor.graph(), free_text=True) is None and said == []  # says nothing itself
    typo = run.answer("Lisbn", "capital of", top_k=3, free_text=True)
    assert typo.head == "(free text)" and len(typo.predictions) == 3
    # a description is no typo: free text, its note naming the entities nearest by embedding (not by spelling)
    said.clear()
    text = "a city on the Atlantic coast"
    free = run.answer(text, "capital of", top_k=3)
    assert free.head == "(free text)" and len(said) == 1
    table = run.embed_entities(run.predictor.graph().entities)  # every entity's tail-tower embedding
    order = np.argsort(-(table @ run.embed_entities([text])[0]))[:5]
    nearest = [run.predictor.graph().resolvable(int(i)) for i in order]
    assert run.predictor.nearest_entities(text, run.entities) == [nearest]
    assert said[0] == (f"{text!r} is not an entity of {run.path}: embedded as free text (nearest entities by "
                       f"embedding: {', '.join(nearest)})")
    bad = kgc("predict", run_dir, "--head", "Lisbn", "--relation", "capital of", "--no-progress", check=False)
    assert bad.returncode == 2 and "did you mean: Lisbon" in bad.stderr and "Traceback" not in bad.stderr
    ok = kgc("predict", run_dir, "--head", "Lisbn", "--relation", "capital of", "--free-text", "--json",
             "--no-progress")
    assert json.loads(ok.stdout)["head"] == "(free text)" and "nearest entities by embedding" in ok.stderr


# ---------------------------------------------------------------- threads and recipe keys


def test_num_threads_auto_leaves_busy_cores_alone(monkeypatch):
    import os

    from kgc.recipe import load_recipe
    from kgc.training import common

    cores = len(os.sched_getaffinity(0))
    assert common.busy_cores(samples=2, interval=0) >= 0
    monkeypatch.setattr(common, "busy_cores", lambda: 1)
    assert common.resolve_threads("auto") == max(1, cores - 1)
    monkeypatch.setattr(common, "busy_cores", lambda: cores + 5)
    assert common.resolve_threads("auto") == 1
    monkeypatch.setattr(common, "busy_cores", lambda: 0)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # auto never takes more than the environment allows
    assert common.resolve_threads("auto") == 1 and common.resolve_threads(2) == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "")
    assert common.resolve_threads("auto") == cores
    assert common.resolve_threads(3) == 3 and common.resolve_threads(None) is None
    assert load_recipe(None, ["train.num_threads=auto"]).train.num_threads == "auto"
    assert load_recipe(None).train.num_threads == "auto"  # the default: a run leaves busy cores alone
    assert load_recipe(None, ["train.num_threads=null"]).train.num_threads is None  # torch's own default
    assert load_recipe(ROOT / "recipes" / "wn18rr_cpu_biencoder.yaml").train.num_threads == 2  # named: kept
    with pytest.raises(KGCError, match="train.num_threads"):
        load_recipe(None, ["train.num_threads=0"])


def test_training_sets_its_threads_for_the_run_only(tmp_path, tiny_bert, monkeypatch):
    """train.num_threads is the run's: a program calling kgc.train gets its own thread count back, finished or
    failed (a test process left at 2 threads beside another worker ran 4x slower)."""
    import torch

    from kgc.recipe import load_recipe
    from kgc.training.loop import train

    data = write_toy(tmp_path / "TOY")
    recipe = load_recipe(small_recipe(tmp_path / "r.yaml", tiny_bert, data, num_threads=2, max_steps=1))
    before = torch.get_num_threads()
    seen = []
    try:
        torch.set_num_threads(1)
        train(recipe, out=tmp_path / "run", progress=False, echo=lambda m: seen.append(torch.get_num_threads()))
        assert seen and seen[-1] == 2 and torch.get_num_threads() == 1
        calls, real = [], torch.set_num_threads
        monkeypatch.setattr(torch, "set_num_threads", lambda n: (calls.append(n), real(n)))
        with pytest.raises(KGCError, match="already"):  # a run that fails after its threads were set
            train(recipe, out=tmp_path / "run", progress=False, echo=lambda m: None)
        assert calls == [2, 1] and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_recipe_keys_lists_every_key_with_a_default_and_a_line():
    from kgc.recipe import key_reference, valid_keys

    rows = key_reference()
    assert list(dict.fromkeys(r["key"] for r in rows)) == valid_keys()
    # a member's key says whose it is; a key two members define differently has a row each
    assert [r["for"] for r in rows if r["key"] == "model.rank"] == ["model.conditioner hypernet"]
    assert {r["for"] for r in rows if r["key"] == "model.router_layers"} == {"model.conditioner biencoder",
                                                                             "model.conditioner router"}
    assert [r["for"] for r in rows if r["key"] == "index.nprobe"] == ["task linkpred; index.type ivf, ivfpq"]
    assert [r["for"] for r in rows if r["key"] == "train.lr"] == [""]
    missing = [r["key"] for r in rows if not r["description"]]
    assert not missing, f"recipe keys without a description: {missing}"
    out = kgc("recipe", "keys", "train.num").stdout
    assert out.startswith("train.num_threads") and "default auto" in out
    linkpred = {r["key"] for r in key_reference("linkpred")}
    assert "loss.table_tails" in linkpred and "loss.mse_weight" not in linkpred


# ---------------------------------------------------------------- property-based: malformed inputs


def _mutations():
    from hypothesis import strategies as st

    files = st.sampled_from(["train.tsv", "dev.tsv", "test.tsv", "entity2text.txt", "relation2text.txt"])
    return st.lists(st.one_of(
        st.tuples(st.just("bytes"), files, st.binary(max_size=40)),  # the file replaced by arbitrary bytes
        st.tuples(st.just("line"), files, st.text(max_size=30)),  # an arbitrary line appended
        st.tuples(st.just("delete"), files, st.none()),
        st.tuples(st.just("folder"), files, st.none()),
        st.tuples(st.just("empty"), files, st.none()),
        st.tuples(st.just("latin1"), files, st.none()),
        st.tuples(st.just("crlf-bom"), files, st.none()),  # harmless: must still read
    ), max_size=3)


def _recipes():
    from hypothesis import strategies as st

    keys = st.sampled_from(["train.lr", "train.batch_size", "train.warmup_steps", "data.max_tokens", "train.keep",
                            "loss.margin", "model.conditioner", "eval.batch_size", "train.epochz", "data"])
    values = st.one_of(st.integers(-3, 5), st.floats(allow_nan=True), st.text(max_size=8), st.booleans(),
                       st.none(), st.lists(st.integers(), max_size=2))
    return st.one_of(st.dictionaries(keys, values, max_size=3),
                     st.text(max_size=60).map(lambda t: ("raw", t)))


def _apply(folder: Path, mutations) -> None:
    for kind, name, value in mutations:
        path = folder / name
        if path.is_dir():
            shutil.rmtree(path)
            path.write_text("")
        if kind == "bytes":
            path.write_bytes(value)
        elif kind == "line":
            with open(path, "a", encoding="utf-8", errors="surrogatepass") as fh:
                fh.write(value.encode("utf-8", "surrogatepass").decode("utf-8", "replace") + "\n")
        elif kind == "delete":
            path.unlink(missing_ok=True)
        elif kind == "folder":
            path.unlink(missing_ok=True)
            path.mkdir()
        elif kind == "empty":
            path.write_text("")
        elif kind == "latin1" and path.is_file():
            path.write_bytes(path.read_bytes() + "caf\u00e9\tx\ty\n".encode("latin-1"))
        elif kind == "crlf-bom" and path.is_file():
            path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes().replace(b"\n", b"\r\n"))


def test_malformed_datasets_and_recipes_end_in_kgcerror_or_a_whole_run(tiny_bert, tmp_path_factory, monkeypatch):
    """Random damage to a dataset folder and random recipe values: `kgc train` raises KGCError — and leaves no run
    directory — or trains a complete run (train_summary.json); no other exception, ever."""
    import yaml
    from hypothesis import HealthCheck, given, settings

    import kgc as api
    from kgc.recipe import load_recipe

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
    counts = {"error": 0, "run": 0}

    @settings(max_examples=40, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(mutations=_mutations(), recipe=_recipes())
    def check(mutations, recipe):
        tmp = tmp_path_factory.mktemp("case")
        folder = write_toy(tmp / "TOY")
        _apply(folder, mutations)
        path = small_recipe(tmp / "r.yaml", tiny_bert, folder, max_steps=1, batch_size=4)
        tree = yaml.safe_load(path.read_text())
        if isinstance(recipe, tuple):
            path.write_text(path.read_text() + recipe[1])  # arbitrary text after a valid recipe
        else:
            for key, value in recipe.items():
                section, _, name = key.partition(".")
                if name and isinstance(tree.get(section), dict):
                    tree[section][name] = value
                else:
                    tree[section] = value
            path.write_text(yaml.safe_dump(tree))
        out = tmp / "run"
        try:
            rec = load_recipe(path)
            api.train(rec, out, progress=False, echo=None)
        except KGCError:
            counts["error"] += 1
            assert not out.exists() or not (out / "recipe.yaml").exists(), "a half-written run directory"
            assert not out.exists() or not any(out.iterdir()), f"left behind: {list(out.iterdir())}"
            return
        counts["run"] += 1
        assert (out / "train_summary.json").is_file() and (out / "best.pt").is_file()

    threads = torch.get_num_threads()
    try:
        check()
    finally:
        torch.set_num_threads(threads)
    assert counts["error"] > 10 and counts["run"] >= 1, counts  # both outcomes were exercised
