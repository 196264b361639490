"""The devices of the IREE targets, and the fingerprint their records are keyed by.

``iree-llvm-cpu`` runs on the host CPU through IREE's ``local-task`` driver (its
thread pool sized to the cores this process may use); ``iree-vulkan`` on a Vulkan
device, read from ``vulkaninfo`` (Mesa's lavapipe, ``llvmpipe``, where there is no
GPU). The fingerprint names the IREE release, the Vulkan device and driver, and the
CPU's features: everything that changes what a config measures.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache

from autosched._version import __version__
from autosched.errors import DeviceError, InvalidInputError
from autosched.iree.toolchain import vulkan_target_limits
from autosched.measure.cpu import host_cpu
from autosched.records.record import canonical_json
from autosched.space.device import device_limits, vector_bits
from autosched.space.space import DeviceLimits

DRIVERS = {"iree-llvm-cpu": "local-task", "iree-vulkan": "vulkan"}


@dataclass(frozen=True)
class IreeDevice:
    """A device of one IREE target, as plain data.

    Attributes:
        target: ``iree-llvm-cpu`` or ``iree-vulkan``.
        name: the CPU model, or the Vulkan device's name.
        driver: the IREE runtime driver (``local-task`` or ``vulkan``).
        driver_info: the Vulkan driver and its version (empty for the CPU).
        type: ``cpu`` or ``gpu`` (lavapipe is a CPU-type Vulkan device).
        cores: host cores the runtime's (or lavapipe's) threads may use; 1 for a GPU,
            whose compute units Vulkan does not report (the prior reads 1 as unknown).
        max_invocations: Vulkan workgroup invocations at most: the device's, narrowed to
            what its SPIR-V target assumes (1 for the CPU).
        shared_bytes: Vulkan shared memory per workgroup, narrowed the same way (0 for
            the CPU).
        subgroup_size: Vulkan subgroup size (0 for the CPU).
        vector_bits: the host CPU's widest SIMD register.
        isa: the host CPU's vector extensions.
        vulkan_target: ``--iree-vulkan-target`` for this device (empty for the CPU).
        iree_version: the ``iree-base-compiler`` release.
        cpu_name: the host CPU's model name (empty for a GPU).
        cpu_model: the host CPU's exact model (``cpu_model_id``; empty for a GPU).
        index: the Vulkan device's position (0 for the CPU).
        llvm_cpu: iree-llvm-cpu: LLVM's name of the CPU to build for, where that is not
            the building machine's own (a CPU measured elsewhere); in the fingerprint
            only when set.
    """

    target: str
    name: str
    driver: str
    driver_info: str
    type: str
    cores: int
    max_invocations: int
    shared_bytes: int
    subgroup_size: int
    vector_bits: int
    isa: tuple[str, ...]
    vulkan_target: str
    iree_version: str
    cpu_name: str = ""
    cpu_model: str = ""
    index: int = 0
    platform: str = "iree"
    llvm_cpu: str = ""

    @property
    def compute_units(self) -> int:
        return self.cores

    @property
    def selector(self) -> str:
        return str(self.index)

    @property
    def limits(self) -> DeviceLimits:
        return device_limits(self.fingerprint(), self.target)

    def fingerprint(self, target: str | None = None) -> dict:
        """Everything that can change a measurement: IREE, Vulkan device and driver, CPU."""
        self._check(target)
        built_for = {"llvm_cpu": self.llvm_cpu} if self.llvm_cpu else {}
        return {
            **built_for,
            "target": self.target,
            "platform": self.platform,
            "name": self.name,
            "type": self.type,
            "driver": self.driver,
            "driver_info": self.driver_info,
            "compute_units": self.cores,
            "max_invocations": self.max_invocations,
            "shared_bytes": self.shared_bytes,
            "subgroup_size": self.subgroup_size,
            "vulkan_target": self.vulkan_target,
            "cpu": self.cpu_name,
            "cpu_model": self.cpu_model,
            "isa": list(self.isa),
            "iree_version": self.iree_version,
            "autosched_version": __version__,
        }

    def key(self, target: str | None = None) -> str:
        return hashlib.sha1(canonical_json(self.fingerprint(target)).encode()).hexdigest()[:16]

    def family(self, target: str | None = None) -> str:
        """Same hardware whatever the IREE and driver versions."""
        self._check(target)
        text = canonical_json([self.target, self.platform, self.name, self.cpu_model, self.cores])
        return hashlib.sha1(text.encode()).hexdigest()[:16]

    def _check(self, target: str | None) -> None:
        if target is not None and target != self.target:
            raise InvalidInputError(
                f"device {self.name!r} serves target {self.target!r}, not {target!r}; "
                f"accepted: {self.target}"
            )


def iree_version() -> str:
    try:
        from iree.compiler.version import VERSION
    except ImportError:
        raise DeviceError(
            "the IREE targets need the iree extra: `pip install autosched[iree]` "
            "(or EXTRAS=iree bash scripts/install.sh)"
        ) from None
    return str(VERSION)


def _cpu_device() -> IreeDevice:
    cpu = host_cpu()
    return cpu_device(cpu.name, cpu.model_id, cpu.cores, cpu.isa, version=iree_version())


def cpu_device(
    name: str, model: str, cores: int, isa: tuple[str, ...], *, version: str, llvm_cpu: str = ""
) -> IreeDevice:
    """The ``iree-llvm-cpu`` device of a CPU: this machine's, or one measured elsewhere
    (``llvm_cpu``: LLVM's name of it, what its code is built for)."""
    return IreeDevice(
        target="iree-llvm-cpu",
        name=name,
        driver="local-task",
        driver_info="",
        type="cpu",
        cores=cores,
        max_invocations=1,
        shared_bytes=0,
        subgroup_size=0,
        vector_bits=vector_bits(isa),
        isa=isa,
        vulkan_target="",
        iree_version=version,
        cpu_name=name,
        cpu_model=model,
        llvm_cpu=llvm_cpu,
    )


_FIELDS = {
    "deviceName": str,
    "deviceType": str,
    "driverInfo": str,
    "driverName": str,
    "maxComputeWorkGroupInvocations": int,
    "maxComputeSharedMemorySize": int,
    "subgroupSize": int,
}


def parse_vulkaninfo(text: str) -> list[dict]:
    """Per physical device (``GPU0:``, ``GPU1:``, ...), the first value of each field
    this module reads, from ``vulkaninfo``'s text output."""
    out = []
    for chunk in re.split(r"^GPU\d+:\s*$", text, flags=re.M)[1:]:
        info: dict = {}
        for name, kind in _FIELDS.items():
            m = re.search(rf"^\s*{name}\s*=\s*(.+?)\s*$", chunk, flags=re.M)
            if m:
                info[name] = kind(m.group(1))
        if "deviceName" in info:
            out.append(info)
    return out


def _vulkan_target(info: dict) -> str:
    """IREE's ``--iree-vulkan-target`` for a device: lavapipe by name, else the
    portable baseline that any Vulkan 1.1 compute device runs."""
    if info.get("driverName") == "llvmpipe" or "llvmpipe" in info["deviceName"]:
        return "llvmpipe"
    return "vp_android_baseline_2022"


@lru_cache(maxsize=1)
def vulkan_devices() -> tuple[IreeDevice, ...]:
    """The Vulkan devices ``vulkaninfo`` lists, as devices of ``iree-vulkan``."""
    tool = shutil.which("vulkaninfo")
    if tool is None:
        raise DeviceError(
            "no vulkaninfo: install Mesa's Vulkan driver and tools "
            "(`apt-get install mesa-vulkan-drivers libvulkan1 vulkan-tools`)"
        )
    proc = subprocess.run([tool], capture_output=True, text=True, timeout=60)
    infos = parse_vulkaninfo(proc.stdout)
    if not infos:
        raise DeviceError("no Vulkan device found; install a Vulkan driver (mesa-vulkan-drivers)")
    cpu = host_cpu()
    version = iree_version()
    return tuple(device_from_info(info, i, cpu, version) for i, info in enumerate(infos))


def device_from_info(info: dict, index: int, cpu, version: str) -> IreeDevice:
    """The ``iree-vulkan`` device of one ``vulkaninfo`` entry. Its workgroup limits are
    the device's, narrowed to what its SPIR-V target assumes (the portable baseline
    that a GPU without a named target gets allows 128 invocations and 16 KiB of shared
    memory where a discrete GPU has 1024 and 48 KiB): the space must not propose what
    the compiler builds for neither."""
    is_cpu = "CPU" in info.get("deviceType", "")
    target = _vulkan_target(info)
    threads, memory = vulkan_target_limits(target)
    return IreeDevice(
        target="iree-vulkan",
        name=info["deviceName"],
        driver="vulkan",
        driver_info=info.get("driverInfo", ""),
        type="cpu" if is_cpu else "gpu",
        cores=cpu.cores if is_cpu else 1,
        max_invocations=min(info.get("maxComputeWorkGroupInvocations", 128), threads),
        shared_bytes=min(info.get("maxComputeSharedMemorySize", 16384), memory),
        subgroup_size=info.get("subgroupSize", 32),
        vector_bits=vector_bits(cpu.isa),
        isa=cpu.isa if is_cpu else (),
        vulkan_target=target,
        iree_version=version,
        cpu_name=cpu.name if is_cpu else "",
        cpu_model=cpu.model_id if is_cpu else "",
        index=index,
    )


def spirv_target(limits: DeviceLimits) -> str:
    """The SPIR-V target an iree-vulkan space's configs are built for: that of the
    device its limits came from, else the default Vulkan device's."""
    return limits.spirv_target or select_iree_device(None, "iree-vulkan").vulkan_target


def select_iree_device(selector: str | int | None, target: str) -> IreeDevice:
    """The device of ``target`` that ``selector`` names: None or ``0`` for the first;
    an index or part of the name for Vulkan; ``host``/``cpu`` for llvm-cpu."""
    text = "" if selector is None else str(selector).strip().lower()
    if target == "iree-llvm-cpu":
        dev = _cpu_device()
        if text in ("", "0", "host", "cpu") or text in dev.name.lower():
            return dev
        raise InvalidInputError(
            f"no device {selector!r} for target iree-llvm-cpu; accepted: host, cpu or 0 "
            f"(the host CPU, {dev.name})"
        )
    devices = vulkan_devices()
    if text == "":
        gpus = [d for d in devices if d.type == "gpu"]
        return (gpus or list(devices))[0]
    if text.isdigit() and int(text) < len(devices):
        return devices[int(text)]
    for d in devices:
        if text in d.name.lower():
            return d
    names = "; ".join(f"{d.index}: {d.name}" for d in devices)
    raise InvalidInputError(
        f"no Vulkan device {selector!r}; accepted: an index or part of a name ({names})"
    )
