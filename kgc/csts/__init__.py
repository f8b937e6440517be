"""Conditional sentence similarity (C-STS) on the conditioning core: data (official CSVs, the synthetic set),
model, objective, training, evaluation, scoring new pairs, and the run-level verbs (:mod:`kgc.csts.run`).

Importing the package registers the task (:class:`kgc.csts.task.CSTSTask`) in ``kgc.registry.TASKS``.
"""

from kgc.csts.task import CSTSTask
from kgc.registry import TASKS

TASKS.register(CSTSTask)
