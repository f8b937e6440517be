"""Conditioners, by registry name. Importing this package registers the built-in ones."""

from kgc.conditioning.base import CONDITIONERS, Conditioner, build_conditioner, register
from kgc.conditioning.biencoder import BiEncoder

__all__ = ["CONDITIONERS", "BiEncoder", "Conditioner", "build_conditioner", "register"]
