"""``autosched iree spec|annotate`` and ``autosched tune --mlir``: IREE builds that use
the records.

``iree annotate IN.mlir --target iree-vulkan|iree-llvm-cpu -o OUT.mlir`` writes the
best config of every root op the records cover into the module as
``compilation_info``; ``iree spec -o spec.mlir`` writes a tuning spec for
``iree-compile --iree-codegen-tuning-spec-path`` (llvm-cpu). ``tune --mlir FILE``
tunes each root op of a file as its own task, keyed by op, shapes and dtype, so its
records serve ``--op`` tuning and the other way round.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autosched.cli.shared import check_writable, open_records, say_dropped
from autosched.errors import InvalidInputError
from autosched.iree import IREE_TARGETS


def _read(path: str) -> str:
    """An MLIR file's text; an ONNX model (``.onnx``) is imported to Linalg first."""
    try:
        is_onnx = Path(path).suffix.lower() == ".onnx"
        text = None if is_onnx else Path(path).read_text()
        if is_onnx and not Path(path).is_file():
            raise FileNotFoundError(2, "No such file or directory")
    except OSError as exc:
        raise InvalidInputError(
            f"cannot read {path}: {exc.strerror}; accepted: an MLIR file or an ONNX model"
        ) from None
    if text is None:
        from autosched.iree.toolchain import import_onnx

        return import_onnx(path)
    return text


def _write(path: str, text: str) -> None:
    try:
        Path(path).write_text(text)
    except OSError as exc:
        raise InvalidInputError(f"cannot write {path}: {exc.strerror}") from None


def _provenance(found) -> str:
    if found is None:
        return "no record: left to IREE"
    rec = found.record
    if rec.config.get("pipeline") == "auto":
        return f"IREE's own config measured fastest ({found.provenance}): left to IREE"
    return f"record {rec.id} ({found.provenance}), {rec.gflops or 0:.1f} GFLOP/s"


def cmd_annotate(args: argparse.Namespace) -> int:
    from autosched.iree.annotate import annotate_mlir
    from autosched.measure.device import select_device

    text = _read(args.input)
    dev = select_device(args.device, target=args.target)
    check_writable(args.output, "-o")
    db = open_records(args.db)
    try:
        out, applied = annotate_mlir(text, db=db, target=args.target, device=dev)
    finally:
        db.close()
    _write(args.output, out)
    for a in applied:
        what = str(a.workload) if a.workload is not None else "no autosched operator"
        print(f"{a.function}: {a.op} [{what}]: {_provenance(a.found)}")
    print(f"wrote {args.output} ({sum(bool(a.found) for a in applied)} of {len(applied)} root ops)")
    return 0


def cmd_spec(args: argparse.Namespace) -> int:
    from autosched.iree.annotate import tuning_spec
    from autosched.measure.device import select_device

    dev = select_device(args.device, target="iree-llvm-cpu")
    check_writable(args.output, "-o")
    db = open_records(args.db)
    try:
        spec, used = tuning_spec(db, device=dev)
    finally:
        db.close()
    _write(args.output, spec)
    for found in used:
        wl = found.record.workload
        print(f"{wl['op']} {wl['params']}: {_provenance(found)}")
    print(f"wrote {args.output} ({len(used)} configs)")
    return 0


def tune_mlir(args: argparse.Namespace) -> int:
    """``autosched tune --mlir FILE``: every root op with an autosched workload, in turn."""
    from autosched.iree.mlir import find_roots
    from autosched.measure.device import select_device
    from autosched.tuning.tune import tune

    if args.target not in IREE_TARGETS:
        raise InvalidInputError(
            f"--mlir needs an IREE target, not {args.target!r}; accepted: {', '.join(IREE_TARGETS)}"
        )
    if args.op or args.shape:
        raise InvalidInputError("--mlir tunes the file's ops; accepted: --mlir or --op/--shape")
    roots = find_roots(_read(args.mlir))
    tasks = list(dict.fromkeys(r.workload for r in roots if r.workload is not None))
    skipped = [r for r in roots if r.workload is None]
    if not tasks:
        raise InvalidInputError(
            f"{args.mlir} has no root op that autosched tunes; accepted: a module with "
            "linalg matmul, batch_matmul, conv_2d/depthwise (NHWC or NCHW) or row reductions"
        )
    dev = select_device(args.device, target=args.target)
    db = open_records(args.db)
    for r in skipped:
        print(f"skipping {r.function}: {r.op} (no autosched operator)", file=sys.stderr)
    try:
        for wl in tasks:
            print(f"tuning {wl} on {dev.name} ({args.target})", file=sys.stderr)
            say_dropped(wl, args.target)
            result = tune(
                wl,
                trials=args.trials,
                batch=args.batch,
                strategy=args.strategy,
                db=db,
                device=dev,
                target=args.target,
                seed=args.seed,
                timeout_s=args.timeout,
            )
            best = result.best
            speed = f"{best.gflops:.1f} GFLOP/s" if best and best.gflops else "no working config"
            ratio = f", {result.speedup:.2f}x IREE's default" if result.speedup else ""
            print(f"{wl}  key {wl.key}: {speed}{ratio} ({result.trials} trials)")
    finally:
        db.close()
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("iree", help="IREE builds with the records: annotate MLIR, tuning specs")
    iree_sub = p.add_subparsers(dest="iree_command", metavar="COMMAND", required=True)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--db", default=None, help="records database (default: the user's)")
        q.add_argument("--device", default=None, help="device selector (default: the first)")
        q.add_argument("-o", "--output", required=True, help="the file to write")

    q = iree_sub.add_parser(
        "annotate",
        help="write the records' configs into an MLIR file as compilation_info",
        description="Write the best recorded config of every tunable root op of IN into "
        "it as a compilation_info attribute (what iree-compile's SPIR-V pipeline honours; "
        "llvm-cpu too). Ops without a record are left to IREE.",
    )
    q.add_argument("input", help="the MLIR file (Linalg on tensors)")
    q.add_argument("--target", choices=IREE_TARGETS, required=True)
    common(q)
    q.set_defaults(func=cmd_annotate)

    q = iree_sub.add_parser(
        "spec",
        help="write a tuning spec for iree-compile's llvm-cpu backend",
        description="Write a transform-dialect tuning spec with the best recorded "
        "iree-llvm-cpu config of every workload, for iree-compile "
        "--iree-codegen-tuning-spec-path (the SPIR-V pipeline ignores specs: use annotate).",
    )
    common(q)
    q.set_defaults(func=cmd_spec)
