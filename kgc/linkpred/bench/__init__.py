"""Link prediction's benchmarks, a module for what each measures: :mod:`~kgc.linkpred.bench.speed` (``kgc bench
inference / train / loss``), :mod:`~kgc.linkpred.bench.steps` (``inputs``), :mod:`~kgc.linkpred.bench.retrieval`
(``index``), :mod:`~kgc.linkpred.bench.structure` (``rules``, ``structure``), :mod:`~kgc.linkpred.bench.precision`,
:mod:`~kgc.linkpred.bench.grail` and :mod:`~kgc.linkpred.bench.scale` (``kgc bench scale``: the whole path at sizes,
driven by :mod:`~kgc.linkpred.bench.workload`); :mod:`~kgc.linkpred.bench.commands` describes them all."""
