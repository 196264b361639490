"""What a report section holds: plain, frozen data read from the records.

:func:`autosched.report.collect` returns these; :mod:`autosched.report.html` renders them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autosched.records.record import Record


@dataclass(frozen=True)
class RunInfo:
    """One tuning run (``Record.run_id``) of a workload on a device."""

    run_id: str
    start: float  # timestamp of its first record
    end: float  # timestamp of its last record
    trials: int  # search-phase records
    finalists: int  # records re-measured at the end of the run
    best_gflops: float | None  # best search-phase GFLOP/s of this run


@dataclass(frozen=True)
class ConfigRow:
    """One config among the fastest: its fastest measurement and how often it was measured."""

    rank: int
    record: Record  # the fastest ok measurement of this config
    measured: int  # records of this config, any status
    gflops_min: float
    gflops_max: float
    is_default: bool


@dataclass(frozen=True)
class ErrorKind:
    """How many records failed with ``status`` and the message of the first of them."""

    status: str
    count: int
    example: str


@dataclass(frozen=True)
class Importance:
    """Feature importances of a cost model fitted on an operator's records on a device family.

    ``features`` is empty when there were too few records; ``reason`` then says so.
    """

    op: str
    target: str
    device_family: str
    model: str  # cost model kind, see autosched.cost_model.KINDS
    method: str  # how the importances were computed
    n_records: int  # training rows (records whose config is valid in its space)
    n_ok: int
    n_workloads: int
    features: tuple[tuple[str, float], ...]  # (feature, share of the total), largest first
    reason: str = ""


@dataclass(frozen=True)
class Finalist:
    """A config re-measured at the end of a run, with its search-phase measurement."""

    final: Record
    search: Record | None  # its first measurement (None if that one failed)
    # Rank of ``search`` among the search-phase configs measured before the round, 1 = fastest:
    # the ranking the run picked its finalists from.
    search_rank: int | None
    final_rank: int  # rank among this run's finalists, 1 = fastest
    is_default: bool


@dataclass(frozen=True)
class FinalRound:
    """The finalists one run re-measured side by side, fastest first."""

    run_id: str
    finalists: tuple[Finalist, ...]
    kendall_tau: float | None  # search-phase order vs re-measured order (>= 3 with both)


@dataclass(frozen=True)
class VendorFigure:
    """A reference throughput from outside autosched and where it comes from."""

    gflops: float
    source: str
    label: str = "vendor"


@dataclass(frozen=True)
class Section:
    """Everything the report shows about one workload on one device."""

    workload: dict[str, Any]
    workload_key: str
    target: str
    device: dict[str, Any]
    device_key: str
    device_family: str
    records: tuple[Record, ...]  # by time
    search: tuple[Record, ...]  # search-phase records, in trial order
    runs: tuple[RunInfo, ...]
    default_config_key: str | None
    default_search: Record | None  # the default schedule's search-phase measurement
    best: Record | None  # what compilers take (``autosched.records.choice.chosen``)
    top: tuple[ConfigRow, ...]
    errors: tuple[ErrorKind, ...]  # one per error kind, zero counts included
    final_rounds: tuple[FinalRound, ...]
    importance: Importance
    vendor: tuple[VendorFigure, ...]

    @property
    def op(self) -> str:
        return str(self.workload.get("op", ""))

    @property
    def trials(self) -> int:
        """Distinct configs measured: what ``tune(trials=...)`` counts."""
        return len({r.config_key for r in self.records})

    @property
    def n_ok(self) -> int:
        return sum(r.ok for r in self.records)

    @property
    def default_final(self) -> Record | None:
        """The default re-measured side by side in the latest run that did so."""
        for rnd in reversed(self.final_rounds):
            for f in rnd.finalists:
                if f.is_default:
                    return f.final
        return None
