"""What the SQL backends read the same way: filters, the fastest records, measured keys.

Each backend supplies ``_read(sql, params) -> rows`` (its own connection, retries and
placeholders); the statements come from :mod:`autosched.records.rows`.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self

from autosched.records import rows
from autosched.records.record import Record


class SQLReads:
    """The read half of :class:`~autosched.records.base.Database` over SQL."""

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

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
        """Records matching every given filter, in insertion order (by id)."""
        sql, params = rows.query_sql(
            {
                "workload_key": workload_key,
                "op": op,
                "target": target,
                "device_key": device_key,
                "device_family": device_family,
                "status": status,
            },
            limit,
        )
        return [rows.from_row(row) for row in self._read(sql, params)]

    def best(
        self,
        workload_key: str,
        *,
        target: str | None = None,
        device_key: str | None = None,
        device_family: str | None = None,
        k: int = 1,
    ) -> list[Record]:
        """The ``k`` fastest ok records of a workload, fastest first (ties by id)."""
        sql, params = rows.best_sql(
            workload_key, target=target, device_key=device_key, device_family=device_family, k=k
        )
        return [rows.from_row(row) for row in self._read(sql, params)]

    def latest_round(self, workload_key: str, *, device_key: str, config_key: str) -> list[Record]:
        """The ok records of the latest side-by-side round on this device that measured
        ``config_key``, fastest first (ties by id); empty when none did."""
        sql, params = rows.latest_round_sql(
            workload_key, device_key=device_key, config_key=config_key
        )
        return [rows.from_row(row) for row in self._read(sql, params)]

    def measured_config_keys(self, workload_key: str, *, device_key: str, target: str) -> set[str]:
        """Config keys already measured (any status) for this workload on this exact device."""
        sql, params = rows.measured_sql(workload_key, device_key=device_key, target=target)
        return {row[0] for row in self._read(sql, params)}

    def __len__(self) -> int:
        return int(self._read("SELECT COUNT(*) FROM records")[0][0])

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
