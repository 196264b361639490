"""Benchmark: matmuls with prime and odd extents, convolutions with odd outputs and
row-wise operators over odd rows, tuned on both targets, against numpy.

    python -m bench.awkward [--shapes 127x1000x333,conv:512x7x7,...|rowwise]
                            [--targets opencl,llvm] [--trials 48]

Issue 13, part 3: tiles that need not divide their axes (guarded tails) give prime and
odd extents the wide register tiles and vectors of their power-of-two neighbours, and
on llvm an odd row (7 wide, ResNet's last stage in NCHW) gets vectors of 7 lanes. A
shape is a matmul ``MxNxK`` or a 3x3 convolution ``conv:CxHxW`` (C channels in and
out, stride 1, zero padding 1, NCHW: its rows are the vectorised axis), or a row-wise
operator ``softmax:RxC``, ``layernorm:RxC`` or ``elementwise:RxC[:ops]`` (R rows of C
columns; ops a ``+``-joined chain, add+gelu by default); ``--shapes rowwise`` names
:data:`ROWWISE`, a ViT-B/16's 197-column rows (no vector width divides them: vector
tails). Each shape is tuned from a cold database with the default strategy (the cost model) for
``--trials`` trials on each target. Then the tune's best kernel and numpy (OpenBLAS, as
the peers benchmark runs it: :class:`bench.peers_retime.Vendor`, the faster of the BLAS's
threads and one) are timed again side by side, in ``--rounds`` interleaved rounds (the
order alternating), and the ratio of their medians over all rounds is the figure: on a
shared 2-core VM a neighbour's burst halves either for a while, and timings apart (numpy
before and after the tune, as this benchmark read until 2026-11-29, kept for reference)
compare one's quiet moment with the other's busy one. Target: at least 0.8x numpy on
both targets.

Runs accumulate: each (shape, target) row replaces the one of the same key in the JSON
(``--out``, default bench/results/awkward.json), so a long benchmark can run in chunks.
Prints the table of everything in the file.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

import autosched
from autosched.measure.build import build
from autosched.measure.cpu import host_cpu
from autosched.measure.device import select_device
from autosched.report.vendor import time_vendor
from autosched.space.config import Config
from autosched.space.select import make_space
from bench.peers_retime import Vendor, retime
from bench.peers_runs import Finalist

# M x N x K: M prime, K = 9 x 37; all three prime or odd; N prime (no vector divides it
# but 1); M and K just past a power of two. ResNet's last 3x3 conv, in NCHW: rows of 7.
SHAPES = ("127x1000x333", "251x509x127", "257x512x129", "conv:512x7x7")
# A ViT-B/16's attention softmax (12 heads x 197 tokens, rows of 197), a bias add and
# GELU over rows of 197 and its layernorm (197 rows of 768).
ROWWISE = ("softmax:2364x197", "elementwise:2364x197:add+gelu", "layernorm:197x768")
ROW_OPS = ("softmax", "layernorm", "elementwise")
GOAL = 0.8
OUT = Path(__file__).parent / "results" / "awkward.json"


def parse_shape(text: str) -> tuple[str, dict[str, int | str]]:
    """(operator, parameters) of ``MxNxK`` (a matmul), ``conv:CxHxW`` (a 3x3 conv) or
    ``OP:RxC[:ops]`` (a row-wise operator, OP one of :data:`ROW_OPS`)."""
    op, _, rest = text.lower().partition(":")
    if op in ROW_OPS:
        dims, _, ops = rest.partition(":")
        try:
            rows, cols = (int(v) for v in dims.split("x"))
            if min(rows, cols) < 1 or (ops and op != "elementwise"):
                raise ValueError
        except ValueError:
            raise SystemExit(
                f"error: shape {text!r} is not {op}:RxC (e.g. {op}:2364x197"
                + (", or elementwise:RxC:add+gelu)" if op == "elementwise" else ")")
            ) from None
        params: dict[str, int | str] = {"rows": rows, "cols": cols}
        if op == "elementwise":
            params["ops"] = ops or "add+gelu"
        return op, params
    conv = text.lower().startswith("conv:")
    try:
        dims = [int(v) for v in text.lower().removeprefix("conv:").split("x")]
        if len(dims) != 3 or min(dims) < 1:
            raise ValueError
    except ValueError:
        raise SystemExit(
            f"error: shape {text!r} is neither MxNxK (e.g. 127x1000x333), conv:CxHxW "
            f"(e.g. conv:512x7x7) nor OP:RxC with OP one of {', '.join(ROW_OPS)} "
            "(e.g. softmax:2364x197)"
        ) from None
    if conv:
        c, h, w = dims
        return "conv2d", dict(n=1, c=c, h=h, w=w, k=c, r=3, s=3, stride=1, pad=1, layout="NCHW")
    m, n, k = dims
    return "matmul", dict(M=m, N=n, K=k)


def run_one(
    shape: str, target: str, device, *, trials: int, batch: int, seed: int, rounds: int
) -> dict:
    op, params = parse_shape(shape)
    wl = autosched.workload(op, **params)
    lib_before = time_vendor(wl)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        res = autosched.tune(
            wl,
            trials=trials,
            batch=batch,
            target=target,
            db=Path(tmp) / "bench.db",
            device=device,
            seed=seed,
        )
    wall = time.perf_counter() - t0
    lib_after = time_vendor(wl)
    best = res.best.gflops if res.best else None
    side = retime_with_numpy(wl, device, target, res.best.config, rounds) if best else {}
    ratio = side["tuned_gflops"] / side["numpy_gflops"] if "numpy_gflops" in side else None
    return {
        "shape": shape,
        "target": target,
        "params": wl.params,
        "tuned_gflops": best,
        "tuned_spread": res.best.spread if res.best else None,
        "default_gflops": res.default.gflops if res.default else None,
        "library": lib_before.method + (f" ({lib_before.blas})" if lib_before.blas else ""),
        "library_gflops_before": lib_before.gflops,
        "library_gflops_after": lib_after.gflops,
        "side_by_side": side,
        "tuned_vs_library": ratio,
        "met": None if ratio is None else ratio >= GOAL,
        "best_config": res.best.config if res.best else None,
        "trials": res.trials,
        "wall_s": wall,
    }


def retime_with_numpy(wl, device, target: str, config: dict, rounds: int) -> dict:
    """The tuned kernel and numpy timed in ``rounds`` interleaved rounds by the peers'
    harness: GFLOP/s of the median of each one's samples over all rounds, and each one's
    spread (interquartile range over median)."""
    program = build(make_space(wl, target=target, limits=device.limits), Config.from_json(config))
    finalist = Finalist("tuned", program, 0.0)
    vendor = Vendor(wl)
    try:
        per_round = retime(
            [finalist], wl, device=device, rounds=rounds, vendor=vendor, timeout_s=30
        )
    finally:
        vendor.close()
    if finalist.error:
        return {"error": finalist.error}
    kernel = [x for v in finalist.visits for x in v]
    library = [x for v in per_round for x in v]

    def summary(samples: list[float]) -> tuple[float, float]:
        q1, med, q3 = np.percentile(samples, [25, 50, 75])
        return float(wl.flops() / med / 1e9), float((q3 - q1) / med)

    tuned, tuned_spread = summary(kernel)
    numpy_gflops, numpy_spread = summary(library)
    return {
        "rounds": rounds,
        "tuned_gflops": tuned,
        "tuned_spread": tuned_spread,
        "numpy_gflops": numpy_gflops,
        "numpy_spread": numpy_spread,
        "numpy_threads": vendor.threads,
    }


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def table(rows: list[dict]) -> str:
    lines = [
        "| shape | target | tuned GFLOP/s (tune / side by side) | default "
        "| numpy GFLOP/s (before / after / side by side) | tuned / numpy, side by side "
        "| >= 0.8 | best config |",
        "|" + "---|" * 8,
    ]
    for r in rows:
        cfg = r["best_config"] or {}
        tiles = " ".join(f"{k}={v}" for k, v in sorted(cfg.items()))
        side = r.get("side_by_side") or {}
        lines.append(
            f"| {r['shape']} | {r['target']} | {_fmt(r['tuned_gflops'])} / "
            f"{_fmt(side.get('tuned_gflops'))} | {_fmt(r['default_gflops'])} | "
            f"{_fmt(r['library_gflops_before'])} / {_fmt(r['library_gflops_after'])} / "
            f"{_fmt(side.get('numpy_gflops'))} | {_fmt(r['tuned_vs_library'], '.2f')} | "
            f"{'-' if r['met'] is None else ('yes' if r['met'] else 'NO')} | {tiles} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--shapes",
        default=",".join(SHAPES),
        help="comma-separated MxNxK, conv:CxHxW or OP:RxC; 'rowwise' for the ViT rows",
    )
    p.add_argument("--targets", default="opencl,llvm")
    p.add_argument("--trials", type=int, default=48)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=6, help="side-by-side rounds with numpy")
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args()
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    shapes = [x for s in shapes for x in (ROWWISE if s == "rowwise" else (s,))]
    for s in shapes:
        parse_shape(s)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    bad = [t for t in targets if t not in ("opencl", "llvm")]
    if bad:
        p.error(f"unknown targets {bad}; accepted: opencl, llvm")
    out_path = Path(args.out)
    data = json.loads(out_path.read_text()) if out_path.exists() else {"results": []}
    cpu = host_cpu()
    data["cpu"] = {
        "name": cpu.name,
        "vendor": cpu.vendor,
        "mcpu": cpu.mcpu,
        "model": cpu.model_id,
        "isa": list(cpu.isa),
    }
    data["cores"] = cpu.cores
    data["devices"] = data.get("devices", {})
    devices = {target: select_device(target=target) for target in targets}
    for target, device in devices.items():
        data["devices"][target] = device.fingerprint(target)
    data["goal"] = f"tuned >= {GOAL}x numpy on both targets, {args.trials} trials"
    for shape in shapes:
        for target in targets:
            row = run_one(
                shape, target, devices[target], trials=args.trials, batch=args.batch,
                seed=args.seed, rounds=args.rounds,
            )  # fmt: skip
            row["date"] = time.strftime("%Y-%m-%d %H:%M:%S")
            side = row["side_by_side"]
            print(
                f"{shape:14s} {target:6s} tuned {_fmt(row['tuned_gflops']):>7s}, side by "
                f"side {_fmt(side.get('tuned_gflops')):>7s} against numpy "
                f"{_fmt(side.get('numpy_gflops')):>7s}: {_fmt(row['tuned_vs_library'], '.2f')}"
                f"  ({row['wall_s']:.0f} s)",
                flush=True,
            )
            data["results"] = [
                r for r in data["results"] if (r["shape"], r["target"]) != (shape, target)
            ] + [row]
            data["results"].sort(key=lambda r: (r["shape"], r["target"]))
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.write_text(json.dumps(data, indent=1) + "\n")
    print()
    print(table(data["results"]))
    print(f"\nwrote {out_path}")


if __name__ == "__main__":
    main()
