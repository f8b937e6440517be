"""Link prediction's benchmarks: :mod:`~kgc.linkpred.bench.speed` (``kgc bench inference / train / loss / inputs /
rules / structure / index``) and :mod:`~kgc.linkpred.bench.scale` (``kgc bench scale``: the whole path at sizes)."""
