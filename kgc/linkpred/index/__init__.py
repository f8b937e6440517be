"""The entity index's files and types: :mod:`~kgc.linkpred.index.store` (build, freshness, search parameters,
appending), :mod:`~kgc.linkpred.index.types` (one class per index type, registered in ``kgc.registry.INDEX_TYPES``)
and :mod:`~kgc.linkpred.index.added` (entities added without retraining). The run's index as one object is
:class:`kgc.linkpred.answer.entities.EntityIndex`."""
