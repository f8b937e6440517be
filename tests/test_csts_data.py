"""C-STS data: the official CSV reader and its bad rows, fetch's OpenSSL decryption, the synthetic set,
metrics against scipy, and the objective by hand."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from kgc.csts.data import load_csts, read_csts
from kgc.csts.evaluate import similarity_metrics
from kgc.csts.loss import CSTSLoss
from kgc.csts.synth import CONDITIONS, GROUPS, NUMBERS, generate_rows, label, write_synthetic
from kgc.errors import KGCError

HEADER = "sentence1,sentence2,condition,label\n"
TRAIN = HEADER + ('"A man, on a red bike.",A woman on a blue bike.,The colour of the bike.,1.0\n'
                  '"A man, on a red bike.",A woman on a blue bike.,The vehicle.,5\n'
                  "Two dogs run.,Three dogs run.,The number of dogs.,4\n"
                  "Two dogs run.,Three dogs run.,The animal.,4\n"
                  "Two dogs run.,Three dogs run.,The action.,5\n")
VALID = HEADER + "A cat sleeps.,A dog sleeps.,The animal.,2\nA cat sleeps.,A dog sleeps.,The action.,5\n"
TEST = HEADER + "A cat sleeps.,A cat eats.,The action.,-1\nA cat sleeps.,A cat eats.,The animal.,-1\n"


def write_official(folder: Path, train=TRAIN, valid=VALID, test=TEST) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in (("train", train), ("validation", valid), ("test", test)):
        (folder / f"csts_{name}.csv").write_text(text)
    return folder


def test_reader_groups_pairs_and_keeps_test_unlabelled(tmp_path):
    data = read_csts(write_official(tmp_path / "CSTS"))
    train = data.split("train")
    assert len(train) == 5 and data.sentences[train.s1[0]] == "A man, on a red bike."  # quoted comma
    assert [g.tolist() for g in train.groups] == [[0, 1], [2, 3, 4]]
    high, low = train.contrast_pairs()
    assert sorted(zip(high.tolist(), low.tolist())) == [(1, 0), (4, 2), (4, 3)]  # ties (4, 4) are no pair
    assert train.lines.tolist() == [2, 3, 4, 5, 6]
    test = data.split("test")
    assert np.isnan(test.label).all() and test.contrast_pairs()[0].size == 0
    assert data.conditions[train.cond[2]] == "The number of dogs."


@pytest.mark.parametrize("text,message", [
    ("sentence1,sentence2,label\na,b,3\n", r"csts_train\.csv:1: header sentence1,sentence2,label lacks condition"),
    (HEADER + "a,b,c,3\na,b,c,6\n", r"csts_train\.csv:3: label 6 outside 1-5"),
    (HEADER + "a,b,c,3\na, ,c,3\n", r"csts_train\.csv:3: empty sentence2"),
    (HEADER + "a,b,c,-1\n", r"csts_train\.csv:2: label -1 \(unlabelled\) belongs in the test split only"),
    (HEADER + "a,b,c,3\na,b,c,x\n", r"csts_train\.csv:3: label 'x' is not a number"),
    (HEADER + "a,b,c,3\na,b,c,d,3\n", r"csts_train\.csv:3: 5 fields, expected 4"),
    ("", r"csts_train\.csv: empty file"),
])
def test_bad_rows_name_file_and_line(tmp_path, text, message):
    folder = write_official(tmp_path / "CSTS", train=text)
    with pytest.raises(KGCError, match=message):
        read_csts(folder)


def test_catalog_lookup_and_the_offline_message(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("KGC_DATA_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(KGCError, match=r"home/CSTS \(put csts_train\.csv, csts_validation\.csv, csts_test\.csv "
                                       r"there, or run `kgc data fetch csts --password …`"):
        load_csts("csts")
    write_official(home / "CSTS")
    assert len(load_csts("csts").split("train")) == 5
    with pytest.raises(KGCError, match="'umls' is a linkpred dataset"):
        load_csts("umls")


def _encrypted_archive(tmp_path: Path, password: str) -> Path:
    """A tar of the three CSVs (under data/, as an archive would hold them), encrypted by OpenSSL itself."""
    assert shutil.which("openssl"), "the openssl binary is needed to make a reference encrypted file"
    src = write_official(tmp_path / "src" / "data")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(src, arcname="data")
    (tmp_path / "csts.tar").write_bytes(buf.getvalue())
    out = tmp_path / "csts.tar.enc"
    subprocess.run(["openssl", "enc", "-aes-256-cbc", "-a", "-salt", "-pbkdf2", "-in", str(tmp_path / "csts.tar"),
                    "-out", str(out), "-pass", f"pass:{password}"], check=True)
    return out


def test_fetch_decrypts_openssl_files_and_leaves_nothing_on_failure(tmp_path):
    from kgc.data import catalog
    from kgc.data.openssl import decrypt

    enc = _encrypted_archive(tmp_path, "s3cret pass")
    assert decrypt(enc.read_bytes(), "s3cret pass") == (tmp_path / "csts.tar").read_bytes()
    home = tmp_path / "home"
    with pytest.raises(KGCError, match="wrong password"):
        catalog.fetch_dataset("csts", home, password="guess", source=str(enc))
    assert not home.exists() or list(home.iterdir()) == []  # nothing half-written
    with pytest.raises(KGCError, match="is distributed encrypted: pass --password"):
        catalog.fetch_dataset("csts", home)
    target = catalog.fetch_dataset("csts", home, password="s3cret pass", source=str(enc))
    assert target == home / "CSTS" and sorted(p.name for p in home.iterdir()) == ["CSTS"]
    assert len(read_csts(target).split("validation")) == 2
    other = tmp_path / "other"
    with pytest.raises(KGCError, match=r"could not read .*nowhere.*put csts_train\.csv, csts_validation\.csv, "
                                       r"csts_test\.csv into"):
        catalog.fetch_dataset("csts", other, password="x", source=(tmp_path / "nowhere.enc").as_uri())
    assert not other.exists()  # an unreadable archive creates nothing, not even the data home


def test_fetch_checks_the_columns_before_publishing(tmp_path, monkeypatch):
    from kgc.data import catalog

    bad = write_official(tmp_path / "bad", valid="s1,s2,condition,label\na,b,c,3\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for f in bad.iterdir():
            tar.add(f, arcname=f.name)
    (tmp_path / "bad.tar").write_bytes(buf.getvalue())
    subprocess.run(["openssl", "enc", "-aes-256-cbc", "-a", "-salt", "-pbkdf2", "-in", str(tmp_path / "bad.tar"),
                    "-out", str(tmp_path / "bad.enc"), "-pass", "pass:p"], check=True)
    home = tmp_path / "home"
    with pytest.raises(KGCError, match=r"csts_validation\.csv:1: header s1,s2,condition,label lacks sentence1"):
        catalog.fetch_dataset("csts", home, password="p", source=str(tmp_path / "bad.enc"))
    assert list(home.iterdir()) == []


def _value(attribute: str, sentence: str) -> str:
    """Read an attribute's value back out of a generated sentence."""
    words = NUMBERS if attribute == "number" else [v for g in GROUPS[attribute] for v in g]
    found = [w for w in words if re.search(rf"\b{w}s?\b", sentence, flags=re.I)]
    assert len(found) == 1, (attribute, sentence, found)
    return found[0].lower()


