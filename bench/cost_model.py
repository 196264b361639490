"""Compare cost-model kinds on recorded measurements: do their top picks beat random picks?

Splits (all on real records replayed from a JSON Lines file):

* ``by-workload``: leave one shape out; train on the others, rank the held-out shape's
  records (transfer to a shape never measured);
* ``transfer+32``: as above, plus 32 random records of the held-out shape in the
  training set (a tuner after its first batch);
* ``random``: 75/25 random split of all records, scored per shape (5 splits).

Metrics per held-out shape, targets normalized by that shape's best held-out record:
mean and best normalized GFLOP/s of the model's top 8 against 8 random picks
(expectation over 500 draws), Spearman rank correlation and NDCG@8. Averaged over
shapes, splits and 3 model seeds. Also the times to fit ~2,000 rows and to predict
5,000 candidates (1 and 2 threads), and to featurize 5,000 configs.

Example::

    python -m bench.cost_model --records tests/data/matmul_pocl_records.jsonl
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr
from sklearn.metrics import ndcg_score

from autosched.cost_model.features import feature_names, featurize
from autosched.cost_model.model import KINDS, make_model, normalized_targets, training_set
from autosched.ops import workload_from_json
from autosched.records.record import Record
from autosched.space.config import Config
from autosched.space.select import make_space
from autosched.space.space import DeviceLimits, Space

log = logging.getLogger("bench.cost_model")

TOP_K = 8
SEEDS = (0, 1, 2)


def load_records(path: Path) -> list[Record]:
    with path.open() as f:
        return [Record.from_json(json.loads(line)) for line in f if line.strip()]


def limits_from_fingerprint(device: dict) -> DeviceLimits:
    return DeviceLimits(
        max_work_group_size=int(device["max_work_group_size"]),
        max_work_item_size=int(device["max_work_item_sizes"][0]),
        local_mem_bytes=int(device["local_mem_bytes"]),
        is_cpu=device.get("type") == "cpu",
    )


def space_factory(records: Sequence[Record]) -> Callable[[dict], Space]:
    """Spaces of the records' workloads on the recorded device (one space per workload)."""
    limits = limits_from_fingerprint(records[0].device)
    cache: dict[str, Space] = {}

    def space_for(wl: dict) -> Space:
        key = json.dumps(wl, sort_keys=True)
        if key not in cache:
            cache[key] = make_space(workload_from_json(wl), limits=limits)
        return cache[key]

    return space_for


def rank_metrics(pred: np.ndarray, y: np.ndarray, rng: np.random.Generator, k: int = TOP_K) -> dict:
    """How good the top ``k`` by ``pred`` are, against ``k`` random picks; ``y`` in [0, 1]."""
    top = np.argsort(-pred, kind="stable")[:k]
    draws = np.array([rng.choice(len(y), size=min(k, len(y)), replace=False) for _ in range(500)])
    rho = spearmanr(pred, y).statistic if np.ptp(pred) > 0 else 0.0
    return {
        "top_mean": float(y[top].mean()),
        "top_best": float(y[top].max()),
        "random_mean": float(y.mean()),
        "random_best": float(y[draws].max(axis=1).mean()),
        "spearman": float(np.nan_to_num(rho)),
        "ndcg": float(ndcg_score(y[None, :], pred[None, :], k=k)),
    }


