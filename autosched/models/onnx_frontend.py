"""ONNX files: checked against TVM's Relax ONNX frontend, imported, referenced by onnxruntime."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from autosched.errors import InvalidInputError
from autosched.models.model import Model, check_overrides, main_inputs, prepare
from autosched.models.onnx_recurrent import unroll_recurrent

ACCEPTED = "an ONNX model file (.onnx) as onnx.save or torch.onnx.export write it"


def load_onnx(path: Path, *, inputs: Mapping[str, tuple[int, ...]] | None = None) -> Model:
    """Import the ONNX model at ``path``; ``inputs`` sets the shapes of named inputs."""
    original = _read(path)
    graph = original.graph
    initialised = {init.name for init in graph.initializer}
    graph_inputs = [value for value in graph.input if value.name not in initialised]
    overrides = dict(inputs or {})
    check_overrides(overrides, [v.name for v in graph_inputs], source=str(path))
    shapes: dict[str, list[int]] = {}
    dtypes: dict[str, str] = {}
    for value in graph_inputs:
        shapes[value.name] = list(overrides.get(value.name) or _static_shape(value, path))
        dtypes[value.name] = _dtype(value, path)

    from tvm.relax.frontend.onnx import from_onnx

    proto = unroll_recurrent(original, shapes, source=str(path))
    _check_ops(proto.graph, path)
    try:
        mod = from_onnx(proto, shape_dict=shapes, dtype_dict=dtypes)
    except InvalidInputError:
        raise
    except Exception as exc:  # the converters raise anything; the user needs one line
        raise InvalidInputError(
            f"TVM's Relax ONNX frontend could not convert {path}: {_first_line(exc)}"
        ) from exc
    mod = prepare(mod)
    specs = main_inputs(mod)
    # The frontend may rename inputs into valid identifiers; its parameters keep the
    # graph's order, so the onnxruntime feed maps by position.
    feed_names = {spec.name: value.name for spec, value in zip(specs, graph_inputs)}
    model_bytes = original.SerializeToString()  # onnxruntime runs the file as it is
    return Model(
        name=path.stem,
        framework="onnx",
        mod=mod,
        inputs=specs,
        _reference=_OnnxRuntime(model_bytes, feed_names),
        _runtimes=lambda threads: {"onnxruntime": _OnnxRuntime(model_bytes, feed_names, threads)},
    )


class _OnnxRuntime:
    """onnxruntime on the host CPU (on ``threads`` intra-op threads where given), the
    session made on first use."""

    def __init__(
        self, model_bytes: bytes, feed_names: dict[str, str], threads: int | None = None
    ) -> None:
        self._bytes = model_bytes
        self._feed_names = feed_names
        self._threads = threads
        self._session: Any = None

    def __call__(self, arrays: Mapping[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        import onnxruntime as ort

        if self._session is None:
            options = ort.SessionOptions()
            if self._threads:
                options.intra_op_num_threads = self._threads
                options.inter_op_num_threads = 1
            self._session = ort.InferenceSession(
                self._bytes, options, providers=["CPUExecutionProvider"]
            )
        feed = {self._feed_names[name]: np.asarray(a) for name, a in arrays.items()}
        return tuple(np.asarray(out) for out in self._session.run(None, feed))


def _read(path: Path) -> Any:
    import onnx

    if not path.is_file():
        raise InvalidInputError(
            f"model file {path} does not exist or is not a file; accepted: {ACCEPTED}"
        )
    try:
        proto = onnx.load(str(path))
    except Exception as exc:  # protobuf's DecodeError and friends
        raise InvalidInputError(
            f"{path} is not an ONNX model ({_first_line(exc)}); accepted: {ACCEPTED}"
        ) from exc
    if not proto.graph.node:
        raise InvalidInputError(
            f"{path} is not an ONNX model (its graph has no node); accepted: {ACCEPTED}"
        )
    return proto


def _check_ops(graph: Any, path: Path) -> None:
    """Name the first node whose op TVM's Relax ONNX frontend has no converter for."""
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    converters = set(_get_convert_map()) | {"If", "Constant"}  # handled outside the map
    for index, node in enumerate(graph.node):
        if node.domain not in ("", "ai.onnx") or node.op_type not in converters:
            op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
            where = node.name or f"#{index}"
            raise InvalidInputError(
                f"unsupported ONNX op {op} at node {where!r} ({path}); accepted: the "
                f"{len(converters)} ops TVM's Relax ONNX frontend converts (Conv, Gemm, "
                "MatMul, Softmax, LayerNormalization, ...)"
            )


def _static_shape(value: Any, path: Path) -> tuple[int, ...]:
    dims = value.type.tensor_type.shape.dim
    shape = []
    for dim in dims:
        if dim.HasField("dim_value") and dim.dim_value > 0:
            shape.append(int(dim.dim_value))
        else:
            example = "x".join(str(d.dim_value) if d.dim_value > 0 else "N" for d in dims)
            raise InvalidInputError(
                f"ONNX input {value.name!r} of {path} has a symbolic dimension "
                f"{dim.dim_param or '?'!r}; give its shape with --input {value.name}={example}"
            )
    return tuple(shape)


def _dtype(value: Any, path: Path) -> str:
    import onnx

    elem = value.type.tensor_type.elem_type
    try:
        return str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)))
    except Exception as exc:
        raise InvalidInputError(
            f"ONNX input {value.name!r} of {path} has element type {elem}; "
            "accepted: tensors of a numpy dtype (float32, int64, ...)"
        ) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
