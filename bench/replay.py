"""Replay benchmark: every strategy on every cached CPU family, no hardware, seeded.

A cache (``bench/replay/*.jsonl.gz``, listed with its CPU in ``bench/replay/caches.json``)
is a large measured sample of one workload's space on one device. Each strategy of
:mod:`bench.replay_strategies` searches the cache's configs for ``--budget`` trials with
each of ``--seeds`` seeds; :mod:`bench.replay_metrics` turns the runs into median trials
to 90/95/99 % of the cache's best, the median best after 16/32/64 trials (a fraction
of the cache's best) and the methodology score of Willemsen et al. (0 = random search,
1 = the optimum). Prints a table, writes ``bench/results/replay.json`` and a PNG of the
median best-so-far curves, and says per cache whether the issue's targets hold and how
firmly: each strategy's per-seed figures are kept, and a bootstrap over the seeds says in
what share of resamples each target holds (a median over 20 seeds that sits between two
trial counts, or a score within a few runs' luck of another, shows as a share near 0.5
instead of a verdict).

    flock /tmp/autosched-cpu.lock .venv/bin/python bench/replay.py
    .venv/bin/python bench/replay.py --seeds 3 --caches matmul-512-opencl-zen4 --strategies autosched-model,optuna-tpe

A run is deterministic: the same caches, seeds and code give the same JSON.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import multiprocessing as mp
import os
import sys
import tempfile
import time
import warnings
import zlib
from pathlib import Path
from typing import Any

# One thread per process (the models' libraries would take every core): a run's result
# must not depend on the machine's core count, and --jobs says how many cores it uses.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench import replay_update  # noqa: E402
from bench.replay_metrics import (  # noqa: E402
    methodology_score,
    per_seed,
    seed_curves,
    summarise,
    support,
    transfer_summary,
)
from bench.replay_strategies import (  # noqa: E402
    KernelTunerReplay,
    autosched_run,
    fixed_trials,
    optuna_run,
)

CACHE_DIR = HERE / "replay"
# An autosched run's trials before its strategy proposes (the space's seeds), where an
# entry does not say (bench/replay_strategies.fixed_trials).
FIXED_TRIALS = 1
# Scores and fractions equal but for float rounding (summed in another order, 5e-15
# apart) are a tie, not a loss.
TIE = 1e-9
RESULTS = HERE / "results"
STRATEGIES = (
    "autosched-model",
    "autosched-model-transfer",
    "autosched-random",
    "autosched-tpe",
    "optuna-tpe",
    "optuna-gp",
    "kernel_tuner-bayes_opt",
    "kernel_tuner-genetic_algorithm",
)

_caches: list[Any] = []
_others: list[list[Any]] = []
_kt: dict[int, KernelTunerReplay] = {}
# Where this run's Kernel Tuner cache files go: a folder the main process makes and
# removes. Pool workers end without running finalizers, so a temporary folder of their
# own outlived every run (two per run of --jobs 2, up to 6 MB each).
_kt_root: list[str] = []
_devices: list[int] = [1]  # devices of the kind an autosched run keeps busy (--devices)


def cache_list(folder: Path = CACHE_DIR) -> list[dict[str, Any]]:
    """The caches' descriptions (``caches.json``: file, cpu, isa, ...)."""
    return json.loads((folder / "caches.json").read_text())["caches"]


def _load(entries: list[dict[str, Any]], folder: str) -> None:
    from autosched.tuning.replay import load_caches

    _caches.clear()
    for entry in entries:
        (cache,) = load_caches(Path(folder) / entry["file"])
        _caches.append(cache)
    _others.clear()
    for c in _caches:
        # Transfer: the other device families' records of the same workload on the same
        # target (the tuning loop reads no other target's records: their knobs differ).
        _others.append([r for o in _caches if _transfers(o, c) for r in o.all_records()])


