"""Devices: discovery, selection and the fingerprint that records are keyed by.

OpenCL devices are listed here; the ``llvm`` target's only device is the host CPU
(:class:`autosched.measure.cpu.HostCPU`), which ``select_device(..., target="llvm")``
returns without touching OpenCL.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from autosched._version import __version__, tvm_version
from autosched.errors import DeviceError, InvalidInputError
from autosched.iree import IREE_TARGETS
from autosched.measure.cpu import HostCPU, cpu_model_id, select_host
from autosched.records.record import canonical_json
from autosched.space.device import device_limits
from autosched.space.space import ALL_TARGETS, DeviceLimits

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Device:
    """An OpenCL device as plain data; ``index`` is its position in ``list_devices()``."""

    index: int
    platform_index: int
    device_index: int
    platform: str
    platform_version: str
    name: str
    version: str
    driver_version: str
    opencl_c_version: str
    type: str  # "cpu", "gpu", "accelerator"
    compute_units: int
    max_work_group_size: int
    max_work_item_sizes: tuple[int, ...]
    local_mem_bytes: int
    global_mem_bytes: int
    native_vector_width_float: int = 0
    local_mem_type: str = ""  # "local" (dedicated) or "global" (emulated in memory)
    registers_per_group: int = 0  # where the driver says (NVIDIA); 0: not known
    subgroup_size: int = 0  # a GPU's warp or wavefront, where the driver says; 0: not known

    @property
    def selector(self) -> str:
        return f"{self.platform_index}:{self.device_index}"

    @property
    def limits(self) -> DeviceLimits:
        return device_limits(self.fingerprint(), "opencl")

    def fingerprint(self, target: str = "opencl") -> dict:
        """Everything that can change a measurement: hardware, driver, compilers."""
        fp = asdict(self)
        # Positions depend on what else is installed; PoCL derives global memory from
        # the host's free RAM. Neither changes how a kernel runs.
        for k in ("index", "platform_index", "device_index", "global_mem_bytes"):
            fp.pop(k)
        for vendor_field in ("registers_per_group", "subgroup_size"):
            if not fp[vendor_field]:  # unknown: fingerprints (and keys) stay as before
                fp.pop(vendor_field)
        fp["max_work_item_sizes"] = list(self.max_work_item_sizes)
        fp["target"] = target
        fp["autosched_version"] = __version__
        fp["tvm_version"] = tvm_version()
        m = re.search(r"PoCL (\S+)", self.platform_version)
        fp["pocl_version"] = m.group(1) if m else ""
        if self.type == "cpu":  # a CPU device runs on this host's CPU, whose name it may hide
            fp["host_cpu"] = cpu_model_id()
        return fp

    def key(self, target: str = "opencl") -> str:
        """Exact identity: hash of the full fingerprint."""
        return opencl_key(self.fingerprint(target))

    def family(self, target: str = "opencl") -> str:
        """Same hardware whatever the driver and library versions."""
        return opencl_family(self.fingerprint(target))


def opencl_key(fingerprint: dict) -> str:
    """The device key of an OpenCL device's fingerprint (a record's ``device``)."""
    return hashlib.sha1(canonical_json(fingerprint).encode()).hexdigest()[:16]


def opencl_family(fingerprint: dict) -> str:
    """The device family of an OpenCL device's fingerprint: its target, platform,
    name, compute units and, for a CPU device, the CPU's exact model."""
    fp = fingerprint
    parts = [fp["target"], fp["platform"], fp["name"], fp.get("host_cpu", ""), fp["compute_units"]]
    return hashlib.sha1(canonical_json(parts).encode()).hexdigest()[:16]


_TYPES = {2: "cpu", 4: "gpu", 8: "accelerator"}

# GPU vendors' OpenCL libraries, where their packages and containers put them, and the
# platform name each registers. A container often has the library (mounted with the
# driver) but no ICD file naming it in /etc/OpenCL/vendors: OpenCL then lists only the
# CPU's platform, and a tuner picks it without a word.
_VENDOR_LIBRARIES = (
    ("NVIDIA", "nvidia", "libnvidia-opencl.so.1", "NVIDIA CUDA"),
    ("AMD", "amdocl64", "libamdocl64.so", "AMD Accelerated Parallel Processing"),
    ("Intel", "intel", "libigdrcl.so", "Intel(R) OpenCL"),
)
LIBRARY_DIRS = (
    "/usr/local/nvidia/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/opt/rocm/lib",
    "/usr/lib/x86_64-linux-gnu/intel-opencl",
)


def unregistered_drivers(platforms: list[str], dirs: tuple[str, ...] = LIBRARY_DIRS) -> list[str]:
    """One line for each GPU vendor's OpenCL library found in ``dirs`` whose platform is
    not among ``platforms`` (what OpenCL lists), saying how to register it."""
    hints = []
    for vendor, icd, library, platform in _VENDOR_LIBRARIES:
        if any(platform.lower() in p.lower() for p in platforms):
            continue
        for folder in dirs:
            path = Path(folder) / library
            if path.exists():
                hints.append(
                    f"{vendor}'s OpenCL driver is installed ({path}) but no ICD file "
                    f"registers it, so OpenCL does not list its devices: "
                    f"`echo {path} > /etc/OpenCL/vendors/{icd}.icd` (or put that file in "
                    "a folder named by OCL_ICD_VENDORS)"
                )
                break
    return hints


