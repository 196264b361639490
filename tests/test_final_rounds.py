"""The tuner's final side-by-side rounds (autosched.tuning.loop._final): what the records
hand compilers after them is a config the run re-measured and reports."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

from autosched.records.sqlite import SQLiteDatabase
from autosched.tuning.job import Job, Task
from autosched.tuning.loop import run_job
from autosched.tuning.replay import ReplayRunner, caches_from_records, read_records

ZEN4 = (
    Path(__file__).resolve().parent.parent / "bench" / "replay" / "matmul-512-opencl-zen4.jsonl.gz"
)


def _fastest_configs(n):
    """The records of the ``n`` fastest configs of the Zen 4 sample (close rivals)."""
    records = read_records(ZEN4)
    (whole,) = caches_from_records(records)
    ranked = sorted(whole.records.values(), key=lambda r: r.latency_s or float("inf"))
    keep = {r.config_key for r in ranked[:n]}
    return [r for r in records if r.config_key in keep]


class SlowFinalists(ReplayRunner):
    """Answers as recorded, each batch at its own time, except that the configs of the
    first final round read 100x slower in every final round (configs that run slower
    beside each other than alone: a shared cache, a thermal limit)."""

    def __init__(self, caches):
        super().__init__(caches)
        self.clock = itertools.count(1)
        self.rounds: list[list[str]] = []
        self.slow: set[str] = set()
        self.default_key = ""

    def answer(self, request):
        out = super().answer(request)
        start = 1.0e9 + 100.0 * next(self.clock)
        keys = [r.config_key for r in out]
        if request.rounds:
            if not self.rounds:
                self.slow = set(keys) - {self.default_key}
            self.rounds.append(keys)
        return [
            dataclasses.replace(
                r.scaled(0.01 if request.rounds and r.config_key in self.slow else 1.0),
                timestamp=start + i,
                started_at=start,
            )
            for i, r in enumerate(out)
        ]


def test_a_config_the_final_round_did_not_measure_is_measured_before_it_is_handed_on():
    """After the first final round the finalists' readings put a config it did not
    re-measure first in the records (every reading counts): it is re-measured beside the
    round's leaders, so the run reports, and compilers take, a config measured side by
    side with the default."""
    (cache,) = caches_from_records(_fastest_configs(48))
    runner = SlowFinalists([cache])
    (slot,) = runner.slots()
    space = runner.space(cache.workload, target="opencl", slot=slot)
    runner.default_key = space.default().key
    db = SQLiteDatabase(":memory:")
    job = Job(name="f", tasks=(Task("f", cache.workload, "opencl", 24),), seed=1, batch=8)
    (pair,) = run_job(job, runner, db, finalists=3).pairs

    assert len(runner.rounds) >= 2
    first, last = runner.rounds[0], runner.rounds[-1]
    assert len(set(first) - {runner.default_key}) == 3
    top = db.best(cache.workload.key, device_key=slot.device_key, target="opencl")[0]
    assert top.config_key not in first and top.config_key in last
    assert pair.best is not None and pair.best.config_key == top.config_key
    assert pair.best.started_at == max(r.started_at for r in db.query(status="ok"))
    assert (
        pair.default_record is not None and pair.default_record.started_at == pair.best.started_at
    )
