"""Conditioners, by registry name. Importing this package registers the built-in ones."""

from kgc.conditioning.base import CONDITIONERS, Conditioner, Explained, build_conditioner, register
from kgc.conditioning.biencoder import BiEncoder
from kgc.conditioning.case import Case
from kgc.conditioning.pooled import Concat, Hadamard, HyperNet
from kgc.conditioning.router import Router

__all__ = ["CONDITIONERS", "BiEncoder", "Case", "Concat", "Conditioner", "Explained", "Hadamard", "HyperNet",
           "Router", "build_conditioner", "register"]
