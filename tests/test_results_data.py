"""Results as data (issue 53): each recipe's ``measured:`` block is where its figures live. Its page shows each one,
``kgc recipes list`` prints them, no ``about:`` line restates one, and a README results row or a docs/choosing.md
row that names a recipe and links the page of one of its figures gives that figure — so a figure changed in one
place and not the others fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kgc.families import Measured, families, read_header

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
TABLES = [ROOT / "README.md", ROOT / "docs" / "choosing.md"]  # the pages whose rows say what a recipe reaches


def measured() -> dict[str, list[Measured]]:
    return {p.stem: read_header(p)["measured"] for p in RECIPES}


def shows(text: str, value: str) -> bool:
    """Whether ``value`` stands in ``text`` as a figure of its own (0.336 is not in 0.3360 or 10.336)."""
    return re.search(rf"(?<![\d.]){re.escape(value)}(?![\d])", text) is not None


def test_every_figure_is_on_its_page():
    missing = [f"{name}: {m.metric} {m.value} is not on {m.page}" for name, ms in measured().items() for m in ms
               if not (ROOT / m.page).is_file() or not shows((ROOT / m.page).read_text(encoding="utf-8"), m.value)]
    assert not missing, "\n".join(missing)
    assert sum(map(len, measured().values())) >= 40  # the shipped recipes' figures are all here


def test_no_about_line_restates_a_figure():
    restated = [f"{p.name}: {read_header(p)['about']}" for p in RECIPES
                if re.search(r"\d\.\d{3}", read_header(p)["about"])]
    assert not restated, "figures belong in measured:, not in about:\n" + "\n".join(restated)


def _rows(page: Path) -> list[str]:
    return [line for line in page.read_text(encoding="utf-8").splitlines()
            if line.startswith("|") and not set(line) <= set("|-: ")]


def _linked_pages(page: Path, row: str) -> set[str]:
    """The repository paths of the pages a row links (anchors dropped)."""
    out = set()
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", row):
        if not target.startswith("http"):
            out.add((page.parent / target).resolve().relative_to(ROOT).as_posix())
    return out


def _named_recipes(row: str) -> set[str]:
    """Recipes a row names as they are (``recipes/NAME.yaml`` in a code span without ``--set``: an override
    measures something else)."""
    return {name for span in re.findall(r"`([^`]*)`", row) if "--set" not in span
            for name in re.findall(r"recipes/([A-Za-z0-9_]+)\.yaml", span)}


def drift(page: Path, rows: list[str], figures: dict[str, list[Measured]]) -> tuple[list[str], int]:
    """(the rows that name a recipe and link its figure's page without giving the figure, checks made): for each
    recipe a row names, the first figure measured for each page the row links."""
    found, checks = [], 0
    for row in rows:
        pages = _linked_pages(page, row)
        for name in sorted(_named_recipes(row) & set(figures)):
            for target in sorted(pages):
                first = next((m for m in figures[name] if m.page == target), None)
                if first is None:
                    continue
                checks += 1
                if not shows(row, first.value):
                    found.append(f"{page.relative_to(ROOT)}: the row of {name} links {target} but does not give its "
                                 f"{first.split} {first.metric} {first.value} (recipes/{name}.yaml measured:):\n"
                                 f"  {row[:160]}")
    return found, checks


def test_the_readme_and_the_chooser_agree_with_the_recipes():
    figures, problems, checks = measured(), [], 0
    for page in TABLES:
        found, n = drift(page, _rows(page), figures)
        problems += found
        checks += n
    assert not problems, "\n".join(problems)
    assert checks >= 12, checks  # the rows that name a recipe and its page: each checked


def test_the_check_sees_a_changed_figure():
    m = Measured(split="test", metric="MRR", value="0.6961", hardware="2 CPU cores", budget="one epoch",
                 page="docs/results/umls.md")
    page = ROOT / "README.md"
    row = "| UMLS | `recipes/umls_biencoder.yaml` | test MRR {} | [UMLS](docs/results/umls.md) |"
    assert drift(page, [row.format("0.6961")], {"umls_biencoder": [m]}) == ([], 1)
    assert len(drift(page, [row.format("0.6960")], {"umls_biencoder": [m]})[0]) == 1
    assert len(drift(page, [row.format("0.69610")], {"umls_biencoder": [m]})[0]) == 1
    overridden = "| UMLS | `kgc train recipes/umls_biencoder.yaml --set train.epochs=2` | test MRR 0.7 | [x](docs/results/umls.md) |"
    assert drift(page, [overridden], {"umls_biencoder": [m]}) == ([], 0)


def test_recipes_list_prints_the_measured_figures():
    import json

    from tests.conftest import cli

    res = cli("recipes", "list")
    lines = {line.split()[0]: line for line in res.stdout.splitlines() if line.strip()}
    assert "test MRR 0.6961, H@10 0.8979 [2 CPU cores" in lines["umls_biencoder"]
    assert "test MRR 0.4411, H@10 0.6744 [NVIDIA H200" in lines["wn18rr_biencoder"]
    assert lines["fb15k237_biencoder"].endswith("test MRR 0.336 [SimKGC's paper, 10 epochs]")
    as_json = {f["name"]: f for f in json.loads(cli("recipes", "list", "--json").stdout)}
    assert as_json["umls_biencoder"]["measured"][0] == {
        "split": "test", "metric": "MRR", "value": "0.6961", "hardware": "2 CPU cores",
        "budget": "one epoch (10,432 triple-directions)", "page": "docs/results/umls.md", "source": "kgc", "note": "",
        "command": "kgc train recipes/umls_biencoder.yaml --out runs/quickstart && kgc evaluate runs/quickstart"}


@pytest.mark.parametrize("block, message", [
    ("measured: 0.5", "a list of figures"),
    ("measured:\n  - {split: test, metric: MRR, value: 0.5, hardware: x, budget: y, page: z}", "write the figure as text"),
    ("measured:\n  - {split: test, metric: MRR, value: \"0.5\", hardware: x, page: z}", "missing budget"),
    ("measured:\n  - {split: test, metric: MRR, value: \"0.5\", hardware: x, budget: y, page: z, when: now}",
     "unknown key(s) when"),
])
def test_a_bad_measured_block_is_one_message(tmp_path, block, message):
    from kgc.errors import KGCError
    from kgc.families import load_tree

    path = tmp_path / "r.yaml"
    path.write_text(f"{block}\ntask: linkpred\n", encoding="utf-8")
    with pytest.raises(KGCError, match=re.escape(message)) as err:
        load_tree(path)
    assert str(path) in str(err.value)


def test_a_child_does_not_inherit_its_roots_figures():
    entries = {v.name: v for f in families() for v in [f.root, *f.variants]}
    assert entries["wn18rr_cpu_hadamard"].measured[0].value == "0.1072"
    assert all(m.value != "0.1139" for m in entries["wn18rr_cpu_hadamard"].measured)


def recipes_named(command: str) -> set[str]:
    """The shipped recipes a command runs: each ``recipes/X.yaml`` in it, braces (``umls_{a,b}``) and globs
    (``wn18rr_cpu_*``) expanded against the folder."""
    out = set()
    for token in re.findall(r"recipes/([A-Za-z0-9_*{},]+)\.yaml", command):
        braces = re.match(r"(.*)\{([^}]*)\}(.*)", token)
        for variant in ([braces.group(1) + x + braces.group(3) for x in braces.group(2).split(",")] if braces
                        else [token]):
            out |= {p.stem for p in (ROOT / "recipes").glob(variant + ".yaml")}
    return out


def own_figure_problems(figures: dict[str, list[Measured]]) -> list[str]:
    return [f"{name}: {m.metric} {m.value} " + (f"was measured by `{m.command}`, which does not run recipes/{name}.yaml"
                                               if m.command else "names no command (measured: ... command: \"...\")")
            for name, ms in figures.items() for m in ms
            if m.source == "kgc" and (not m.command or name not in recipes_named(m.command))]


def test_every_figure_was_measured_with_its_own_recipe():
    """Each of kgc's figures names the exact command that produced it, and that command runs this recipe's file: a
    figure measured with another recipe (`wn18rr_laptop.yaml --set model.conditioner=concat` under wn18rr_concat)
    does not belong under this one in `kgc recipes list`."""
    problems = own_figure_problems(measured())
    assert not problems, "\n".join(problems)
    assert sum(bool(m.command) for ms in measured().values() for m in ms) >= 38  # every kgc figure of the recipes


def test_the_own_figure_check_sees_another_recipes_figure():
    m = Measured(split="test", metric="MRR", value="0.2284", hardware="2 CPU cores", budget="the laptop table's",
                 page="docs/results/wn18rr.md",
                 command="kgc compare recipes/wn18rr_laptop.yaml --set model.conditioner=concat --out runs/t")
    assert len(own_figure_problems({"wn18rr_concat": [m]})) == 1
    assert own_figure_problems({"wn18rr_laptop": [m]}) == []
    assert recipes_named("kgc compare recipes/umls_{biencoder,concat}.yaml") == {"umls_biencoder", "umls_concat"}
    assert "wn18rr_cpu_case" in recipes_named("kgc compare recipes/wn18rr_cpu_*.yaml --out x")
