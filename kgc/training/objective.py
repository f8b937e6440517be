"""The objective a task's :meth:`~kgc.training.task.Training.make_loss` returns: a module whose ``forward`` the
task's ``batch_loss`` calls, and which owns what the training loop asks of an objective besides its parameters.

* :meth:`Objective.after_step` — after every optimiser step (SimKGC's loss keeps its learnt τ within bounds);
* :meth:`Objective.figures` — figures logged beside the loss on the steps that log (``tau``); reading one may wait
  for the device, so the loop asks only on those steps;
* :meth:`Objective.extra_state` / :meth:`Objective.load_extra_state` — training state that is not a parameter
  (SimKGC's pre-batch queue, the entity table of negatives), saved in ``checkpoints/last.pt`` as ``loss_extra``;
* :meth:`Objective.probing` — a context in which a forward may run before the first step's preparation (the
  precision probe of ``train.amp: auto`` times a step before training starts): SimKGC's loss then scores a
  random stand-in of its entity table, of the table's shape, where the first step has not set the table yet.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import nn


class Objective(nn.Module):
    """Base of the tasks' losses: the hooks above, each a no-op by default."""

    def after_step(self) -> None:
        """After every optimiser step."""

    def figures(self) -> dict[str, float]:
        """Figures logged beside the loss (read only on the steps that log)."""
        return {}

    def extra_state(self) -> Any:
        """State a resumed run needs that ``state_dict()`` does not hold (None: none)."""
        return None

    def load_extra_state(self, state: Any, device: torch.device) -> None:
        """Restore :meth:`extra_state` (``state`` None: a checkpoint without it)."""

    @contextlib.contextmanager
    def probing(self) -> Iterator[None]:
        """A forward inside runs before the first step's preparation (:meth:`~kgc.training.task.Training.before_step`):
        the objective makes do without what that sets (a stand-in of its shape). Default: nothing to make do for."""
        yield
