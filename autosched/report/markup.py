"""How the report writes things: numbers, times, configs, workloads, and the HTML tables
and figures every part of the page is made of. Every value from the records is escaped."""

from __future__ import annotations

import html
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from autosched.records.record import device_label

if TYPE_CHECKING:
    from autosched.report.sections import Section

DASH = "\u2013"


# -- values ------------------------------------------------------------------------------
def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def fmt_gflops(value: float | None) -> str:
    """GFLOP/s as the report prints it: 2 decimals below 100, 1 above."""
    if value is None or not math.isfinite(value):
        return DASH
    return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.2f}"


def fmt_latency(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return DASH
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} \u00b5s"
    if seconds < 1.0:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds:.3f} s"


def fmt_pct(fraction: float | None, *, signed: bool = False) -> str:
    if fraction is None or not math.isfinite(fraction):
        return DASH
    return f"{100 * fraction:+.1f}%" if signed else f"{100 * fraction:.1f}%"


def fmt_ratio(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return DASH
    return f"{value:.2f}\u00d7"


def fmt_time(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def fmt_duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


def fmt_knob(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "\u00d7".join(str(v) for v in value)
    return str(value)


def fmt_config(config: Mapping[str, Any]) -> str:
    return "  ".join(f"{k}={fmt_knob(config[k])}" for k in knob_order(config))


def knob_order(names: Iterable[str]) -> list[str]:
    """Tiles first, then vector width, staging, then the rest, each alphabetical."""

    def rank(name: str) -> tuple[int, str]:
        for i, prefix in enumerate(("tile.", "vec", "stage.", "reduce_at", "tile_inner")):
            if name.startswith(prefix):
                return i, name
        return 9, name

    return sorted(set(names), key=rank)


def tabulate(
    headers: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    numeric: Sequence[int] = (),
    highlight: Sequence[bool] | None = None,
    wrap: Sequence[int] = (),
    cls: str = "",
) -> str:
    """A table; cells are HTML already (escape values before passing them)."""
    num = set(numeric)
    head = "".join(
        f'<th class="num">{h}</th>' if i in num else f"<th>{h}</th>" for i, h in enumerate(headers)
    )
    body = []
    for r, row in enumerate(rows):
        cells = []
        for i, cell in enumerate(row):
            klass = "num" if i in num else "wrap" if i in wrap else ""
            cells.append(f'<td class="{klass}">{cell}</td>' if klass else f"<td>{cell}</td>")
        hl = ' class="hl"' if highlight is not None and highlight[r] else ""
        body.append(f"<tr{hl}>{''.join(cells)}</tr>")
    klass = f' class="{cls}"' if cls else ""
    return (
        f'<div class="scroll"><table{klass}><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{caption}</figcaption></figure>"


# -- workloads ---------------------------------------------------------------------------
def _split(workload: Mapping[str, Any]) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    """(shape parameters, options) of a workload, each in the order its op lists them.

    Options are the parameters with a fixed set of values (the op's ``choices``: epilogue,
    layout, reduction kind, elementwise chain); everything else is shape text, strides
    and padding included. An op this version does not know: its string parameters are
    options, the rest shapes, alphabetically.
    """
    from autosched.ops import OPS

    params = workload.get("params", {})
    if not isinstance(params, Mapping):
        return [], []
    cls = OPS.get(str(workload.get("op", "")))
    if cls is None:
        names = sorted(params)
        options = {k for k in names if isinstance(params[k], str)}
    else:
        known = [k for k in cls.shape_params if k in params]
        names = known + sorted(k for k in params if k not in cls.shape_params)
        options = set(cls.choices)
    shape = [(k, params[k]) for k in names if k not in options]
    return shape, [(k, params[k]) for k in names if k in options]


def shape_params(workload: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The workload's shape parameters (not options such as the epilogue), in the order
    its op lists them (``Workload.shape_params``)."""
    return _split(workload)[0]


def option_params(workload: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The workload's options (the op's ``choices``: epilogue, layout, kind, ops)."""
    return _split(workload)[1]


def shape_text(workload: Mapping[str, Any]) -> str:
    from autosched.ops import params_text

    text = params_text(workload)  # a fused function: its blocks and argument shapes
    return text if text is not None else ", ".join(f"{k}={v}" for k, v in shape_params(workload))


def _shown_options(workload: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The options a heading or header shows: none where shape_text says the whole
    workload in its own words (a fused function)."""
    from autosched.ops import params_text

    return [] if params_text(workload) is not None else option_params(workload)


def options_text(workload: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in _shown_options(workload))


def title(s: Section) -> str:
    from autosched.ops import OPS

    defaults = OPS[s.op].defaults if s.op in OPS else {}
    shown = [f"{k}={v}" for k, v in _shown_options(s.workload) if defaults.get(k) != v]
    extra = f" ({', '.join(shown)})" if shown else ""
    device = device_label(s.device, default=s.device_key)
    return f"{s.op} {shape_text(s.workload)}{extra} on {device} ({s.target})"
