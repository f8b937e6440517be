"""A tracker from a plugin: each metrics row, as JSON, into ``RUN/plugin_metrics.jsonl``. Its entry point names
this module, whose import registers the class (``@TRACKERS.register``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kgc.fileio import append_line
from kgc.registry import TRACKERS
from kgc.training.trackers import Tracker


@TRACKERS.register
class CopyTracker(Tracker):
    name = "jsonl_copy"

    def log(self, record: dict[str, Any]) -> None:
        append_line(Path(self.run_dir) / "plugin_metrics.jsonl", json.dumps(record, default=str))
