"""The records database contract.

Any store that keeps measurement records implements :class:`Database`; SQLite is
the embedded default (:mod:`~autosched.records.sqlite`), PostgreSQL the server one
(:mod:`~autosched.records.postgres`), and :func:`autosched.records.open_database` picks
one from a path or URL.

Contract (every implementation must honour it; ``tests/test_records.py`` runs one
conformance suite over each):

* ``add`` is atomic: either every record of the call is stored or none is. A kill at
  any moment leaves the store consistent. Records are append-only; nothing is updated
  in place.
* ``add`` is idempotent for identical records (same workload, device, config, timestamp
  and run): adding one twice stores it once. That makes imports repeatable.
* ``query`` filters are ANDed; ``None`` means "any". Results are ordered by id (the order
  of insertion).
* ``best`` returns only ``ok`` records, fastest (lowest ``latency_s``) first.
* ``latest_round`` returns the ok records of one side-by-side round, fastest first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from autosched.records.record import Record


@runtime_checkable
class Database(Protocol):
    def add(self, records: Sequence[Record]) -> list[int]:
        """Store ``records`` in one transaction; return their ids (existing id for duplicates)."""
        ...

    def query(
        self,
        *,
        workload_key: str | None = None,
        op: str | None = None,
        target: str | None = None,
        device_key: str | None = None,
        device_family: str | None = None,
        status: str | None = None,
        limit: int | None = None,
    ) -> list[Record]:
        """Records matching every given filter, in insertion order."""
        ...

    def best(
        self,
        workload_key: str,
        *,
        target: str | None = None,
        device_key: str | None = None,
        device_family: str | None = None,
        k: int = 1,
    ) -> list[Record]:
        """The ``k`` fastest ok records of a workload, fastest first."""
        ...

    def latest_round(self, workload_key: str, *, device_key: str, config_key: str) -> list[Record]:
        """The ok records of the latest side-by-side round (``Record.rounds`` > 0: one run
        id, one ``started_at``) on this exact device that measured ``config_key``,
        fastest first; empty when none did."""
        ...

    def measured_config_keys(self, workload_key: str, *, device_key: str, target: str) -> set[str]:
        """Config keys already measured (any status) for this workload on this exact device."""
        ...

    def close(self) -> None: ...