def test_synthetic_labels_follow_the_attributes(tmp_path):
    rows = generate_rows(400, seed=3)
    assert rows == generate_rows(400, seed=3) and rows != generate_rows(400, seed=4)  # deterministic
    by_condition = {c: a for a, phrasings in CONDITIONS.items() for c in phrasings}
    for k in range(0, len(rows), 2):
        (s1, s2, c1, y1), (t1, t2, c2, y2) = rows[k], rows[k + 1]
        assert (s1, s2) == (t1, t2) and s1 != s2 and y1 != y2  # every pair twice: a high and a low condition
        for cond, y in ((c1, y1), (c2, y2)):
            a = by_condition[cond]
            assert label(a, _value(a, s1), _value(a, s2)) == y
    assert label("colour", "red", "orange") == 3 and label("colour", "red", "blue") == 1
    assert label("number", "two", "five") == 2 and label("animal", "owl", "owl") == 5
    write_synthetic(tmp_path / "a", seed=1, train_pairs=30, validation_pairs=5, test_pairs=5)
    write_synthetic(tmp_path / "b", seed=1, train_pairs=30, validation_pairs=5, test_pairs=5)
    for split in ("train", "validation", "test"):
        a, b = (tmp_path / d / f"csts_{split}.csv" for d in "ab")
        assert a.read_bytes() == b.read_bytes()
    data = read_csts(tmp_path / "a")  # the official layout, read by the official reader
    assert len(data.split("train")) == 60 and len(data.split("train").contrast_pairs()[0]) == 30


