"""One real ``kgc`` process per command, on the toy graph and a tiny random BERT.

Everywhere else the commands run in the test process (:func:`tests.conftest.cli`); these check what only a
real process shows: the entry point (``python -m kgc`` → ``kgc.cli.main``) starts, imports what each command
needs, exits 0 with its output on stdout — and bad input exits 2 with one ``error:`` line, no traceback.

The processes are independent, so they run concurrently (the machine has 2 cores; each spends most of its
few seconds importing torch): those needing a trained run start once ``kgc train`` has made it, each on its
own copy of the run when it writes into it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import SHARED_DATA, TOY_ENTITIES, TOY_TEST, write_toy

pytestmark = pytest.mark.slow


def toy_recipe(path: Path, backbone: Path, data: Path, conditioner: dict, **train) -> Path:
    t = {"epochs": 1, "max_steps": 2, "batch_size": 4, "lr": 1e-3, "warmup_steps": 1, "log_every": 1,
         "num_threads": 1, **train}
    path.write_text(f"name: {path.stem}\n"
                    f"data: {{dataset: {data}, max_tokens: 24}}\n"
                    f"model: {json.dumps({'backbone': str(backbone), **conditioner})}\n"
                    "loss: {pre_batch: 0}\n"
                    f"train: {json.dumps(t)}\n"
                    "eval: {batch_size: 16}\n")
    return path


@pytest.fixture(scope="module")
def smoke(tiny_bert, tmp_path_factory, data_home):
    """Every command's finished process (args, returncode, stdout, stderr), and the paths they used."""
    import kgc
    from tests.test_csts_cli import write_recipe as write_csts_recipe

    tmp = tmp_path_factory.mktemp("smoke")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "KGC_DATA_HOME": str(SHARED_DATA), "HF_HUB_OFFLINE": "1",
           "KGC_CACHE_HOME": str(tmp / "cache")}
    toy = write_toy(tmp / "TOY")
    p = {"tmp": tmp, "toy": toy, "run": tmp / "run", "cmp": tmp / "cmp", "export": tmp / "export",
         "png": tmp / "explain.png", "bench": tmp / "bench.json", "fetch": tmp / "home", "runs": {}}
    p["fetch"].mkdir()

    def kgc_process(*args) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kgc", *map(str, args)], capture_output=True, text=True,
                              env=env, stdin=subprocess.DEVNULL, timeout=600)

    router = toy_recipe(tmp / "smoke_router.yaml", tiny_bert, toy, {"conditioner": "router", "router_layers": 1})
    blind = toy_recipe(tmp / "smoke_bi.yaml", tiny_bert, toy, {"conditioner": "biencoder"})
    done = {}
    with ThreadPoolExecutor(max_workers=2) as pool:
        first = {
            "train": pool.submit(kgc_process, "train", router, "--out", p["run"], "--no-progress"),
            "compare": pool.submit(kgc_process, "compare", blind, "--set", "train.max_steps=1", "--out", p["cmp"],
                                   "--no-progress"),
            "data": pool.submit(kgc_process, "data", "fetch", "wikidata5m", "--dest", p["fetch"]),
            "bench": pool.submit(kgc_process, "bench", "index", "--entities", 600, "--dim", 8, "--queries", 10,
                                 "--types", "flat,ivf", "--nprobe", "1,4", "--repeats", 1, "--out", p["bench"]),
        }
        with pytest.MonkeyPatch.context() as m:  # meanwhile, a C-STS run for `kgc similarity`, in this process
            m.setenv("KGC_CACHE_HOME", str(tmp / "cache"))
            csts = kgc.train(write_csts_recipe(tmp / "csts.yaml", tiny_bert, {"conditioner": "hadamard"},
                                               max_steps=1), tmp / "csts", progress=False, echo=None)
        p["csts"] = csts.path
        p["pair"] = ("A red car.", "A blue car.", "The colour of the car.")
        p["similarity"] = kgc.load(csts.path, echo=None).similarity(*p["pair"])
        second = {"similarity": pool.submit(kgc_process, "similarity", csts.path, "--s1", p["pair"][0], "--s2",
                                            p["pair"][1], "--condition", p["pair"][2], "--json")}
        done["train"] = first.pop("train").result()
        if done["train"].returncode == 0:
            for name in ("evaluate", "index", "predict", "structure"):  # these write into the run: a copy each
                p["runs"][name] = shutil.copytree(p["run"], tmp / f"run_{name}")
            second |= {
                "evaluate": pool.submit(kgc_process, "evaluate", p["runs"]["evaluate"], "--no-progress"),
                "index": pool.submit(kgc_process, "index", p["runs"]["index"], "--no-progress"),
                "predict": pool.submit(kgc_process, "predict", p["runs"]["predict"], "--head", "e_dog",
                                       "--relation", "hypernym", "--top-k", 3, "--json", "--no-progress"),
                "structure": pool.submit(kgc_process, "structure", p["runs"]["structure"], "--set",
                                         "structure.model=TransE", "--set", "structure.dim=4", "--set",
                                         "structure.epochs=1", "--no-progress"),
                "export": pool.submit(kgc_process, "export", p["run"], p["export"]),
                "explain": pool.submit(kgc_process, "explain", p["run"], "--head", "e_dog", "--relation",
                                       "_hypernym", "--out", p["png"], "--json"),
                "curves": pool.submit(kgc_process, "curves", p["run"], "--out", tmp / "curves.png"),
            }
        else:  # test_train reports why; the commands that need the run cannot start
            done |= dict.fromkeys(("evaluate", "index", "predict", "structure", "export", "explain", "curves"))
        done |= {name: f.result() for name, f in (first | second).items()}
    return done, p


