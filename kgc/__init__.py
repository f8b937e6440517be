"""kgc — knowledge-graph completion with text encoders (SimKGC pipeline, swappable conditioning core).

The Python API (the CLI answers the same questions)::

    import kgc
    run = kgc.train("recipes/umls_biencoder.yaml", train__max_steps=10)   # or kgc.load(RUN_DIR)
    run.evaluate()                     # PyKEEN's results dict (results.json)
    run.predict("virus", "causes")     # DataFrame: rank, entity, text, score

``kgc.api`` imports nothing heavy at module level (torch, transformers and pykeen load on first use), so
``import kgc`` stays fast.
"""

from kgc.api import Answers, Run, load, resolve_recipe, resume, train
from kgc.errors import KGCError

__version__ = "0.1.0"
__all__ = ["Answers", "KGCError", "Run", "load", "resolve_recipe", "resume", "train", "__version__"]
