"""Conditional sentence similarity (C-STS) on the conditioning core: data (official CSVs, the synthetic set),
model, objective, training, evaluation, scoring new pairs."""
