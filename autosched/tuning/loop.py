"""The tuning loop of a job: propose -> measure (on a runner) -> records -> learn.

Every (task, device kind) pair gets its own search: the strategy over a space built
with that device's limits, which first learns from every record of that device
family in the database. The task scheduler's policy decides which pair gets the next
batch whenever a device kind has a free device; about one batch is in flight per
device. The records database is the only state: a rerun of the same job skips what is
measured and tops every pair up to its trials. At the deadline no new batch is
proposed; the batches in flight are awaited and stored. What the loop knows of each pair,
and how a pair opens, proposes and stores a batch, is :mod:`autosched.tuning.pair`; how
the free devices get their batches (in threads), :mod:`autosched.tuning.proposing`.

A batch can come back not measured at all: the device's session found that the device
failed, not the configs (nothing measured, and no measurement child could start or the
batch's control failed too, the best config so far, which the device measured before:
:mod:`autosched.tuning.control`), even after running it once more in a fresh measurement
child (:meth:`autosched.tuning.runner.DeviceSession.run`); or the runner or harness
raised. Such a batch is not stored (recorded, its configs would read as broken to every
later search and build) and is proposed again; after :data:`BROKEN_IN_A_ROW` in a row
(per device of the kind) its device kind is given up (or, where the kind's other tasks
still measure, the task on that kind), the job goes on with the others and a rerun takes
them up again. A batch whose configs brought down every process that measured it
(:class:`~autosched.tuning.runner.PoisonBatch`) is theirs to answer for: its configs are
stored as run errors. On a farm, a worker whose device measures nothing in
:data:`BROKEN_IN_A_ROW` batches in a row stops taking that kind's batches
(:class:`autosched.farm.worker.DevicePlugin`): the kind's other workers carry on, and
the kind is given up only when none is left.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field
from typing import Any

from autosched.errors import HarnessError
from autosched.measure.lifeline import GUARD, importing_main
from autosched.records.base import Database
from autosched.records.choice import settled
from autosched.records.record import RUN_ERROR, Record
from autosched.space.config import Config
from autosched.tuning.interrupt import check as check_interrupt
from autosched.tuning.interrupt import latched
from autosched.tuning.job import Job, Task
from autosched.tuning.pair import (
    Pair,
    error_record,
    left,
    open_pair,
    sibling_pairs,
    store,
    withdraw,
)
from autosched.tuning.proposing import pick, proposed
from autosched.tuning.runner import BatchRequest, LostBatch, PoisonBatch, Runner, Slot
from autosched.tuning.scheduler import TaskScheduler, make_policy

log = logging.getLogger(__name__)

_SLOT_REFRESH_S = 5.0
# Batches of one device kind in a row in which it measured nothing, not even the control,
# before the job gives the device kind up.
BROKEN_IN_A_ROW = 3


@dataclass(frozen=True)
class JobEvent:
    """Sent after every batch that came back: which pair, how far, how good."""

    pair: Pair
    batch: tuple[Record, ...]
    elapsed_s: float
    deadline: float | None
    pairs: tuple[Pair, ...] = ()
    devices: int = 0  # devices the runner reaches now (farm workers alive)


@dataclass
class JobResult:
    job: Job
    pairs: list[Pair]
    wall_s: float
    deadline_reached: bool
    failed_batches: int = 0
    # Targets or device kinds with trials left that no worker served within the wait.
    unserved: list[str] = field(default_factory=list)
    lost_batches: int = 0  # proposed again after the runner lost them (a scheduler restart)
    # Proposed again after they came back not measured (the device or harness failed).
    dropped_batches: int = 0
    workers_seen: list[str] = field(default_factory=list)
    workers_lost: list[str] = field(default_factory=list)  # seen, gone at the end
    started: float = 0.0
    # Device kinds (or tasks on one) given up after BROKEN_IN_A_ROW batches in a row that
    # came back not measured: which, and the last batch's error.
    broken: list[str] = field(default_factory=list)

    def rows(self) -> list[dict[str, Any]]:
        """Per task and device kind: trials, the best against the default (side by side)."""
        rows = []
        for pair in self.pairs:
            best, default = pair.best, pair.default_record
            speedup = None
            if best and default and best.latency_s and default.latency_s:
                speedup = default.latency_s / best.latency_s
            rows.append(
                {
                    "task": pair.task.name,
                    "workload": pair.task.workload.key,
                    "target": pair.task.target,
                    "device": pair.slot.name,
                    "device_key": pair.slot.device_key,
                    "trials": len(pair.measured),
                    "wanted": pair.task.trials,
                    "new_trials": pair.new,
                    "best_gflops": best.gflops if best else pair.best_gflops,
                    "default_gflops": default.gflops if default else None,
                    "speedup": speedup,
                    "config": best.config if best else None,
                }
            )
        return rows

    @property
    def new_trials(self) -> int:
        return sum(p.new for p in self.pairs)


def _run_job(
    job: Job,
    runner: Runner,
    db: Database,
    *,
    deadline: float | None = None,
    policy: TaskScheduler | None = None,
    finalists: int = 3,
    progress: Callable[[JobEvent], None] | None = None,
    device_wait_s: float = 120.0,
    history: Sequence[Record] = (),
    proposers: int | None = None,
) -> JobResult:
    """Tune every task of ``job`` on every device kind of its target that ``runner`` reaches.

    Args:
        job: the tasks (from a job file or a model).
        runner: where batches are measured (this machine, or a farm).
        db: the records database; every batch is one transaction.
        deadline: a ``time.time()`` after which no batch is proposed.
        policy: the task scheduler (default: the job's ``policy``).
        finalists: best configs re-measured side by side with the default at the end
            of each pair (skipped once the deadline has passed).
        progress: called after every batch that came back.
        device_wait_s: how long to wait for a device of a kind that has trials left
            (none has joined yet, or its workers died) before giving up on it; a rerun
            resumes it.
        history: records the strategies observe before the database's own (this
            device family's), e.g. other device families' records for transfer.
        proposers: threads that propose batches of different pairs (task and device kind)
            at once when several devices are free (default: the runner's ``proposers``,
            else 1: one at a time). Each pair's proposals stay in turn and alike, so
            the results are the same; a farm's client proposes for its devices sooner.
    """
    if importing_main():  # a child re-running an unguarded script: tune nothing here
        raise HarnessError(f"not tuning in a child process: {GUARD}")
    start = time.time()
    proposers = max(1, proposers or getattr(runner, "proposers", 1))
    policy = policy or make_policy(job.policy, seed=job.seed, batch=job.batch)
    pairs: list[Pair] = []
    known: set[str] = set()
    slots: dict[str, Slot] = {}
    in_flight: dict[Any, tuple[Pair, list[Config], Config | None]] = {}
    busy: dict[str, int] = {}
    failed = lost = dropped = 0
    in_a_row: dict[str, int] = {}  # device key -> batches in a row not measured
    broken: dict[str, str] = {}  # device key -> why it was given up
    failing: dict[str, set[str]] = {}  # device key -> pairs with batches not measured since
    peak: dict[str, int] = {}  # device key -> the most devices of the kind seen at once
    refreshed = 0.0
    waiting_since = 0.0
    unserved: list[str] = []

    def refresh() -> None:
        nonlocal refreshed
        refreshed = time.time()
        before.clear()  # device kinds that join later see what was measured since
        slots.clear()
        for slot in runner.slots():
            slots[slot.device_key] = slot
            peak[slot.device_key] = max(peak.get(slot.device_key, 0), slot.count)
            if slot.device_key in known:
                continue
            known.add(slot.device_key)
            for task in job.tasks:
                if task.target == slot.target:
                    pairs.append(open_pair(job, task, slot, db, runner, seen_before(task)))

    # What every strategy of an operator observes when it opens: the records of the
    # operator on the target (all device families, given history first), read once per
    # round of joining devices rather than once per task and device kind.
    before: dict[tuple[str, str], list[Record]] = {}

    def seen_before(task: Task) -> list[Record]:
        key = (task.workload.op, task.target)
        if key not in before:
            given = [r for r in history if r.op == key[0] and r.target == key[1]]
            before[key] = given + db.query(op=key[0], target=key[1])
        return before[key]

    def stopping() -> bool:
        return deadline is not None and time.time() >= deadline

    def give_up(pair: Pair, why: str) -> None:
        """Count a batch not measured against its pair and its device kind. After
        BROKEN_IN_A_ROW in a row per device of the kind (the most it had: on a farm, a
        worker whose device broke stops taking its batches itself, and the kind's other
        workers go on), the kind is given up where they came from two tasks or more (or
        from its only task left): the device failed; the task alone where the kind's
        other tasks have batches still to show: the task failed."""
        kind = pair.slot.device_key
        in_a_row[kind] = in_a_row.get(kind, 0) + 1
        failing.setdefault(kind, set()).add(pair.name)
        pair.dropped += 1
        limit = BROKEN_IN_A_ROW * peak.get(kind, 1)
        count = max(in_a_row[kind], pair.dropped)  # the pair's own run may be the longer
        if kind in broken or count < limit:
            return
        others = [
            p
            for p in pairs
            if p.slot.device_key == kind and p is not pair and left(p) > 0 and not p.exhausted
        ]
        if len(failing[kind]) >= 2 or not others:
            broken[kind] = (
                f"{pair.task.target} device {pair.slot.name} ({kind}) measured nothing in "
                f"{count} batches in a row: {why}"
            )
            log.error("%s; it is given up, and a rerun takes it up again", broken[kind])
        elif pair.dropped >= limit:
            pair.given_up = f"{pair.name}: {pair.dropped} batches in a row not measured: {why}"
            pair.exhausted = True
            log.error("%s; it is given up, and a rerun takes it up again", pair.given_up)

    refresh()
    while True:
        check_interrupt()
        if not stopping():
            if time.time() - refreshed > _SLOT_REFRESH_S:
                refresh()
            while True:  # fill every free device: pick, propose (in parallel), submit
                picks = pick(job, policy, pairs, slots, busy, broken, proposers)
                if not picks:
                    break
                for (key, slot, pair, n), configs in proposed(picks, proposers):
                    pair.progress.in_flight += len(configs) - n  # n was held for it
                    if not configs:
                        pair.exhausted = True
                        log.info("%s: the strategy has nothing new to propose", pair.name)
                        continue
                    sent, control = pair.control.with_control(configs)
                    request = BatchRequest(
                        workload=pair.task.workload.to_json(),
                        target=pair.task.target,
                        device_key=key,
                        configs=tuple(c.to_json() for c in sent),
                        seed=job.seed,
                        timeout_s=job.timeout_s,
                        control=control.key if control is not None else "",
                    )
                    # In flight: the new configs; the control rides along.
                    in_flight[runner.submit(slot, request)] = (pair, configs, control)
                    busy[key] = busy.get(key, 0) + 1
        waiting = _waiting_for(job, pairs, slots, broken)
        if waiting and not stopping():
            waiting_since = waiting_since or time.time()
            if time.time() - waiting_since > device_wait_s:
                # Batches queued for a device kind that never came back are given up;
                # they were never measured, so a rerun proposes them again.
                lost = [h for h, (p, *_) in in_flight.items() if p.slot.device_key not in slots]
                for handle in lost:
                    pair, configs, _ = in_flight.pop(handle)
                    busy[pair.slot.device_key] -= 1
                    withdraw(pair, configs)
                if lost:
                    runner.cancel(lost)
                if not in_flight:
                    unserved = sorted(waiting)
                    log.warning(
                        "no device for %s within %.0f s", "; ".join(unserved), device_wait_s
                    )
                    break
        else:
            waiting_since = 0.0
        if not in_flight:
            if not waiting or stopping():
                break
            time.sleep(1.0)
            refresh()
            continue
        for handle, result in runner.wait(list(in_flight), 1.0):
            # A batch that came back after Ctrl-C or SIGTERM is not stored: a service
            # manager's SIGTERM reaches the measurement child too, and the batch's configs
            # left would come back as run errors that were the stop's, not theirs.
            check_interrupt()
            pair, configs, control = in_flight.pop(handle)
            busy[pair.slot.device_key] -= 1
            if isinstance(result, LostBatch):
                lost += 1
                log.warning("%s: %s; it is proposed again", pair.name, result)
                withdraw(pair, configs)
                continue
            if isinstance(result, HarnessError):  # this process cannot measure at all
                raise result
            if isinstance(result, PoisonBatch):  # the configs' fault: stored as theirs
                failed += 1
                log.warning("%s: a batch failed: %s", pair.name, result)
                result = [error_record(pair, c, RUN_ERROR, str(result)) for c in configs]
            elif isinstance(result, BaseException):  # the device's or the harness's
                dropped += 1
                withdraw(pair, configs)
                why = f"{type(result).__name__}: {result}"
                log.warning(
                    "%s: a batch was not measured (%s); it is proposed again", pair.name, why
                )
                give_up(pair, why)
                continue
            in_a_row[pair.slot.device_key] = pair.dropped = 0
            failing.pop(pair.slot.device_key, None)
            batch, seen = store(db, pair, configs, result, control)
            for other in sibling_pairs(pairs, pair):
                other.search.observe(seen)
            if progress:
                devices = sum(s.count for s in slots.values())
                elapsed = time.time() - start
                progress(JobEvent(pair, tuple(batch), elapsed, deadline, tuple(pairs), devices))

    reached = stopping()
    if finalists and not reached:
        alive = [p for p in pairs if p.slot.device_key not in broken and not p.given_up]
        _final(alive, runner, db, job, finalists)
    seen = sorted(getattr(runner, "workers_seen", ()))
    now = set(getattr(runner, "workers_now", ()))
    return JobResult(
        job,
        pairs,
        time.time() - start,
        reached,
        failed,
        unserved,
        lost_batches=lost,
        dropped_batches=dropped,
        workers_seen=seen,
        workers_lost=[w for w in seen if w not in now],
        started=start,
        broken=list(broken.values()) + [p.given_up for p in pairs if p.given_up],
    )


@functools.wraps(_run_job)
def run_job(*args: Any, **kwargs: Any) -> JobResult:
    # _run_job's signature and docstring; Ctrl-C is latched while it runs
    # (autosched.tuning.interrupt).
    with latched():
        return _run_job(*args, **kwargs)


def _waiting_for(
    job: Job, pairs: list[Pair], slots: dict[str, Slot], broken: Container[str]
) -> set[str]:
    """Targets no device has served yet, and device kinds gone with trials left (not
    those given up: a farm worker stops serving a device it gave up)."""
    served = {s.target for s in slots.values()} | {p.task.target for p in pairs}
    waiting = {f"target {t.target}" for t in job.tasks if t.target not in served}
    for pair in pairs:
        key = pair.slot.device_key
        if key not in slots and key not in broken and left(pair) > 0 and not pair.exhausted:
            waiting.add(f"{pair.slot.target} device {pair.slot.name} ({pair.slot.device_key})")
    return waiting


def _chosen(db: Database, pair: Pair) -> Record | None:
    """The config every reader of the records takes (``autosched best``, ``compile``, Relax
    builds: :func:`autosched.records.choice.chosen`), after its final round that is the
    leader of that round, shown by its record there (so its figure and the default's
    come from one interleaved run)."""
    where = dict(device_key=pair.slot.device_key, target=pair.task.target)
    top = db.best(pair.task.workload.key, k=1, **where)
    if not top:
        return None
    picked = settled(db, top[0])
    if picked.config_key != top[0].config_key:
        log.info(
            "%s: side by side %s led the records' fastest reading, %s; compilers take %s",
            pair.name,
            picked.config_key,
            top[0].config_key,
            picked.config_key,
        )
    return picked


def _final(pairs: list[Pair], runner: Runner, db: Database, job: Job, k: int) -> None:
    """Re-measure each pair's best few side by side with its default schedule."""
    handles: dict[Any, Pair] = {}
    for pair in pairs:
        where = dict(device_key=pair.slot.device_key, target=pair.task.target)
        # k * (k + 2): earlier runs' finalists hold several records each.
        ranked = db.best(pair.task.workload.key, k=k * (k + 2), **where)
        if not ranked:
            continue
        unique = {r.config_key: r for r in reversed(ranked)}  # keeps each one's fastest
        configs = [Config(r.config) for r in ranked if unique.pop(r.config_key, None)][:k]
        # What an earlier run's final chose defends its place; the default stands by.
        held = settled(db, ranked[0])
        for extra in (Config(held.config), pair.default):
            if extra.key not in {c.key for c in configs}:
                configs.append(extra)
        request = BatchRequest(
            workload=pair.task.workload.to_json(),
            target=pair.task.target,
            device_key=pair.slot.device_key,
            configs=tuple(c.to_json() for c in configs),
            seed=job.seed,
            timeout_s=job.timeout_s,
            rounds=3,
        )
        handles[runner.submit(pair.slot, request)] = pair
    while handles:
        check_interrupt()
        for handle, result in runner.wait(list(handles), 5.0):
            check_interrupt()  # as above: a round that came back after the stop is not stored
            pair = handles.pop(handle)
            if isinstance(result, BaseException):
                log.warning("%s: re-measuring the finalists failed: %s", pair.name, result)
                continue
            ok = [r for r in result if r.ok]
            db.add(ok)
            pair.default_record = next((r for r in ok if r.config_key == pair.default.key), None)
            pair.best = _chosen(db, pair)
