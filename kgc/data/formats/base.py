"""What a graph format is: a reader of one folder layout into a :class:`~kgc.data.graph.KnowledgeGraph`."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from kgc.data.graph import KnowledgeGraph


class GraphFormat:
    """One folder layout of a knowledge graph, registered in :data:`kgc.registry.GRAPH_FORMATS` (built-ins:
    :mod:`kgc.data.formats.kgbert`, :mod:`kgc.data.formats.label_tsv`; a plugin's through the ``kgc.graph_formats``
    entry point group).

    A folder is read by the format of lowest ``rank`` that :meth:`recognises` it; ``markers`` are the files whose
    presence says a folder holds a graph of this format (:meth:`recognises` asks for any of them, and
    ``kgc.data.formats.markers`` tells the dataset finder and the catalog what a dataset folder holds); ``files``
    are every file it reads (``kgc data check`` lists those present). :meth:`read` returns the graph, with every
    fallback it took in ``graph.notes`` and ``layout`` its ``title``; a file it cannot read is one KGCError
    naming the file and line (read them through :mod:`kgc.data.formats.lines` and, for triples,
    :mod:`kgc.data.formats.triples`)."""

    name: ClassVar[str]
    title: ClassVar[str]  # how kgc data check and kgc train name the layout
    rank: ClassVar[int] = 50
    markers: ClassVar[tuple[str, ...]] = ()
    files: ClassVar[tuple[str, ...]] = ()

    def recognises(self, folder: Path) -> bool:
        return any((folder / marker).exists() for marker in self.markers)

    def read(self, folder: Path, *, long_text: bool, optional_splits: tuple[str, ...]) -> KnowledgeGraph:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<graph format {self.name}>"