def _transfers(source: Any, cache: Any) -> bool:
    """Whether ``source``'s records are a transfer source of a search over ``cache``:
    the same workload on the same target, from another device family the search would
    learn from (a CPU's records say nothing of a GPU's schedules: similarity 0)."""
    from autosched.space.device import similarity

    return (
        source.workload.key == cache.workload.key
        and source.target == cache.target
        and source.slot.family != cache.slot.family
        and similarity(source.slot.limits, cache.slot.limits) > 0
    )


def _init(entries: list[dict[str, Any]], folder: str, kt_root: str, devices: int = 1) -> None:
    _kt.clear()
    _kt_root[:] = [kt_root]
    _devices[:] = [devices]
    logging.getLogger("autosched").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")
    try:
        import torch  # optuna's GP sampler

        torch.set_num_threads(1)
    except ImportError:
        pass
    _load(entries, folder)


def run_one(task: tuple[int, str, int, int]) -> tuple[int, str, int, list[str] | str, float]:
    """One seeded run; returns the config keys measured in order (or, for a strategy
    that raised, the error as text: a failing strategy is reported, not fatal) and its
    seconds."""
    i, strategy, seed, budget = task
    start = time.perf_counter()
    try:
        keys: list[str] | str = _search(i, strategy, seed, budget)
    except Exception as exc:  # noqa: BLE001 - reported per strategy in the results
        keys = f"{type(exc).__name__}: {exc}"
    return i, strategy, seed, keys, time.perf_counter() - start


def _search(i: int, strategy: str, seed: int, budget: int) -> list[str]:
    cache = _caches[i]
    if strategy.startswith("autosched-"):
        name = strategy.removeprefix("autosched-")
        history = ()
        if name == "model-transfer":
            name, history = "model", _others[i]
        keys = autosched_run(cache, name, seed, budget, history=history, devices=_devices[0])
    elif strategy.startswith("optuna-"):
        keys = optuna_run(cache, strategy.removeprefix("optuna-"), seed, budget)
    elif strategy.startswith("kernel_tuner-"):
        if i not in _kt:
            own = Path(_kt_root[0]) / f"{os.getpid()}-{i}"
            own.mkdir()
            _kt[i] = KernelTunerReplay(cache, folder=own)
        keys = _kt[i].run(strategy.removeprefix("kernel_tuner-"), seed, budget)
    else:
        raise ValueError(f"unknown strategy {strategy!r}; accepted: {', '.join(STRATEGIES)}")
    return keys


def _targets(
    strategies: dict[str, dict[str, Any]], fixed: int = FIXED_TRIALS
) -> dict[str, bool | None]:
    """The issue's replay targets for autosched-model (None where a peer is missing);
    ``fixed``: the trials every autosched run spends before its strategy proposes."""
    strategies = {k: v for k, v in strategies.items() if "error" not in v}
    mine = strategies.get("autosched-model")
    if not mine:
        return {}
    others = {k: v for k, v in strategies.items() if not k.startswith("autosched-model")}
    out: dict[str, bool | None] = {}
    kt = strategies.get("kernel_tuner-bayes_opt")
    if kt:
        a, b = mine["trials_to_95"], kt["trials_to_95"]
        out["trials_to_95_at_most_half_of_bayes_opt"] = a is not None and (b is None or a <= b / 2)
    if others:
        # The highest: no other scores more. Where every start finds the cache's best
        # with its first proposal (the seed) autosched's other strategies tie it.
        out["highest_score"] = all(mine["score"] >= v["score"] - TIE for v in others.values())
        if "best_at_64" in mine:
            out["highest_best_at_64"] = all(
                mine["best_at_64"] >= v["best_at_64"] - TIE for v in others.values()
            )
    tr, rnd = strategies.get("autosched-model-transfer"), strategies.get("autosched-random")
    if tr and rnd:

        def t95(s: dict[str, Any]) -> float:
            return float("inf") if s["trials_to_95"] is None else s["trials_to_95"]

        # The first trials are the space's seeds: where the cold search reaches 95 %
        # with one of them or its first proposal, no start can need fewer, and equal is
        # the target.
        out["transfer_fewer_trials_than_cold"] = t95(tr) < t95(mine) or (
            t95(tr) == t95(mine) <= fixed + 1
        )
        out["transfer_not_more_than_random"] = t95(tr) <= t95(rnd)
    return out


