"""Every shipped recipe (recipes/*.yaml) validates, names itself after its file, and survives the round trip
through the copy a run saves (recipe.yaml in the run directory, re-read when it resumes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kgc.recipe import load_recipe

RECIPES = sorted((Path(__file__).resolve().parents[1] / "recipes").glob("*.yaml"))


def test_there_are_recipes_of_both_tasks():
    tasks = {load_recipe(p).task for p in RECIPES}
    assert len(RECIPES) >= 20 and tasks == {"linkpred", "csts"}


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_recipe_validates(path, tmp_path):
    from kgc.data.catalog import catalog_entry

    recipe = load_recipe(path)  # a `structure:` section is checked against PyKEEN's models here
    assert recipe.name == path.stem  # runs and compare tables are named after it
    assert f"recipes/{path.stem}.yaml" in path.read_text(encoding="utf-8").splitlines()[0]  # its usage line
    if recipe.data.path is None and recipe.data.dataset != "synth-csts":  # generated; the others: catalog names
        derived = f"data/{recipe.data.dataset} " in path.read_text(encoding="utf-8")  # its comments make it
        assert catalog_entry(recipe.data.dataset) is not None or derived, recipe.data.dataset
    if getattr(recipe, "structure", None) is not None:
        assert recipe.task == "linkpred"
    saved = tmp_path / "recipe.yaml"
    saved.write_text(recipe.to_yaml(), encoding="utf-8")
    assert load_recipe(saved, saved=True).model_dump() == recipe.model_dump()
    short = load_recipe(path, ["train.max_steps=1"])  # what `kgc train RECIPE --set …` resolves
    assert short.train.max_steps == 1 and short.model_dump(exclude={"train"}) == recipe.model_dump(exclude={"train"})


def test_profiling_sections_sum_only_while_collecting():
    """kgc.profiling: sections are free outside collect(), summed (nested ones too) inside it."""
    import time

    from kgc.profiling import collect, section

    with section("outside"):
        pass
    with collect() as parts:
        for _ in range(2):
            with section("outer"):
                with section("inner"):
                    time.sleep(0.01)
    assert set(parts) == {"outer", "inner"} and parts["outer"] >= parts["inner"] > 0  # nested: a part of its parent
    with collect() as again:
        pass
    assert dict(again) == {}
