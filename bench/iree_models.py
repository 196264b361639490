"""Benchmark: a whole model through IREE, its dispatches tuned by autosched, against
IREE's default configs and onnxruntime.

    python -m bench.iree_models [--model bert] [--target iree-llvm-cpu] [--trials 32]
                                [--db PATH] [--tiny] [--rounds 7]

The model (a zoo model with random weights, as in bench/models.py) is exported to ONNX
and imported to Linalg by IREE's importer. Every root op that autosched tunes becomes a
task (``autosched tune --mlir``'s path): ``autosched.tune`` tops each up to ``--trials``
measurements in ``--db``, so a second call with a larger budget resumes. The records are
written into the imported module as ``compilation_info`` (``autosched iree annotate``'s
path) and both modules, as imported and as annotated, are built by ``iree-compile`` for
the target. The two builds and onnxruntime then run in interleaved rounds in this
process, each checked against onnxruntime's outputs before it is timed.

Prints a table per task and for the model, and merges a row per (model, target) into
bench/results/iree_models.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.models import (  # noqa: E402
    MODELS,
    Runner,
    max_error,
    onnxruntime_runner,
    time_rounds,
)

RESULTS = ROOT / "bench" / "results" / "iree_models.json"
# The importer's synchronous entry point for the ONNX graph (main_graph$async does the work).
ENTRY = "main_graph"

log = logging.getLogger("bench.iree_models")


def iree_module_runner(runner: Any, module: bytes, inputs: list[np.ndarray]) -> Runner:
    """One compiled module on ``runner``'s IREE device (an
    :class:`autosched.measure.iree_runner.IreeRunner`), inputs already on the device."""
    rt = runner.rt
    vm = rt.VmModule.copy_buffer(runner.config.vm_instance, module)
    ctx = rt.SystemContext(vm_modules=[vm], config=runner.config)
    func = ctx.modules.module[ENTRY]
    args = [rt.asdevicearray(runner.device, np.ascontiguousarray(a)) for a in inputs]

    def run() -> list[np.ndarray]:
        out = func(*args)
        return [runner.to_numpy(o) for o in (out if isinstance(out, tuple | list) else (out,))]

    return run


def tune_tasks(text: str, *, target: str, trials: int, db: Any, device: Any) -> list[dict]:
    """Top every tunable root op of ``text`` up to ``trials`` records; a row per task."""
    from autosched.iree.mlir import find_roots
    from autosched.tuning.tune import tune

    roots = find_roots(text)
    tasks = list(dict.fromkeys(r.workload for r in roots if r.workload is not None))
    rows = []
    for wl in tasks:
        t0 = time.perf_counter()
        res = tune(wl, trials=trials, db=db, device=device, target=target, seed=0)
        best, default = res.best, res.default
        rows.append(
            {
                "workload": str(wl),
                "key": wl.key,
                "ops": sum(r.workload == wl for r in roots),
                "trials": res.trials,
                "new_trials": res.new_trials,
                "wall_s": time.perf_counter() - t0,
                "tuned_ms": best.latency_s * 1e3 if best else None,
                "default_ms": default.latency_s * 1e3 if default and default.latency_s else None,
                "speedup": res.speedup,
                "config": best.config if best else None,
            }
        )
        log.info("%s: %s", wl, rows[-1])
    rows.append({"untuned_root_ops": sum(r.workload is None for r in roots)})
    return rows


def bench_model(
    key: str, *, target: str, trials: int, db_path: str, tiny: bool, rounds: int, round_s: float
) -> dict:
    from autosched.iree.annotate import annotate_mlir
    from autosched.iree.toolchain import compile_flags, compile_mlir, import_onnx
    from autosched.measure.device import select_device
    from autosched.measure.iree_device import DRIVERS
    from autosched.measure.iree_runner import IreeRunner
    from autosched.models import zoo
    from autosched.records import open_database

    factory = MODELS[key][1 if tiny else 0]
    module, example = getattr(zoo, factory)()
    inputs = [t.numpy() for t in example]
    device = select_device(None, target=target)
    with tempfile.TemporaryDirectory(prefix="bench-iree-models-") as tmp:
        onnx_path = zoo.export_onnx(module, example, Path(tmp) / f"{factory}.onnx")
        text = import_onnx(str(onnx_path))
        db = open_database(db_path)
        try:
            t0 = time.perf_counter()
            tasks = tune_tasks(text, target=target, trials=trials, db=db, device=device)
            tune_s = time.perf_counter() - t0
            annotated, applied = annotate_mlir(text, db=db, target=target, device=device)
        finally:
            db.close()
        flags = compile_flags(target, vulkan_target=device.vulkan_target or "llvmpipe")
        builds = {}
        for name, source in (("iree_default", text), ("iree_tuned", annotated)):
            t0 = time.perf_counter()
            builds[name] = (compile_mlir(source, flags), time.perf_counter() - t0)
        runner = IreeRunner(DRIVERS[target])
        # onnxruntime on every core this process may use, whatever IREE's device is.
        reference = onnxruntime_runner(onnx_path, inputs)
        expected = tuple(reference())
        runners: dict[str, Runner] = {"onnxruntime": reference}
        errors: dict[str, float] = {}
        for name, (vmfb, _) in builds.items():
            run = iree_module_runner(runner, vmfb, inputs)
            errors[name] = max_error(run(), expected)
            if errors[name] <= 1e-3:
                runners[name] = run
            else:
                log.warning("%s differs from onnxruntime (%.2e): not timed", name, errors[name])
        timings = time_rounds(runners, rounds=rounds, round_s=round_s)
    rows: dict[str, dict] = {}
    for name in ("iree_default", "iree_tuned", "onnxruntime"):
        row: dict[str, Any] = {"max_rel_error": errors.get(name, 0.0)}
        if name in builds:
            row["build_s"] = builds[name][1]
        if name in timings:
            row.update(vars(timings[name]))
        rows[name] = row
    tuned, default = rows["iree_tuned"].get("median_ms"), rows["iree_default"].get("median_ms")
    return {
        "model": key,
        "factory": f"autosched/models/zoo.py:{factory}",
        "target": target,
        "device": device.name,
        "device_fingerprint": device.fingerprint(target),
        "trials_per_task": trials,
        "tuning_wall_s": tune_s,
        "root_ops_annotated": sum(a.found is not None for a in applied),
        "root_ops": len(applied),
        "tasks": tasks,
        "rows": rows,
        "tuned_vs_default": default / tuned if tuned and default else None,
    }


def _fmt(x: float | None, spec: str) -> str:
    return format(x, spec) if x is not None else "-"


def print_result(res: dict) -> None:
    print(f"\n{res['model']} on {res['target']} ({res['device']}), {res['trials_per_task']} "
          f"trials per task, tuning {res['tuning_wall_s']:.0f} s")  # fmt: skip
    print(f"{'task':<48}{'ops':>4}{'trials':>7}{'tuned ms':>10}{'IREE ms':>10}{'speedup':>9}")
    for t in res["tasks"]:
        if "workload" not in t:
            print(f"{'root ops autosched does not tune':<48}{t['untuned_root_ops']:>4}")
            continue
        print(
            f"{t['workload'][:47]:<48}{t['ops']:>4}{t['trials']:>7}{_fmt(t['tuned_ms'], '.3f'):>10}"
            f"{_fmt(t['default_ms'], '.3f'):>10}{_fmt(t['speedup'], '.2f'):>8}x"
        )
    print(f"{'whole model':<20}{'median ms':>10}{'min ms':>9}{'spread':>8}{'max err':>10}")
    for name, row in res["rows"].items():
        print(
            f"{name:<20}{_fmt(row.get('median_ms'), '.2f'):>10}{_fmt(row.get('min_ms'), '.2f'):>9}"
            f"{_fmt(row.get('spread'), '.2f'):>8}{row['max_rel_error']:>10.1e}"
        )
    print(f"tuned vs IREE's default: {_fmt(res['tuned_vs_default'], '.2f')}x "
          f"({res['root_ops_annotated']} of {res['root_ops']} root ops annotated)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="bert")
    ap.add_argument("--target", choices=("iree-llvm-cpu", "iree-vulkan"), default="iree-llvm-cpu")
    ap.add_argument("--trials", type=int, default=32, help="measurements per task (default 32)")
    ap.add_argument("--db", default="/tmp/autosched-bench-iree-models.db")
    ap.add_argument("--tiny", action="store_true", help="the zoo's tiny version (for tests)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--round-s", type=float, default=0.5)
    ap.add_argument("--results", default=str(RESULTS), help="JSON to merge the row into")
    args = ap.parse_args(argv)
    if args.trials < 1:
        ap.error(f"--trials must be at least 1, not {args.trials}")
    logging.basicConfig(level=logging.WARNING)
    res = bench_model(
        args.model, target=args.target, trials=args.trials, db_path=args.db, tiny=args.tiny,
        rounds=args.rounds, round_s=args.round_s,
    )  # fmt: skip
    from bench.iree import cpu_summary

    # Each row names the CPU and the day it ran (the file gathers rows of several runs).
    res["cpu"] = cpu_summary()
    res["date"] = time.strftime("%Y-%m-%d %H:%M")
    path = Path(args.results)
    data = json.loads(path.read_text()) if path.exists() else {"rows": []}
    rows = {(r["model"], r["target"], r["factory"]): r for r in data["rows"]}
    rows[(res["model"], res["target"], res["factory"])] = res
    out = {
        "machine": {
            "cpu": cpu_summary(),
            "python": platform.python_version(),
            "of": "the last run",
        },
        "rows": sorted(rows.values(), key=lambda r: (r["model"], r["target"], r["factory"])),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print_result(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