def _vendor_query(cl, d, extension: str, name: str) -> int:
    """A vendor extension's device property (0 where the driver lacks it or cannot say):
    NVIDIA's ``cl_nv_device_attribute_query`` gives the registers one work-group may use
    (65,536 on Hopper, CUDA's regsPerBlock) and the warp size, AMD's
    ``cl_amd_device_attribute_query`` the wavefront width."""
    param = getattr(cl.device_info, name, None)
    if param is None or extension not in d.extensions:
        return 0
    try:
        return int(d.get_info(param))
    except Exception:  # an extension the driver lists but does not answer
        return 0


_LOCAL_MEM_TYPES = {1: "local", 2: "global"}


@lru_cache(maxsize=1)
def list_devices() -> tuple[Device, ...]:
    """Every OpenCL device on this machine, in platform then device order."""
    try:
        import pyopencl as cl

        platforms = cl.get_platforms()
    except Exception as exc:  # no ICD loader, no platform
        raise DeviceError(
            f"no OpenCL platform found ({exc}); install an OpenCL driver, "
            "e.g. `apt-get install pocl-opencl-icd ocl-icd-libopencl1`"
        ) from None
    out = []
    for pi, p in enumerate(platforms):
        for di, d in enumerate(p.get_devices()):
            out.append(
                Device(
                    index=len(out),
                    platform_index=pi,
                    device_index=di,
                    platform=p.name.strip(),
                    platform_version=p.version.strip(),
                    name=d.name.strip(),
                    version=d.version.strip(),
                    driver_version=d.driver_version.strip(),
                    opencl_c_version=getattr(d, "opencl_c_version", "").strip(),
                    type=_TYPES.get(d.type & 14, "other"),
                    compute_units=int(d.max_compute_units),
                    max_work_group_size=int(d.max_work_group_size),
                    max_work_item_sizes=tuple(int(x) for x in d.max_work_item_sizes),
                    local_mem_bytes=int(d.local_mem_size),
                    global_mem_bytes=int(d.global_mem_size),
                    native_vector_width_float=int(d.native_vector_width_float),
                    local_mem_type=_LOCAL_MEM_TYPES.get(int(d.local_mem_type), ""),
                    registers_per_group=_vendor_query(
                        cl, d, "cl_nv_device_attribute_query", "REGISTERS_PER_BLOCK_NV"
                    ),
                    subgroup_size=_vendor_query(
                        cl, d, "cl_nv_device_attribute_query", "WARP_SIZE_NV"
                    )
                    or _vendor_query(cl, d, "cl_amd_device_attribute_query", "WAVEFRONT_WIDTH_AMD"),
                )
            )
    if not out:
        raise DeviceError("no OpenCL device found; install an OpenCL driver (e.g. pocl-opencl-icd)")
    return tuple(out)


def select_device(
    selector: str | int | Device | HostCPU | None = None, *, target: str = "opencl"
) -> Device | HostCPU:
    """Pick a device for ``target``.

    For ``"opencl"``, ``selector`` is None (the first GPU, else the first device), an
    index into ``list_devices()`` (``"0"``), ``"platform:device"`` (``"0:1"``), or a
    substring of the device or platform name (case-insensitive, ``"pthread"``).
    For ``"llvm"`` the device is the host CPU: None, ``0``, ``host``, ``cpu`` or part
    of its name. For the IREE targets see
    :func:`autosched.measure.iree_device.select_iree_device`. A device object is
    returned as it is if it serves ``target``.

    Raises:
        InvalidInputError: no such device, or a device that does not serve ``target``.
        DeviceError: no OpenCL platform (``"opencl"`` only).
    """
    if target not in ALL_TARGETS:
        raise InvalidInputError(
            f"target {target!r} is not supported; accepted: {', '.join(ALL_TARGETS)}"
        )
    if target in IREE_TARGETS:
        from autosched.measure.iree_device import IreeDevice, select_iree_device

        if isinstance(selector, IreeDevice):
            selector.fingerprint(target)  # raises for a device of the other IREE target
            return selector
        if isinstance(selector, (Device, HostCPU)):
            raise InvalidInputError(
                f"device {selector.name!r} does not serve target {target!r}; accepted: "
                f"a device of target {target!r}"
            )
        return select_iree_device(selector, target)
    if isinstance(selector, (Device, HostCPU)):
        if isinstance(selector, HostCPU) != (target == "llvm"):
            serves = "llvm" if isinstance(selector, HostCPU) else "opencl"
            raise InvalidInputError(
                f"device {selector.name!r} does not serve target {target!r}; accepted: "
                f"a device of target {target!r} (this one serves {serves})"
            )
        return selector
    if target == "llvm":
        return select_host(selector)
    devices = list_devices()
    accepted = f"an index (0..{len(devices) - 1}), 'platform:device', or part of a device name"
    if selector is None or selector == "":
        gpus = [d for d in devices if d.type == "gpu"]
        if not gpus:
            for hint in unregistered_drivers([d.platform for d in devices]):
                log.warning("%s", hint)
        return (gpus or list(devices))[0]
    text = str(selector).strip()
    if text.isdigit():
        i = int(text)
        if i < len(devices):
            return devices[i]
        raise InvalidInputError(f"no device {text!r}; accepted: {accepted}")
    if re.fullmatch(r"\d+:\d+", text):
        for d in devices:
            if d.selector == text:
                return d
        raise InvalidInputError(f"no device {text!r}; accepted: {accepted}")
    matches = [d for d in devices if text.lower() in f"{d.platform} {d.name}".lower()]
    if not matches:
        names = "; ".join(f"{d.index}: {d.name}" for d in devices)
        raise InvalidInputError(
            f"no device matches {text!r}; accepted: {accepted} (devices: {names})"
        )
    return matches[0]
