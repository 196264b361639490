"""A compiled kernel: the built program, where its config came from, and a runner.

The manifest (:meth:`CompiledKernel.manifest`) carries everything another runtime needs
to launch the program without autosched. OpenCL: the source file and its kernels in
launch order, each with its arguments in kernel-argument order (name, shape, dtype,
role) and its global and local sizes. llvm: a shared library built by TVM for the host
CPU and the one function to call, with its arguments in order.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from autosched.compiler.arguments import bind, check_out, describe
from autosched.errors import DeviceError, InvalidInputError
from autosched.measure.device import Device
from autosched.measure.program import KernelProgram
from autosched.ops.base import TensorSpec, Workload
from autosched.records.record import Record
from autosched.space.config import Config

if TYPE_CHECKING:
    from autosched.measure.cpu import HostCPU
    from autosched.measure.program import CpuProgram, Program

MANIFEST_VERSION = 1
MANIFEST_FILE = "manifest.json"
# The program's file, by program kind (``Program.kind``).
PROGRAM_FILES = {"opencl": "kernel.cl", "llvm": "kernel.so"}


class CompiledKernel:
    """A workload compiled for one device, called like a function on numpy arrays.

        >>> wl = autosched.workload("matmul", M=64, N=64, K=64)
        >>> kernel = autosched.compile(wl)     # doctest: +SKIP
        >>> c = kernel(a, b)                   # doctest: +SKIP
        >>> kernel(a, B=b, out=c)              # doctest: +SKIP

    Made by :func:`autosched.compiler.compile`; attributes are read-only by convention.

    Attributes:
        workload: what it computes.
        target: the code generation target (``"opencl"`` or ``"llvm"``).
        device: the device it was compiled for.
        config: the schedule config it was built with.
        program: the built program. OpenCL: a ``KernelProgram`` (source, kernels in
            launch order with their arguments and global/local sizes, argument tensors);
            llvm: a ``CpuProgram`` (shared library, entry function, argument tensors).
        provenance: ``"exact"``, ``"driver_mismatch"``, ``"nearest_shape"`` or ``"untuned"``.
        record: the record the config came from (another workload's when
            ``nearest_shape``), or None when untuned.
        database: where ``record`` was found: a database path, or ``"shipped"``.
    """

    def __init__(
        self,
        *,
        workload: Workload,
        target: str,
        device: Device | HostCPU,
        config: Config,
        program: Program,
        provenance: str,
        record: Record | None = None,
        database: str = "",
    ) -> None:
        self.workload = workload
        self.target = target
        self.device = device
        self.config = config
        self.program = program
        self.provenance = provenance
        self.record = record
        self.database = database
        self._lock = threading.Lock()
        self._executor: _OpenCLExecutor | _CpuExecutor | None = None

    @property
    def source(self) -> str | None:
        """The OpenCL C source of every kernel; None for llvm (see ``program.library``)."""
        return self.program.source if isinstance(self.program, KernelProgram) else None

    def __repr__(self) -> str:
        rec = f"record {self.record.id}" if self.record is not None else "no record"
        return (
            f"CompiledKernel({self.workload}, {self.target}, {self.device.name!r}, "
            f"{self.provenance}, {rec})"
        )

    # -- running ----------------------------------------------------------------------------
    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        """The inputs in call order (name, shape, dtype): the workload's, e.g. ``A, B``."""
        return tuple(s for s in self.program.tensors if s.role == "input")

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        """The outputs in return order (name, shape, dtype)."""
        return tuple(s for s in self.program.tensors if s.role == "output")

    def __call__(
        self,
        *args: np.ndarray,
        out: np.ndarray | Sequence[np.ndarray] | None = None,
        **kwargs: np.ndarray,
    ) -> np.ndarray | tuple[np.ndarray, ...]:
        """Run on the device: ``kernel(a, b)``, ``kernel(A=a, B=b)`` or ``kernel(a, B=b)``.

        Inputs are bound as a Python function binds its arguments: by position in the
        order of :attr:`inputs`, or by name. Each is an array of the input's shape whose
        dtype casts to the input's (``same_kind``: float64 to float32 is accepted).

        Args:
            out: where to write the output: an array of the output's exact shape and
                dtype, C-contiguous and writeable (a tuple of them, in the order of
                :attr:`outputs`, when there are several).

        Returns:
            The output: a new array, or the ``out`` array itself; a tuple (in the order
            of :attr:`outputs`) when the workload has several outputs.

        Raises:
            InvalidInputError: too many positional arguments, an unknown name, an input
                given twice or missing, a wrong shape or dtype, or an unusable ``out``;
                the message lists the accepted inputs with their shapes and dtypes.
            DeviceError: the device cannot be opened or the program cannot be loaded.
        """
        arrays = bind(self.inputs, args, kwargs, what=str(self.workload))
        dest = None if out is None else check_out(self.outputs, out, what=str(self.workload))
        results = self._execute(arrays, dest)  # ``dest``'s arrays themselves when given
        values = tuple(results[s.name] for s in self.outputs)
        return values[0] if len(values) == 1 else values

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run with ``inputs`` by name; return the outputs by name.

        For code that handles any workload by name (``Workload.make_inputs`` and
        ``Workload.reference`` use the same names). Same checks and errors as calling
        the kernel with keyword arguments.
        """
        if not isinstance(inputs, Mapping):
            raise InvalidInputError(
                f"run() takes the inputs of {self.workload} as a mapping of name to array, "
                f"got {type(inputs).__name__}; accepted: {describe(self.inputs)}"
            )
        return self._execute(bind(self.inputs, (), inputs, what=str(self.workload)), None)

    def _execute(
        self, arrays: dict[str, np.ndarray], out: dict[str, np.ndarray] | None
    ) -> dict[str, np.ndarray]:
        """Run the program in this process (OpenCL through pyopencl, llvm through TVM's
        runtime), loading it on the first call; write the outputs into ``out`` (by name)
        or new arrays, and return them by name."""
        if out is None:
            out = {s.name: np.empty(s.shape, dtype=s.dtype) for s in self.outputs}
        with self._lock:  # kernel arguments are state of the shared kernel objects
            if self._executor is None:
                if isinstance(self.program, KernelProgram):
                    self._executor = _OpenCLExecutor(self.program, self.device)
                else:
                    self.device.use_in_this_process()  # the threads it was measured on
                    self._executor = _CpuExecutor(self.program)
            self._executor.run(arrays, out)
        return out

    # -- manifest -----------------------------------------------------------------------------
    @property
    def program_file(self) -> str:
        """Name of the program's file in :meth:`save`'s directory."""
        return PROGRAM_FILES["opencl" if isinstance(self.program, KernelProgram) else "llvm"]

    def manifest(self) -> dict[str, Any]:
        """Everything needed to launch the program elsewhere, and where its config came from.

        Keys: ``format_version``; ``workload`` and ``workload_key``; ``target``;
        ``device`` (fingerprint), ``device_key`` and ``device_family``; ``source`` (the
        program file's name: ``kernel.cl`` for OpenCL, ``kernel.so`` for llvm);
        ``tensors`` (every buffer: name, shape, dtype, role input/output/scratch);
        ``kernels`` in launch order, each with ``name`` and ``args`` (tensors in
        argument order) and, for OpenCL, ``global_size`` and ``local_size`` (dimension 0
        first; global = work-groups x local); for llvm the one kernel is the library's
        function, and ``tvm_target`` says what it was compiled for; ``config``;
        ``provenance``; ``record``: id, database, the workload it was measured on, device
        key, config, GFLOP/s, latency (s), spread, timestamp; None when untuned.
        """
        tensors = self.program.tensors
        if isinstance(self.program, KernelProgram):
            kernels = [
                {
                    "name": k.name,
                    "args": [_tensor_json(tensors[i]) for i in k.args],
                    "global_size": list(k.global_size),
                    "local_size": list(k.local_size),
                }
                for k in self.program.kernels
            ]
            extra: dict[str, Any] = {}
        else:
            kernels = [{"name": self.program.entry, "args": [_tensor_json(t) for t in tensors]}]
            extra = {"tvm_target": dict(self.program.target)}
        record = None
        if self.record is not None:
            r = self.record
            record = {
                "id": r.id,
                "database": self.database,
                "workload": r.workload,
                "workload_key": r.workload_key,
                "device_key": r.device_key,
                "config": r.config,
                "gflops": r.gflops,
                "latency_s": r.latency_s,
                "spread": r.spread,
                "timestamp": r.timestamp,
            }
        return {
            "format_version": MANIFEST_VERSION,
            "workload": self.workload.to_json(),
            "workload_key": self.workload.key,
            "target": self.target,
            "device": self.device.fingerprint(self.target),
            "device_key": self.device.key(self.target),
            "device_family": self.device.family(self.target),
            "source": self.program_file,
            "tensors": [_tensor_json(t) for t in tensors],
            "kernels": kernels,
            **extra,
            "config": self.config.to_json(),
            "provenance": self.provenance,
            "record": record,
        }

    def save(self, directory: str | os.PathLike[str]) -> list[Path]:
        """Write the program file and ``manifest.json`` into ``directory`` (created if needed).

        Returns:
            The paths written.

        Raises:
            InvalidInputError: the directory cannot be created or written.
        """
        out = Path(directory).expanduser()
        if out.exists() and not out.is_dir():
            raise InvalidInputError(f"output {out} is a file; accepted: a directory")
        program_path, manifest_path = out / self.program_file, out / MANIFEST_FILE
        try:
            out.mkdir(parents=True, exist_ok=True)
            if isinstance(self.program, KernelProgram):
                program_path.write_text(self.program.source, encoding="utf-8")
            else:
                program_path.write_bytes(self.program.library)
            text = json.dumps(self.manifest(), indent=2, sort_keys=True) + "\n"
            manifest_path.write_text(text, encoding="utf-8")
        except OSError as exc:
            reason = (exc.strerror or str(exc)).lower()
            raise InvalidInputError(
                f"cannot write into output directory {out}: {reason}; accepted: a writable path"
            ) from None
        return [program_path, manifest_path]


def _tensor_json(spec: TensorSpec) -> dict[str, Any]:
    return {"name": spec.name, "shape": list(spec.shape), "dtype": spec.dtype, "role": spec.role}


class _OpenCLExecutor:
    """An OpenCL context, queue and kernel objects for one program, made once."""

    def __init__(self, program: KernelProgram, device: Device) -> None:
        import pyopencl as cl

        self.cl = cl
        self.program = program
        try:
            platform = cl.get_platforms()[device.platform_index]
            self.ctx = cl.Context([platform.get_devices()[device.device_index]])
            self.queue = cl.CommandQueue(self.ctx)
        except Exception as exc:
            raise DeviceError(f"cannot open OpenCL device {device.name}: {exc}") from None
        try:
            built = cl.Program(self.ctx, program.source).build()
        except Exception as exc:
            first = " | ".join(ln for ln in str(exc).splitlines()[:6] if ln.strip())
            raise DeviceError(
                f"the OpenCL compiler of {device.name} rejected the kernel: {first}"
            ) from None
        # Kernel objects are reused: PoCL compiles again for each new kernel object and
        # local size at its first launch.
        self.kernels = [cl.Kernel(built, k.name) for k in program.kernels]

    def run(self, arrays: dict[str, np.ndarray], out: dict[str, np.ndarray]) -> None:
        """Launch with ``arrays`` (inputs by name); copy the outputs into ``out``."""
        cl = self.cl
        mf = cl.mem_flags
        bufs, outputs = [], []
        for spec in self.program.tensors:
            if spec.role == "input":
                buf = cl.Buffer(
                    self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=arrays[spec.name]
                )
            else:  # outputs and scratch: every element is written by a kernel
                buf = cl.Buffer(self.ctx, mf.READ_WRITE, size=max(spec.nbytes, 1))
                if spec.role == "output":
                    outputs.append((out[spec.name], buf))
            bufs.append(buf)
        for kern, launch in zip(self.kernels, self.program.kernels):
            kern.set_args(*(bufs[i] for i in launch.args))
            cl.enqueue_nd_range_kernel(self.queue, kern, launch.global_size, launch.local_size)
        for host, buf in outputs:
            cl.enqueue_copy(self.queue, host, buf)  # blocking; the queue runs in order


class _CpuExecutor:
    """A TVM runtime module loaded from an llvm program's shared library, made once."""

    def __init__(self, program: CpuProgram) -> None:
        import tvm

        self.tvm = tvm
        self.program = program
        self.dev = tvm.cpu(0)
        with tempfile.TemporaryDirectory(prefix="autosched-kernel-") as tmp:
            path = Path(tmp) / PROGRAM_FILES["llvm"]
            path.write_bytes(program.library)
            try:
                # Loaded: the mapping outlives the file.
                self.module = tvm.runtime.load_module(str(path))
                self.func = self.module[program.entry]
            except Exception as exc:
                raise DeviceError(f"cannot load the kernel library: {exc}") from None

    def run(self, arrays: dict[str, np.ndarray], out: dict[str, np.ndarray]) -> None:
        """Call the library's function with ``arrays`` (inputs by name); copy the outputs
        into ``out``."""
        tensor = self.tvm.runtime.tensor
        args, outputs = [], []
        for spec in self.program.tensors:
            if spec.role == "input":
                args.append(tensor(arrays[spec.name], self.dev))
                continue
            buf = self.tvm.runtime.empty(spec.shape, spec.dtype, self.dev)
            args.append(buf)
            if spec.role == "output":
                outputs.append((out[spec.name], buf))
        self.func(*args)
        for host, buf in outputs:
            # TVM wraps only 64-byte aligned memory: copy rather than write into ``host``.
            np.copyto(host, buf.numpy())
