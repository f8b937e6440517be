"""The wheel carries the shipped recipes and examples (pyproject.toml holds everything else).

The checkout keeps its layout — ``recipes/`` and ``data/examples/`` at the top, where ``kgc recipes`` reads them in
an editable install — and a built wheel (or an install from a source tree) gets a copy of both inside the package,
``kgc/_shipped/recipes`` and ``kgc/_shipped/data/examples``: the same relative places, so ``capitals.yaml``'s
``data.path: ../data/examples/capitals`` resolves inside the installed package as it does in the checkout
(``kgc.families.recipe_folder`` finds them)."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED = ("recipes", "data/examples")  # copied to kgc/_shipped/<the same path>


class BuildPyWithRecipes(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):  # an editable install reads the checkout's own folders
            return
        for folder in SHIPPED:
            target = Path(self.build_lib) / "kgc" / "_shipped" / folder
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(ROOT / folder, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(cmdclass={"build_py": BuildPyWithRecipes})
