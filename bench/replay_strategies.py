"""The strategies bench/replay.py compares, each over exactly the configs of one cache.

Every function runs one seeded search of ``budget`` trials over a
:class:`~autosched.tuning.replay.ReplayCache` and returns the config keys it measured,
in order (distinct configs, at most ``budget``; fewer when a strategy gives up):

* autosched's strategies run through the live tuner's loop
  (:func:`autosched.tuning.loop.run_job`) on a :class:`~autosched.tuning.replay.ReplayRunner`
  with an in-memory records database, batches of 8 like a live run; "transfer" hands
  them other device families' records of the same workload as history.
* Optuna's TPE and GP samplers ask for knob values (each knob an integer: the index
  of its value among the values the cache holds, sorted, so tile sizes keep their
  order; a categorical encoding made the GP sampler some 20 s a run); the asked point is answered by the nearest recorded config
  not measured yet (fewest knobs unlike it), and that config and its latency are what
  the study is told (the asked trial itself is told as failed, so samplers ignore it).
* Kernel Tuner's bayes_opt and genetic_algorithm run in its simulation mode on a
  Kernel Tuner cache file written from the cache, with one tunable parameter per knob
  and a restriction to the recorded configs (its search space is exactly the cache).
  Kernel Tuner draws from Python's and NumPy's global generators, which are seeded
  before each run; bayes_opt's two other sources of chance (an unseeded Latin
  hypercube, refits timed by the wall clock) are pinned for the run
  (:func:`_deterministic_bayes_opt`), so every strategy's run is a function of its seed.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import random
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from autosched.records.record import Record
from autosched.records.sqlite import SQLiteDatabase
from autosched.space.config import Config
from autosched.tuning.job import Job, Task
from autosched.tuning.loop import run_job
from autosched.tuning.replay import ReplayCache, ReplayRunner

log = logging.getLogger(__name__)

BATCH = 8  # configs per batch for autosched's strategies, as in a live run


def autosched_run(
    cache: ReplayCache,
    strategy: str,
    seed: int,
    budget: int,
    *,
    history: Sequence[Record] = (),
    devices: int = 1,
) -> list[str]:
    """One run of autosched's ``strategy`` through the tuning loop on a replay runner
    (``devices`` of the kind: :class:`~autosched.tuning.replay.ReplayRunner`)."""
    runner = ReplayRunner([cache], devices=devices)
    db = SQLiteDatabase(":memory:")
    task = Task("replay", cache.workload, cache.target, budget)
    job = Job(name="replay", tasks=(task,), strategy=strategy, seed=seed, batch=BATCH)
    try:
        result = run_job(job, runner, db, finalists=0, history=history)
    finally:
        runner.close()
        db.close()
    (pair,) = result.pairs
    return _distinct([r.config_key for r in pair.history])[:budget]


def fixed_trials(cache: ReplayCache) -> int:
    """Trials every autosched run of ``cache`` spends before its strategy proposes: the
    space's seeds, after the default config where that is the compiler's own choice
    (IREE's; TVM's comes last in the first batch: :func:`autosched.tuning.pair.propose`)."""
    space = ReplayRunner([cache]).space(cache.workload, target=cache.target, slot=cache.slot)
    default = space.default().key
    seeds = len({c.key for c in space.seeds() if c.key != default})
    return seeds + int(space.heuristic_default)


def _distinct(keys: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(keys))


def _value_text(value: Any) -> Any:
    """A knob value as a primitive for Optuna and Kernel Tuner (lists become text)."""
    if isinstance(value, (list, tuple)):
        return "x".join(str(v) for v in value)
    return value


class Encoded:
    """A cache's configs as rows of value codes, one column per knob."""

    def __init__(self, cache: ReplayCache) -> None:
        self.keys = list(cache.records)
        configs = [Config(r.config).to_json() for r in cache.records.values()]
        self.names = sorted({n for c in configs for n in c})
        self.values: list[list[Any]] = []
        for name in self.names:
            seen = dict.fromkeys(_value_text(c.get(name)) for c in configs)
            self.values.append(sorted(seen, key=lambda v: (str(type(v)), v)))
        self.rows = [[_value_text(c.get(n)) for n in self.names] for c in configs]
        index = [{v: i for i, v in enumerate(vals)} for vals in self.values]
        self.matrix = np.array(
            [[index[j][v] for j, v in enumerate(row)] for row in self.rows], dtype=np.int64
        )

    def nearest_unmeasured(
        self, params: dict[str, int], taken: set[int], rng: np.random.Generator
    ) -> int:
        """The row nearest to ``params`` (value indices; fewest unlike knobs) not in
        ``taken``, ties broken by ``rng`` (so no row is favoured by its position)."""
        row = np.array([params[n] for n in self.names], dtype=np.int64)
        distance = (self.matrix != row).sum(axis=1).astype(float)
        if taken:
            distance[list(taken)] = np.inf
        ties = np.flatnonzero(distance == distance.min())
        return int(ties[rng.integers(len(ties))])


