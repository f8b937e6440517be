"""Link prediction: model (query + tail towers), SimKGC loss, the ranking protocol, evaluation, the entity index
and added entities, structure fusion, and the run-level verbs (:mod:`kgc.linkpred.answer.run`).

Importing the package registers the task (:class:`kgc.linkpred.task.LinkPredTask`) in ``kgc.registry.TASKS``.
"""

from kgc.linkpred.task import LinkPredTask
from kgc.registry import TASKS

TASKS.register(LinkPredTask)
