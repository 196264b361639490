"""What the workload commands share: the ``--op``/``--shape``/``--epilogue`` arguments,
the workload they name, and how a config is printed."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from autosched.errors import InvalidInputError

if TYPE_CHECKING:
    from autosched.ops import Workload


def add_workload_args(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    """``--op``, ``--shape`` and ``--epilogue``, as every workload command takes them."""
    from autosched.ops import OPS

    p.add_argument(
        "--op", required=required, help=f"operator: {', '.join(OPS)} (see `autosched ops`)"
    )
    p.add_argument(
        "--shape",
        required=required,
        help="the op's parameters as name=value, e.g. n=1,c=64,h=56,w=56,k=64,r=3,s=3,pad=1; "
        "bare values in order for matmul (M,N,K), batch_matmul (b,m,n,k), softmax and "
        "layernorm (rows,cols); `autosched ops` lists them",
    )
    p.add_argument(
        "--epilogue",
        default=None,
        help="matmul: none, bias, bias_relu; dense: also bias_gelu (default none; dense "
        "also takes epilogue= in --shape)",
    )


def workload_from_args(args: argparse.Namespace) -> Workload:
    """The workload of ``--op``, ``--shape`` and ``--epilogue`` (matmul and dense)."""
    from autosched.ops import OPS, workload
    from autosched.ops.shape import parse_shape

    params = parse_shape(args.op, args.shape)
    epilogue = getattr(args, "epilogue", None)
    if epilogue is not None and "epilogue" in OPS[args.op].shape_params:
        if params.setdefault("epilogue", epilogue) != epilogue:
            raise InvalidInputError(
                f"--epilogue {epilogue} contradicts epilogue={params['epilogue']} in --shape; "
                "accepted: one of them, or both the same"
            )
    elif epilogue not in (None, "none"):
        takers = [op for op, cls in OPS.items() if "epilogue" in cls.shape_params]
        raise InvalidInputError(
            f"--epilogue {epilogue} does not apply to {args.op}; accepted: --epilogue for "
            f"{', '.join(takers)} only"
        )
    return workload(args.op, **params)


def format_config(config: dict) -> str:
    """A config on one line, ``name=value`` sorted by name; tiles as ``4x2``."""
    return "  ".join(
        f"{k}={'x'.join(map(str, v)) if isinstance(v, list) else v}"
        for k, v in sorted(config.items())
    )


def check_writable(path: str, option: str) -> None:
    """Refuse an output path that cannot be written, before any work (one line, exit 2)."""
    target = Path(path).expanduser()
    folder = target.parent
    if target.is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK):
        raise InvalidInputError(
            f"cannot write {option} {path}: its folder does not exist or is not writable; "
            "accepted: a file path in a writable folder"
        )


def open_records(path: str | None, *, create: bool = True):
    """The records database ``path`` names (a path or a postgresql:// URL), else the
    default one every command shares; ``create=False`` refuses one that does not exist."""
    from autosched.records import open_database
    from autosched.records.sqlite import default_db_path

    return open_database(path or default_db_path(), create=create)


def positive(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an integer; accepted: an integer >= 1"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is too small; accepted: an integer >= 1")
    return value


def say_dropped(wl, target: str, task: str = "") -> None:
    """A line on stderr where IREE will build its own config whatever the tune tries
    (``task`` names the job's task it is about)."""
    if target.startswith("iree-"):
        from autosched.iree.linalg import config_dropped

        why = config_dropped(wl)
        if why:
            print(f"note: {f'task {task} on {target}: ' if task else ''}{why}", file=sys.stderr)
