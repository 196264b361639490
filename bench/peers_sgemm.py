"""The hand-written tunable SGEMM (``bench/kernels/sgemm.cl``): knobs, restrictions, programs.

This is what a user who hand-writes an OpenCL kernel and tunes it with Kernel Tuner
would have: a CLBlast-style kernel whose tile sizes, vector widths and local-memory
staging are preprocessor defines. Nothing here imports Kernel Tuner, so autosched's
own harness can build and time any config of the kernel.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from functools import lru_cache
from pathlib import Path

from autosched.measure.program import KernelLaunch, KernelProgram
from autosched.ops.base import TensorSpec

KERNEL_NAME = "sgemm"
KERNEL_PATH = Path(__file__).parent / "kernels" / "sgemm.cl"

# The values Kernel Tuner searches over (its ``tune_params``), in the kernel's terms.
TUNE_PARAMS: dict[str, list[int]] = {
    "MWG": [4, 8, 16, 32, 64, 128],
    "NWG": [16, 32, 64, 128, 256],
    "KWG": [8, 16, 32, 64],
    "MDIMC": [1, 2, 4, 8, 16],
    "NDIMC": [1, 2, 4, 8, 16],
    "VWM": [1, 2, 4, 8],
    "VWN": [1, 2, 4, 8, 16],
    "KWI": [1, 2, 4, 8],
    "SA": [0, 1],
    "SB": [0, 1],
}

# Accumulators per work-item at most: beyond 512 floats (32 AVX-512 registers) the tile
# only spills, and its fully unrolled body takes PoCL many seconds to compile.
MAX_TILE_FLOATS = 512


@lru_cache(maxsize=1)
def kernel_source() -> str:
    return KERNEL_PATH.read_text()


def shaped_source(m: int, n: int, k: int) -> str:
    """The kernel with the problem size fixed (what Kernel Tuner is given)."""
    return f"#define MSIZE {m}\n#define NSIZE {n}\n#define KSIZE {k}\n" + kernel_source()


def restrictions(m: int, n: int, k: int, *, local_mem_bytes: int) -> list[str]:
    """The kernel's requirements as Kernel Tuner restriction strings.

    Kernel Tuner already drops work-groups larger than the device allows
    (``MDIMC * NDIMC``, the block-size names).
    """
    return [
        f"{m} % MWG == 0",
        f"{n} % NWG == 0",
        f"{k} % KWG == 0",
        "MWG % MDIMC == 0",
        "NWG % NDIMC == 0",
        "NWG % (NDIMC * VWN) == 0",  # with the rule above: VWN divides NWG / NDIMC
        "KWG % KWI == 0",
        "KWI % VWM == 0",
        f"(MWG // MDIMC) * (NWG // NDIMC) <= {MAX_TILE_FLOATS}",
        f"4 * (SA * MWG * KWG + SB * KWG * NWG) <= {local_mem_bytes}",
    ]


def violations(
    p: Mapping[str, int], m: int, n: int, k: int, *, local_mem_bytes: int, max_work_group: int
) -> list[str]:
    """Why config ``p`` cannot run correctly at this shape (empty: it can).

    The same rules as :func:`restrictions`, written out separately so a test can check
    the two against each other.
    """
    out = []
    if m % p["MWG"] or n % p["NWG"] or k % p["KWG"]:
        out.append("the tiles must divide the problem (no bounds checks)")
    if p["MWG"] % p["MDIMC"] or p["NWG"] % p["NDIMC"]:
        out.append("the work-items must divide the work-group tile")
    elif (p["NWG"] // p["NDIMC"]) % p["VWN"]:
        out.append("VWN must divide the work-item's columns")
    elif (p["MWG"] // p["MDIMC"]) * (p["NWG"] // p["NDIMC"]) > MAX_TILE_FLOATS:
        out.append(f"more than {MAX_TILE_FLOATS} accumulators per work-item")
    if p["KWG"] % p["KWI"] or p["KWI"] % p["VWM"]:
        out.append("KWI must divide KWG and VWM must divide KWI")
    if 4 * (p["SA"] * p["MWG"] * p["KWG"] + p["SB"] * p["KWG"] * p["NWG"]) > local_mem_bytes:
        out.append("the local tiles exceed the device's local memory")
    if p["MDIMC"] * p["NDIMC"] > max_work_group:
        out.append("the work-group exceeds the device's limit")
    return out


def all_configs() -> Iterator[dict[str, int]]:
    """Every combination of :data:`TUNE_PARAMS`, valid or not."""
    names = list(TUNE_PARAMS)
    for values in itertools.product(*TUNE_PARAMS.values()):
        yield dict(zip(names, values))


def launch(p: Mapping[str, int], m: int, n: int) -> KernelLaunch:
    return KernelLaunch(
        name=KERNEL_NAME,
        args=(0, 1, 2),
        global_size=(n // p["NWG"] * p["NDIMC"], m // p["MWG"] * p["MDIMC"]),
        local_size=(p["NDIMC"], p["MDIMC"]),
    )


def program(p: Mapping[str, int], m: int, n: int, k: int) -> KernelProgram:
    """Config ``p`` as a program autosched's runner can check and time.

    The defines are prepended exactly as Kernel Tuner prepends them.
    """
    defines = "".join(f"#define {name} {int(p[name])}\n" for name in TUNE_PARAMS)
    return KernelProgram(
        source=defines + shaped_source(m, n, k),
        kernels=(launch(p, m, n),),
        tensors=(
            TensorSpec("A", (m, k), "float32", "input"),
            TensorSpec("B", (k, n), "float32", "input"),
            TensorSpec("C", (m, n), "float32", "output"),
        ),
    )


def config_key(p: Mapping[str, int]) -> str:
    return ",".join(f"{name}={int(p[name])}" for name in TUNE_PARAMS)
