"""kgc — knowledge-graph completion with text encoders (SimKGC pipeline, swappable conditioning core)."""

__version__ = "0.1.0"