def finished(smoke, name: str, code: int = 0) -> subprocess.CompletedProcess:
    proc = smoke[0][name]
    assert proc is not None, f"kgc {name} needs the run that `kgc train` failed to make (see test_train)"
    assert proc.returncode == code, f"kgc {name}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
    return proc


def test_train(smoke):
    proc, p = finished(smoke, "train"), smoke[1]
    assert f"run directory: {p['run']}" in proc.stdout and "finished 2 steps" in proc.stdout
    assert json.loads((p["run"] / "train_summary.json").read_text())["steps"] == 2
    assert (p["run"] / "best.pt").is_file() and not (p["run"] / "checkpoints").exists()  # train.keep: best
    assert f"next: kgc evaluate {p['run']}" in proc.stdout and "triples" in proc.stdout  # the data summary


def test_evaluate(smoke):
    proc, run = finished(smoke, "evaluate"), smoke[1]["runs"]["evaluate"]
    assert "MRR" in proc.stdout and f"wrote {run / 'results.json'}" in proc.stdout
    res = json.loads((run / "results.json").read_text())
    assert res["kgc"]["queries"] == 2 * len(TOY_TEST) and res["kgc"]["entities"] == len(TOY_ENTITIES)
    assert 0 < res["both"]["realistic"]["inverse_harmonic_mean_rank"] <= 1
    assert len((run / "ranks.tsv").read_text().splitlines()) == 1 + 2 * len(TOY_TEST)


def test_index(smoke):
    proc, run = finished(smoke, "index"), smoke[1]["runs"]["index"]
    meta = json.loads((run / "index" / "meta.json").read_text())
    assert meta["entities"] == len(TOY_ENTITIES) and f"indexed {len(TOY_ENTITIES)} entities" in proc.stdout


def test_predict(smoke):
    proc, run = finished(smoke, "predict"), smoke[1]["runs"]["predict"]
    answer = json.loads(proc.stdout)
    assert answer["head"] == "e_dog" and answer["relation"] == "_hypernym"
    assert [p["rank"] for p in answer["predictions"]] == [1, 2, 3]
    assert {p["entity"] for p in answer["predictions"]} <= set(TOY_ENTITIES)
    assert "no index yet: building it" in proc.stderr and (run / "index" / "meta.json").is_file()


def test_structure(smoke):
    proc, run = finished(smoke, "structure"), smoke[1]["runs"]["structure"]
    meta = json.loads((run / "structure" / "meta.json").read_text())
    assert meta["model"] == "TransE" and meta["params"]["dim"] == 4 and meta["entities"] == len(TOY_ENTITIES)
    assert "TransE: " in proc.stdout and (run / "structure" / "model.pt").is_file()


def test_export(smoke):
    proc, out = finished(smoke, "export"), smoke[1]["export"]
    assert f"→ {out}" in proc.stdout and "conditioner router" in proc.stdout
    meta = json.loads((out / "kgc.json").read_text())
    assert meta["format"] == "sentence-transformers" and meta["conditioner"]["name"] == "router"
    assert len((out / "entities.tsv").read_text().splitlines()) >= len(TOY_ENTITIES)


def test_explain(smoke):
    proc, png = finished(smoke, "explain"), smoke[1]["png"]
    ex = json.loads(proc.stdout)
    assert ex["png"] == str(png) and png.stat().st_size > 0 and len(ex["conditions"]) == 1
    assert ex["tokens"][0] == "[CLS]" and ex["tokens"][-1] == "[SEP]"
    for row in ex["weights"].values():  # the router's weights over the head's tokens: a distribution
        assert len(row) == len(ex["tokens"]) and sum(row) == pytest.approx(1.0, abs=1e-5)