def evaluate(
    records: Sequence[Record],
    kinds: Sequence[str],
    *,
    space_for: Callable[[dict], Space],
    seeds: Sequence[int] = SEEDS,
    features: Callable[[Sequence[Record]], tuple] | None = None,
) -> dict[str, dict[str, dict[str, float]]]:
    """Metrics per split and kind, averaged over held-out shapes, splits and seeds.

    ``features`` turns records into ``(X, y, groups)``; default :func:`training_set`.
    """
    names = feature_names(space_for(records[0].workload))
    rows = features or (lambda recs: training_set(recs, space_for, names=names))
    keys = list(dict.fromkeys(r.workload_key for r in records))
    # (split, training records, test sets: one per shape, each ranked on its own)
    tasks: list[tuple[str, list[Record], list[list[Record]]]] = []
    for key in keys:
        held = [r for r in records if r.workload_key == key]
        rest = [r for r in records if r.workload_key != key]
        tasks.append(("by-workload", rest, [held]))
        for draw in range(3):
            perm = np.random.default_rng([draw, len(tasks)]).permutation(len(held))
            train = rest + [held[i] for i in perm[:32]]
            tasks.append(("transfer+32", train, [[held[i] for i in perm[32:]]]))
    for split in range(5):
        perm = np.random.default_rng(100 + split).permutation(len(records))
        cut = int(0.75 * len(records))
        test = [records[i] for i in perm[cut:]]
        tests = [[r for r in test if r.workload_key == key] for key in keys]
        tasks.append(("random", [records[i] for i in perm[:cut]], tests))

    acc: dict[str, dict[str, list[dict]]] = {}
    for split, train, tests in tasks:
        X, y, g = rows(train)
        held_out = [rows(test)[:2] for test in tests]
        for kind in kinds:
            for seed in seeds if kind != "prior" else seeds[:1]:
                model = make_model(kind, seed=seed).fit(X, y, g)
                for Xt, yt in held_out:
                    if len(yt) < 2 * TOP_K or yt.max() <= 0:
                        continue
                    m = rank_metrics(model.predict(Xt), yt, np.random.default_rng(seed))
                    acc.setdefault(split, {}).setdefault(kind, []).append(m)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for split, per in acc.items():
        for kind, ms in per.items():
            summary = {m: float(np.mean([d[m] for d in ms])) for m in ms[0]}
            # Spread over held-out sets (and seeds): how much of a difference is noise.
            tops = np.array([d["top_mean"] for d in ms])
            summary["top_mean_se"] = (
                float(tops.std(ddof=1) / np.sqrt(len(tops))) if len(tops) > 1 else 0.0
            )
            summary["n"] = len(ms)
            out.setdefault(split, {})[kind] = summary
    return out


def timings(
    records: Sequence[Record],
    kinds: Sequence[str],
    space_for,
    *,
    seed: int = 0,
    n_jobs: Sequence[int] = (1, 2),
    repeats: int = 3,
) -> dict:
    """Median seconds to featurize 5,000 configs, fit 2,000 rows and predict 5,000 rows."""
    rng = np.random.default_rng(seed)
    space = space_for(records[-1].workload)
    configs = space.sample(rng, 5000)
    fresh, cached = [], []
    for _ in range(repeats):
        new = make_space(space.workload, limits=space.limits)  # an empty feature cache
        t = time.perf_counter()
        cand = featurize(new, configs)
        fresh.append(time.perf_counter() - t)
        t = time.perf_counter()
        featurize(new, configs)
        cached.append(time.perf_counter() - t)
    out: dict = {
        "featurize_5000_s": float(np.median(fresh)),
        "featurize_5000_cached_s": float(np.median(cached)),
        "n_candidates": len(configs),
    }
    X, y, g = training_set(records, space_for, names=feature_names(space))
    idx = np.sort(rng.choice(len(y), size=2000, replace=len(y) < 2000))
    X2, y2, g2 = X[idx], y[idx], g[idx]
    out["fit_rows"] = len(y2)
    for kind in kinds:
        for jobs in n_jobs if kind != "prior" else n_jobs[:1]:
            fit_s, predict_s = [], []
            for r in range(repeats):
                model = make_model(
                    kind, seed=seed + r, **({} if kind == "prior" else {"n_jobs": jobs})
                )
                t = time.perf_counter()
                model.fit(X2, y2, g2)
                fit_s.append(time.perf_counter() - t)
                model.predict(cand[:10])
                t = time.perf_counter()
                model.predict(cand)
                predict_s.append(time.perf_counter() - t)
            out[kind if kind == "prior" else f"{kind} n_jobs={jobs}"] = {
                "fit_s": float(np.median(fit_s)),
                "predict_5000_s": float(np.median(predict_s)),
            }
    return out


