"""kgc — knowledge-graph completion with text encoders (SimKGC pipeline, swappable conditioning core).

The Python API (the CLI answers the same questions)::

    import kgc
    run = kgc.train("recipes/umls_biencoder.yaml", train__max_steps=10)   # or kgc.load(RUN_DIR)
    run.evaluate()                     # PyKEEN's results dict (results.json)
    run.predict("virus", "causes")     # DataFrame: rank, entity, text, score

The tools are ``kgc.api.export`` / ``compare`` / ``explain`` / ``bench``. ``kgc.train`` / ``kgc.load`` return the
task's run class — :class:`LinkPredRun` or :class:`CSTSRun`, both a
:class:`Run`. Nothing heavy loads at import (torch, transformers and pykeen load on first use), so
``import kgc`` stays fast.
"""

from kgc import api
from kgc.api import load, resolve_recipe, resume, train
from kgc.errors import KGCError

__version__ = "0.1.0"
__all__ = ["Answers", "CSTSRun", "KGCError", "LinkPredRun", "Run", "api", "load", "resolve_recipe", "resume", "train",
           "__version__"]

def __getattr__(name: str):
    """The run classes, imported on first use (they bring torch): :class:`Run`, and each task's own names
    (:meth:`kgc.training.task.Task.public_names`: ``LinkPredRun``, ``Answers``, ``CSTSRun``)."""
    if name == "Run":
        from kgc.training.run import Run

        return Run
    if not name.startswith("_"):
        from kgc.training.task import public_name

        found = public_name(name)
        if found is not None:
            return found
    raise AttributeError(f"module 'kgc' has no attribute {name!r}")