def optuna_run(cache: ReplayCache, sampler: str, seed: int, budget: int) -> list[str]:
    """One run of Optuna's ``"tpe"`` or ``"gp"`` sampler (see the module docstring)."""
    import optuna
    from optuna.distributions import IntDistribution
    from optuna.trial import TrialState, create_trial

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    enc = Encoded(cache)
    dists = {n: IntDistribution(0, len(vals) - 1) for n, vals in zip(enc.names, enc.values)}
    if sampler == "tpe":
        chosen = optuna.samplers.TPESampler(seed=seed)
    elif sampler == "gp":
        chosen = optuna.samplers.GPSampler(seed=seed)
    else:
        raise ValueError(f"sampler {sampler!r}; accepted: tpe, gp")
    study = optuna.create_study(direction="minimize", sampler=chosen)
    taken: set[int] = set()
    rng = np.random.default_rng(seed)
    out: list[str] = []
    for _ in range(min(budget, len(enc.keys))):
        trial = study.ask(dists)
        i = enc.nearest_unmeasured(trial.params, taken, rng)
        study.tell(trial, state=TrialState.FAIL)
        taken.add(i)
        key = enc.keys[i]
        out.append(key)
        rec = cache.records[key]
        params = {n: int(v) for n, v in zip(enc.names, enc.matrix[i])}
        if rec.ok and rec.latency_s:
            study.add_trial(create_trial(params=params, distributions=dists, value=rec.latency_s))
        else:
            study.add_trial(create_trial(params=params, distributions=dists, state=TrialState.FAIL))
    return out


def write_kernel_tuner_cache(cache: ReplayCache, path: str | os.PathLike[str]) -> dict[str, Any]:
    """Write ``cache`` as a Kernel Tuner cache file; returns the tune_params."""
    enc = Encoded(cache)
    tune_params = {n: vals for n, vals in zip(enc.names, enc.values)}
    entries: dict[str, Any] = {}
    for key, row in zip(enc.keys, enc.rows):
        rec = cache.records[key]
        entry: dict[str, Any] = dict(zip(enc.names, row))
        if rec.ok and rec.latency_s:
            entry["time"] = rec.latency_s * 1e3  # Kernel Tuner keeps milliseconds
            entry["times"] = [x * 1e3 for x in rec.latencies]
        else:
            entry["time"] = "RuntimeFailedConfig"
        entry.update(compile_time=0.0, verification_time=0.0, benchmark_time=0.0)
        entries[",".join(str(v) for v in row)] = entry
    data = {
        "device_name": cache.slot.name,
        "kernel_name": cache.workload.op,
        "problem_size": [1],
        "tune_params_keys": enc.names,
        "tune_params": tune_params,
        "objective": "time",
        "cache": entries,
    }
    Path(path).write_text(json.dumps(data))
    return tune_params


class _RecordedPrefix:
    """Kernel Tuner's restriction: are the assigned knob values those of a recorded
    config? Unassigned values (python-constraint's ``Unassigned``) match anything; the
    recorded rows projected onto each set of assigned positions are built once."""

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self.rows = rows
        self._projections: dict[tuple[int, ...], set[tuple[Any, ...]]] = {}

    def __call__(self, *values: Any) -> bool:
        # Looked up here, not kept on self: Kernel Tuner deep-copies its restrictions,
        # and a copied sentinel would no longer be python-constraint's ``Unassigned``.
        from constraint import Unassigned

        at = tuple(i for i, v in enumerate(values) if v is not Unassigned)
        seen = self._projections.get(at)
        if seen is None:
            seen = {tuple(row[i] for i in at) for row in self.rows}
            self._projections[at] = seen
        return tuple(values[i] for i in at) in seen


