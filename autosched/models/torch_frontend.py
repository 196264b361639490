"""PyTorch models: a ``file.py:factory`` or a saved ``torch.export`` program (``.pt2``).

Both go through ``torch.export`` and TVM's Relax ``from_exported_program``, with
PyTorch's decompositions (batch-norm is wrong without them) and rewrites of the ops the
frontend lacks (:mod:`autosched.models.torch_decompose`); torch eager is the reference.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import io
import sys
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from autosched.errors import InvalidInputError
from autosched.models.model import InputRange, Model, check_overrides, main_inputs, prepare

FACTORY = (
    "path/to/file.py:factory, where factory() returns (torch.nn.Module, tuple of example tensors)"
)


def load_factory(
    path: Path, factory_name: str, *, inputs: Mapping[str, tuple[int, ...]] | None = None
) -> Model:
    """Import ``factory_name`` from the Python file ``path``, call it and export its module."""
    import torch

    factory = _find_factory(path, factory_name)
    try:
        made = factory()
    except Exception as exc:
        raise InvalidInputError(
            f"{path}:{factory_name}() raised {_first_line(exc)}; accepted: {FACTORY}"
        ) from exc
    if (
        not isinstance(made, tuple | list)
        or len(made) != 2
        or not isinstance(made[0], torch.nn.Module)
        or not isinstance(made[1], tuple | list)
        or not all(isinstance(t, torch.Tensor) for t in made[1])
    ):
        raise InvalidInputError(
            f"{path}:{factory_name}() returned {_describe(made)}; accepted: {FACTORY}"
        )
    module, example = made[0].eval(), tuple(made[1])
    names = _forward_names(module, len(example))
    overrides = dict(inputs or {})
    check_overrides(overrides, names, source=f"{path}:{factory_name}")
    ranges: dict[str, InputRange] = {}
    resized = []
    for name, tensor in zip(names, example):
        if not tensor.dtype.is_floating_point and tensor.numel():
            ranges[name] = InputRange(int(tensor.min()), int(tensor.max()) + 1)
        if name in overrides and tuple(overrides[name]) != tuple(tensor.shape):
            tensor = _resized(tensor, overrides[name], ranges.get(name))
        resized.append(tensor)
    try:
        with torch.no_grad(), _quiet():
            program = torch.export.export(module, tuple(resized))
    except Exception as exc:
        raise InvalidInputError(
            f"torch.export could not export {path}:{factory_name}: {_first_line(exc)}; "
            "accepted: modules torch.export.export takes without graph breaks"
        ) from exc
    return _from_program(
        program, factory_name, reference=module, source=f"{path}:{factory_name}", ranges=ranges
    )


def load_exported(path: Path, *, inputs: Mapping[str, tuple[int, ...]] | None = None) -> Model:
    """Import a program saved with ``torch.export.save``; its input shapes are fixed."""
    import torch

    if not path.is_file():
        raise InvalidInputError(
            f"model file {path} does not exist or is not a file; accepted: a program saved "
            "with torch.export.save (.pt2)"
        )
    try:
        program = torch.export.load(str(path))
    except Exception as exc:
        raise InvalidInputError(
            f"{path} is not a saved torch.export program ({_first_line(exc)}); accepted: a "
            "file written by torch.export.save"
        ) from exc
    placeholders = _user_inputs(program)
    overrides = dict(inputs or {})
    check_overrides(overrides, [name for name, _ in placeholders], source=str(path))
    for name, shape in placeholders:
        if name in overrides and tuple(overrides[name]) != shape:
            raise InvalidInputError(
                f"--input {name}={'x'.join(map(str, overrides[name]))} differs from the "
                f"shape {path} was exported with; accepted: {name}={'x'.join(map(str, shape))}"
                " (export again for other shapes)"
            )
    return _from_program(
        program, path.stem, reference=program.module(), source=str(path), ranges={}
    )


def _decompositions() -> Any:
    """torch.export's default decompositions, with the recurrent layers' own
    (:mod:`autosched.models.torch_recurrent`)."""
    import torch

    from autosched.models.torch_recurrent import decompositions

    table = torch.export.default_decompositions()
    for op, fn in decompositions().items():
        table[op] = fn
    return table


def _from_program(
    program: Any, name: str, *, reference: Any, source: str, ranges: dict[str, InputRange]
) -> Model:
    from tvm.relax.frontend.torch import from_exported_program

    from autosched.models.torch_decompose import rewrite

    with _quiet():
        program = rewrite(program.run_decompositions(_decompositions()))
    _check_ops(program, source)
    try:
        # Decomposed above already (what the default would do again).
        with _quiet():
            mod = from_exported_program(program, run_ep_decomposition=False)
    except Exception as exc:  # the converters raise anything; the user needs one line
        raise InvalidInputError(
            f"TVM's Relax torch frontend could not convert {source}: {_first_line(exc)}"
        ) from exc
    mod = prepare(mod)
    specs = main_inputs(mod)
    user_names = [n for n, _ in _user_inputs(program)]
    relax_ranges = {spec.name: ranges[u] for spec, u in zip(specs, user_names) if u in ranges}
    names = [spec.name for spec in specs]
    return Model(
        name=name,
        framework="torch",
        mod=mod,
        inputs=specs,
        _reference=_TorchEager(reference, names),
        _int_ranges=relax_ranges,
        _runtimes=lambda threads: {
            "onnxruntime": _InOnnxRuntime(reference, names, threads),
            "torch": _TorchEager(reference, names, threads),
        },
    )


class _TorchEager:
    """The module in torch eager mode, without autograd, inputs in the given order (on
    ``threads`` threads where given: torch's setting is per process)."""

    def __init__(self, module: Any, names: list[str], threads: int | None = None) -> None:
        self._module = module
        self._names = names
        self._threads = threads

    def __call__(self, arrays: Mapping[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        import torch
        from torch.utils._pytree import tree_leaves

        if self._threads and torch.get_num_threads() != self._threads:
            torch.set_num_threads(self._threads)
        args = [torch.from_numpy(np.ascontiguousarray(arrays[n])) for n in self._names]
        with torch.no_grad():
            out = self._module(*args)
        return tuple(t.detach().numpy() for t in tree_leaves(out) if isinstance(t, torch.Tensor))


class _InOnnxRuntime:
    """The module exported to ONNX (TorchScript's exporter, opset 17, offline) and run in
    onnxruntime; exported on the first call, with its arrays as the example inputs."""

    def __init__(self, module: Any, names: list[str], threads: int | None) -> None:
        self._module = module
        self._names = names
        self._threads = threads
        self._run: Any = None

    def __call__(self, arrays: Mapping[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        if self._run is None:
            import torch

            from autosched.models.onnx_frontend import _OnnxRuntime

            args = tuple(torch.from_numpy(np.ascontiguousarray(arrays[n])) for n in self._names)
            feed = {n: f"input{i}" for i, n in enumerate(self._names)}
            buffer = io.BytesIO()
            try:
                with _quiet():
                    export_onnx(self._module, args, buffer)
            except Exception as exc:  # the exporter raises anything; one line for the user
                raise InvalidInputError(
                    f"torch.onnx could not export the model for onnxruntime: "
                    f"{_first_line(exc)}; accepted: modules its TorchScript exporter takes"
                ) from exc
            self._run = _OnnxRuntime(buffer.getvalue(), feed, self._threads)
        return self._run(arrays)


def export_onnx(module: Any, example: tuple[Any, ...], target: Any) -> None:
    """Write ``module`` as ONNX to ``target`` (a path or a binary file) with TorchScript's
    exporter (opset 17).

    torch 2.13's default (dynamo) exporter needs onnxscript, which the ``models`` extra
    does not bring; the TorchScript one works offline. Inputs are named ``input0``, ...,
    outputs ``output0``, ...; eval-mode batch-norm after a convolution is folded by it.
    PyTorch's fused fast path of ``nn.TransformerEncoderLayer`` and ``nn.MultiheadAttention``
    (``aten::_transformer_encoder_layer_fwd``, taken in eval mode) has no ONNX form, so it
    is turned off while exporting: the layers export as the ops they compute.
    """
    import torch

    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.no_grad():
            outputs = module(*example)
            count = len(outputs) if isinstance(outputs, tuple | list) else 1
            torch.onnx.export(
                module, example, target, dynamo=False, opset_version=17,
                input_names=[f"input{i}" for i in range(len(example))],
                output_names=[f"output{i}" for i in range(count)],
            )  # fmt: skip
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)


def _check_ops(program: Any, source: str) -> None:
    """Name the first ATen op TVM's Relax torch frontend has no converter for."""
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

    converters = ExportedProgramImporter().convert_map
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        op = getattr(node.target, "__name__", str(node.target))
        if op not in converters:
            stack = node.meta.get("nn_module_stack") or {}
            where = f" in module {list(stack.values())[-1][0]!r}" if stack else ""
            raise InvalidInputError(
                f"unsupported torch op {op} at node {node.name!r}{where} ({source}); accepted: "
                f"the {len(converters)} ATen ops TVM's Relax torch frontend converts"
            )


def _user_inputs(program: Any) -> list[tuple[str, tuple[int, ...]]]:
    from torch.export.graph_signature import InputKind

    user = {
        spec.arg.name
        for spec in program.graph_signature.input_specs
        if spec.kind == InputKind.USER_INPUT
    }
    found = []
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in user:
            val = node.meta.get("val")
            shape = tuple(int(d) if str(d).isdigit() else -1 for d in getattr(val, "shape", ()))
            found.append((node.name, shape))
    return found


def _find_factory(path: Path, factory_name: str) -> Any:
    if not path.is_file() or path.suffix != ".py":
        raise InvalidInputError(
            f"factory file {path} does not exist or is not a .py file; accepted: {FACTORY}"
        )
    module_name = f"autosched_models_user_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise InvalidInputError(f"cannot import {path} as Python; accepted: {FACTORY}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up here
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise InvalidInputError(f"importing {path} raised {_first_line(exc)}") from exc
    factory = getattr(module, factory_name, None)
    if factory is None:
        defined = sorted(
            n for n, v in vars(module).items()
            if inspect.isfunction(v) and v.__module__ == module_name and not n.startswith("_")
        )  # fmt: skip
        raise InvalidInputError(
            f"{path} has no factory {factory_name!r}; accepted: the functions it defines "
            f"({', '.join(defined) or 'none'})"
        )
    if not callable(factory):
        raise InvalidInputError(
            f"{path}:{factory_name} is a {type(factory).__name__}, not callable; accepted: {FACTORY}"
        )
    return factory


def _forward_names(module: Any, count: int) -> list[str]:
    """The names of forward's first ``count`` parameters, as torch.export names inputs."""
    try:
        params = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        params = []
    names = params[:count] if len(params) >= count else []
    return names or [f"arg{i}" for i in range(count)]


def _resized(tensor: Any, shape: tuple[int, ...], span: InputRange | None) -> Any:
    import torch

    # Only traced, never computed with: any values of the right shape and dtype do.
    gen = torch.Generator().manual_seed(0)
    if tensor.dtype.is_floating_point:
        return torch.randn(shape, dtype=tensor.dtype, generator=gen)
    span = span or InputRange()
    return torch.randint(span.low, span.high, shape, dtype=tensor.dtype, generator=gen)


def _describe(value: Any) -> str:
    if isinstance(value, tuple | list):
        return f"a {type(value).__name__} of ({', '.join(type(v).__name__ for v in value)})"
    return f"a {type(value).__name__}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """torch's notes about its own internals (FutureWarnings such as pytree's
    ``LeafSpec``, the ONNX exporter's DeprecationWarning) while exporting: nothing a user
    of a model can act on."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        yield
