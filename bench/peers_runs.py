"""The peers benchmark's tuners: one run of one tuner with one seed, and what it leaves.

Every runner returns a :class:`Run`: each trial's GFLOP/s by the tuner's own stopwatch,
when it was known, and the run's best few programs (:class:`Finalist`) for the shared
re-timing (:mod:`bench.peers_retime`).
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.peers_metrics import best_round_gflops, best_so_far, checkpoint_leaders, first_trials

log = logging.getLogger(__name__)

# name -> (family, target, strategy)
TUNERS: dict[str, tuple[str, str, str]] = {
    "autosched-model": ("autosched", "opencl", "model"),
    "autosched-random": ("autosched", "opencl", "random"),
    "autosched-tpe": ("autosched", "opencl", "tpe"),
    "autosched-llvm": ("autosched", "llvm", "model"),
    "kt-bayes_opt": ("kernel_tuner", "opencl", "bayes_opt"),
    "kt-genetic_algorithm": ("kernel_tuner", "opencl", "genetic_algorithm"),
    "kt-random_sample": ("kernel_tuner", "opencl", "random_sample"),
    "ms-llvm": ("metaschedule", "llvm", "evolutionary"),
    "ms-opencl": ("metaschedule", "opencl", "evolutionary"),
}
# Quick: no genetic algorithm (its first generation, 26 configs, is a random sample, so
# within 24 trials it is random sampling) and no llvm pair (MetaSchedule llvm alone takes
# 1-2 minutes for 24 trials here).
QUICK_TUNERS = (
    "autosched-model",
    "autosched-random",
    "kt-bayes_opt",
    "kt-random_sample",
    "ms-opencl",
)


@dataclass
class Finalist:
    """One of a run's best programs, to be timed again by the shared harness."""

    label: str
    program: Any  # KernelProgram or CpuProgram
    own_gflops: float
    config: Any = None
    visits: list[list[float]] = field(default_factory=list)  # latencies, per round
    error: str | None = None
    trial: int | None = None  # the run's trial (1-based) that first measured it, if known
    leads: list[int] = field(default_factory=list)  # checkpoints its run's own best stood on

    def retimed_gflops(self, flops: float) -> float | None:
        """The best round's median: on this machine noise only ever slows a kernel."""
        return best_round_gflops(self.visits, flops) if not self.error else None

    def retimed_median_gflops(self, flops: float) -> float | None:
        """The median of every round's samples pooled."""
        pooled = [x for v in self.visits for x in v]
        return flops / float(np.median(pooled)) / 1e9 if pooled and not self.error else None


@dataclass
class Run:
    """One tuner, one seed: every trial's own figure, when it was known, the finalists."""

    tuner: str
    seed: int
    target: str
    gflops: list[float | None] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    keys: list[Any] = field(default_factory=list)  # each trial's config, as a hashable key
    wall_s: float = 0.0
    finalists: list[Finalist] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def curve(self) -> list[float]:
        return best_so_far(self.gflops)


def _top_distinct(items: Sequence[tuple[Any, float]], k: int) -> list[tuple[Any, float]]:
    """The ``k`` best (key, gflops) pairs with distinct keys, best first."""
    seen, out = set(), []
    for key, g in sorted(items, key=lambda x: -x[1]):
        if key in seen:
            continue
        seen.add(key)
        out.append((key, g))
        if len(out) == k:
            break
    return out


def _picks(
    run: Run, ranked: Sequence[tuple[Any, float]], k: int
) -> list[tuple[Any, float, list[int]]]:
    """What the shared harness re-times of a run, as (key, own GFLOP/s, leads): its ``k``
    best distinct configs by its own figures, then the config its best-so-far stood on at
    each checkpoint (16, 32 trials) when not among them, so the tuners are compared
    re-timed at those points too; ``leads`` names the checkpoints a config stood on."""
    leaders = checkpoint_leaders(run.gflops)
    out = _top_distinct(ranked, k)
    have = {key for key, _ in out}
    for i in leaders.values():
        key = run.keys[i]
        if key not in have:
            have.add(key)
            out.append((key, run.gflops[i]))
    return [(key, g, [n for n, i in leaders.items() if run.keys[i] == key]) for key, g in out]


