"""ONNX recurrent layers (LSTM, GRU, RNN) written as the ops they are made of.

TVM 0.27's Relax ONNX frontend has no converter for ONNX's recurrent ops, and every
``torch.nn.LSTM``, ``GRU`` or ``RNN`` that ``torch.onnx.export`` writes is one of them.
With static shapes a recurrent layer is its steps, unrolled: one MatMul of the whole
input sequence by the input weights (all steps and gates at once), then per step a
MatMul of the hidden state by the recurrence weights, the gates' slices and
activations, as the ONNX operator specification defines them (gate order i, o, f, c
for LSTM and z, r, h for GRU; peepholes, ``clip``, ``linear_before_reset``,
``input_forget``, both layouts, forward, reverse and bidirectional). The per-step
arithmetic is then tasks like any other (a model's steps share their shapes, so their
tasks are one per kind).

Weights must be constants (initializers or Constant nodes), as exporters write them;
``sequence_lens``, where given, must be a constant that covers every step (padded
batches of shorter sequences are refused in one line). onnxruntime, the reference,
runs the original file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from autosched.errors import InvalidInputError

RECURRENT = {"LSTM": 4, "GRU": 3, "RNN": 1}  # op -> gates
DEFAULT_ACTIVATIONS = {
    "LSTM": ("Sigmoid", "Tanh", "Tanh"),
    "GRU": ("Sigmoid", "Tanh"),
    "RNN": ("Tanh",),
}
# Activation -> (ONNX op, its attributes from alpha and beta); "Affine" and
# "ScaledTanh" are arithmetic (below).
_ACTIVATION_OPS = {
    "Sigmoid": ("Sigmoid", ()),
    "Tanh": ("Tanh", ()),
    "Relu": ("Relu", ()),
    "Softsign": ("Softsign", ()),
    "Softplus": ("Softplus", ()),
    "LeakyRelu": ("LeakyRelu", ("alpha",)),
    "ThresholdedRelu": ("ThresholdedRelu", ("alpha",)),
    "Elu": ("Elu", ("alpha",)),
    "HardSigmoid": ("HardSigmoid", ("alpha", "beta")),
    "Affine": (None, ("alpha", "beta")),
    "ScaledTanh": (None, ("alpha", "beta")),
}


def has_recurrent(graph: Any) -> bool:
    return any(n.op_type in RECURRENT and n.domain in ("", "ai.onnx") for n in graph.node)


def unroll_recurrent(proto: Any, shapes: Mapping[str, Sequence[int]], *, source: str) -> Any:
    """A copy of ``proto`` whose LSTM, GRU and RNN nodes are unrolled into standard ops,
    its inputs' dimensions set to ``shapes`` (their static shapes; ``source`` names the
    file in errors); ``proto`` itself, unchanged, where it has no such node."""
    import onnx

    if not has_recurrent(proto.graph):
        return proto
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    graph = model.graph
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if opset < 10:
        raise InvalidInputError(
            f"{source} has recurrent layers at ONNX opset {opset}; accepted: opset 10 or "
            "later (its Slice reads its bounds as inputs)"
        )
    known = _inferred_shapes(model, shapes)
    constants = {init.name: onnx.numpy_helper.to_array(init) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            value = next((a for a in node.attribute if a.name == "value"), None)
            if value is not None:
                constants[node.output[0]] = onnx.numpy_helper.to_array(value.t)
    nodes = []
    for index, node in enumerate(graph.node):
        if node.op_type in RECURRENT and node.domain in ("", "ai.onnx"):
            where = f"{node.op_type} node {node.name or f'#{index}'!r} of {source}"
            layer = _Layer(node, where, known, constants, prefix=f"unrolled{index}_", opset=opset)
            nodes.extend(layer.nodes())
            graph.initializer.extend(layer.initializers)
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def _inferred_shapes(model: Any, shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple]:
    """Every value's shape that ONNX's shape inference finds with the inputs' shapes set
    in ``model`` (a dimension it cannot tell is None)."""
    import onnx

    for value in model.graph.input:
        if value.name in shapes:
            dims = value.type.tensor_type.shape.dim
            del dims[:]
            for d in shapes[value.name]:
                dims.add().dim_value = int(d)
    try:
        probe = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001 - what it cannot infer is reported where needed
        probe = model
    out: dict[str, tuple] = {}
    g = probe.graph
    for value in [*g.input, *g.value_info, *g.output]:
        t = value.type.tensor_type
        if t.HasField("shape"):
            out[value.name] = tuple(d.dim_value if d.dim_value > 0 else None for d in t.shape.dim)
    for init in g.initializer:
        out[init.name] = tuple(init.dims)
    return out


class _Layer:
    """One recurrent node and the nodes that replace it."""

    def __init__(
        self,
        node: Any,
        where: str,
        known: Mapping[str, tuple],
        constants: Mapping[str, np.ndarray],
        *,
        prefix: str,
        opset: int,
    ) -> None:
        from onnx import helper

        self.op = node.op_type
        self.where = where
        self.prefix = prefix
        self.opset = opset
        self.out: list[Any] = []
        self.initializers: list[Any] = []
        self._count = 0
        self._small: dict[tuple, str] = {}
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        self.hidden = int(attrs.get("hidden_size", 0))
        direction = attrs.get("direction", b"forward")
        direction = direction.decode() if isinstance(direction, bytes) else str(direction)
        if direction not in ("forward", "reverse", "bidirectional"):
            raise self.error(f"direction {direction!r}", "forward, reverse, bidirectional")
        self.directions = ["forward", "reverse"] if direction == "bidirectional" else [direction]
        self.layout = int(attrs.get("layout", 0))
        self.clip = attrs.get("clip")
        self.linear_before_reset = int(attrs.get("linear_before_reset", 0))
        self.input_forget = int(attrs.get("input_forget", 0))
        self.activations = self._activations(attrs)
        inputs = list(node.input) + [""] * (8 - len(node.input))
        self.x = inputs[0]
        self.w = self._constant(inputs[1], "W", constants)
        self.r = self._constant(inputs[2], "R", constants)
        gates = RECURRENT[self.op]
        if self.hidden <= 0:
            self.hidden = self.r.shape[-1]
        size = gates * self.hidden
        n_dir = len(self.directions)
        if self.w.shape[:2] != (n_dir, size) or self.r.shape != (n_dir, size, self.hidden):
            raise self.error(
                f"weights W {list(self.w.shape)} and R {list(self.r.shape)}",
                f"W [{n_dir}, {size}, input] and R [{n_dir}, {size}, {self.hidden}]",
            )
        self.b = (
            self._constant(inputs[3], "B", constants)
            if inputs[3]
            else np.zeros((n_dir, 2 * size), dtype=self.w.dtype)
        )
        x_shape = known.get(self.x)
        if not x_shape or len(x_shape) != 3 or None in x_shape:
            raise self.error(
                f"input X of shape {_shape_text(x_shape)} not known statically",
                "a 3-D input whose shape follows from the model inputs' (give them with "
                "--input NAME=DIMS)",
            )
        self.steps, self.batch = (x_shape[1], x_shape[0]) if self.layout else x_shape[:2]
        if inputs[4]:
            lens = self._constant(inputs[4], "sequence_lens", constants)
            if lens.shape != (self.batch,) or not np.all(lens == self.steps):
                raise self.error(
                    f"sequence_lens {lens.tolist()} (sequences shorter than the input)",
                    f"none, or {self.steps} for every sequence of the batch",
                )
        self.initial_h, self.initial_c = inputs[5], inputs[6]
        self.p = self._constant(inputs[7], "P", constants) if inputs[7] else None
        self.outputs = list(node.output) + [""] * (3 - len(node.output))

    def error(self, what: str, accepted: str) -> InvalidInputError:
        return InvalidInputError(f"{self.where}: {what}; accepted: {accepted}")

    def _activations(self, attrs: dict[str, Any]) -> list[tuple[str, float | None, float | None]]:
        names = [
            a.decode() if isinstance(a, bytes) else str(a) for a in attrs.get("activations", [])
        ]
        per = len(DEFAULT_ACTIVATIONS[self.op])
        if not names:
            names = list(DEFAULT_ACTIVATIONS[self.op]) * len(self.directions)
        if len(names) != per * len(self.directions):
            raise self.error(
                f"{len(names)} activations", f"{per} per direction ({per * len(self.directions)})"
            )
        alphas = list(attrs.get("activation_alpha", []))
        betas = list(attrs.get("activation_beta", []))
        out = []
        for name in names:
            if name not in _ACTIVATION_OPS:
                raise self.error(f"activation {name!r}", ", ".join(_ACTIVATION_OPS))
            takes = _ACTIVATION_OPS[name][1]
            alpha = alphas.pop(0) if "alpha" in takes and alphas else None
            beta = betas.pop(0) if "beta" in takes and betas else None
            out.append((name, alpha, beta))
        return out

    def _constant(self, name: str, what: str, constants: Mapping[str, np.ndarray]) -> np.ndarray:
        if name not in constants:
            raise self.error(
                f"{what} {name!r} computed in the graph",
                f"{what} as an initializer or a Constant node, as exporters write it",
            )
        return np.asarray(constants[name])

    # -- emitting ------------------------------------------------------------------

    def _name(self, hint: str) -> str:
        self._count += 1
        return f"{self.prefix}{hint}{self._count}"

    def _const(self, array: np.ndarray, hint: str) -> str:
        """An initializer holding ``array`` (small ones shared by value)."""
        from onnx import numpy_helper

        array = np.asarray(array)
        small = array.size <= 4
        key = (array.dtype.str, array.shape, array.tobytes()) if small else None
        if key in self._small:
            return self._small[key]
        name = self._name(hint)
        if small:
            self._small[key] = name
        self.initializers.append(numpy_helper.from_array(array.copy(order="C"), name))
        return name

    def _emit(self, op: str, inputs: Sequence[str], output: str | None = None, **attrs: Any) -> str:
        from onnx import helper

        output = output or self._name(op.lower())
        self.out.append(helper.make_node(op, list(inputs), [output], name=output, **attrs))
        return output

    def _act(self, value: str, activation: tuple[str, float | None, float | None]) -> str:
        name, alpha, beta = activation
        op, takes = _ACTIVATION_OPS[name]
        if name == "Affine":  # alpha * x + beta
            scaled = self._emit("Mul", [value, self._scalar(1.0 if alpha is None else alpha)])
            return self._emit("Add", [scaled, self._scalar(0.0 if beta is None else beta)])
        if name == "ScaledTanh":  # alpha * tanh(beta * x)
            inner = self._emit("Mul", [value, self._scalar(1.0 if beta is None else beta)])
            tanh = self._emit("Tanh", [inner])
            return self._emit("Mul", [tanh, self._scalar(1.0 if alpha is None else alpha)])
        attrs = {
            k: v for k, v in (("alpha", alpha), ("beta", beta)) if k in takes and v is not None
        }
        return self._emit(op, [value], **attrs)

    def _scalar(self, value: float) -> str:
        return self._const(np.array(value, dtype=self.w.dtype), "scalar")

    def _pre(self, value: str) -> str:
        """A gate's input before its activation, clipped where the node says."""
        if self.clip is None:
            return value
        low = self._emit("Max", [value, self._scalar(-self.clip)])
        return self._emit("Min", [low, self._scalar(self.clip)])

    def nodes(self) -> list[Any]:
        x = self.x
        if self.layout:
            x = self._emit("Transpose", [x], perm=[1, 0, 2])
        h_all, c_all = self._states(self.initial_h), self._states(self.initial_c)
        ys, hs, cs = [], [], []
        for d, direction in enumerate(self.directions):
            y, h, c = self._direction(x, d, direction, h_all, c_all)
            ys.append(y)
            hs.append(h)
            if c is not None:
                cs.append(c)
        self._finish(ys, hs, cs)
        return self.out

    def _states(self, name: str) -> str | None:
        """An initial state [num_dir, batch, hidden] (None where not given)."""
        if not name:
            return None
        return self._emit("Transpose", [name], perm=[1, 0, 2]) if self.layout else name

    def _initial(self, states: str | None, d: int) -> str:
        if states is None:
            shape = (1, self.batch, self.hidden)
            return self._const(np.zeros(shape, dtype=self.w.dtype), "zeros")
        start, end = self._const(np.array([d]), "start"), self._const(np.array([d + 1]), "end")
        return self._emit("Slice", [states, start, end, self._const(np.array([0]), "axis")])

    def _direction(
        self, x: str, d: int, direction: str, h_all: str | None, c_all: str | None
    ) -> tuple[str, str, str | None]:
        gates = RECURRENT[self.op]
        size = gates * self.hidden
        acts = self.activations[d * len(DEFAULT_ACTIVATIONS[self.op]) :][
            : len(DEFAULT_ACTIVATIONS[self.op])
        ]
        wb, rb = self.b[d, :size], self.b[d, size:]
        # Every step's input projection at once: [steps, batch, gates * hidden].
        x_bias = wb + rb
        if self.op == "GRU" and self.linear_before_reset:
            # The h gate's recurrence bias goes inside the reset product.
            x_bias = np.concatenate([x_bias[: 2 * self.hidden], wb[2 * self.hidden :]])
        xw = self._emit("MatMul", [x, self._const(self.w[d].T, "w")])
        xw = self._emit("Add", [xw, self._const(x_bias, "wb")])
        r_t = self.r[d].T
        if self.op == "GRU":  # z and r read the state; h reads it reset
            r_zr = self._const(r_t[:, : 2 * self.hidden], "rzr")
            r_h = self._const(r_t[:, 2 * self.hidden :], "rh")
            rb_h = self._const(rb[2 * self.hidden :], "rbh")
        else:
            r_all = self._const(r_t, "r")
        # LSTM peepholes: i, o, f.
        peep = None
        if self.p is not None:
            hid = self.hidden
            peep = [self._const(self.p[d, k * hid : (k + 1) * hid], "p") for k in range(3)]
        h = self._initial(h_all, d)
        c = self._initial(c_all, d) if self.op == "LSTM" else None
        order = range(self.steps) if direction == "forward" else range(self.steps - 1, -1, -1)
        per_step: dict[int, str] = {}
        xs = self._steps(xw)
        for t in order:
            xt = xs[t]
            if self.op == "LSTM":
                h, c = self._lstm_step(xt, h, c, r_all, peep, acts)
            elif self.op == "GRU":
                h = self._gru_step(xt, h, r_zr, r_h, rb_h, acts)
            else:
                pre = self._emit("Add", [xt, self._emit("MatMul", [h, r_all])])
                h = self._act(self._pre(pre), acts[0])
            per_step[t] = h
        y = self._emit("Concat", [per_step[t] for t in range(self.steps)], axis=0)
        return y, h, c

    def _steps(self, xw: str) -> list[str]:
        """``xw`` [steps, batch, size] as one [1, batch, size] value per step: one Split
        (a Gather per step is a call per step in the built model)."""
        from onnx import helper

        parts = [self._name("step") for _ in range(self.steps)]
        if self.steps == 1:
            parts = [xw]
        elif self.opset >= 13:  # the split sizes are an input
            sizes = self._const(np.ones(self.steps, dtype=np.int64), "split")
            self.out.append(helper.make_node("Split", [xw, sizes], parts, name=parts[0], axis=0))
        else:
            self.out.append(
                helper.make_node(
                    "Split", [xw], parts, name=parts[0], axis=0, split=[1] * self.steps
                )
            )
        return parts

    def _slices(self, value: str, count: int) -> list[str]:
        """``value`` [1, batch, count * hidden] cut into its ``count`` gates."""
        axis = self._const(np.array([2]), "axis")
        return [
            self._emit(
                "Slice",
                [
                    value,
                    self._const(np.array([k * self.hidden]), "start"),
                    self._const(np.array([(k + 1) * self.hidden]), "end"),
                    axis,
                ],
            )
            for k in range(count)
        ]

    def _reshape(self, value: str, shape: Sequence[int]) -> str:
        return self._emit("Reshape", [value, self._const(np.array(shape, dtype=np.int64), "shape")])

    def _lstm_step(
        self, xt: str, h: str, c: str, r_t: str, peep: list[str] | None, acts: Sequence[tuple]
    ) -> tuple[str, str]:
        f, g, hact = acts
        pre = self._emit("Add", [xt, self._emit("MatMul", [h, r_t])])
        i_in, o_in, f_in, c_in = self._slices(pre, 4)
        if peep is not None:
            i_in = self._emit("Add", [i_in, self._emit("Mul", [c, peep[0]])])
        i = self._act(self._pre(i_in), f)
        if self.input_forget:
            forget = self._emit("Sub", [self._scalar(1.0), i])
        else:
            if peep is not None:
                f_in = self._emit("Add", [f_in, self._emit("Mul", [c, peep[2]])])
            forget = self._act(self._pre(f_in), f)
        cand = self._act(self._pre(c_in), g)
        c_new = self._emit("Add", [self._emit("Mul", [forget, c]), self._emit("Mul", [i, cand])])
        if peep is not None:
            o_in = self._emit("Add", [o_in, self._emit("Mul", [c_new, peep[1]])])
        o = self._act(self._pre(o_in), f)
        return self._emit("Mul", [o, self._act(c_new, hact)]), c_new

    def _gru_step(
        self, xt: str, h: str, r_zr: str, r_h: str, rb_h: str, acts: Sequence[tuple]
    ) -> str:
        f, g = acts
        x_z, x_r, x_h = self._slices(xt, 3)
        h_z, h_r = self._slices(self._emit("MatMul", [h, r_zr]), 2)
        z = self._act(self._pre(self._emit("Add", [x_z, h_z])), f)
        r = self._act(self._pre(self._emit("Add", [x_r, h_r])), f)
        if self.linear_before_reset:
            inner = self._emit(
                "Mul", [r, self._emit("Add", [self._emit("MatMul", [h, r_h]), rb_h])]
            )
        else:
            inner = self._emit("MatMul", [self._emit("Mul", [r, h]), r_h])
        cand = self._act(self._pre(self._emit("Add", [x_h, inner])), g)
        # (1 - z) * cand + z * h = cand + z * (h - cand)
        return self._emit("Add", [cand, self._emit("Mul", [z, self._emit("Sub", [h, cand])])])

    def _finish(self, ys: list[str], hs: list[str], cs: list[str]) -> None:
        y_out, h_out, c_out = self.outputs[:3]
        # Y: [steps, num_dir, batch, hidden] (layout 1: [batch, steps, num_dir, hidden]).
        parts = [self._reshape(part, [self.steps, 1, self.batch, self.hidden]) for part in ys]
        y = parts[0] if len(parts) == 1 else self._emit("Concat", parts, axis=1)
        h = hs[0] if len(hs) == 1 else self._emit("Concat", hs, axis=0)
        c = None if not cs else cs[0] if len(cs) == 1 else self._emit("Concat", cs, axis=0)
        if self.layout:
            y = self._emit("Transpose", [y], perm=[2, 0, 1, 3])
            h = self._emit("Transpose", [h], perm=[1, 0, 2])
            c = None if c is None else self._emit("Transpose", [c], perm=[1, 0, 2])
        for value, name in ((y, y_out), (h, h_out), (c, c_out)):
            if name and value is not None:
                self._emit("Identity", [value], name)


def _shape_text(shape: tuple | None) -> str:
    if not shape:
        return "unknown"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
