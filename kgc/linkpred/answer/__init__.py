"""A trained run answering questions: :mod:`~kgc.linkpred.answer.predictor` (``Predictor``: model, structural
model and α loaded once), :mod:`~kgc.linkpred.answer.entities` (``EntityIndex``: the index files, their freshness,
the search structure), :mod:`~kgc.linkpred.answer.topk` (top-k answers, one query or a batch, query files),
:mod:`~kgc.linkpred.answer.query` (``QueryOptions``), :mod:`~kgc.linkpred.answer.results` (a run's evaluation and
its one-transaction write), :mod:`~kgc.linkpred.answer.sharded` (the entities encoded in shards over processes),
:mod:`~kgc.linkpred.answer.run` (``LinkPredRun``, the run's verbs) and :mod:`~kgc.linkpred.answer.routes` (what
``kgc serve`` adds for link prediction)."""
