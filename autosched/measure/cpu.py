"""The host CPU as the device of the ``llvm`` target: identity, fingerprint, TVM target.

Kernels for ``llvm`` are compiled by TVM's LLVM code generation for this machine's CPU
(``mcpu`` from LLVM's host detection: without it the code is generic x86-64 and
several times slower) and run through TVM's runtime on all usable cores. Nothing here
needs OpenCL.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from autosched._version import __version__, tvm_version
from autosched.errors import InvalidInputError
from autosched.records.record import canonical_json
from autosched.space.device import device_limits
from autosched.space.space import DeviceLimits

# Instruction-set extensions that change what LLVM emits for these kernels.
_ISA_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512dq",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "asimd",
    "sve",
)

HOST_SELECTORS = ("host", "cpu", "0")


TVM_THREADS = "TVM_NUM_THREADS"


@dataclass(frozen=True)
class HostCPU:
    """This machine's CPU as plain data; the only device of the ``llvm`` target.

    Attributes:
        name: the CPU model as the OS reports it.
        vendor: ``GenuineIntel``, ``AuthenticAMD``, ...
        mcpu: LLVM's name for the host CPU; what kernels are compiled for.
        cores: CPUs this process may run on; TVM's thread pool uses all of them.
        isa: vector instruction-set extensions present (a fixed list of relevant ones).
        cache_bytes: ``(level, bytes)`` of the data and unified caches of one core.
        llvm_version: major version of the LLVM inside TVM.
        model_id: the CPU's exact model (:func:`cpu_model_id`): cloud VMs report a bare
            ``AMD EPYC`` for a Zen 4 and a Zen 5 alike.
    """

    name: str
    vendor: str
    mcpu: str
    cores: int
    isa: tuple[str, ...]
    cache_bytes: tuple[tuple[int, int], ...]
    llvm_version: str
    model_id: str = ""

    index: int = 0
    type: str = "cpu"
    platform: str = "host"

    @property
    def compute_units(self) -> int:
        return self.cores

    @property
    def selector(self) -> str:
        return "host"

    @property
    def limits(self) -> DeviceLimits:
        return device_limits(self.fingerprint(), "llvm")

    def tvm_target(self) -> dict[str, Any]:
        """The TVM target (as the dict ``tvm.target.Target`` takes) kernels are built for:
        tuned, compiled (autosched's compile API, Relax builds) and built for the peers alike.

        ``fast-math-reassoc`` lets LLVM reorder floating-point adds and multiplies, and
        nothing else (no assumption that values are finite or not NaN: an attention mask's
        -inf stays -inf). A reduction that a schedule leaves scalar, a softmax over 197
        columns that no vector width divides, then runs in vector lanes; an explicit
        ``vec`` already splits a reduction into that many partial results, the same
        reordering. Same configs, built both ways, interleaved (AMD EPYC Zen 3, AVX2,
        2026-12-03): the 2364 x 197 softmax 1.47-1.50x faster, the 1536 x 128 one, the
        512^3 matmul and the ResNet 3x3 conv2d within 0.99-1.02x."""
        return {
            "kind": "llvm",
            "mcpu": self.mcpu,
            "num-cores": self.cores,
            "fast-math-reassoc": True,
        }

    def fingerprint(self, target: str = "llvm") -> dict:
        """Everything that can change a measurement: CPU, cores, compilers."""
        _check_target(target)
        return {
            "target": target,
            "platform": self.platform,
            "name": self.name,
            "vendor": self.vendor,
            "model_id": self.model_id,
            "type": self.type,
            "mcpu": self.mcpu,
            "compute_units": self.cores,
            "isa": list(self.isa),
            "cache_bytes": {f"L{level}": size for level, size in self.cache_bytes},
            "llvm_version": self.llvm_version,
            "tvm_version": tvm_version(),
            "autosched_version": __version__,
        }

    def thread_env(self) -> dict[str, str]:
        """The environment that has TVM's runtime run on :attr:`cores` threads."""
        return {TVM_THREADS: str(self.cores)}

    def use_in_this_process(self) -> None:
        """Have TVM's runtime in this process run on as many threads as the measurements.

        TVM sizes its thread pool from ``TVM_NUM_THREADS`` when it first runs a parallel
        loop; unset, it takes half the logical CPUs (it assumes two hardware threads per
        core), which on a 2-vCPU VM is one thread: a BERT layer tuned on 2 threads ran at
        half its speed in the process that built it. A value the user set stays, and a
        pool that already started keeps its size.
        """
        os.environ.setdefault(TVM_THREADS, str(self.cores))

    def key(self, target: str = "llvm") -> str:
        """Exact identity: hash of the full fingerprint."""
        return hashlib.sha1(canonical_json(self.fingerprint(target)).encode()).hexdigest()[:16]

    def family(self, target: str = "llvm") -> str:
        """Same hardware whatever the compiler versions (as ``Device.family``)."""
        _check_target(target)
        text = canonical_json([target, self.platform, self.name, self.model_id, self.cores])
        return hashlib.sha1(text.encode()).hexdigest()[:16]


def _check_target(target: str) -> None:
    if target != "llvm":
        raise InvalidInputError(
            f"target {target!r} does not run on the host CPU device; accepted: llvm"
        )


@lru_cache(maxsize=1)
def host_cpu() -> HostCPU:
    """This machine's CPU (read once per process)."""
    from tvm.target import codegen

    info = _cpuinfo()
    return HostCPU(
        name=cpu_name(info),
        vendor=info.get("vendor_id", ""),
        mcpu=str(codegen.llvm_get_system_cpu()),
        cores=_usable_cores(),
        isa=isa_of(info),
        cache_bytes=_caches(),
        llvm_version=str(codegen.llvm_version_major()),
        model_id=cpu_model_id(),
    )


@lru_cache(maxsize=1)
def cpu_model_id() -> str:
    """This machine's exact CPU model, for device fingerprints and families: vendor,
    family and model numbers on x86 (``AuthenticAMD family 26 model 2``), implementer,
    part and variant on Arm; the OS's processor name elsewhere. Two CPUs whose model
    names read alike (a cloud VM's bare ``AMD EPYC``) are different devices when these
    differ: a Zen 5 runs the same PoCL kernel twice as fast as a Zen 4."""
    return model_id_of(_cpuinfo()) or _platform_cpu()


def cpu_name(info: dict[str, str]) -> str:
    """The CPU's model name in a :func:`parse_cpuinfo` result (the OS's name if none)."""
    return info.get("model name") or info.get("cpu model") or _platform_cpu()


def isa_of(info: dict[str, str]) -> tuple[str, ...]:
    """The vector extensions (of :data:`_ISA_FLAGS`) a :func:`parse_cpuinfo` result lists."""
    flags = set(info.get("flags", info.get("features", "")).split())
    return tuple(f for f in _ISA_FLAGS if f in flags)


def model_id_of(info: dict[str, str]) -> str:
    """:func:`cpu_model_id` of a :func:`parse_cpuinfo` result ('' where it has none)."""
    fields = [
        ("vendor_id", ""),
        ("cpu family", "family"),
        ("model", "model"),
        ("CPU implementer", "implementer"),
        ("CPU part", "part"),
        ("CPU variant", "variant"),
    ]
    parts = [f"{label} {info[key]}".strip() for key, label in fields if info.get(key)]
    return " ".join(parts)


def select_host(selector: str | int | None) -> HostCPU:
    """The host CPU if ``selector`` names it (None, ``0``, ``host``, ``cpu`` or part of its name)."""
    cpu = host_cpu()
    text = "" if selector is None else str(selector).strip().lower()
    if text in ("", *HOST_SELECTORS) or (not text.isdigit() and text in cpu.name.lower()):
        return cpu
    raise InvalidInputError(
        f"no device {selector!r} for target llvm; accepted: host, cpu or 0 "
        f"(the host CPU, {cpu.name})"
    )


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _cpuinfo() -> dict[str, str]:
    """The first processor's entries of /proc/cpuinfo (empty where there is none)."""
    try:
        return parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        return {}


def parse_cpuinfo(text: str) -> dict[str, str]:
    """The first processor's entries of a /proc/cpuinfo text (this machine's or another's)."""
    out: dict[str, str] = {}
    for line in text.split("\n\n")[0].splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _platform_cpu() -> str:
    import platform

    return platform.processor() or platform.machine() or "unknown CPU"


def _caches() -> tuple[tuple[int, int], ...]:
    """Data and unified cache sizes of CPU 0, smallest level first (empty if unknown)."""
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    out = []
    for index in sorted(root.glob("index*")):
        try:
            kind = (index / "type").read_text().strip()
            level = int((index / "level").read_text())
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        m = re.fullmatch(r"(\d+)([KMG]?)", size)
        if kind == "Instruction" or not m:
            continue
        scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)]
        out.append((level, int(m.group(1)) * scale))
    return tuple(sorted(out))
