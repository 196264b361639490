"""``--shape`` text -> an operator's keyword parameters (the CLI and job files share it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autosched.errors import InvalidInputError

if TYPE_CHECKING:
    from autosched.ops.base import Workload


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
