"""How the job loop fills the devices that are free: the task scheduler's picks, then
their batches, proposed in threads where they are different pairs'
(:func:`autosched.tuning.loop.run_job`'s ``proposers``)."""

from __future__ import annotations

import threading
from collections.abc import Container, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

from autosched.space.config import Config
from autosched.tuning.job import Job
from autosched.tuning.pair import Pair, left, propose
from autosched.tuning.runner import Slot
from autosched.tuning.scheduler import TaskScheduler


def pick(
    job: Job,
    policy: TaskScheduler,
    pairs: list[Pair],
    slots: dict[str, Slot],
    busy: dict[str, int],
    broken: Container[str],
    proposers: int,
) -> list[tuple[str, Slot, Pair, int]]:
    """The policy's picks for the devices free now: (device key, slot, pair, trials held
    for its batch). Each pick's trials count as in flight at once (``progress.start``), so
    the policy's next pick sees them, as it saw a proposed batch's before. With one proposer
    one pick at a time: the loop proposes and submits it before the policy picks again."""
    picks: list[tuple[str, Slot, Pair, int]] = []
    held: dict[int, int] = {}  # pair index -> trials held for its picks of this round
    for key, slot in slots.items():
        taken = 0
        while key not in broken and busy.get(key, 0) + taken < slot.count:
            if proposers <= 1 and picks:
                return picks
            mine = [i for i, p in enumerate(pairs) if p.slot.device_key == key]
            eligible = [
                i for i in mine if left(pairs[i]) > held.get(i, 0) and not pairs[i].exhausted
            ]
            progress_now = [p.progress for p in pairs]
            i = policy.next_task(progress_now, eligible)
            if i is None:
                break
            room = policy.room(progress_now, i)
            n = min(
                job.batch if room is None else min(job.batch, room), left(pairs[i]) - held.get(i, 0)
            )
            held[i] = held.get(i, 0) + n
            pairs[i].progress.start(n)
            picks.append((key, slot, pairs[i], n))
            taken += 1
    return picks


def proposed(
    picks: Sequence[tuple[str, Slot, Pair, int]], proposers: int
) -> Iterator[tuple[tuple[str, Slot, Pair, int], list[Config]]]:
    """Each pick with its batch, in the picks' order, each as soon as it and the ones
    before it are proposed (so its device gets it then). The picks of one pair are
    proposed in turn, each knowing the ones before it as in flight; different pairs' in
    up to ``proposers`` threads at once (a fit of the cost model, most of a proposal,
    runs outside the GIL), so a farm's client that proposes for many devices keeps them
    busy. The order, and so every search, is the same whatever ``proposers`` is."""
    lanes: dict[int, list[int]] = {}  # one lane per pair, its picks in order
    for j, chosen in enumerate(picks):
        lanes.setdefault(id(chosen[2]), []).append(j)

    def one(j: int) -> list[Config]:
        _, _, pair, n = picks[j]
        configs = propose(pair, n)
        pair.in_flight.update(c.key for c in configs)
        return configs

    if proposers <= 1 or len(lanes) == 1:
        for j, chosen in enumerate(picks):
            yield chosen, one(j)
        return
    done: dict[int, list[Config] | BaseException] = {}
    ready = threading.Condition()

    def lane(js: list[int]) -> None:
        for k, j in enumerate(js):
            try:
                result: list[Config] | BaseException = one(j)
            except BaseException as exc:  # noqa: BLE001 - raised in the loop's thread
                with ready:
                    done.update({later: exc for later in js[k:]})
                    ready.notify_all()
                return
            with ready:
                done[j] = result
                ready.notify_all()

    with ThreadPoolExecutor(min(proposers, len(lanes)), "autosched-propose") as pool:
        for js in lanes.values():
            pool.submit(lane, js)
        for j, chosen in enumerate(picks):
            with ready:
                ready.wait_for(lambda j=j: j in done)
                result = done.pop(j)
            if isinstance(result, BaseException):
                raise result
            yield chosen, result