def per_store_features(records: Sequence[Record], space_for) -> Callable[[Sequence[Record]], tuple]:
    """Rows from TVM's PerStoreFeature (sum and max over stores) plus workload features."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from autosched.space.schedule import schedule

    extractor = ms.feature_extractor.PerStoreFeature()
    cache: dict[tuple[str, str], np.ndarray] = {}
    names = feature_names(space_for(records[0].workload))
    target = tvm.target.Target({"kind": "opencl"})
    failed = 0
    t0 = time.perf_counter()
    for r in records:
        key = (r.workload_key, r.config_key)
        if key in cache:
            continue
        space = space_for(r.workload)
        config = Config.from_json(r.config)
        if not space.is_valid(config):
            continue
        try:
            mod = schedule(space, config)
            sch = tvm.s_tir.Schedule(mod)
            ctx = ms.TuneContext(mod=mod, target=target, num_threads=1)
            cand = ms.MeasureCandidate(sch, ms.arg_info.ArgInfo.from_prim_func(mod["main"]))
            f = extractor.extract_from(ctx, [cand])[0].numpy()
            agg = np.concatenate([f.sum(axis=0), f.max(axis=0)])
        except Exception as exc:  # a config TVM cannot schedule: no program features
            log.debug("PerStoreFeature failed for %s: %s", r.config, exc)
            failed += 1
            agg = np.zeros(2 * 164, dtype=np.float32)
        wl = featurize(space, [config], names=names)[0, -4:]  # the workload columns
        cache[key] = np.concatenate([agg, wl]).astype(np.float32)
    log.info(
        "PerStoreFeature: %d configs in %.1f s (%d failed)",
        len(cache),
        time.perf_counter() - t0,
        failed,
    )

    def rows(recs: Sequence[Record]) -> tuple:
        kept = [r for r in recs if (r.workload_key, r.config_key) in cache]
        groups_of = {k: i for i, k in enumerate(dict.fromkeys(r.workload_key for r in kept))}
        order = sorted(range(len(kept)), key=lambda i: groups_of[kept[i].workload_key])
        kept = [kept[i] for i in order]
        X = np.stack([cache[(r.workload_key, r.config_key)] for r in kept])
        y = normalized_targets(kept)
        g = np.array([groups_of[r.workload_key] for r in kept])
        return X, y, g

    return rows


def format_results(results: dict) -> str:
    head = (
        f"{'split':<12} {'kind':<16} {'top8 mean':>13} {'rand mean':>9} {'top8 best':>9} "
        f"{'rand best':>9} {'spearman':>8} {'ndcg@8':>7}"
    )
    lines = []
    for split, per in results.items():
        lines.append(head)
        for kind, m in per.items():
            lines.append(
                f"{split:<12} {kind:<16} {m['top_mean']:6.3f}±{m['top_mean_se']:.3f} "
                f"{m['random_mean']:9.3f} {m['top_best']:9.3f} {m['random_best']:9.3f} "
                f"{m['spearman']:8.3f} {m['ndcg']:7.3f}"
            )
        lines.append("")
    return "\n".join(lines)


def format_timings(times: dict) -> str:
    lines = [
        f"featurize 5000 configs: {times['featurize_5000_s'] * 1e3:.0f} ms fresh, "
        f"{times['featurize_5000_cached_s'] * 1e3:.0f} ms cached",
        f"{'kind':<25} {'fit ' + str(times['fit_rows']) + ' rows':>14} {'predict 5000':>13}",
    ]
    for kind, t in times.items():
        if isinstance(t, dict):
            lines.append(
                f"{kind:<25} {t['fit_s'] * 1e3:11.0f} ms {t['predict_5000_s'] * 1e3:10.1f} ms"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=Path, default=Path("tests/data/matmul_pocl_records.jsonl"))
    p.add_argument("--out", type=Path, default=Path("bench/results/cost_model.json"))
    p.add_argument("--kinds", default=",".join(KINDS), help="comma-separated model kinds")
    p.add_argument("--per-store", action="store_true", help="also evaluate TVM's PerStoreFeature")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    records = load_records(args.records)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    space_for = space_factory(records)
    t0 = time.perf_counter()
    results = evaluate(records, kinds, space_for=space_for)
    log.info("evaluated in %.1f s", time.perf_counter() - t0)
    times = timings(records, kinds, space_for)
    report = {
        "records": str(args.records),
        "n_records": len(records),
        "n_ok": sum(r.ok for r in records),
        "workloads": sorted({json.dumps(r.workload["params"], sort_keys=True) for r in records}),
        "top_k": TOP_K,
        "seeds": list(SEEDS),
        "results": results,
        "timings": times,
    }
    if args.per_store:
        rows = per_store_features(records, space_for)
        ps_kinds = [k for k in kinds if k != "prior"]
        report["per_store"] = evaluate(records, ps_kinds, space_for=space_for, features=rows)
        print("TVM PerStoreFeature (sum+max over stores + workload features):")
        print(format_results(report["per_store"]))
        print("autosched features (Space.describe + workload):")
    print(format_results(results))
    print(format_timings(times))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    log.info("wrote %s", args.out)


if __name__ == "__main__":
    main()
