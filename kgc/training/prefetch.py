"""Step n+1's inputs built while step n runs: a background thread, a short queue.

On a GPU a training step is kernels the host queues and the card runs; whatever the host does between two steps —
token rows from the text bank, padding, distinct rows, pinning — the card waits for, unless it is done while the
previous step's kernels run. :class:`Prefetcher` runs ``make`` (the task's :meth:`~kgc.training.task.Training.prepare`)
over the epoch's batches in one daemon thread, ``depth`` batches ahead. The work is NumPy and small torch CPU
operations (most of it outside the GIL); it never touches the device but for page-locked host memory.

The batches and their order are the epoch's, exactly: the prefetched path trains on the same inputs as the plain
one (``tests/test_step_inputs.py``). An exception in the thread is raised in the loop at the batch it belongs to;
:meth:`Prefetcher.close` (at a ``break``, or when the loop fails) stops the thread without waiting for the rest.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterable, Iterator

_END = object()


class Prefetcher:
    """``make(item)`` for each item of ``source``, in order, computed ``depth`` ahead in a background thread;
    ``enabled=False``: computed when asked, in the caller's thread (the same results)."""

    def __init__(self, source: Iterable[Any], make: Callable[[Any], Any], *, depth: int = 2,
                 enabled: bool = True) -> None:
        self.source, self.make, self.enabled = source, make, enabled
        self.queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None
        if enabled:
            self.thread = threading.Thread(target=self._work, name="kgc-prefetch", daemon=True)
            self.thread.start()

    def _put(self, item: Any) -> bool:
        while not self.stopped.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _work(self) -> None:
        try:
            for item in self.source:
                if self.stopped.is_set() or not self._put((self.make(item), None)):
                    return
        except BaseException as exc:  # noqa: BLE001 — handed to the loop, raised there
            self._put((None, exc))
            return
        self._put((_END, None))

    def __iter__(self) -> Iterator[Any]:
        if not self.enabled:
            for item in self.source:
                yield self.make(item)
            return
        while True:
            value, error = self.queue.get()
            if error is not None:
                raise error
            if value is _END:
                return
            yield value

    def close(self) -> None:
        """Stop the thread (it finishes the batch in hand, then ends) and drop what it built."""
        self.stopped.set()
        if self.thread is not None:
            while self.thread.is_alive():
                try:
                    self.queue.get(timeout=0.05)
                except queue.Empty:
                    pass
            self.thread = None

    def __enter__(self) -> "Prefetcher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