def test_metrics_agree_with_scipy():
    rng = np.random.default_rng(0)
    pred, label_ = rng.normal(size=40), rng.integers(1, 6, size=40).astype(float)
    label_[[3, 7]] = np.nan  # unlabelled rows are ignored
    high, low = np.array([0, 2, 4, 6]), np.array([1, 3, 5, 8])
    pred[6] = pred[8]  # one tie: counts one half
    m = similarity_metrics(pred, label_, high, low)
    seen = ~np.isnan(label_)
    assert m["spearman"] == pytest.approx(stats.spearmanr(pred[seen], label_[seen]).statistic)
    assert m["pearson"] == pytest.approx(stats.pearsonr(pred[seen], label_[seen]).statistic)
    wins = sum(pred[h] > pred[lo] for h, lo in zip(high, low))
    assert m["pair_accuracy"] == pytest.approx((wins + 0.5) / 4) and m["ties"] == 1
    assert m["mse"] == pytest.approx(np.mean((pred[seen] - (label_[seen] - 1) / 4) ** 2))
    assert m["labelled_rows"] == 38
    blind = similarity_metrics(np.repeat(rng.normal(size=20), 2), np.tile([5.0, 1.0], 20),
                               np.arange(0, 40, 2), np.arange(1, 40, 2))
    # each pair scored the same under both conditions: chance pair accuracy, and no rank correlation at all
    assert blind["pair_accuracy"] == 0.5 and blind["spearman"] == pytest.approx(0.0, abs=1e-12)
    assert similarity_metrics(np.ones(4), np.array([5.0, 1, 4, 2]), high[:0], low[:0])["spearman"] is None


def test_objective_by_hand():
    cos = torch.tensor([0.9, 0.2, 0.5, 0.4], requires_grad=True)
    lab = torch.tensor([5.0, 1.0, 3.0, 4.0])
    high, low = torch.tensor([0, 3]), torch.tensor([1, 2])
    tau = 1.5
    mse = sum((c - (y - 1) / 4) ** 2 for c, y in zip([0.9, 0.2, 0.5, 0.4], [5, 1, 3, 4])) / 4
    cl = np.mean([-np.log(np.exp(a / tau) / (np.exp(a / tau) + np.exp(b / tau))) for a, b in ((0.9, 0.2), (0.4, 0.5))])
    loss = CSTSLoss(mse_weight=0.5, contrastive=True, contrastive_weight=2.0, contrastive_temperature=tau)
    assert loss(cos, lab, high, low).item() == pytest.approx(0.5 * mse + 2.0 * cl, rel=1e-6)
    off = CSTSLoss(contrastive=False)
    assert off(cos, lab, high, low).item() == pytest.approx(mse, rel=1e-6)
    loss(cos, lab, high, low).backward()
    assert cos.grad[0] < 0 and cos.grad[1] > 0  # pushes φ(c_high) up and φ(c_low) down


def test_batches_keep_each_sentence_pair_whole(tmp_path, monkeypatch):
    from kgc.csts.task import CSTSTraining
    from kgc.recipe import load_recipe

    monkeypatch.setenv("KGC_CACHE_HOME", str(tmp_path))
    recipe = load_recipe(None, ["task=csts", "data.dataset=synth-csts", "data.synth.train_pairs=50",
                                "train.batch_size=16", "train.seed=3"])
    task = CSTSTraining(recipe)
    assert task.steps_per_epoch == 7  # 50 pairs, 8 per batch
    split = task.split
    for epoch in (0, 1):
        batches = task.epoch_batches(epoch)
        assert len(batches) == 7 and sorted(np.concatenate(batches).tolist()) == list(range(100))
        for batch in batches:
            pairs = {(split.s1[i], split.s2[i]) for i in batch}
            assert len(batch) == 2 * len(pairs)  # both conditions of every pair in the batch
            assert len(split.contrast_pairs(batch)[0]) == len(pairs)
    assert [b.tolist() for b in task.epoch_batches(1)] == [b.tolist() for b in CSTSTraining(recipe).epoch_batches(1)]
    assert [b.tolist() for b in task.epoch_batches(0)] != [b.tolist() for b in task.epoch_batches(1)]


