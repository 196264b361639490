"""What a device's fingerprint says about its schedules: limits and vector shape.

A fingerprint is the plain-data description every record carries (``Record.device``):
an OpenCL device's properties (:class:`autosched.measure.device.Device`) or the host
CPU's (:class:`autosched.measure.cpu.HostCPU`). The spaces need its limits to prune
configs, and the cost model's prior needs its vector shape (lanes of one native fp32
vector, vector registers per thread) and compute units. Both come from the device's
own properties, so records of any device, including ones never met, rebuild the same
space and prior.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from autosched.space.space import DeviceLimits

# Vector registers of each x86/Arm SIMD extension (the architectural register file).
_X86_AVX512 = ("avx512f",)
_X86_AVX = ("avx2", "avx")
_ARM = ("asimd", "sve", "neon")


def vector_bits(isa: Iterable[str] | None) -> int:
    """The widest x86 vector a CPU with these extensions (``isa`` flags) runs, in bits."""
    flags = {str(x).lower() for x in isa or ()}
    if flags & set(_X86_AVX512):
        return 512
    if flags & set(_X86_AVX):
        return 256
    return 128


def vector_shape(device: Mapping[str, Any]) -> tuple[int, int]:
    """``(fp32 lanes of one native vector, vector registers per thread)`` of a device.

    From the CPU's instruction-set extensions (``isa``, the llvm target's fingerprint)
    or the OpenCL driver's ``native_vector_width_float``. A fingerprint recorded before
    that field existed falls back to what its name says (PoCL names its CPU device after
    LLVM's CPU, e.g. ``pthread-skylake-avx512``). A GPU work-item is scalar with a
    budget of about 64 registers for accumulators.
    """
    isa = {str(x).lower() for x in device.get("isa") or ()}
    if isa:
        lanes = vector_bits(isa) // 32
        # x86's 512-bit extension doubled the register file; Arm's has 32 registers.
        return lanes, 32 if lanes >= 16 or isa & set(_ARM) else 16
    is_cpu = device.get("type", "cpu") == "cpu"
    width = int(device.get("native_vector_width_float") or 0)
    if not is_cpu:
        return max(1, width), 64
    if width <= 0:
        text = f"{device.get('name', '')} {device.get('version', '')}".lower()
        width = 16 if "avx512" in text else 8 if "x86" in text else 4
    # x86's 512-bit extension doubled the register file; Arm's has 32 registers.
    arm = any(a in str(device.get("name", "")).lower() for a in ("arm", "aarch64"))
    return width, 32 if width >= 16 or arm else 16


def _cache_bytes(device: Mapping[str, Any]) -> tuple[int, ...]:
    """A CPU fingerprint's data cache sizes, L1 first (``{"L1": bytes, ...}``)."""
    caches = device.get("cache_bytes") or {}
    levels = sorted(int(k[1:]) for k in caches if str(k)[:1] == "L" and str(k)[1:].isdigit())
    return tuple(int(caches[f"L{n}"]) for n in levels)


def device_limits(device: Mapping[str, Any], target: str) -> DeviceLimits:
    """The limits a device's fingerprint (``Record.device``) implies for ``target``.

    Raises:
        KeyError, TypeError, ValueError: the fingerprint lacks a field the target needs.
    """
    lanes, registers = vector_shape(device)
    units = max(1, int(device.get("compute_units") or 1))
    if target.startswith("iree-"):  # as IreeDevice.limits
        bits = vector_bits(device.get("isa"))
        invocations = int(device.get("max_invocations") or 1)
        return DeviceLimits(
            max_work_group_size=invocations,
            max_work_item_size=invocations,
            local_mem_bytes=int(device.get("shared_bytes") or 0),
            is_cpu=device.get("type") == "cpu",
            cores=units,
            compute_units=units,
            vector_lanes=lanes,
            vector_registers=registers,
            vector_bits=bits,
            subgroup_size=int(device.get("subgroup_size") or 0),
            spirv_target=str(device.get("vulkan_target") or ""),
            llvm_cpu=str(device.get("llvm_cpu") or ""),
        )
    if target == "llvm":
        return DeviceLimits(
            max_work_group_size=1,
            max_work_item_size=1,
            local_mem_bytes=0,
            is_cpu=True,
            cores=units,
            compute_units=units,
            vector_lanes=lanes,
            vector_registers=registers,
            cache_bytes=_cache_bytes(device),
        )
    sizes = device.get("max_work_item_sizes") or [device["max_work_group_size"]]
    is_cpu = device.get("type") == "cpu"
    # Recorded before the type was kept: CPU drivers emulate local memory.
    emulated = device["local_mem_type"] == "global" if "local_mem_type" in device else is_cpu
    return DeviceLimits(
        max_work_group_size=int(device["max_work_group_size"]),
        max_work_item_size=int(sizes[0]),
        local_mem_bytes=int(device["local_mem_bytes"]),
        is_cpu=is_cpu,
        compute_units=units,
        vector_lanes=lanes,
        vector_registers=registers,
        local_mem_emulated=emulated,
        registers_per_group=int(device.get("registers_per_group") or 0),
        subgroup_size=int(device.get("subgroup_size") or 0),
    )


def similarity(a: DeviceLimits, b: DeviceLimits) -> float:
    """How alike two devices are, in (0, 1] (0 between a CPU and a GPU): ``exp(-d)``,
    ``d`` the mean |log2 ratio| of what their fingerprints say the schedules depend
    on (vector lanes and registers, compute units, local memory, work-group size).

    An AVX2 and an AVX-512 CPU of two cores: 0.55; two AVX-512 CPUs: 1. The search
    trusts another device's records this much before this device has measured
    anything (:mod:`autosched.search.sources`).
    """
    if a.is_cpu != b.is_cpu:
        return 0.0
    pairs = [
        (a.vector_lanes, b.vector_lanes),
        (a.vector_registers, b.vector_registers),
        (a.compute_units, b.compute_units),
        (a.local_mem_bytes, b.local_mem_bytes),
        (a.max_work_group_size, b.max_work_group_size),
    ]
    d = sum(abs(math.log2(max(1, x) / max(1, y))) for x, y in pairs) / len(pairs)
    return math.exp(-d)
