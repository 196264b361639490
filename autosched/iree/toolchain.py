"""``iree-compile`` for the IREE targets: the flags that pick a backend, and a build.

The compiler runs as its own process (the ``iree-compile`` of the installed
``iree-base-compiler``), so a crash or a hang in it is an error value of one
candidate, never the tuner's.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache

from autosched.errors import DeviceError, ScheduleError


def compile_flags(
    target: str, *, vulkan_target: str = "llvmpipe", llvm_cpu: str = "host"
) -> list[str]:
    """The ``iree-compile`` flags that build for ``target`` (``iree-llvm-cpu``: the CPU
    LLVM calls ``llvm_cpu``, this machine's by default; ``vulkan_target`` names the
    SPIR-V target of ``iree-vulkan``)."""
    if target == "iree-llvm-cpu":
        return [
            "--iree-hal-target-device=local",
            "--iree-hal-local-target-device-backends=llvm-cpu",
            f"--iree-llvmcpu-target-cpu={llvm_cpu}",
        ]
    if target == "iree-vulkan":
        return ["--iree-hal-target-device=vulkan", f"--iree-vulkan-target={vulkan_target}"]
    raise ValueError(f"not an IREE target: {target!r}")


_PROBE = "func.func @probe(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }"


@cache
def vulkan_target_limits(vulkan_target: str) -> tuple[int, int]:
    """What IREE's SPIR-V target ``vulkan_target`` assumes of a workgroup: its most
    invocations and its shared-memory bytes, read off the target attribute that
    ``iree-compile`` makes for it (``max_thread_count_per_workgroup``,
    ``max_workgroup_memory_bytes``). Code built for the target may rely on both, and
    the compiler rejects a config that stages more shared memory than the target has,
    whatever the device running it has.

    Raises:
        DeviceError: ``iree-compile`` does not know the target or printed no limits.
    """
    what = f"iree-compile gives no workgroup limits for --iree-vulkan-target={vulkan_target}"
    flags = compile_flags("iree-vulkan", vulkan_target=vulkan_target)
    try:
        out = compile_mlir(_PROBE, flags, timeout_s=120, extra=["--compile-to=executable-targets"])
    except ScheduleError as exc:
        raise DeviceError(f"{what}: {exc}") from None
    text = out.decode(errors="replace")
    threads = re.search(r"max_thread_count_per_workgroup = (\d+)", text)
    memory = re.search(r"max_workgroup_memory_bytes = (\d+)", text)
    if not threads or not memory:
        raise DeviceError(what)
    return int(threads.group(1)), int(memory.group(1))


def iree_compile_path() -> str:
    from iree.compiler.tools.binaries import find_tool

    return find_tool("iree-compile")


def compile_mlir(
    text: str, flags: list[str], *, timeout_s: float = 300.0, extra: list[str] | None = None
) -> bytes:
    """Compile MLIR ``text`` with ``flags`` to a ``.vmfb`` module.

    Raises:
        ScheduleError: the compiler rejected the input or the config (its first error
            lines are the message), crashed, or ran past ``timeout_s``.
    """
    cmd = [iree_compile_path(), "-", *flags, *(extra or []), "-o", "-"]
    try:
        proc = subprocess.run(cmd, input=text.encode(), capture_output=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ScheduleError(f"iree-compile took longer than {timeout_s:g} s") from None
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.decode(errors="replace").splitlines() if "error" in ln]
        first = " | ".join(lines[:4]) or proc.stderr.decode(errors="replace")[-1000:]
        how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
        raise ScheduleError(f"iree-compile ({how}): {first}"[:2000])
    return proc.stdout


def import_onnx(path: str, *, timeout_s: float = 300.0) -> str:
    """An ONNX model as MLIR that ``iree-compile`` takes and whose root ops are Linalg:
    IREE's ONNX importer (``iree-import-onnx``, torch dialect), then ``iree-compile
    --compile-to=input`` (the input conversion to Linalg on tensors). The weights stay
    in the module, so the result builds and runs on its own.

    Raises:
        InvalidInputError: not a file IREE's importer reads as ONNX (its message), an op
            it cannot convert, or the importer missing (it needs the ``onnx`` package).
    """
    import shutil
    import sys
    import tempfile
    from pathlib import Path

    from autosched.errors import InvalidInputError

    importer = shutil.which("iree-import-onnx", path=str(Path(sys.executable).parent))
    importer = importer or shutil.which("iree-import-onnx")
    try:
        import onnx  # noqa: F401  (the importer's own dependency)
    except ImportError:
        importer = None
    if importer is None:
        raise InvalidInputError(
            f"{path} is ONNX, which needs IREE's importer and the onnx package; accepted: "
            "an MLIR file, or install the iree and models extras"
        )
    with tempfile.TemporaryDirectory(prefix="autosched-onnx-") as tmp:
        torch_mlir = Path(tmp) / "model.torch.mlir"
        steps = (
            [importer, str(path), "-o", str(torch_mlir)],
            [iree_compile_path(), str(torch_mlir), "--compile-to=input", "-o", "-"],
        )
        for cmd in steps:
            try:
                proc = subprocess.run(cmd, capture_output=True, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise InvalidInputError(
                    f"importing {path} took longer than {timeout_s:g} s"
                ) from None
            if proc.returncode != 0:
                err = proc.stderr.decode(errors="replace").strip().splitlines()
                why = next((ln for ln in err if "error" in ln.lower()), err[-1] if err else "")
                raise InvalidInputError(
                    f"IREE cannot import {path}: {why.strip()[:300]}; accepted: an ONNX model "
                    "whose ops IREE's ONNX importer converts, or an MLIR file"
                )
        return proc.stdout.decode()