def test_compare_row_says_when_validation_also_selected_best_pt():
    """The official C-STS test labels are hidden: `kgc compare` reports validation, the split best.pt was picked
    on when the run validated — the table says so."""
    from types import SimpleNamespace

    from kgc.csts.task import CSTSTask

    run = SimpleNamespace(recipe=SimpleNamespace(data=SimpleNamespace(dataset="csts")))
    results = {"split": "validation", "spearman": 0.4, "pearson": 0.4, "pair_accuracy": 0.6}
    picked = CSTSTask.compare_row(run, results, {"best_dev_spearman": 0.41, "pairs_per_s": 10}, 1.0)
    assert picked["data"] == "csts validation (best.pt selected on it)"
    final = CSTSTask.compare_row(run, results, {"best_dev_spearman": None, "pairs_per_s": 10}, 1.0)
    assert final["data"] == "csts validation"
    test = CSTSTask.compare_row(run, {**results, "split": "test"}, {"best_dev_spearman": 0.41, "pairs_per_s": 10}, 1.0)
    assert test["data"] == "csts test"


def test_kgc_data_check_reports_a_csts_folder(tmp_path):
    """`kgc data check FOLDER` checks a C-STS folder (found by its csts_train.csv) as C-STS training reads it:
    rows, labels and sentence pairs per split, and what training would stumble on."""
    from kgc import api
    from kgc.csts.data import CSTSReport
    from tests.conftest import cli

    folder = write_official(tmp_path / "C", train=TRAIN.replace(",1.0\n", ",5\n"))  # the first pair: 5 and 5
    report = api.check_data(folder)
    assert isinstance(report, CSTSReport) and report.errors == []
    assert report.rows == {"train": 5, "validation": 2, "test": 2}
    assert report.labelled == {"train": 5, "validation": 2, "test": 0}
    assert report.pairs == {"train": 2, "validation": 1, "test": 1}
    assert (report.sentences, report.conditions) == (7, 5)
    assert report.of("warning") == [
        "csts_train.csv: 1 sentence pair(s) not under exactly two conditions (first at line 4); C-STS asks each "
        "pair twice",
        "csts_train.csv: 1 sentence pair(s) with the same label under both conditions: nothing for the "
        "contrastive term"]
    out = cli("data", "check", folder).stdout.splitlines()
    assert out[0] == f"data: {folder} (C-STS CSV: sentence1,sentence2,condition,label; csts_train.csv, " \
                     "csts_validation.csv, csts_test.csv)"
    assert out[3:6] == ["  rows               5          2          2", "  labelled           5          2          0",
                        "  pairs              2          1          1"]
    assert "warning: csts_train.csv: 1 sentence pair(s) not under exactly two conditions" in out[6]
    # leakage, a missing test split, a row training would refuse
    leak = write_official(tmp_path / "L", valid=HEADER + "Two dogs run.,Three dogs run.,The animal.,2\n"
                                                         "Two dogs run.,Three dogs run.,The action.,5\n")
    (leak / "csts_test.csv").unlink()
    found = api.check_data(leak)
    assert "validation: 1 sentence pair(s) also in train" in found.of("warning")
    assert found.of("note") == ["no csts_test.csv: `kgc evaluate` takes --split validation"]
    bad = write_official(tmp_path / "B", valid=VALID.replace(",2\n", ",7\n"))
    res = cli("data", "check", bad, check=False)
    assert res.returncode == 2 and "csts_validation.csv:2: label 7 outside 1-5" in res.stderr
    # the recipe's task decides when one is named
    res = cli("data", "check", folder, "--set", "task=linkpred", check=False)
    assert res.returncode == 2 and "not a catalog name for task linkpred" in res.stderr


def test_data_check_is_a_task_hook():
    from kgc.recipe import resolve_recipe
    from kgc.training.task import Task

    class Other(Task):  # a task without its own check says so
        name = "other"

    with pytest.raises(KGCError, match="kgc data check has no check for task other"):
        Other.check_data(resolve_recipe({}), "x")
