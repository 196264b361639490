"""What the workload commands share: the ``--op``/``--shape``/``--epilogue`` arguments,
the workload they name, and how a config is printed."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from autosched.errors import InvalidInputError

if TYPE_CHECKING:
    from autosched.ops import Workload


def add_workload_args(p: argparse.ArgumentParser) -> None:
    """``--op``, ``--shape`` and ``--epilogue``, as every workload command takes them."""
    from autosched.ops import OPS

    p.add_argument("--op", required=True, help=f"operator: {', '.join(OPS)} (see `autosched ops`)")
    p.add_argument(
        "--shape",
        required=True,
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


def _accepted(cls: type[Workload]) -> str:
    by_position = f", or {','.join(cls.positional)} by position" if cls.positional else ""
    return f"accepted: {cls.describe_params()}{by_position}; e.g. --shape {cls.example}"


def parse_shape(op: str, text: str) -> dict[str, Any]:
    """``--shape`` text -> keyword parameters of the op (defaults left to the op to fill).

    Every op takes named parameters, ``n=1,c=64,h=56,...`` (names as ``autosched ops``
    lists them, case-insensitive, so matmul takes ``M=`` or ``m=``); ops with
    ``positional`` parameters also take bare values in that order (matmul ``512,512,512``).
    Values are integers, except the op's string parameters (``epilogue``, ``layout``,
    ``kind``, ``ops``). The op itself checks the values.

    Raises:
        InvalidInputError: an unknown op, or an unknown, missing, repeated or non-integer
            parameter; the message lists the parameters the op accepts.
    """
    from autosched.ops import OPS

    cls = OPS.get(op)
    if cls is None:
        raise InvalidInputError(f"unknown op {op!r}; accepted: {', '.join(OPS)}")
    accepted = _accepted(cls)
    parts = [p.strip() for p in text.split(",") if p.strip()]
    named = [p for p in parts if "=" in p]
    raw: dict[str, str] = {}
    if parts and len(named) == len(parts):
        canonical = {name.lower(): name for name in cls.shape_params}
        for part in parts:
            given, _, value = part.partition("=")
            name = canonical.get(given.strip().lower())
            if name is None:
                raise InvalidInputError(
                    f"--shape: unknown parameter {given.strip()!r} for {op}; {accepted}"
                )
            if name in raw:
                raise InvalidInputError(f"--shape: {name} is given twice; {accepted}")
            raw[name] = value.strip()
    elif parts and not named and len(parts) == len(cls.positional):
        raw = dict(zip(cls.positional, parts))
    elif parts and not named and not cls.positional:
        raise InvalidInputError(f"--shape {text!r}: {op} takes name=value parameters; {accepted}")
    else:
        raise InvalidInputError(f"--shape {text!r} is malformed for {op}; {accepted}")
    missing = [n for n in cls.shape_params if n not in raw and n not in cls.defaults]
    if missing:
        raise InvalidInputError(f"--shape {text!r} lacks {', '.join(missing)}; {accepted}")
    out: dict[str, Any] = {}
    for name, value in raw.items():
        if name in cls.choices:
            out[name] = value
            continue
        try:
            out[name] = int(value)
        except ValueError:
            raise InvalidInputError(
                f"--shape: {name}={value!r} is not an integer; {accepted}"
            ) from None
    return out


def workload_from_args(args: argparse.Namespace) -> Workload:
    """The workload of ``--op``, ``--shape`` and ``--epilogue`` (matmul and dense)."""
    from autosched.ops import OPS, workload

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
