"""PyTorch's recurrent layers (``aten.lstm``, ``gru``, ``rnn_tanh``, ``rnn_relu``)
decomposed for the import as :mod:`autosched.models.onnx_recurrent` unrolls ONNX's.

``torch.export``'s own decomposition of an LSTM transposes the recurrence weight again
at every step and slices each step's input projection out with its own slice and
squeeze: a 2-layer, 32-step LSTM became 43 tasks and five calls per step (0.72 ms on a
Zen 5 against onnxruntime's 0.43, where the ONNX file's unrolled form took 0.48). Here
each layer and direction computes the whole sequence's input projection in one matmul
(both biases added once), cuts it into steps with one split, and per step runs one
``addmm`` of the hidden state by the weights transposed once, then the gates: three
calls per step, in torch's own gate order and formulas (LSTM i, f, g, o and its
projection ``proj_size``; GRU r, z, n with the reset applied to the recurrence's
output; RNN tanh or relu), in eval mode (no dropout between layers).
"""

from __future__ import annotations

from typing import Any


def decompositions() -> dict[Any, Any]:
    """The recurrent ops' decompositions, keyed by ATen overload."""
    import torch

    aten = torch.ops.aten
    return {
        aten.lstm.input: _decomposition("lstm"),
        aten.gru.input: _decomposition("gru"),
        aten.rnn_tanh.input: _decomposition("tanh"),
        aten.rnn_relu.input: _decomposition("relu"),
    }


def _decomposition(kind: str) -> Any:
    """The decomposition of ATen's ``kind`` layer: its signature is ATen's (``hx``: the
    initial hidden state, with the cell state for an LSTM); it returns the output
    sequence and each state's final values."""

    def layer(
        x: Any,
        hx: Any,
        params: Any,
        has_biases: bool,
        num_layers: int,
        dropout: float,
        train: bool,
        bidirectional: bool,
        batch_first: bool,
    ) -> tuple[Any, ...]:
        states = list(hx) if kind == "lstm" else [hx]
        step = {"lstm": _lstm_step, "gru": _gru_step}.get(kind, _rnn_step(kind))
        out, finals = _layers(
            x,
            states,
            params,
            has_biases,
            num_layers,
            bidirectional,
            batch_first,
            step,
            hh_bias_inside=kind == "gru",
        )
        return (out, *finals)

    return layer


def _lstm_step(xt: Any, state: tuple[Any, ...], w: dict[str, Any]) -> tuple[Any, Any]:
    import torch

    h, c = state
    i, f, g, o = _gates(torch.addmm(xt, h, w["hh"]), 4)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(c)
    if "hr" in w:  # proj_size
        h = torch.mm(h, w["hr"])
    return h, c


def _gru_step(xt: Any, state: tuple[Any, ...], w: dict[str, Any]) -> tuple[Any]:
    import torch

    (h,) = state
    hh = torch.mm(h, w["hh"]) if w["b_hh"] is None else torch.addmm(w["b_hh"], h, w["hh"])
    x_r, x_z, x_n = _gates(xt, 3)
    h_r, h_z, h_n = _gates(hh, 3)
    r = torch.sigmoid(x_r + h_r)
    z = torch.sigmoid(x_z + h_z)
    n = torch.tanh(x_n + r * h_n)
    return (n + z * (h - n),)  # (1 - z) * n + z * h


def _rnn_step(activation: str) -> Any:
    def step(xt: Any, state: tuple[Any, ...], w: dict[str, Any]) -> tuple[Any]:
        import torch

        act = torch.tanh if activation == "tanh" else torch.relu
        return (act(torch.addmm(xt, state[0], w["hh"])),)

    return step


def _gates(value: Any, count: int) -> list[Any]:
    """``value`` [batch, count * hidden] cut into its gates by slices, which fuse into
    the gates' arithmetic (a ``chunk`` is a split: a call of its own per step)."""
    size = value.shape[1] // count
    return [value.narrow(1, k * size, size) for k in range(count)]


def _layers(
    x: Any,
    states: list[Any],
    params: Any,
    has_biases: bool,
    num_layers: int,
    bidirectional: bool,
    batch_first: bool,
    step: Any,
    *,
    hh_bias_inside: bool = False,
) -> tuple[Any, list[Any]]:
    """Run ``step`` over every layer and direction; the output sequence and, per state,
    its final values stacked ``[layers * directions, batch, ...]``.

    ``hh_bias_inside``: the recurrence bias stays with the recurrence (GRU's reset
    multiplies it), else both biases join the input projection."""
    import torch

    dirs = 2 if bidirectional else 1
    per = len(params) // (num_layers * dirs)
    seq = x.transpose(0, 1) if batch_first else x  # [steps, batch, features]
    steps, batch = seq.shape[0], seq.shape[1]
    finals: list[list[Any]] = [[] for _ in states]
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            group = list(params[(layer * dirs + d) * per : (layer * dirs + d + 1) * per])
            w_ih, w_hh = group[0], group[1]
            b_ih, b_hh = (group[2], group[3]) if has_biases else (None, None)
            w = {"hh": w_hh.t(), "b_hh": b_hh if hh_bias_inside else None}
            # w_ih, w_hh, (b_ih, b_hh), then an LSTM's w_hr where it has proj_size.
            if len(group) % 2:
                w["hr"] = group[-1].t()
            flat = seq.reshape(steps * batch, seq.shape[2])
            if not has_biases:
                bias = None
            elif hh_bias_inside:
                bias = b_ih
            else:
                bias = b_ih + b_hh
            xw = torch.mm(flat, w_ih.t()) if bias is None else torch.addmm(bias, flat, w_ih.t())
            inputs = torch.split(xw, batch, dim=0)  # one [batch, gates] per step
            state = tuple(s[layer * dirs + d] for s in states)
            ys: list[Any] = [None] * steps
            order = range(steps) if d == 0 else range(steps - 1, -1, -1)
            for t in order:
                state = step(inputs[t], state, w)
                ys[t] = state[0]
            outs.append(torch.stack(ys))
            for final, value in zip(finals, state):
                final.append(value)
        seq = outs[0] if dirs == 1 else torch.cat(outs, dim=2)
    out = seq.transpose(0, 1) if batch_first else seq
    return out, [torch.stack(values) for values in finals]
