"""Model frontends: ONNX files and PyTorch models imported as Relax modules with weights.

>>> from autosched.models import load_model
>>> model = load_model("resnet.onnx", inputs={"input": (1, 3, 224, 224)})  # doctest: +SKIP
>>> arrays = model.example_inputs(np.random.default_rng(0))               # doctest: +SKIP
>>> expected = model.reference(arrays)  # onnxruntime / torch eager        # doctest: +SKIP

``model.mod`` is what task extraction takes (``relax.get_pipeline("zero")``-style
legalisation and fusion happen downstream, in :mod:`autosched.tvm`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from autosched.errors import InvalidInputError
from autosched.models.model import Model, count_ops, parse_input_shape

__all__ = ["Model", "count_ops", "load_model", "parse_input_shape"]

ACCEPTED = (
    "an ONNX file (.onnx), a program saved with torch.export.save (.pt2), or "
    "path/to/file.py:factory (factory() returns the module and a tuple of example inputs)"
)


def load_model(source: str, *, inputs: Mapping[str, tuple[int, ...]] | None = None) -> Model:
    """Import a model as a Relax module with its weights bound as constants.

    Args:
        source: a ``.onnx`` file, a ``.pt2`` saved ``torch.export`` program, or
            ``path/to/file.py:factory`` with ``factory()`` returning
            ``(torch.nn.Module, tuple of example tensors)``.
        inputs: shapes by input name; needed for ONNX inputs with symbolic dimensions,
            and resizes a factory's example inputs.

    Raises:
        InvalidInputError: the source is missing, unreadable or of an unknown kind, the
            factory is missing or returns something else, an input shape is missing or
            unknown, or an op is one TVM's Relax frontends do not convert (named with
            its node).
    """
    text = str(source).strip()
    head, sep, tail = text.rpartition(":")
    if sep and head.endswith(".py"):
        from autosched.models.torch_frontend import load_factory

        if not tail.isidentifier():
            raise InvalidInputError(
                f"model source {text!r} names factory {tail!r}, not a Python name; accepted: {ACCEPTED}"
            )
        return load_factory(Path(head), tail, inputs=inputs)
    path = Path(text)
    if path.suffix == ".onnx":
        from autosched.models.onnx_frontend import load_onnx

        return load_onnx(path, inputs=inputs)
    if path.suffix == ".pt2":
        from autosched.models.torch_frontend import load_exported

        return load_exported(path, inputs=inputs)
    if path.suffix == ".py":
        raise InvalidInputError(
            f"model source {text!r} names no factory; accepted: {text}:FACTORY (a function in it)"
        )
    raise InvalidInputError(f"model source {text!r} is not a model; accepted: {ACCEPTED}")
