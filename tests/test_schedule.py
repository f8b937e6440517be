"""The learning-rate schedule: linear warm-up and decay, and ``train.schedule: minutes`` fitting its end to the
minutes left at the pace measured (hand-computed values)."""

from __future__ import annotations

import pytest
import torch

from kgc.training.common import fit_schedule, linear_schedule


def _lrs(scheduler, optimizer, steps: int) -> list[float]:
    out = []
    for _ in range(steps):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def test_linear_schedule_and_its_refit():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = linear_schedule(opt, warmup=4, total=104)
    assert _lrs(sched, opt, 6) == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 0.99])  # (104 - 5) / 100
    # 6 steps done at 2 s each, 30 s left: the end moves to step 6 + 15 = 21, warm-up to 21 // 10 = 2 steps
    assert fit_schedule(sched, step=6, seconds_per_step=2.0, seconds_left=30.0, warmup=4, most=1000) == 21
    assert sched.span == {"total": 21, "warmup": 2}
    # the lr already set for step 6 stays (0.98); from step 7 on it follows the new line
    assert _lrs(sched, opt, 16) == pytest.approx([0.98] + [(21 - s) / 19 for s in range(7, 21)] + [0.0])
    # bounded by the steps the epochs allow, and always at least one more step
    assert fit_schedule(sched, step=6, seconds_per_step=0.001, seconds_left=60.0, warmup=4, most=50) == 50
    assert fit_schedule(sched, step=6, seconds_per_step=5.0, seconds_left=-3.0, warmup=4, most=50) == 7


def test_a_schedule_in_minutes_needs_the_minutes():
    from kgc.recipe import TrainConfig

    assert TrainConfig(schedule="minutes", max_minutes=5).schedule == "minutes"
    with pytest.raises(ValueError, match="train.schedule=minutes fits the decay to train.max_minutes"):
        TrainConfig(schedule="minutes")