def run_autosched(wl, *, strategy: str, target: str, seed: int, args, device) -> Run:
    import autosched
    from autosched.measure.build import build
    from autosched.measure.device import select_device
    from autosched.space.config import Config
    from autosched.space.select import make_space

    dev = select_device(device if target == "opencl" else None, target=target)
    run = Run(tuner="", seed=seed, target=target)
    start = time.perf_counter()

    def progress(event) -> None:
        rec = event.record
        run.gflops.append(rec.gflops if rec.ok else None)
        run.times.append(time.perf_counter() - start)
        run.keys.append(rec.config_key)

    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        res = autosched.tune(
            wl,
            trials=args.trials,
            batch=args.batch,
            strategy=strategy,
            target=target,
            db=Path(tmp) / "records.db",
            device=dev,
            seed=seed,
            timeout_s=args.timeout,
            progress=progress,
        )
    run.wall_s = time.perf_counter() - start
    errors: dict[str, int] = {}
    for rec in res.history:
        if not rec.ok:
            errors[rec.status] = errors.get(rec.status, 0) + 1
    run.info = {
        "final_gflops": res.best.gflops if res.best else None,
        "final_config": res.best.config if res.best else None,
        "default_gflops": res.default.gflops if res.default else None,
        "errors": errors,
    }
    by_key = {r.config_key: r.config for r in res.history if r.ok}
    ranked = [(r.config_key, r.gflops) for r in res.history if r.ok and r.gflops]
    if res.best is not None:  # its own final re-measurement's winner goes first
        ranked.append((res.best.config_key, float("inf")))
    space = make_space(wl, target=target, limits=dev.limits)
    first = first_trials(run.keys)
    for key, _, leads in _picks(run, ranked, args.retime_top):
        own = max(
            (r.gflops or 0.0 for r in res.history if r.ok and r.config_key == key), default=0.0
        )
        try:
            program = build(space, Config(by_key[key]))
        except Exception as exc:  # a config that measured fine builds again; say so if not
            log.warning("%s: cannot rebuild %s: %s", wl, key, exc)
            continue
        run.finalists.append(
            Finalist(key, program, own, by_key[key], trial=first.get(key), leads=leads)
        )
    return run


def run_kernel_tuner(wl, *, strategy: str, seed: int, args, device) -> Run:
    from autosched.measure.worker import pocl_pinning
    from bench import peers_kt, peers_sgemm

    m, n, k = wl.M, wl.N, wl.K
    result = peers_kt.tune(
        m=m,
        n=n,
        k=k,
        strategy=strategy,
        trials=args.trials,
        seed=seed,
        platform=device.platform_index,
        device=device.device_index,
        tolerance=wl.tolerance(),
        local_mem_bytes=device.local_mem_bytes,
        timeout_s=max(600.0, 60.0 * args.trials),
        env=pocl_pinning(device),  # the environment autosched's measurement child has
    )
    run = Run(tuner="", seed=seed, target="opencl", wall_s=result["wall_s"])
    for ev in result["evaluations"]:
        g = wl.flops() / (ev["time_ms"] * 1e-3) / 1e9 if ev["time_ms"] else None
        run.gflops.append(g)
        run.times.append(ev["t"])
    evs = result["evaluations"]
    run.keys = [peers_sgemm.config_key(ev["config"]) for ev in evs]
    keyed = dict(zip(run.keys, (ev["config"] for ev in evs)))
    ranked = [(key, g) for key, g in zip(run.keys, run.gflops) if g is not None]
    first = first_trials(run.keys)
    for key, g, leads in _picks(run, ranked, args.retime_top):
        cfg = keyed[key]
        program = peers_sgemm.program(cfg, m, n, k)
        run.finalists.append(Finalist(key, program, g, cfg, trial=first[key], leads=leads))
    errors: dict[str, int] = {}
    for ev in evs:
        if ev["error"]:
            errors[ev["error"]] = errors.get(ev["error"], 0) + 1
    run.info = {
        "evaluations": len(evs),
        "unique_configs": len(keyed),
        "iterations": result["iterations"],
        "errors": errors,
        "best_config": run.finalists[0].config if run.finalists else None,
    }
    return run


def run_metaschedule(wl, *, target: str, seed: int, args, device) -> Run:
    from bench import peers_ms

    _quiet_metaschedule()
    if target == "llvm":
        result = peers_ms.tune_llvm(
            wl, trials=args.trials, batch=args.batch, seed=seed, top=args.retime_top
        )  # programs: its database's top, then the checkpoints' best-so-far
    else:
        result = peers_ms.tune_opencl(
            wl,
            device=device,
            trials=args.trials,
            batch=args.batch,
            seed=seed,
            top=args.retime_top,
            timeout_s=args.timeout,
        )
    run = Run(tuner="", seed=seed, target=target, wall_s=result["wall_s"])
    for entry in result["history"]:
        run.gflops.append(entry["gflops"])
        run.times.append(entry["t"])
    # Each of its trials is one candidate: the leader at N is the finalist of its trial.
    leaders = checkpoint_leaders(run.gflops)
    for label, program, g, trial in result["programs"]:
        leads = [n for n, i in leaders.items() if i + 1 == trial]
        run.finalists.append(Finalist(label, program, g, trial=trial, leads=leads))
    errors: dict[str, int] = {}
    for entry in result["history"]:
        if entry["error"]:
            # MetaSchedule's messages start with who failed and why (one line, say
            # "LocalBuilder: Timeout, killed after 30.0 seconds"); the rest is a traceback.
            kind = entry["error"].strip().splitlines()[0][:160]
            errors[kind] = errors.get(kind, 0) + 1
    run.info = {"errors": errors, "wall_clock": result["wall_clock"]}
    if "target" in result:
        run.info["tvm_target"] = result["target"]
    if result.get("best_trace"):  # the schedule of its best, to read what it found
        run.info["best_trace"] = result["best_trace"]
    if target == "opencl" and run.finalists:
        run.info["best_source"] = run.finalists[0].program.source
    return run


def _quiet_metaschedule() -> None:
    # MetaSchedule's console handler takes the level its logger has when tuning starts,
    # and each tune_tir call resets that level to DEBUG.
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
