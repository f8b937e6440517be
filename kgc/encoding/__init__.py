"""Encoders: backbone resolution/loading, pooling, normalisation."""

from kgc.encoding.backbone import TextEncoder, load_backbone, load_tokenizer, resolve_backbone

__all__ = ["TextEncoder", "load_backbone", "load_tokenizer", "resolve_backbone"]
