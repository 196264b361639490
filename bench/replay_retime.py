"""Benchmark: is a replay sample's top real? Its best configs timed again, side by side.

    python -m bench.replay_retime [FILE ...] [--top 10] [--random 10] [--repeats 4]

A replay sample holds one reading per config (drift taken out), and the replay targets
are fractions of its best. Where several configs run within the readings' noise of
each other (a flat top), which of them the sample ranks first is luck, and its best
reading is the luckiest of them (a winner's curse): a strategy that finds another
config of that top scores below 100 % of "the best" though it found as fast a kernel.

For each sample measured on this machine's device (the same fingerprint; the others
are listed and skipped), this times its ``--top`` best configs and ``--random`` drawn
from the rest again, side by side: ``--repeats`` batches of ``--rounds`` interleaved
rounds in alternating order, each config's figure the median of its batches. It prints
per sample where the sample's best config lands among them, how many of the top run
within 5 % of the fastest of them, Kendall's tau of the sample's order against the new
one (over the top alone and over all), each config's spread between batches, and how
much the sample's figures of its top exceed their new ones beyond what those of the
random draw do (the winner's curse). Writes bench/results/replay_retime.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from autosched.measure.device import select_device
from autosched.measure.runner import TimingOptions
from autosched.report.aggregate import kendall_tau
from autosched.tuning.replay import ReplayCache, load_caches
from autosched.tuning.runner import DeviceSession
from bench.choice import retime
from bench.iree import machine_summary
from bench.replay import cache_list

HERE = Path(__file__).resolve().parent
CACHES = HERE / "replay"
RESULTS = HERE / "results"
WITHIN = 0.95  # "as fast": within 5 % of the fastest re-timed config


def picks(cache: ReplayCache, top: int, random: int, seed: int) -> tuple[list, list]:
    """The sample's ``top`` fastest records and ``random`` others drawn with ``seed``."""
    ranked = sorted(
        (r for r in cache.records.values() if r.ok and r.gflops),
        key=lambda r: -(r.gflops or 0.0),
    )
    rest = ranked[top:]
    rng = np.random.default_rng(seed)
    drawn = rng.choice(len(rest), size=min(random, len(rest)), replace=False)
    return ranked[:top], [rest[i] for i in sorted(drawn)]


def session_for(
    sessions: dict[str, DeviceSession], cache: ReplayCache, name: str
) -> DeviceSession | None:
    """A measuring session on this machine's device of ``cache``'s target (opened once
    per target into ``sessions``), or None, said in one line, where ``cache`` (the
    sample ``name``) was measured on another device."""
    target = cache.target
    if target not in sessions:
        device = select_device(None, target=target)
        sessions[target] = DeviceSession(device, target, timing=TimingOptions())
    here = sessions[target].slot().device_key
    if here != cache.slot.device_key:
        print(
            f"{name}: measured on device {cache.slot.device_key}, not this machine's "
            f"{here} ({cache.slot.name}); skipped"
        )
        return None
    return sessions[target]


def measure_sample(
    session: DeviceSession, cache: ReplayCache, args: argparse.Namespace
) -> dict[str, Any]:
    top, drawn = picks(cache, args.top, args.random, args.seed)
    configs = {r.config_key: r.config for r in top + drawn}
    figures = retime(session, cache.workload, cache.target, configs, args.repeats, args.rounds)
    now = {k: statistics.median(v) for k, v in figures.items() if v}
    if not now:  # every config failed this time (a driver gone, a changed machine)
        return {"top": len(top), "random": len(drawn), "error": "no config ran again"}
    fastest = max(now.values())

    def share(key: str) -> float | None:
        return now[key] / fastest if key in now else None

    top_keys = [r.config_key for r in top if r.config_key in now]
    order = sorted(now, key=lambda k: -now[k])
    best_key = top[0].config_key

    def inflation(records: list) -> float | None:
        ratios = [(r.gflops or 0.0) / now[r.config_key] for r in records if r.config_key in now]
        return statistics.median(ratios) if ratios else None

    spreads = [(max(v) - min(v)) / statistics.median(v) for v in figures.values() if len(v) > 1]
    return {
        "top": len(top),
        "random": len(drawn),
        "sample_best_gflops": top[0].gflops,
        "retimed_best_gflops": fastest,
        "sample_best_retimed_share": share(best_key),
        "sample_best_retimed_place": order.index(best_key) + 1 if best_key in now else None,
        "top_within_5pct": sum(now[k] >= WITHIN * fastest for k in top_keys),
        "kendall_top": kendall_tau(
            [cache.records[k].gflops for k in top_keys], [now[k] for k in top_keys]
        ),
        "kendall_all": kendall_tau([cache.records[k].gflops for k in now], list(now.values())),
        "median_spread": statistics.median(spreads) if spreads else None,
        "winners_curse": _ratio(inflation(top), inflation(drawn)),
        "configs": [
            {
                "key": r.config_key,
                "config": r.config,
                "drawn": r in drawn,
                "sample_gflops": r.gflops,
                "retimed_gflops": figures.get(r.config_key, []),
            }
            for r in top + drawn
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", help="sample files (default: every one in caches.json)")
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--random", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=4, help="side-by-side batches")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds per batch")
    ap.add_argument("--seed", type=int, default=0, help="draws the random configs")
    ap.add_argument("--out", type=Path, default=RESULTS / "replay_retime.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    files = args.files or [str(CACHES / e["file"]) for e in cache_list(CACHES)]
    started = time.time()
    sessions: dict[str, DeviceSession] = {}
    rows: list[dict[str, Any]] = []
    try:
        for path in files:
            (cache,) = load_caches(path)
            target = cache.target
            session = session_for(sessions, cache, Path(path).name)
            if session is None:
                continue
            row = {
                "file": Path(path).name,
                "cpu": cache.slot.name,
                "target": target,
                "workload": str(cache.workload),
                **measure_sample(session, cache, args),
            }
            rows.append(row)
            if "error" in row:
                print(f"{row['file']}: {row['error']}")
                continue
            print(
                f"{row['file']}: sample best {row['sample_best_gflops']:.1f} re-times at "
                f"{_f(row['sample_best_retimed_share'], '.3f')} of the fastest, place "
                f"{row['sample_best_retimed_place']}; {row['top_within_5pct']} of the top "
                f"{row['top']} within 5 %; tau top {_f(row['kendall_top'])}, all "
                f"{_f(row['kendall_all'])}; spread {_f(row['median_spread'])}; "
                f"winner's curse {_f(row['winners_curse'])}",
                flush=True,
            )
    finally:
        for s in sessions.values():
            s.close()
    result = {
        "benchmark": "replay_retime",
        "date": time.strftime("%Y-%m-%d %H:%M", time.localtime(started)),
        "machine": machine_summary(),
        "top": args.top,
        "random": args.random,
        "repeats": args.repeats,
        "rounds": args.rounds,
        "samples": rows,
        "wall_s": time.time() - started,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _f(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


if __name__ == "__main__":
    main()
