"""A structural model beside the text model: :mod:`~kgc.linkpred.structure.pykeen` (a PyKEEN model, the fused
scorer, α chosen on dev), :mod:`~kgc.linkpred.structure.rules` (rules mined from the train graph) and
:mod:`~kgc.linkpred.structure.options` (the options both share)."""
