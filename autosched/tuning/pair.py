"""One task on one device kind inside a job: its search, its progress, its batches.

The job loop (:mod:`autosched.tuning.loop`) decides which pair gets the next batch and
where it runs; a :class:`Pair` is what it knows about one task on one device kind, and
the functions here open one (its space, its search fed with the records already
measured), propose its next batch and store a batch that came back (the records as
measured, the search's view of them scaled by the batch's control,
:mod:`autosched.tuning.control`).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from autosched.measure.runner import refused_group
from autosched.ops import workload_from_json
from autosched.records.base import Database
from autosched.records.record import Record
from autosched.search import SearchStrategy, make_strategy
from autosched.space.config import Config
from autosched.space.select import make_space
from autosched.space.space import Space
from autosched.tuning.control import BatchControl
from autosched.tuning.job import Job, Task
from autosched.tuning.runner import Runner, Slot
from autosched.tuning.scheduler import TaskProgress

log = logging.getLogger(__name__)


@dataclass
class Pair:
    """One task on one device kind: its search, its progress, its results."""

    task: Task
    slot: Slot
    space: Space
    search: SearchStrategy
    progress: TaskProgress
    measured: set[str]
    history: list[Record]
    default: Config
    in_flight: set[str] = field(default_factory=set)
    exhausted: bool = False
    new: int = 0
    best: Record | None = None
    default_record: Record | None = None
    control: BatchControl = field(default_factory=BatchControl)
    dropped: int = 0  # batches in a row that came back not measured (the loop's count)
    given_up: str = ""  # why the loop gave this pair up ("": it did not)

    @property
    def name(self) -> str:
        return f"{self.task.name} [{self.task.target} on {self.slot.name}]"

    @property
    def best_gflops(self) -> float | None:
        return max((r.gflops or 0.0 for r in self.history if r.ok), default=None)


def sibling_pairs(pairs: Sequence[Pair], pair: Pair) -> list[Pair]:
    """The other pairs that learn from ``pair``'s measurements as they come back: those
    of the same space kind on the same device and target. A twin (the same loop nest
    under another epilogue: a convolution with and without a residual add) takes them
    as its own data; another shape of the kind (a model's other convolutions) as a
    transfer source and its best configs as seeds. Without this, tasks tuned side by
    side would each start from nothing, and one given few trials would stay far behind
    a sibling that found the register tile they share; a resumed run sees such records
    in the database anyway."""
    return [
        other
        for other in pairs
        if other is not pair
        and other.slot.device_key == pair.slot.device_key
        and other.task.target == pair.task.target
        and type(other.space) is type(pair.space)
    ]


# Configs over the largest work-group that ran, refused by the driver's limit for
# their compiled kernels, before larger groups are no longer proposed.
GROUP_REFUSALS = 3


def learn_group_cap(space: Space, records: Sequence[Record]) -> None:
    """Stop proposing work-groups larger than any that ran once the driver has refused
    :data:`GROUP_REFUSALS` configs over that size and run none.

    A driver allows each compiled kernel only as many work-items as its registers
    leave, which the space's estimate does not foresee: on an H100 every sampled
    matmul and conv2d config with 448 to 1024 work-items per group was refused (256
    allowed, whatever the register tile), and the model search kept proposing such
    configs, 4 to 6 of its 64 trials. What the device has run decides, not a
    constant: where 512 work-items run (an H200), 512 stays in the space.
    """
    ran = [space.threads(Config(r.config)) for r in records if r.ok]
    refused = [space.threads(Config(r.config)) for r in records if refused_group(r.status, r.error)]
    if not ran or not refused:
        return
    largest = max(ran)
    over = sum(t > largest for t in refused)
    if over >= GROUP_REFUSALS and space.group_cap != largest:
        space.group_cap = largest
        log.info(
            "work-groups over %d work-items are no longer proposed: the device refused "
            "%d configs over that size and ran none",
            largest,
            over,
        )


def left(pair: Pair) -> int:
    """Trials the pair still wants, not counting those in flight."""
    return max(0, pair.task.trials - len(pair.measured) - len(pair.in_flight))


def open_pair(
    job: Job, task: Task, slot: Slot, db: Database, runner: Runner, before: Sequence[Record]
) -> Pair:
    """Open ``task`` on ``slot``'s device kind: its space under the device's limits, a
    search that has observed ``before`` (the operator's records on the target) and its
    progress resumed from what the database holds for this exact device."""
    wl = task.workload
    space = runner.space(wl, target=task.target, slot=slot)

    spaces: dict[str, Space] = {wl.key: space}

    def space_for(wl_json: dict) -> Space:  # other shapes' records, refitted every batch
        other = workload_from_json(wl_json)
        if other.key not in spaces:
            spaces[other.key] = make_space(other, target=task.target, limits=slot.limits)
        return spaces[other.key]

    # A pair's randomness depends on the job's seed and on what it tunes, never on
    # the order in which device kinds showed up.
    salt = hashlib.sha256(f"{task.key}|{slot.device_key}".encode()).digest()[:8]
    rng = np.random.default_rng([job.seed, int.from_bytes(salt, "little")])
    search = make_strategy(job.strategy, space, rng=rng, space_for=space_for, family=slot.family)
    mine = db.query(workload_key=wl.key, device_key=slot.device_key, target=task.target)
    # This family's records of the operator teach the cost model; other families'
    # records of it (in the database or given as history) are transfer sources,
    # weighed by how they rank this device.
    search.observe(before)
    measured = {r.config_key for r in mine}
    prog = TaskProgress(trials=task.trials, weight=task.weight, done=len(measured))
    ok = [r.latency_s for r in mine if r.ok and r.latency_s]
    if ok:
        prog.curve.append((len(measured), min(ok)))
    if mine:
        log.info("resuming %s: %d trials measured on %s", task.name, len(measured), slot.name)
    pair = Pair(task, slot, space, search, prog, measured, list(mine), space.default())
    pair.control.seed(mine)
    learn_group_cap(space, mine)
    return pair


def propose(pair: Pair, batch: int) -> list[Config]:
    """The pair's next batch of up to ``batch`` configs: the space's seeds (the compiler's
    own choice written out as knobs) not yet measured, its search's proposals, neither
    measured nor in flight, and, until it is measured, the default config: first where
    it is the compiler's own heuristic choice (``Space.heuristic_default``: IREE's), last
    where it is the plainest schedule (TVM's).

    The plainest schedule is measured for the report and the final's side by side, not
    as a guess at a fast config. Alone before the first batch, as it was until
    2026-12-07, it cost a round trip to the device and took the first trial: on the llvm
    replay samples of contractions it runs 27-335x slower than the sample's best (a
    random config 6.7-13x; softmax 3.5-8.4x against 2.6-3.0x), which sank the
    best-so-far curve's first trial far below random search's and took up to half of the
    methodology score's mean (bench/replay). IREE's default, its own heuristics, is the
    compiler's choice as the seeds are: on its llvm-cpu samples 1.1-3.1x the best's
    latency (see ``IreeSpace.heuristic_default``); measured last, the 28x28 conv's score
    on the first Xeon's sample went from 0.98 to 0.58 (the prior's first pick, with
    nothing measured, ran at 0.04 of the best)."""
    want = min(batch, left(pair))
    taken = pair.measured | pair.in_flight
    default = pair.default.key not in taken
    room = max(0, want - int(default))  # the default takes a slot of the batch
    taken.add(pair.default.key)
    out: list[Config] = [c for c in pair.space.seeds() if c.key not in taken][:room]
    taken |= {c.key for c in out}
    for _ in range(3):  # a strategy may repeat what is in flight elsewhere; ask again
        if len(out) >= room:
            break
        proposed = pair.search.propose(room - len(out)) or []
        for c in proposed:
            if c.key not in taken:
                taken.add(c.key)
                out.append(c)
        if not proposed:
            break
    out = out[:room]
    if not default:
        return out
    return [pair.default, *out] if pair.space.heuristic_default else [*out, pair.default]


def store(
    db: Database,
    pair: Pair,
    configs: Sequence[Config],
    records: list[Record],
    control: Config | None,
) -> tuple[list[Record], list[Record]]:
    """Store a batch of new ``configs`` that came back (``records``: theirs and the
    control's); returns the new configs' records as measured and as the search sees
    them (scaled by the batch's control, :mod:`.control`)."""
    db.add(records)  # one transaction per batch, the control's record too
    seen = pair.control.scale(records, control)
    pair.search.observe(seen)
    new = [r for r in records if control is None or r.config_key != control.key]
    pair.history.extend(new)
    learn_group_cap(pair.space, pair.history)
    pair.in_flight.difference_update(c.key for c in configs)
    pair.new += len([r for r in records if r.config_key not in pair.measured])
    pair.measured.update(r.config_key for r in records)
    best = min((r.latency_s for r in records if r.ok and r.latency_s), default=None)
    pair.progress.finish(len(configs), best)
    pair.progress.done = len(pair.measured)
    return new, seen


def withdraw(pair: Pair, configs: Sequence[Config]) -> None:
    """A batch of new ``configs`` that is not stored (lost with its runner, or the
    device's failure): no longer in flight, so the search proposes them again."""
    pair.in_flight.difference_update(c.key for c in configs)
    pair.progress.in_flight -= len(configs)


def error_record(pair: Pair, config: Config, status: str, error: str) -> Record:
    """A candidate that produced no measurement, kept as data like any other."""
    wl = pair.task.workload
    return Record(
        workload_key=wl.key,
        workload=wl.to_json(),
        target=pair.task.target,
        device_key=pair.slot.device_key,
        device_family=pair.slot.family,
        device=pair.slot.fingerprint,
        config_key=config.key,
        config=config.to_json(),
        status=status,
        error=error[:2000],
        latencies=(),
        latency_s=None,
        spread=None,
        gflops=None,
        timestamp=time.time(),
        run_id="job",
    )
