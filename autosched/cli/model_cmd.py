"""``autosched model tasks|tune|build``: a whole model (ONNX, torch.export, a factory).

Wiring as the other command modules: :func:`add_parser` adds the commands, the parsed
namespace carries ``func``, bad input raises ``AutoschedError`` (one line, exit 2).
MODEL is whatever :func:`autosched.models.load_model` takes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from autosched.cli.shared import check_writable, open_records
from autosched.cli.shared import positive as _positive
from autosched.errors import InvalidInputError

# Outputs that differ from the model's own framework by more than this, relative to the
# output's largest magnitude, are wrong (float32 kernels summing in another order stay
# near 1e-6).
TOLERANCE = 1e-3

TARGETS = ("llvm", "opencl")


def _model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="a .onnx file, a .pt2 program or file.py:factory")
    p.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=1x3x224x224",
        help="shape of a model input whose size the file leaves open (repeatable)",
    )


def _db_arg(p: argparse.ArgumentParser, text: str) -> None:
    """``--db``: the records database every other command uses unless told otherwise, so
    what `autosched tune` or a farm job stored reaches a model's build."""
    from autosched.records.sqlite import default_db_path

    p.add_argument("--db", default=None, help=text.format(default_db_path()))


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "model",
        help="a whole model: list its tasks, tune them, build it with the records",
        description="A model's fused functions are its tasks, weighted by how often it "
        "calls them. `tune` shares --trials among them (the gradient task scheduler); "
        "`build` applies the records and writes a TVM library a Relax VM runs.",
    )
    sub = p.add_subparsers(dest="model_command", metavar="ACTION", required=True)

    tasks = sub.add_parser("tasks", help="the model's tasks: weight, space family, share of time")
    _model_arg(tasks)
    tasks.add_argument("--job", metavar="F.toml", help="also write a farm job of the tasks")
    tasks.add_argument(
        "--trials", type=_positive, default=64, help="trials per task in the job file (default 64)"
    )
    tasks.add_argument("--json", metavar="PATH", help="also write the table as JSON")
    tasks.set_defaults(func=cmd_model_tasks)

    tune = sub.add_parser("tune", help="tune the model's tasks with --trials in all")
    _model_arg(tune)
    tune.add_argument("--target", choices=TARGETS, default="llvm")
    tune.add_argument("--trials", type=_positive, required=True, help="trials in all")
    tune.add_argument("--batch", type=_positive, default=16, help="configs per batch")
    tune.add_argument("--seed", type=int, default=0)
    tune.add_argument("--hours", type=float, help="stop proposing after this many hours")
    _db_arg(tune, "records database, a path or postgresql:// URL (default: {})")
    tune.add_argument("--json", metavar="PATH", help="write the result as JSON")
    tune.add_argument("--report", metavar="F.html", help="write the job's HTML report")
    tune.set_defaults(func=cmd_model_tune)

    build = sub.add_parser(
        "build",
        help="build the model with the records as a TVM library (llvm: checked against the "
        "model's framework on its example inputs)",
    )
    _model_arg(build)
    build.add_argument("--target", choices=TARGETS, default="llvm")
    _db_arg(build, "records database, must exist (default: {})")
    build.add_argument("-o", "--output", required=True, metavar="model.so")
    build.set_defaults(func=cmd_model_build)

    comp = sub.add_parser(
        "compile",
        help="write every tuned kernel of the model with its manifest (OpenCL or llvm)",
        description="For each task a space family covers: the best record's kernel (as "
        "`autosched compile` writes one workload's), checked against the task's reference "
        "on the device, in OUT/<task>/. TVM's Python package runs no OpenCL, so this is "
        "how an OpenCL tuning of a model reaches an application.",
    )
    _model_arg(comp)
    comp.add_argument("--target", choices=TARGETS, default="opencl")
    comp.add_argument("--device", default=None, help="opencl: index or part of a name")
    _db_arg(comp, "records database, must exist (default: {})")
    comp.add_argument("-o", "--output", required=True, metavar="OUT", help="output directory")
    comp.set_defaults(func=cmd_model_compile)


