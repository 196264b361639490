"""Will a workload fit? Checked before any test data is built or any kernel runs."""

from __future__ import annotations

import os

from autosched.errors import InvalidInputError
from autosched.measure.cpu import HostCPU
from autosched.measure.device import Device
from autosched.ops.base import Workload

# Host bytes per byte of the workload's float32 tensors, at the peak: the test data (1)
# and its float64 reference (2) in the tuner, the pickled transfer to the measurement
# child (1) and the child's copy (1), and the device's buffers (1; host memory on a CPU
# device).
_HOST_COPIES = 6


def available_host_bytes() -> int:
    """MemAvailable from /proc/meminfo (what can be allocated without swapping)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_fits(workload: Workload, device: Device | HostCPU) -> None:
    """Raise :class:`InvalidInputError` naming both limits when ``workload`` cannot fit.

    The workload's inputs and outputs must fit the device's global memory (an OpenCL
    device) and about six copies of them the host's available memory.
    """
    tensors = sum(t.nbytes for t in workload.tensor_specs())
    host = available_host_bytes()
    device_bytes = getattr(device, "global_mem_bytes", None)
    too_big_for_device = device_bytes is not None and tensors > device_bytes
    if not too_big_for_device and tensors * _HOST_COPIES <= host:
        return
    where = (
        f"device {device.name!r} has {_gib(device_bytes)} global memory, " if device_bytes else ""
    )
    raise InvalidInputError(
        f"{workload} needs {_gib(tensors)} for its tensors (about {_gib(tensors * _HOST_COPIES)} "
        f"on the host with its test data and reference); {where}the host has {_gib(host)} "
        "available; accepted: a smaller shape"
    )


def _gib(n: int | None) -> str:
    return f"{(n or 0) / 2**30:.1f} GiB"
