"""The search lifecycle: propose a batch, observe its measurements, repeat.

A strategy never measures anything itself. The tuner asks ``propose(n)`` for up to
``n`` configs not measured before, measures them, and hands every resulting record
to ``observe``. ``propose`` returns None once the strategy has nothing new to offer.
Records observed before the first proposal are history (a resumed run, or other
shapes of the same operator on the same device): strategies may learn from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from autosched.records.record import Record
from autosched.space.config import Config
from autosched.space.space import Space

# Draws in a row that bring nothing unseen before a space counts as exhausted. One is
# not enough: a resumed run with the same seed draws what the run before it drew, and
# the first draws of a run resumed a few times are all measured already.
MISSES = 8


class SearchStrategy(Protocol):
    name: str

    def propose(self, n: int) -> list[Config] | None:
        """Up to ``n`` new valid configs, or None when the strategy is exhausted."""
        ...

    def observe(self, records: Sequence[Record]) -> None:
        """Learn from measurements (of this workload or, for transfer, of others)."""
        ...


def score(record: Record) -> float:
    """What strategies maximise: GFLOP/s, with every failure worth 0."""
    return float(record.gflops) if record.ok and record.gflops else 0.0


def draw_unseen(space: Space, rng: np.random.Generator, n: int, seen: set[str]) -> list[Config]:
    """Up to ``n`` random valid configs whose keys are not in ``seen``, distinct; fewer
    (none: the space is exhausted) only after :data:`MISSES` draws in a row brought
    nothing new. ``seen`` is not changed."""
    out: dict[str, Config] = {}
    misses = 0
    while len(out) < n and misses < MISSES:
        fresh = [c for c in space.sample(rng, 4 * n + 16) if c.key not in seen and c.key not in out]
        misses = 0 if fresh else misses + 1
        out.update((c.key, c) for c in fresh[: n - len(out)])
    return list(out.values())