def _inputs(items: list[str]) -> dict[str, tuple[int, ...]] | None:
    from autosched.models import parse_input_shape

    shapes = dict(parse_input_shape(item) for item in items)
    return shapes or None


def _load(args: argparse.Namespace):
    shapes = _inputs(args.input)
    from autosched.models import load_model

    return load_model(args.model, inputs=shapes)


def _task_rows(tasks, device) -> list[dict[str, Any]]:
    from autosched.tvm.tasks import default_latency_ms

    times = [default_latency_ms(t, device=device) for t in tasks]
    # The untuned model runs every convolution direct: Winograd stages are alternatives.
    total = sum(t.weight * ms for t, ms in zip(tasks, times) if t.form == "direct") or 1.0
    return [
        {
            "task": t.name,
            "workload": t.workload.key,
            "weight": t.weight,
            "family": t.family,
            "form": t.form,
            "untuned_ms": ms,
            "share": t.weight * ms / total,
        }
        for t, ms in zip(tasks, times)
    ]


def cmd_model_tasks(args: argparse.Namespace) -> int:
    from autosched.measure.device import select_device
    from autosched.tvm.tasks import extract_tasks

    if args.job:
        check_writable(args.job, "--job")
    model = _load(args)
    device = select_device(None, target="llvm")
    tasks = extract_tasks(model.mod, limits=device.limits)
    rows = _task_rows(tasks, device)
    print(f"{'task':58s} {'weight':>6s} {'family':12s} {'form':9s} {'untuned':>10s} {'share':>6s}")
    for r in sorted(rows, key=lambda r: (r["form"] != "direct", -r["share"])):
        family = r["family"] or "default"
        print(
            f"{r['task'][:58]:58s} {r['weight']:6d} {family:12s} {r['form']:9s} "
            f"{r['untuned_ms']:8.3f}ms {100 * r['share']:5.1f}%"
        )
    untunable = sum(r["share"] for r in rows if r["family"] is None and r["form"] == "direct")
    alternatives = sum(1 for r in rows if r["form"] != "direct")
    print(
        f"{len(rows)} tasks; {100 * untunable:.1f}% of the untuned time has no space family"
        + (
            f"; {alternatives} are stages of 3x3 convolutions' Winograd form (share: of the "
            "direct model's time), built where the model ran faster with them"
            if alternatives
            else ""
        )
    )
    if args.job:
        _write_job(Path(args.job), model.name, tasks, args.trials)
    if args.json:
        Path(args.json).write_text(json.dumps({"model": model.name, "tasks": rows}, indent=2))
    return 0


def _write_job(path: Path, name: str, tasks, trials: int) -> None:
    """A farm job of the model's tunable tasks: each task's workload JSON inline."""
    lines = [f"name = {json.dumps(name)}", f"trials = {trials}", 'policy = "gradient"', ""]
    for t in tasks:
        if t.family is None:
            continue
        lines += [
            "[[tasks]]",
            f"name = {json.dumps(t.name)}",
            f"workload = {json.dumps(json.dumps(t.workload.to_json(), sort_keys=True))}",
            'targets = ["llvm"]',
            f"weight = {t.weight}",
            "",
        ]
    try:
        path.write_text("\n".join(lines))
    except OSError as exc:
        raise InvalidInputError(f"cannot write --job {path}: {exc.strerror}") from None


