"""The config the records choose (autosched.records.choice): the fastest reading gets
into the final, the final side-by-side round decides."""

from __future__ import annotations

import dataclasses

from autosched.records import Record
from autosched.records.choice import chosen
from autosched.records.sqlite import MEMORY, SQLiteDatabase
from tests.records_factory import make_record


def _reading(config: int, ms: float, *, run: str, at: float, rounds: int = 0, **kw) -> Record:
    return make_record(
        config, latency=ms * 1e-3, run_id=run, timestamp=at, started_at=at, rounds=rounds, **kw
    )


def _round(run: str, at: float, ms: dict[int, float], **kw) -> list[Record]:
    """A side-by-side round: one start, three interleaved rounds pooled."""
    return [_reading(c, t, run=run, at=at, rounds=3, **kw) for c, t in ms.items()]


# One run's search: config 0 read once at a lucky moment, 1 and 2 close behind, 9 the default.
SEARCH = [
    _reading(9, 2.00, run="r1", at=10.0),
    _reading(0, 1.00, run="r1", at=11.0),
    _reading(1, 1.05, run="r1", at=12.0),
    _reading(2, 1.10, run="r1", at=13.0),
    _reading(1, 1.06, run="r1", at=14.0),  # config 1 again, as a batch control
]
# Its final round: side by side, config 1 ran ahead of config 0.
FINAL = _round("r1", 20.0, {0: 1.08, 1: 1.04, 2: 1.12, 9: 2.05})


def _db(records: list[Record]) -> SQLiteDatabase:
    db = SQLiteDatabase(MEMORY)
    db.add(records)
    return db


def _key(record: Record | None) -> str | None:
    return record.config_key if record is not None else None


def _chosen(records: list[Record], **where) -> Record | None:
    with _db(records) as db:
        return chosen(db, records[0].workload_key, **where) if records else None


def test_without_a_side_by_side_round_the_fastest_reading_is_chosen():
    with _db(SEARCH) as db:
        picked = chosen(db, SEARCH[0].workload_key)
        assert picked == db.best(SEARCH[0].workload_key, k=1)[0]
    assert _key(picked) == "cfg-0000"


def test_the_leader_of_the_final_round_is_chosen_and_shown_by_its_round_record():
    with _db(SEARCH + FINAL) as db:
        assert _key(db.best(SEARCH[0].workload_key, k=1)[0]) == "cfg-0000"  # read once, lucky
        picked = chosen(db, SEARCH[0].workload_key)
    assert _key(picked) == "cfg-0001"
    assert picked is not None and picked.rounds == 3 and picked.latency_s == FINAL[1].latency_s
    assert picked.id is not None  # a stored record: compilers name it


def test_a_faster_config_found_later_wins_until_a_round_measures_it():
    later = [_reading(3, 0.95, run="r2", at=30.0)]  # a resumed run, killed before its final
    assert _key(_chosen(SEARCH + FINAL + later)) == "cfg-0003"
    settled = _round("r2", 40.0, {3: 1.07, 1: 1.03, 9: 2.1})
    picked = _chosen(SEARCH + FINAL + later + settled)
    assert _key(picked) == "cfg-0001" and picked is not None and picked.started_at == 40.0
    # the latest round that measured the fastest config decides, not an older one
    again = _round("r3", 50.0, {3: 1.01, 1: 1.06, 9: 2.0})
    picked = _chosen(SEARCH + FINAL + later + settled + again)
    assert _key(picked) == "cfg-0003" and picked is not None and picked.started_at == 50.0


def test_rounds_of_another_device_or_failed_records_do_not_decide():
    other = _round("r9", 60.0, {0: 1.2, 2: 0.9}, driver="3.2")  # same family, another driver
    timed_out = dataclasses.replace(
        _reading(0, 0.5, run="r4", at=70.0, rounds=3),
        status="timeout",
        error="timed out",
        latencies=(),
        latency_s=None,
        spread=None,
        gflops=None,
    )
    records = SEARCH + FINAL + other + [timed_out]
    exact = _chosen(records, device_key=SEARCH[0].device_key)
    family = _chosen(records, device_family=SEARCH[0].device_family)
    assert _key(exact) == "cfg-0001" and exact is not None and exact.started_at == 20.0
    # Over the family, config 2's 0.9 ms in the other driver's round is the fastest
    # reading, and that round (on its own device) decides.
    assert _key(family) == "cfg-0002" and family is not None
    assert family.device_key == other[1].device_key != SEARCH[0].device_key
    assert _chosen([timed_out]) is None
    with _db([]) as db:
        assert chosen(db, SEARCH[0].workload_key) is None
