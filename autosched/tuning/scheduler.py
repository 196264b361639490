"""Task scheduling: which task gets the next batch when a device comes free.

One scheduler, several policies. A policy sees each task's progress (trials wanted,
measured, in flight; the best latency after each batch) and picks among the tasks
that the free device can run and that still have trials left. The job runner owns
the progress and tells it what happened; the policy only chooses.

- :class:`FairShare`: the task furthest behind its own trial count goes next, so every
  task reaches the same fraction of its trials at about the same time (a farm job).
- :class:`Gradient`: spend trials where the end-to-end time falls most (Ansor's
  gradient, as MetaSchedule's gradient-based scheduler does it): weight x the task's
  latency and its recent improvement, after a minimum number of trials for every
  task, with a share of random picks so no task starves (a whole model).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from autosched.errors import InvalidInputError


@dataclass
class TaskProgress:
    """What the scheduler knows about one task."""

    trials: int
    weight: float = 1.0
    done: int = 0
    in_flight: int = 0
    # (trials measured, best latency in seconds) after each batch that had a valid record.
    curve: list[tuple[int, float]] = field(default_factory=list)

    @property
    def left(self) -> int:
        return max(0, self.trials - self.done - self.in_flight)

    @property
    def best_s(self) -> float | None:
        return self.curve[-1][1] if self.curve else None

    def start(self, n: int) -> None:
        """A batch of ``n`` configs was handed to a device."""
        self.in_flight += n

    def finish(self, n: int, best_latency_s: float | None) -> None:
        """A batch of ``n`` configs came back; ``best_latency_s`` is its fastest valid one."""
        self.in_flight = max(0, self.in_flight - n)
        self.done += n
        best = self.best_s
        if best_latency_s is not None and (best is None or best_latency_s < best):
            best = best_latency_s
        if best is not None:
            self.curve.append((self.done, best))


class TaskScheduler(Protocol):
    def next_task(self, tasks: Sequence[TaskProgress], eligible: Sequence[int]) -> int | None:
        """The index of the task that gets the next batch, among ``eligible`` (each with
        trials left); ``None`` when ``eligible`` is empty or the policy's budget is spent."""
        ...

    def room(self, tasks: Sequence[TaskProgress], chosen: int | None = None) -> int | None:
        """Trials the policy still allows in all, or to task ``chosen``'s next batch
        (None: only the tasks' own counts limit)."""
        ...


class FairShare:
    """The eligible task with the smallest share of its trials measured or in flight."""

    def room(self, tasks: Sequence[TaskProgress], chosen: int | None = None) -> int | None:
        return None

    def next_task(self, tasks: Sequence[TaskProgress], eligible: Sequence[int]) -> int | None:
        if not eligible:
            return None
        return min(
            eligible, key=lambda i: ((tasks[i].done + tasks[i].in_flight) / tasks[i].trials, i)
        )


class Gradient:
    """Ansor's task gradient: the task whose next trials should cut the weighted latency most.

    For task i with weight w (how often the model runs it), best latency g after t trials,
    the expected gain per trial is ``w * (alpha * backward + (1 - alpha) * forward)``:
    ``backward`` is how fast g fell over the last ``window`` batches, ``forward`` the
    optimistic ``g / t`` (the next trials could improve as much as the average trial so
    far did). Every task first gets ``min_trials``; a task with no valid record yet has
    an unknown latency and goes first; ``explore`` is the share of picks made at random.

    Args:
        alpha: weight of the observed recent improvement against the optimistic estimate.
        window: batches the backward difference spans.
        min_trials: trials every task gets before gradients decide (default: one batch).
        explore: probability of a uniformly random pick among the eligible tasks.
        rng: randomness for the exploration picks (seed it for a reproducible job).
        budget: trials in all, shared out among the tasks (a whole model's ``--trials``),
            the trials the records already hold for them included (a rerun tops up to
            it, as a rerun of ``autosched tune`` does); None: each task's own trial
            count is the only limit.
    """

    def __init__(
        self,
        *,
        alpha: float = 0.2,
        window: int = 3,
        min_trials: int = 16,
        explore: float = 0.05,
        rng: np.random.Generator | None = None,
        budget: int | None = None,
    ) -> None:
        if not 0.0 <= alpha <= 1.0:
            raise InvalidInputError(f"alpha={alpha!r} is not valid; accepted: 0 <= alpha <= 1")
        if window < 1 or min_trials < 0:
            raise InvalidInputError("window must be >= 1 and min_trials >= 0")
        if not 0.0 <= explore < 1.0:
            raise InvalidInputError(f"explore={explore!r} is not valid; accepted: 0 <= explore < 1")
        self.alpha = alpha
        self.window = window
        self.min_trials = min_trials
        self.explore = explore
        self.rng = rng or np.random.default_rng(0)
        if budget is not None and budget < 1:
            raise InvalidInputError(f"budget={budget!r} is not valid; accepted: an integer >= 1")
        self.budget = budget

    def room(self, tasks: Sequence[TaskProgress], chosen: int | None = None) -> int | None:
        """Trials left of the budget; for task ``chosen``, less what the other tasks still
        need to reach their minimum (so every task gets it while the budget allows)."""
        if self.budget is None:
            return None
        left = max(0, self.budget - sum(t.done + t.in_flight for t in tasks))
        if chosen is None:
            return left
        reserved = sum(
            max(0, self.min_trials - t.done - t.in_flight)
            for i, t in enumerate(tasks)
            if i != chosen
        )
        return max(1, left - reserved) if left else 0

    def gradient(self, task: TaskProgress) -> float:
        """Expected fall of the weighted latency per trial (seconds per trial; larger first)."""
        best = task.best_s
        if best is None:
            return math.inf
        done = max(task.done, 1)
        forward = best / done
        backward = 0.0
        if len(task.curve) > self.window:
            then_done, then_best = task.curve[-1 - self.window]
            span = max(task.curve[-1][0] - then_done, 1)
            backward = (then_best - best) / span
        return task.weight * (self.alpha * backward + (1.0 - self.alpha) * forward)

    def next_task(self, tasks: Sequence[TaskProgress], eligible: Sequence[int]) -> int | None:
        if not eligible or self.room(tasks) == 0:
            return None
        warming = [i for i in eligible if tasks[i].done + tasks[i].in_flight < self.min_trials]
        if warming:
            return min(warming, key=lambda i: (tasks[i].done + tasks[i].in_flight, i))
        if self.explore and self.rng.random() < self.explore:
            return int(eligible[int(self.rng.integers(len(eligible)))])
        return max(eligible, key=lambda i: (self.gradient(tasks[i]), -i))


def make_policy(name: str, *, seed: int = 0, batch: int = 16) -> TaskScheduler:
    """``fair`` or ``gradient`` (its minimum per task: one batch)."""
    if name == "fair":
        return FairShare()
    if name == "gradient":
        return Gradient(min_trials=batch, rng=np.random.default_rng([seed, 0x7A5C]))
    raise InvalidInputError(f"unknown task policy {name!r}; accepted: fair, gradient")
