"""The ``autosched`` command line: a thin layer over the Python API.

Every user error ends as one line on stderr and exit status 2; never a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from autosched.cli.shared import (
    add_workload_args,
    check_writable,
    format_config,
    say_dropped,
    workload_from_args,
)
from autosched.cli.shared import positive as _positive
from autosched.errors import AutoschedError, DeviceGivenUp, InvalidInputError

log = logging.getLogger("autosched.cli")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, status 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def _write_json(path: str | None, data: Any) -> None:
    if not path:
        return
    try:
        Path(path).write_text(json.dumps(data, indent=2) + "\n")
    except OSError as exc:
        raise InvalidInputError(f"cannot write --json {path}: {exc.strerror}") from None


# -- commands --------------------------------------------------------------------------


def cmd_devices(args: argparse.Namespace) -> int:
    """Every device of every target this machine has, with the key its records carry;
    a target whose runtime is missing says what to install."""
    from autosched.errors import DeviceError
    from autosched.measure.cpu import host_cpu
    from autosched.measure.device import list_devices, unregistered_drivers

    listed: list[dict] = []

    def entry(target: str, dev, index: int | None, lines: list[str]) -> None:
        print(f"  [{dev.selector}] {dev.name}  ({dev.type}, {dev.compute_units} compute units)")
        for line in lines:
            print(f"      {line}")
        print(f"      key {dev.key(target)}  family {dev.family(target)}  selector {dev.selector}")
        listed.append(
            dict(
                dev.fingerprint(target), key=dev.key(target), family=dev.family(target), index=index
            )
        )

    print("opencl")
    try:
        opencl = list_devices()
    except DeviceError as exc:
        opencl = ()
        print(f"  none: {exc}")
    for hint in unregistered_drivers([d.platform for d in opencl]):
        print(f"  hint: {hint}")
    for d in opencl:
        entry("opencl", d, d.index, [
            f"platform: {d.platform} / {d.platform_version}",
            f"driver {d.driver_version}, {d.version}, {d.opencl_c_version}",
            f"max work-group {d.max_work_group_size}, local memory {d.local_mem_bytes // 1024} KiB",
        ])  # fmt: skip
    cpu = host_cpu()
    print("llvm")
    entry("llvm", cpu, 0, [f"-mcpu={cpu.mcpu}, {', '.join(cpu.isa) or 'no SIMD extension'}"])
    for target, devices in _iree_devices():
        print(target)
        if isinstance(devices, str):
            print(f"  none: {devices}")
            continue
        for d in devices:
            entry(
                target, d, d.index, [f"IREE {d.iree_version}, {d.driver} {d.driver_info}".rstrip()]
            )
    _write_json(args.json, listed)
    return 0


def _iree_devices() -> list[tuple[str, object]]:
    """``(target, devices or why there are none)`` for the IREE targets."""
    from autosched.errors import AutoschedError

    try:
        from autosched.measure.iree_device import select_iree_device, vulkan_devices

        cpu = (select_iree_device(None, "iree-llvm-cpu"),)
    except (ImportError, AutoschedError) as exc:
        why = f"{exc}" if isinstance(exc, AutoschedError) else "the iree extra is not installed"
        return [("iree-llvm-cpu", why), ("iree-vulkan", why)]
    try:
        vulkan: object = vulkan_devices()
    except AutoschedError as exc:
        vulkan = str(exc)
    return [("iree-llvm-cpu", cpu), ("iree-vulkan", vulkan)]


class _Progress:
    """Trials done, best so far and time left: a live line on a terminal (rich), one plain
    line per trial otherwise (logs, CI)."""

    def __init__(self, stream=sys.stderr) -> None:
        self.stream = stream
        self.bar = None
        self.start = time.perf_counter()
        if stream.isatty():
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("best {task.fields[best]}"),
                TextColumn("left"),
                TimeRemainingColumn(),
                console=Console(file=stream),
                transient=True,
            )
            self.task = None

    def __call__(self, ev) -> None:
        done = min(ev.trial, ev.total)
        best = f"{ev.best_gflops:.1f} GFLOP/s" if ev.best_gflops else "-"
        if self.bar is not None:
            if self.task is None:
                self.bar.start()
                self.task = self.bar.add_task("tune", total=ev.total, completed=done - 1, best=best)
            self.bar.update(self.task, completed=done, best=best)
            return
        rate = (time.perf_counter() - self.start) / max(done, 1)
        left = f"{rate * (ev.total - done):.0f} s left" if done < ev.total else "done"
        self.stream.write(f"{done:4d}/{ev.total}  best {best}  {left}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def cmd_tune(args: argparse.Namespace) -> int:
    from autosched.measure.device import select_device
    from autosched.measure.memory import check_fits
    from autosched.records import open_database
    from autosched.records.opener import describe
    from autosched.records.sqlite import default_db_path
    from autosched.tuning.tune import tune

    if args.mlir:
        from autosched.cli.iree_cmd import tune_mlir

        return tune_mlir(args)
    if not args.op or args.shape is None:
        raise InvalidInputError("tune needs --op and --shape, or --mlir FILE; accepted: either")
    # Everything that can be wrong is checked before the first line is printed.
    wl = workload_from_args(args)
    dev = select_device(args.device, target=args.target)
    check_fits(wl, dev)
    db = args.db or default_db_path()
    database = open_database(db)
    if args.json:
        check_writable(args.json, "--json")
    print(f"tuning {wl} on {dev.name} ({args.target})", file=sys.stderr)
    say_dropped(wl, args.target)
    progress = _Progress()
    try:
        result = tune(
            wl,
            trials=args.trials,
            batch=args.batch,
            strategy=args.strategy,
            db=database,
            device=dev,
            target=args.target,
            seed=args.seed,
            timeout_s=args.timeout,
            progress=progress,
        )
    finally:
        progress.close()
        database.close()
    res = result.to_json()
    vendor = _vendor(wl)
    res["vendor"] = vendor
    print(f"workload   {wl}   key {wl.key}")
    print(f"device     {result.device.name}   key {result.device.key(args.target)}")
    print(
        f"trials     {result.trials} in the database ({result.new_trials} measured now, {result.wall_s:.1f} s)"
    )
    if result.best is None:
        print("best       none: no candidate ran correctly (see `autosched records stats`)")
        _write_json(args.json, res)
        return 1
    b = result.best
    print(f"config     {format_config(b.config)}")
    print()
    rows = [("tuned kernel", b.gflops, b.latency_s, f"spread {100 * (b.spread or 0):.1f}%")]
    if result.default is not None:
        default = "IREE's default config" if args.target.startswith("iree-") else "default schedule"
        rows.append((default, result.default.gflops, result.default.latency_s, ""))
    if vendor is not None:
        note = vendor_note(vendor["method"], getattr(result.device, "type", "cpu"))
        rows.append((vendor["name"], vendor["gflops"], vendor["latency_s"], note))
    print(f"{'':<24}{'GFLOP/s':>10}{'ms':>10}{'tuned is':>11}")
    for name, gflops, latency, note in rows:
        ratio = "" if name == "tuned kernel" else f"{b.gflops / gflops:.2f}x"
        print(f"{name:<24}{gflops:>10.1f}{latency * 1e3:>10.3f}{ratio:>11}  {note}".rstrip())
    print("(the tuned kernel and the default re-measured side by side; numpy timed right after)")
    if result.speedup:
        print(f"speedup    {result.speedup:.1f}x over the default schedule")
    print(f"records    {describe(db)}")
    _write_json(args.json, res)
    return 0


def vendor_note(method: str, device_type: str) -> str:
    """The vendor row's note: numpy runs on the host CPU, which is not the tuned device
    when that is a GPU (there the row is for scale, not a peer)."""
    return method if device_type == "cpu" else f"{method}; on the host CPU, not the {device_type}"


def _vendor(wl) -> dict | None:
    """The vendor library (numpy and its BLAS on the CPU) on this workload, timed now."""
    from autosched.report.vendor import VENDOR_OPS, time_vendor

    if wl.op not in VENDOR_OPS:
        return None
    t = time_vendor(wl)
    name = f"numpy ({t.blas.split()[0]})" if t.blas else "numpy"
    return {
        "name": name,
        "gflops": t.gflops,
        "latency_s": t.median_s,
        "method": f"{t.method}, {t.threads}" if t.threads else t.method,
        "blas": t.blas,
    }


def cmd_best(args: argparse.Namespace) -> int:
    from autosched.measure.device import select_device
    from autosched.records import open_database
    from autosched.records.choice import chosen
    from autosched.records.opener import describe
    from autosched.records.sqlite import default_db_path

    wl = workload_from_args(args)
    dev = select_device(args.device, target=args.target)
    path = args.db or default_db_path()
    with open_database(path, create=False) as db:
        r = chosen(db, wl.key, device_key=dev.key(args.target), target=args.target)
    if r is None:
        print(
            f"no ok record of {wl} on {dev.name} in {describe(path)}; run `autosched tune` first",
            file=sys.stderr,
        )
        _write_json(args.json, {"workload": wl.to_json(), "best": None})
        return 1
    print(f"{wl}  on  {dev.name}")
    print(
        f"  {r.gflops:.1f} GFLOP/s   {r.latency_s * 1e3:.3f} ms   spread {100 * (r.spread or 0):.1f}%   record {r.id}"
    )
    print(f"  {format_config(r.config)}")
    if r.rounds:
        print(f"  the leader of run {r.run_id}'s final round: {r.rounds} rounds side by side")
    else:
        print("  one reading: no side-by-side round has timed this config yet")
    _write_json(
        args.json,
        {
            "workload": wl.to_json(),
            "workload_key": wl.key,
            "device_key": dev.key(args.target),
            "best": {
                "gflops": r.gflops,
                "latency_s": r.latency_s,
                "spread": r.spread,
                "config": r.config,
                "record_id": r.id,
                "rounds": r.rounds,
            },
        },
    )
    return 0


def op_catalogue() -> list[dict[str, Any]]:
    """What ``autosched ops`` shows, one entry per operator, as plain data."""
    from autosched.ops import OPS

    return [
        {
            "op": op,
            "summary": cls.summary,
            "parameters": list(cls.shape_params),
            "required": [n for n in cls.shape_params if n not in cls.defaults],
            "defaults": dict(cls.defaults),
            "positional": list(cls.positional),
            "choices": {name: list(values) for name, values in cls.choices.items()},
            "chains": list(cls.chains),
            "example": f"autosched tune --op {op} --shape {cls.example}",
        }
        for op, cls in OPS.items()
    ]


def cmd_ops(args: argparse.Namespace) -> int:
    catalogue = op_catalogue()
    if args.json:
        print(json.dumps(catalogue, indent=2))
        return 0
    for i, entry in enumerate(catalogue):
        params = ", ".join(
            f"{n}={entry['defaults'][n]}" if n in entry["defaults"] else n
            for n in entry["parameters"]
        )
        if entry["positional"]:
            params += f"   (or by position: {','.join(entry['positional'])})"
        print(("\n" if i else "") + f"{entry['op']:<18}{entry['summary']}")
        print(f"  {'parameters':<16}{params}")
        for name, values in entry["choices"].items():
            chained = "; a chain joined by +, e.g. add+relu" if name in entry["chains"] else ""
            print(f"  {name:<16}{', '.join(values)}{chained}")
        print(f"  {'example':<16}{entry['example']}")
    return 0


# -- parser ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from autosched.search import STRATEGIES
    from autosched.space.space import ALL_TARGETS

    parser = _Parser(
        prog="autosched", description="ML-guided autotuning of tensor-operator schedules."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log every failed candidate")
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=_Parser
    )

    p = sub.add_parser("devices", help="list the devices of every target with their keys")
    p.add_argument("--json", metavar="PATH", help="also write the fingerprints as JSON")
    p.set_defaults(func=cmd_devices)

    p = sub.add_parser(
        "ops",
        help="list the operators with their parameters, choices and an example",
        description="List every operator --op accepts: its --shape parameters (with "
        "defaults), the values of its string parameters, and an example command.",
    )
    p.add_argument("--json", action="store_true", help="print the list as JSON instead")
    p.set_defaults(func=cmd_ops)

    def workload_args(p: argparse.ArgumentParser, *, required: bool = True) -> None:
        add_workload_args(p, required=required)
        p.add_argument(
            "--device",
            default=None,
            help="index, platform:device, or part of a name "
            "(default: first GPU, else first device)",
        )
        p.add_argument(
            "--db",
            default=None,
            help="records database, a path or postgresql://USER@HOST/DB "
            "(default: ~/.local/share/autosched/records.db)",
        )
        p.add_argument("--json", metavar="PATH", help="also write the result as JSON")
        p.add_argument(
            "--target",
            choices=ALL_TARGETS,
            default="opencl",
            help="opencl (an OpenCL device), llvm (the host CPU through TVM's LLVM), "
            "iree-llvm-cpu or iree-vulkan (IREE's backends, the iree extra); default opencl",
        )

    p = sub.add_parser("tune", help="tune one workload on a device")
    workload_args(p, required=False)
    p.add_argument(
        "--mlir",
        metavar="FILE",
        help="IREE targets: tune every tunable root op of this MLIR file (one task each, "
        "keyed by op, shapes and dtype) instead of --op/--shape",
    )
    p.add_argument(
        "--trials", type=_positive, default=64, help="measured configs in total (default 64)"
    )
    p.add_argument(
        "--batch", type=_positive, default=16, help="configs per model update (default 16)"
    )
    p.add_argument(
        "--strategy", default="model", help=f"one of {', '.join(STRATEGIES)} (default model)"
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument(
        "--timeout", type=float, default=30.0, help="seconds per candidate before it is killed"
    )
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("best", help="the best record of a workload on a device")
    workload_args(p)
    p.set_defaults(func=cmd_best)

    from autosched.cli import compile_cmd, iree_cmd, job_cmd, model_cmd, records_cmd, report_cmd

    records_cmd.add_parser(sub)
    compile_cmd.add_parser(sub)
    report_cmd.add_parser(sub)
    job_cmd.add_parser(sub)
    iree_cmd.add_parser(sub)
    model_cmd.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("autosched")
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO if args.verbose else logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except AutoschedError as exc:
        print(f"autosched: error: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, DeviceGivenUp) else 2
    except KeyboardInterrupt as exc:
        # A Ctrl-C that lands inside exec() of a string (scipy runs one while a cost model
        # is imported lazily) leaves CPython's "unhandled KeyboardInterrupt" mark set even
        # though it is handled here, and the interpreter would then end by SIGINT instead
        # of with 130. Executing any string clears that mark.
        exec("")
        from autosched.tuning.interrupt import Terminated

        term = isinstance(exc, Terminated)
        print(
            f"autosched: {'terminated (SIGTERM)' if term else 'interrupted'}; measured "
            "batches are saved, rerun the same command to resume",
            file=sys.stderr,
        )
        return 143 if term else 130  # 128 + the signal's number, as a shell reports it
    finally:  # main() may be called again in the same process (tests, embedding tools)
        root.removeHandler(handler)
        root.setLevel(level)


if __name__ == "__main__":
    sys.exit(main())
