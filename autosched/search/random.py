"""Uniform random search over valid configs: the baseline every strategy must beat."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from autosched.records.record import Record
from autosched.space.config import Config
from autosched.space.space import Space

# Draws in a row that bring nothing unseen before the space counts as exhausted. One is
# not enough: a resumed run with the same seed draws what the run before it drew, and
# the first draws of a run resumed a few times are all measured already.
MISSES = 8


class RandomSearch:
    name = "random"

    def __init__(
        self, space: Space, *, rng: np.random.Generator, family: str | None = None
    ) -> None:
        self.family = family  # records of other device families are not this device's
        self.space = space
        self.rng = rng
        self.seen: set[str] = set()

    def propose(self, n: int) -> list[Config] | None:
        out: list[Config] = []
        misses = 0
        while len(out) < n and misses < MISSES:
            fresh = [c for c in self.space.sample(self.rng, 4 * n + 16) if c.key not in self.seen]
            misses = 0 if fresh else misses + 1
            for c in fresh[: n - len(out)]:
                self.seen.add(c.key)
                out.append(c)
        return out or None

    def observe(self, records: Sequence[Record]) -> None:
        key = self.space.workload.key
        self.seen.update(
            r.config_key
            for r in records
            if r.workload_key == key and self.family in (None, r.device_family)
        )