def _support(
    file: str, strategies: dict[str, dict[str, Any]], fixed: int = FIXED_TRIALS
) -> dict[str, float]:
    """How often each target holds over bootstrap resamples of the strategies' seeds
    (:func:`bench.replay_metrics.support`), resampled alike for every run of ``file``."""
    seeds = {k: v["per_seed"] for k, v in strategies.items() if "per_seed" in v}
    if not seeds:
        return {}
    return support(seeds, functools.partial(_targets, fixed=fixed), seed=zlib.crc32(file.encode()))


def _rescore(entry: dict[str, Any]) -> None:
    entry["targets"] = _targets(entry["strategies"], entry["fixed_trials"])
    entry["support"] = _support(entry["file"], entry["strategies"], entry["fixed_trials"])


def _plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(results)
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4 * rows), squeeze=False)
    for ax, entry in zip(axes.flat, results):
        for name, s in entry["strategies"].items():
            if "error" in s:
                continue
            curve = s["median_curve"]
            style = "-" if name.startswith("autosched-model") else "--"
            ax.plot(range(1, len(curve) + 1), curve, style, label=name, linewidth=1.4)
        ax.set_title(f"{entry['workload']}\n{entry['cpu']}", fontsize=9)
        ax.set_xlabel("trial")
        ax.set_ylabel("best so far / cache best (median)")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(x: Any, pct: bool = False) -> str:
    if x is None:
        return "-"
    return f"{100 * x:.0f}%" if pct else f"{x:.1f}" if isinstance(x, float) else str(x)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20, help="seeds per strategy (default 20)")
    parser.add_argument("--budget", type=int, default=64, help="trials per run (default 64)")
    parser.add_argument("--caches", default="", help="comma-separated cache names (file stems)")
    parser.add_argument("--strategies", default="", help=f"comma-separated; of {STRATEGIES}")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--folder", type=Path, default=CACHE_DIR, help="where the caches are")
    parser.add_argument(
        "--devices",
        type=int,
        default=1,
        help="devices of the kind an autosched run keeps busy, as a farm's workers: each "
        "batch after the first N is proposed while N-1 are measured (default 1; the peers "
        "propose one trial at a time whatever it says)",
    )
    parser.add_argument("--json", type=Path, default=RESULTS / "replay.json")
    parser.add_argument(
        "--png", type=Path, default=None, help="the curves (default: --json's path, .png)"
    )
    parser.add_argument(
        "--update",
        action="store_true",
        help="keep what this run does not redo from an existing --json: other caches' "
        "entries, and other strategies' figures of the same seeds and budget (a full run "
        "in chunks)",
    )
    args = parser.parse_args(argv)
    if args.devices < 1:
        parser.error(f"--devices must be 1 or more, not {args.devices}")
    # Every cache is loaded (transfer draws on the others); the selected ones are run.
    entries = cache_list(args.folder)
    selected = list(range(len(entries)))
    if args.caches:
        wanted = args.caches.split(",")
        stems = [e["file"].removesuffix(".jsonl.gz") for e in entries]
        bad = [w for w in wanted if w not in stems]
        if bad:
            parser.error(f"unknown cache {bad[0]!r}; accepted: {', '.join(stems)}")
        selected = [stems.index(w) for w in wanted]
    strategies = args.strategies.split(",") if args.strategies else list(STRATEGIES)
    bad = [s for s in strategies if s not in STRATEGIES]
    if bad:
        parser.error(f"unknown strategy {bad[0]!r}; accepted: {', '.join(STRATEGIES)}")
    if "optuna-gp" in strategies:
        try:
            import torch  # noqa: F401 - optuna's GPSampler needs it
        except ImportError:
            strategies.remove("optuna-gp")
            print(
                "optuna-gp skipped: optuna's GPSampler needs torch (pip install torch "
                "--index-url https://download.pytorch.org/whl/cpu)"
            )
    if args.update:
        files = [entries[i]["file"] for i in selected]
        refused = replay_update.refusal(args.json, files, strategies, args.seeds, args.budget)
        if refused:
            parser.error(refused)
    kt_root = tempfile.TemporaryDirectory(prefix="autosched-kt-")
    try:
        return _run(args, entries, selected, strategies, kt_root.name)
    finally:
        kt_root.cleanup()


