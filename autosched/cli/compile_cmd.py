"""``autosched compile``: write a workload's best kernel as OpenCL source plus a manifest.

Wiring: the main CLI calls :func:`add_parser` with its sub-parsers; the parsed namespace
carries ``func=run``, and :func:`run` returns the exit status. Bad input raises
:class:`~autosched.errors.AutoschedError` subclasses, which the main CLI turns into one
line and exit status 2.

The output directory gets the program (``kernel.cl`` for OpenCL, ``kernel.so`` for
llvm) and ``manifest.json`` (see :meth:`autosched.compiler.CompiledKernel.manifest`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from autosched.cli.shared import add_workload_args, format_config, workload_from_args
from autosched.errors import InvalidInputError
from autosched.records.sqlite import default_db_path
from autosched.space.space import TARGETS


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``compile`` command to the main CLI's sub-parsers."""
    p = subparsers.add_parser(
        "compile",
        help="write a workload's best kernel (OpenCL source + manifest) into a directory",
        description="Look up the best record of a workload on a device (the records "
        "database, then the shipped records, then a nearby tuned shape, else the default "
        "schedule), build it and write kernel.cl (OpenCL; kernel.so for llvm) and manifest.json into OUT.",
    )
    add_workload_args(p)
    p.add_argument(
        "--target", default="opencl", help=f"one of {', '.join(TARGETS)} (default opencl)"
    )
    p.add_argument(
        "--device",
        default=None,
        help="opencl: index, platform:device, or part of a name (default: first GPU, else "
        "first device); llvm: host",
    )
    p.add_argument(
        "--db",
        default=None,
        metavar="PATH",
        help=f"records database, must exist (default: {default_db_path()} if it exists)",
    )
    p.add_argument(
        "--no-shipped",
        dest="shipped",
        action="store_false",
        help="do not consult the records shipped in records/*.jsonl",
    )
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="output directory")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Carry out ``autosched compile``; return the exit status."""
    from autosched.compiler import compile

    if args.target not in TARGETS:
        raise InvalidInputError(
            f"--target {args.target!r} is not supported; accepted: {', '.join(TARGETS)}"
        )
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise InvalidInputError(f"-o {out} is a file; accepted: a directory (created if missing)")
    wl = workload_from_args(args)
    kernel = compile(wl, target=args.target, device=args.device, db=args.db, shipped=args.shipped)
    written = kernel.save(out)
    manifest = kernel.manifest()

    print(f"workload    {wl}   key {wl.key}")
    print(f"device      {kernel.device.name}   key {manifest['device_key']}")
    rec = kernel.record
    if rec is None:
        print("provenance  untuned: the default schedule (run `autosched tune` for this workload)")
    else:
        measured = "" if rec.workload_key == wl.key else f" (measured on {rec.workload_key})"
        print(
            f"provenance  {kernel.provenance}: record {rec.id} from {kernel.database}{measured}, "
            f"{rec.gflops or 0.0:.1f} GFLOP/s, {(rec.latency_s or 0.0) * 1e3:.3f} ms"
        )
    print(f"config      {format_config(kernel.config.to_json())}")
    print(f"kernels     {', '.join(k['name'] for k in manifest['kernels'])}")
    print(f"wrote       {', '.join(str(p) for p in written)}")
    return 0
