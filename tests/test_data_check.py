"""`kgc data check` finds leakage: dev/test triples in train (exactly, or reversed under an inverse or symmetric
relation), duplicates, test triples also in dev, self-loops; `--strict` makes them errors. And a recipe file that
is empty, or not a mapping, is an error (it used to train silently with every default)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kgc.data.check import LEAK, check_graph, inverse_pairs
from kgc.data.formats import read_graph
from kgc.errors import KGCError
from kgc.recipe import load_recipe
from tests.conftest import cli, write_toy

# train: _part_of / _has_part are each other's inverse (part_of 6/6 reversed, has_part 6/7), _similar is symmetric
# (6/7 reversed), _likes is a plain chain (nothing reversed); one triple twice more, one self-loop
TRAIN = ([(f"a{i}", "_part_of", f"b{i}") for i in range(6)] + [(f"b{i}", "_has_part", f"a{i}") for i in range(6)]
         + [("b6", "_has_part", "a6")]
         + [(f"c{i}", "_similar", f"d{i}") for i in range(3)] + [(f"d{i}", "_similar", f"c{i}") for i in range(3)]
         + [("c3", "_similar", "d3")]
         + [(f"e{i}", "_likes", f"e{i + 1}") for i in range(6)]
         + [("e0", "_likes", "e1"), ("e0", "_likes", "e1")]  # two repeats
         + [("e6", "_likes", "e6")])  # a self-loop
DEV = [("e2", "_likes", "e3"),  # exactly in train
       ("a6", "_part_of", "b6"),  # its reverse (b6, _has_part, a6) is in train
       ("e3", "_likes", "e5")]  # clean
TEST = [("d3", "_similar", "c3"),  # its reverse is in train under the same (symmetric) relation
        ("e4", "_likes", "e0"), ("e4", "_likes", "e0"),  # a repeat
        ("e3", "_likes", "e5"),  # also in dev
        ("e5", "_likes", "e5")]  # a self-loop


def write_graph(folder: Path, train=TRAIN, dev=DEV, test=TEST) -> Path:
    folder.mkdir(parents=True)
    entities = sorted({e for rows in (train, dev, test) for h, _, t in rows for e in (h, t)})
    (folder / "entity2text.txt").write_text("".join(f"id_{e}\t{e}, the thing {e}\n" for e in entities))
    relations = sorted({r for rows in (train, dev, test) for _, r, _ in rows})
    (folder / "relation2text.txt").write_text("".join(f"{r}\t{r.strip('_').replace('_', ' ')}\n" for r in relations))
    for name, rows in (("train", train), ("dev", dev), ("test", test)):
        (folder / f"{name}.tsv").write_text("".join(f"id_{h}\t{r}\tid_{t}\n" for h, r, t in rows))
    return folder


def leaks(folder: Path) -> list[str]:
    return [f.text for f in check_graph(read_graph(folder)).findings if f.kind == LEAK]


def test_planted_leaks_are_counted_with_examples(tmp_path):
    found = leaks(write_graph(tmp_path / "LEAKY"))
    assert len(found) == 6, found
    exact, dev_inverse, test_symmetric, dupes, in_dev, loops = found
    assert exact == ("1 dev triple(s) (33.3% of dev) also occur in train, exactly: they test memory, not inference "
                     "(e.g. (e2, _likes, e3))")
    assert dev_inverse.startswith("1 dev triple(s) (33.3% of dev) have their reverse in train under an inverse "
                                  "relation")
    assert "1 relation pair(s): _part_of ↔ _has_part: 1 (6/6 of train reversed)" in dev_inverse
    assert "(e.g. (a6, _part_of, b6) ← (b6, _has_part, a6))" in dev_inverse
    assert test_symmetric.startswith("1 test triple(s) (20.0% of test) have their reverse in train")
    assert "_similar (symmetric): 1 (6/7 of train reversed)" in test_symmetric
    assert "(d3, _similar, c3) ← (c3, _similar, d3)" in test_symmetric
    assert dupes.startswith("duplicate triples (repeats of a triple within its split): train 2, dev 0, test 1 "
                            "(e.g. (e0, _likes, e1))")
    assert in_dev == "1 test triple(s) (20.0% of test) also occur in dev (e.g. (e3, _likes, e5))"
    assert loops == "self-loops (head = tail): train 1, dev 0, test 1 (e.g. (e6, _likes, e6))"


def test_inverse_pairs_need_the_share_and_the_support():
    E, R = 20, 3
    sym = [(i, 0, i + 1) for i in range(0, 8, 2)] + [(i + 1, 0, i) for i in range(0, 8, 2)]  # 8 triples, all reversed
    few = [(10, 1, 11), (11, 1, 10)]  # symmetric, but 2 triples: too few to tell
    half = [(i, 2, i + 1) for i in range(12, 18)] + [(13, 2, 12), (15, 2, 14)]  # 8 triples, 4 reversed: 50%
    train = np.array(sym + few + half + [(5, 0, 5)])  # a self-loop is not a reversal
    assert inverse_pairs(train, E, R) == [(0, 0, 8, 8)]
    assert inverse_pairs(train, E, R, support=2) == [(0, 0, 8, 8), (1, 1, 2, 2)]
    assert inverse_pairs(train, E, R, share=0.5) == [(0, 0, 8, 8), (2, 2, 4, 8)]


def test_a_clean_graph_has_no_leakage_and_strict_changes_nothing(tmp_path):
    toy = write_toy(tmp_path / "TOY")
    assert leaks(toy) == []
    report = check_graph(read_graph(toy))
    assert report.strict().findings == report.findings
    found = leaks(write_graph(tmp_path / "CLEAN_SPLITS", dev=[("e4", "_likes", "e0")], test=[("e3", "_likes", "e5")]))
    assert [t.split(" (e.g.")[0] for t in found] == [  # what is left is train's own
        "duplicate triples (repeats of a triple within its split): train 2, dev 0, test 0",
        "self-loops (head = tail): train 1, dev 0, test 0"]


def test_cli_warns_and_strict_exits_2(tmp_path):
    folder = write_graph(tmp_path / "LEAKY")
    res = cli("data", "check", folder)
    assert res.exit_code == 0
    assert "warning: 1 dev triple(s) (33.3% of dev) also occur in train, exactly" in res.stdout
    assert "warning: self-loops (head = tail): train 1, dev 0, test 1" in res.stdout
    res = cli("data", "check", folder, "--strict", check=False)
    assert res.exit_code == 2, res
    assert "error: 1 dev triple(s) (33.3% of dev) also occur in train, exactly" in res.stdout
    assert "error: duplicate triples" in res.stdout and "warning: duplicate" not in res.stdout
    assert "6 error(s) above" in res.stderr and "--strict" in res.stderr
    assert cli("data", "check", write_toy(tmp_path / "TOY"), "--strict").exit_code == 0


@pytest.mark.parametrize("text, what", [("", "an empty recipe"), ("# only a comment\n", "an empty recipe"),
                                        ("- data\n- model\n", "not a list"), ("umls\n", "not a string")])
def test_an_empty_or_unmapped_recipe_is_an_error(tmp_path, text, what):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    with pytest.raises(KGCError, match=rf"r\.yaml: .*{what}.*recipes/\*\.yaml: copy one"):
        load_recipe(recipe)
    assert load_recipe(None).train.epochs > 0  # no file: the defaults, as `load_recipe(None)` always gave