def test_curves(smoke):
    proc = finished(smoke, "curves")
    assert f"wrote {smoke[1]['tmp'] / 'curves.png'}" in proc.stdout and "dev_mrr" in proc.stdout
    assert (smoke[1]["tmp"] / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_similarity(smoke):
    proc, p = finished(smoke, "similarity"), smoke[1]
    row = json.loads(proc.stdout)["rows"][0]
    assert (row["sentence1"], row["sentence2"], row["condition"]) == p["pair"]
    assert row["similarity"] == pytest.approx(p["similarity"], abs=1e-5)  # the same as kgc.Run.similarity


def test_compare(smoke):
    proc, out = finished(smoke, "compare"), smoke[1]["cmp"]
    table = (out / "compare.md").read_text().splitlines()
    assert table[0].startswith("| recipe | conditioner |") and len(table) == 3 and "| smoke_bi |" in table[2]
    assert table[2] in proc.stdout and f"wrote {out / 'compare.md'}" in proc.stdout
    assert json.loads((out / "smoke_bi" / "train_summary.json").read_text())["steps"] == 1


def test_data(smoke):
    """`kgc data fetch` of the 1.3 GB Wikidata5M with no terminal to ask and no --yes: kgc.cli.main turns the
    KGCError into exit 2 and one message, after the size warning; nothing is downloaded."""
    proc, home = finished(smoke, "data", 2), smoke[1]["fetch"]
    assert proc.stderr.startswith("error: ") and "Rerun with --yes" in proc.stderr
    assert "downloads about 1.3 GB" in proc.stdout and list(home.iterdir()) == []


def test_bench(smoke):
    proc, out = finished(smoke, "bench"), smoke[1]["bench"]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["type"], r["params"].get("nprobe")) for r in rows] == [("flat", None), ("ivf", 1), ("ivf", 4)]
    assert rows[0]["recall_at_10"] == 1.0 and "| ivf |" in proc.stdout


def test_predict_keeps_its_score_column_for_long_ids(capsys):
    """`kgc predict`'s table: an id longer than the column (free text's neighbours, a graph's long ids) widens the
    column for every row, so the scores stay in one column."""
    from kgc.cli.answer import _print_answer

    rows = [{"rank": 1, "entity": "e" * 40, "score": 0.5, "text": "a"}, {"rank": 2, "entity": "short", "score": 0.25,
                                                                            "text": "b"}]
    _print_answer({"head_text": "h", "relation_text": "r", "seconds": 0.001, "predictions": rows}, False)
    lines = capsys.readouterr().out.splitlines()[1:]
    assert len({line.index("0.") for line in lines}) == 1, lines


def test_a_training_log_file_has_its_lines_apart(tmp_path, tiny_bert, data_home):
    """`kgc train … > log 2>&1`: no progress bar where stderr is no terminal, so a validation line is a line of its
    own in the file (it was glued to the bar's carriage-return updates)."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    log = tmp_path / "train.log"
    with log.open("w") as fh:
        subprocess.run([sys.executable, "-m", "kgc", "train", ROOT / "recipes" / "capitals.yaml", "--set",
                        f"model.backbone={tiny_bert}", "--set", "train.max_steps=3", "--set",
                        "eval.validate_every_steps=2", "--out", tmp_path / "run"], stdout=fh, stderr=subprocess.STDOUT,
                       cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True, timeout=300)
    text = log.read_text()
    assert "\r" not in text and any(line.startswith("step 2 (epoch 1): dev MRR") for line in text.splitlines())


def test_an_added_two_field_line_is_noted_as_split(tmp_path, indexed_tiny_run):
    """`kgc index --add` reads `id<TAB>name, description` as entity2text.txt is read, split at the first ", ", and
    says so (as `kgc data check` does for entity2text.txt) instead of splitting silently."""
    import shutil

    from tests.conftest import cli

    run = tmp_path / "run"
    shutil.copytree(indexed_tiny_run, run)
    new = tmp_path / "new.tsv"
    new.write_text("new_a\tQuito, capital of Ecuador\nnew_b\tLima\tcapital of Peru\n")
    out = cli("index", run, "--add", new, "--no-progress").stdout
    assert "1 line(s) of two fields (the first at line 1) were split at the first \", \"" in out
    assert "added 2 entities" in out