def cmd_model_tune(args: argparse.Namespace) -> int:
    import numpy as np

    from autosched.measure.device import select_device
    from autosched.measure.runner import TimingOptions
    from autosched.tuning.model import task_timings, tune_tasks
    from autosched.tuning.runner import LocalRunner
    from autosched.tvm import build
    from autosched.tvm.tasks import extract_tasks

    for path, option in ((args.json, "--json"), (args.report, "--report")):
        if path:
            check_writable(path, option)
    if args.hours is not None and args.hours <= 0:
        raise InvalidInputError(f"--hours {args.hours} is not valid; accepted: a number > 0")
    model = _load(args)
    device = select_device(None, target=args.target)
    tasks = extract_tasks(model.mod, target=args.target, limits=device.limits)
    db = open_records(args.db)
    deadline = time.time() + args.hours * 3600 if args.hours else None
    start = time.time()
    runner = LocalRunner(device, args.target, timing=TimingOptions(), keep=max(1, len(tasks)))
    try:
        result = tune_tasks(
            tasks, runner, db, name=model.name, target=args.target, trials=args.trials,
            batch=args.batch, seed=args.seed, deadline=deadline,
        )  # fmt: skip
    finally:
        runner.close()
    wall = time.time() - start
    arrays = model.example_inputs(np.random.default_rng(args.seed))
    if args.target == "llvm":
        tuned = build(model.mod, args.target, db=db, shipped=False)
        untuned = build(model.mod, args.target, untuned=False, records=False)
        # By key: a task of a convolution's losing form has no function in the build.
        applied = {a.workload.key for a in tuned.applied if a.provenance != "default-schedule"}
        builds = {"untuned": untuned.executable, "tuned": tuned.executable}
    else:  # TVM's Python package runs no OpenCL: the kernels go out by `model compile`
        applied = {t.workload.key for t in tasks if t.family is not None}
        builds = {}
    latency, check = _latencies(model, arrays, builds)
    timings = task_timings(tasks, result)
    data = {
        "model": model.name,
        "target": args.target,
        "trials": args.trials,
        "wall_s": wall,
        "latency_ms": latency,
        **check,
        "tasks": [
            {
                "name": t.name,
                "weight": t.weight,
                "family": t.family,
                "trials": t.trials,
                "best_ms": t.best_ms,
                "default_ms": t.default_ms,
                "form": task.form,
                "applied": task.workload.key in applied,
            }
            for t, task in zip(timings, tasks)
        ],
    }
    for t in data["tasks"]:
        best = f"{t['best_ms']:.4f}" if t["best_ms"] else "-"
        print(f"{t['name'][:58]:58s} w={t['weight']:<3d} trials={t['trials']:<4d} best={best} ms")
    timed = ", ".join(f"{k} {v:.3f} ms" for k, v in latency.items() if v is not None)
    if builds:
        print(f"{model.name}: {timed} ({result.new_trials} trials in {wall:.0f} s)")
    else:
        print(
            f"{model.name}: {result.new_trials} trials in {wall:.0f} s on {args.target}; "
            f"`autosched model compile --target {args.target}` writes the tuned kernels"
            + (f" ({timed} on the host)" if timed else "")
        )
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
    if args.report:
        from autosched.report.job import write_job_report

        write_job_report(db, result, args.report)
    return 0


def _latencies(model, arrays, builds: dict) -> tuple[dict[str, float | None], dict]:
    """Milliseconds of the builds (``untuned``, ``tuned``) and of the model's host
    runtimes (``onnxruntime``, and ``torch`` for a PyTorch model), all on the same
    threads, timed side by side in interleaved rounds once each one's outputs match the
    model's own framework; and ``correct`` / ``max_rel_error`` of the tuned build's
    outputs (None without one). A runtime that cannot run the model gets None and a
    warning."""
    from autosched.measure.cpu import host_cpu
    from autosched.models.latency import max_error, time_rounds, tvm_runner

    expected = model.reference(arrays)
    runners: dict = {name: tvm_runner(exe, model, arrays) for name, exe in builds.items()}
    latency: dict[str, float | None] = {name: None for name in builds}
    for name, runtime in model.runtimes(host_cpu().cores).items():
        latency[name] = None
        try:
            err = max_error(list(runtime(arrays)), expected)
        except InvalidInputError as exc:
            print(f"autosched: warning: {name} not timed: {exc}", file=sys.stderr)
            continue
        if err > TOLERANCE:
            print(
                f"autosched: warning: {name}'s outputs differ from {model.framework}'s by "
                f"{err:.3g}: not timed",
                file=sys.stderr,
            )
            continue
        runners[name] = lambda runtime=runtime: list(runtime(arrays))
    check: dict = {"correct": None, "max_rel_error": None}
    if "tuned" in runners:
        err = max_error(runners["tuned"](), expected)
        check = {"correct": err <= TOLERANCE, "max_rel_error": err}
        if err > TOLERANCE:
            print(
                f"autosched: warning: output of the tuned build differs from the reference "
                f"({model.framework}) by {err:.3g} of its largest magnitude",
                file=sys.stderr,
            )
    for name, timing in time_rounds(runners, rounds=3, round_s=0.3).items():
        latency[name] = timing.median_ms
    return latency, check


