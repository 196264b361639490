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

from autosched.records.record import Record
from autosched.space.config import Config


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
