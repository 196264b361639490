"""Uniform random search over valid configs: the baseline every strategy must beat."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from autosched.records.record import Record
from autosched.search.base import draw_unseen
from autosched.space.config import Config
from autosched.space.space import Space


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
        out = draw_unseen(self.space, self.rng, n, self.seen)
        self.seen.update(c.key for c in out)
        return out or None

    def observe(self, records: Sequence[Record]) -> None:
        key = self.space.workload.key
        self.seen.update(
            r.config_key
            for r in records
            if r.workload_key == key and self.family in (None, r.device_family)
        )
