"""The filtered ranking protocol and what feeds it: :mod:`~kgc.linkpred.evaluation.ranking` (the protocol alone,
into PyKEEN's evaluator), :mod:`~kgc.linkpred.evaluation.scoring` (an evaluation: states once, query vectors, a
scorer) and :mod:`~kgc.linkpred.evaluation.inductive` (the graph of an inductive evaluation). A run's evaluation
(text, re-ranked, fused) is :mod:`kgc.linkpred.answer.results`."""