def _run(
    args: argparse.Namespace,
    entries: list[dict[str, Any]],
    selected: list[int],
    strategies: list[str],
    kt_root: str,
) -> int:
    _init(entries, str(args.folder), kt_root, args.devices)
    tasks = []
    for i in selected:
        for s in strategies:
            if s == "autosched-model-transfer" and not _others[i]:
                continue  # no other device family holds this workload
            tasks += [(i, s, seed, args.budget) for seed in range(args.seeds)]
    start = time.perf_counter()
    if args.jobs > 1:
        with mp.get_context("fork").Pool(
            args.jobs, _init, (entries, str(args.folder), kt_root, args.devices)
        ) as pool:
            done = pool.map(run_one, tasks, chunksize=1)
    else:
        done = [run_one(t) for t in tasks]
    wall = time.perf_counter() - start
    runs: dict[tuple[int, str], list[list[str]]] = {}
    seconds: dict[tuple[int, str], float] = {}
    for i, s, _seed, keys, sec in done:  # in task order: seeds ascending
        runs.setdefault((i, s), []).append(keys)
        seconds[(i, s)] = seconds.get((i, s), 0.0) + sec
    # The models fitted in a replay give slightly different rankings on another CPU
    # (floating-point sums in the boosted trees): each strategy's figures say where they ran.
    from autosched.measure.cpu import host_cpu

    cpu = host_cpu()
    host = f"{cpu.name} ({cpu.model_id}, {cpu.mcpu}), {time.strftime('%Y-%m-%d')}"
    results = []
    for i in selected:
        entry, cache = entries[i], _caches[i]
        ok = [r for r in cache.records.values() if r.ok and r.latency_s]
        best = cache.best_gflops
        out: dict[str, Any] = {}
        for s in strategies:
            if (i, s) not in runs:
                continue
            seq = runs[(i, s)]
            errors = [k for k in seq if isinstance(k, str)]
            if errors:
                out[s] = {"error": errors[0][:500], "failed_runs": len(errors)}
                continue
            gflops = [[cache.records[k].gflops or 0.0 for k in keys] for keys in seq]
            lat = [
                [cache.records[k].latency_s if cache.records[k].ok else None for k in keys]
                for keys in seq
            ]
            curves = seed_curves(gflops, best, args.budget)
            metrics, curve = summarise(curves, args.budget)
            latencies = [r.latency_s for r in ok]
            metrics["score"] = methodology_score(lat, latencies, args.budget)
            metrics["runs_short_of_budget"] = sum(len(k) < args.budget for k in seq)
            metrics["seconds_per_run"] = seconds[(i, s)] / len(seq)
            metrics["median_curve"] = [round(float(x), 4) for x in curve]
            metrics["per_seed"] = per_seed(curves, lat, latencies, args.budget)
            metrics["replayed_on"] = host
            out[s] = metrics
        fixed = fixed_trials(cache)
        results.append(
            {
                "cpu": entry["cpu"],
                "isa": entry["isa"],
                "workload": str(cache.workload),
                "workload_key": cache.workload.key,
                "target": cache.target,
                "device": cache.slot.name,
                "device_key": cache.slot.device_key,
                "file": entry["file"],
                "seeds": args.seeds,
                "budget": args.budget,
                "configs": len(cache.records),
                "ok_configs": len(ok),
                "best_gflops": best,
                "transfer_from": sorted(
                    {e["cpu"] for e, c in zip(entries, _caches) if _transfers(c, cache)}
                ),
                "fixed_trials": fixed,
                "strategies": out,
                "targets": _targets(out, fixed),
                "support": _support(entry["file"], out, fixed),
            }
        )
    if args.update and args.json.exists():
        order = [e["file"] for e in cache_list(args.folder)]
        results = replay_update.merge(args.json, results, order, _rescore)
    report = {
        "benchmark": "replay",
        "budget": args.budget,
        # A run in chunks (--update) may give some caches more seeds (a small sample's
        # figures swing with a few seeds): the fewest here, each cache's own in its entry.
        "seeds": min(e["seeds"] for e in results),
        "autosched_batch": 8,
        "autosched_devices": args.devices,
        "statistic": "seeds: the fewest any cache was replayed with (each cache's own under "
        "caches[].seeds); trials_to_X and best_at_N: medians over the seeds; best_at_N and the "
        "curves as a fraction of the cache's best GFLOP/s; score: Willemsen et al. (FGCS "
        "2024), 0 = random search, 1 = the optimum, averaged over trials 1..budget (the mean "
        "of the seeds' per_seed scores); support: per target, the share of 1000 bootstrap "
        "resamples of every strategy's seeds in which it holds",
        "wall_s": round(wall, 1),
        "transfer": transfer_summary(results, args.budget),
        "caches": results,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    args.png = args.png or args.json.with_suffix(".png")
    _plot(results, args.png)
    for entry in results:
        print(
            f"\n{entry['workload']} on {entry['cpu']} ({entry['isa']}): "
            f"{entry['configs']} configs, best {entry['best_gflops']:.1f} GFLOP/s"
        )
        print(
            f"  {'strategy':32} {'to90':>5} {'to95':>5} {'to99':>5} "
            f"{'@16':>5} {'@32':>5} {'@64':>5} {'score':>6}  s/run"
        )
        for name, m in entry["strategies"].items():
            if "error" in m:
                print(f"  {name:32} failed: {m['error'][:90]}")
                continue
            print(
                f"  {name:32} {_fmt(m['trials_to_90']):>5} {_fmt(m['trials_to_95']):>5} "
                f"{_fmt(m['trials_to_99']):>5} {_fmt(m.get('best_at_16'), True):>5} "
                f"{_fmt(m.get('best_at_32'), True):>5} {_fmt(m.get('best_at_64'), True):>5} "
                f"{m['score']:6.3f}  {m['seconds_per_run']:.2f}"
            )
        if entry["targets"]:
            held = entry.get("support", {})
            print(
                "  targets (share of seed resamples where it holds): "
                + ", ".join(f"{k}={v} ({held.get(k, '-')})" for k, v in entry["targets"].items())
            )
    summary = report["transfer"]
    if summary:
        print(
            f"\ntransfer, {summary['caches']} samples with sources ({summary['statistic']}): "
            f"fewer trials than cold on {summary['transfer_fewer']}, as many on "
            f"{summary['transfer_as_many']}, more on {summary['transfer_more']} (beyond the "
            f"seeds' noise, the paired difference's 90 % bootstrap interval clear of 0: "
            f"fewer on {summary['transfer_fewer_beyond_noise']}, more on "
            f"{summary['transfer_more_beyond_noise']}), more than "
            f"random search on {summary['transfer_more_than_random']}; mean "
            f"{summary['mean_transfer']} against {summary['mean_cold']} cold and "
            f"{summary['mean_random']} random"
        )
    print(f"\n{len(tasks)} runs in {wall:.0f} s; wrote {args.json} and {args.png}")
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