def cmd_model_build(args: argparse.Namespace) -> int:
    from autosched.tvm import build

    check_writable(args.output, "-o")
    model = _load(args)
    db = open_records(args.db, create=False)
    built = build(model.mod, args.target, db=db, shipped=False)
    try:
        built.executable.export_library(args.output)
    except Exception as exc:  # TVM's own errors: the linker's message
        raise InvalidInputError(f"cannot write -o {args.output}: {exc}") from None
    tuned = sum(1 for a in built.applied if a.record_id is not None)
    print(f"{args.output}: {len(built.applied)} functions scheduled, {tuned} from records")
    return _check_build(model, built) if args.target == "llvm" else 0


def _check_build(model, built) -> int:
    """Run the llvm build once on the model's example inputs against its own framework
    (a frontend's silent mistranslation shows here, not in a compiler build later): 0
    when the outputs agree within :data:`TOLERANCE` of their largest magnitude, else 1
    with one line saying by how much."""
    import numpy as np

    from autosched.models.latency import max_error, tvm_runner

    arrays = model.example_inputs(np.random.default_rng(0))
    err = max_error(tvm_runner(built.executable, model, arrays)(), model.reference(arrays))
    if err > TOLERANCE:
        print(
            f"autosched: error: the build's outputs differ from {model.framework}'s by "
            f"{err:.3g} of their largest magnitude on the example inputs; do not use it",
            file=sys.stderr,
        )
        return 1
    print(f"checked on the example inputs: matches {model.framework} (error {err:.1e})")
    return 0


def cmd_model_compile(args: argparse.Namespace) -> int:
    import numpy as np

    from autosched.compiler import compile
    from autosched.measure.device import select_device
    from autosched.tvm.tasks import extract_tasks

    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise InvalidInputError(f"-o {out} is a file; accepted: a directory (created if missing)")
    model = _load(args)
    device = select_device(args.device, target=args.target)
    tasks = [
        t
        for t in extract_tasks(model.mod, target=args.target, limits=device.limits)
        if t.family is not None
    ]
    db = open_records(args.db, create=False)
    rows = []
    try:
        for i, task in enumerate(tasks):
            kernel = compile(task.workload, target=args.target, device=device, db=db, shipped=False)
            inputs, want = task.workload.test_data(np.random.default_rng(i))
            got = kernel.run(inputs)
            rtol, atol = task.workload.tolerance()
            for name, ref in want.items():
                if not np.allclose(got[name], ref, rtol=rtol, atol=atol):
                    raise InvalidInputError(
                        f"{task.name}: the compiled kernel's {name} differs from the reference "
                        f"by {float(np.abs(got[name] - ref).max()):.3g} (a bug: please report it)"
                    )
            folder = out / f"{i:02d}-{task.name}"[:80]
            kernel.save(folder)
            rows.append((task, kernel, folder))
    finally:
        db.close()
    for task, kernel, folder in rows:
        rec = kernel.record
        how = f"record {rec.id}" if rec is not None else "untuned (default schedule)"
        print(
            f"{task.name[:50]:50s} w={task.weight:<3d} {kernel.provenance:14s} {how:28s} {folder}"
        )
    tuned = sum(k.record is not None for _, k, _ in rows)
    print(
        f"wrote {len(rows)} kernels ({tuned} from records) for {device.name} ({args.target}) in {out}"
    )
    return 0