@contextlib.contextmanager
def _deterministic_bayes_opt(seed: int) -> Iterator[None]:
    """Kernel Tuner 1.5's bayes_opt, made a function of its seed for the block.

    Two things in it escape the global generators seeded before a run, so one seed gave
    a different run each time (in one process or a fresh one):

    * it draws its initial sample from SciPy's ``LatinHypercube`` without a seed (fresh
      operating-system entropy): here the constructor gets a generator seeded from
      ``seed``;
    * its default method (multi-ultrafast) refits the Gaussian process only when the
      last evaluation took at least ``predict_eval_ratio`` (5) times the last
      prediction by the wall clock, else every 5th evaluation. In simulation an
      evaluation is a lookup of microseconds, so whether it refits depended on the
      machine's load; in a live run an evaluation (compile, verify, time a kernel)
      takes far longer than a prediction and it refits after every one. Here the ratio
      is 0, so it refits after every evaluation, as it would live.
    """
    from kernel_tuner.strategies import bayes_opt

    cls = bayes_opt.BayesianOptimization
    name = "_BayesianOptimization__optimize_multi_ultrafast"
    unseeded, ultrafast = bayes_opt.LatinHypercube, getattr(cls, name)
    bayes_opt.LatinHypercube = functools.partial(unseeded, rng=np.random.default_rng(seed))
    setattr(cls, name, functools.partialmethod(ultrafast, predict_eval_ratio=0))
    try:
        yield
    finally:
        bayes_opt.LatinHypercube = unseeded
        setattr(cls, name, ultrafast)


@contextlib.contextmanager
def _neighbor_lists() -> Iterator[None]:
    """Kernel Tuner 1.5's search space, with its neighbour cache kept as lists.

    Its partial neighbour cache holds a list per config and appends to it as neighbours
    turn up; but a config whose full Hamming neighbourhood was computed has that entry
    replaced by the NumPy index array the computation returned, and the next neighbour
    found for it fails on ``append`` (an ``AttributeError``; ``pop`` alike). The
    genetic algorithm's mutation meets it where many configs are neighbours: on the
    softmax llvm sample, 2,799 of its space's 2,800 configs, seed 9 failed this way.
    Here every entry is stored as a list of the same indices: the same neighbours in
    the same order."""
    from kernel_tuner.searchspace import Searchspace

    name = "_Searchspace__add_to_neighbor_partial_cache"
    original = getattr(Searchspace, name)

    def as_lists(self, param_config, neighbor_indices, neighbor_method, full_neighbors=False):
        indices = [int(i) for i in neighbor_indices]
        return original(self, param_config, indices, neighbor_method, full_neighbors)

    setattr(Searchspace, name, as_lists)
    try:
        yield
    finally:
        setattr(Searchspace, name, original)


class KernelTunerReplay:
    """Kernel Tuner's simulation mode over one cache (its cache file written once)."""

    def __init__(self, cache: ReplayCache, folder: str | os.PathLike[str] | None = None) -> None:
        self.cache = cache
        self._tmp = None if folder else tempfile.TemporaryDirectory(prefix="autosched-kt-")
        base = Path(folder) if folder else Path(self._tmp.name)
        self.path = base / f"{cache.workload.key}-{cache.slot.device_key}.json"
        self.tune_params = write_kernel_tuner_cache(cache, self.path)
        self.names = list(self.tune_params)
        enc = Encoded(cache)
        by_row = {tuple(row): key for key, row in zip(enc.keys, enc.rows)}
        self.by_row = by_row
        self.restriction: Callable[..., bool] = _RecordedPrefix(list(by_row))

    def run(self, strategy: str, seed: int, budget: int) -> list[str]:
        with _deterministic_bayes_opt(seed), _neighbor_lists():
            # Seeded after the contexts' imports: importing Kernel Tuner's bayes_opt
            # draws from Python's generator, so a process's first run (of any
            # strategy) drew other numbers than the same seed's later runs.
            random.seed(seed)
            np.random.seed(seed)  # noqa: NPY002 - Kernel Tuner draws from the global generators
            results = self._tune(strategy, budget)
        keys = [self.by_row.get(tuple(r[n] for n in self.names)) for r in results if r]
        return _distinct([k for k in keys if k is not None])[:budget]

    def _tune(self, strategy: str, budget: int) -> list[dict[str, Any]]:
        from constraint import FunctionConstraint
        from kernel_tuner import tune_kernel

        results, _ = tune_kernel(
            self.cache.workload.op,
            "",
            (1,),
            [],
            self.tune_params,
            # assigned=False: the solver asks about partial assignments too, so it
            # prunes every branch no recorded config lies under instead of walking the
            # whole product of knob values (71 million for the conv2d cache).
            restrictions=[FunctionConstraint(self.restriction, assigned=False)],
            cache=str(self.path),
            simulation_mode=True,
            strategy=strategy,
            strategy_options={"max_fevals": budget},
            quiet=True,
            verbose=False,
        )
        return results

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
