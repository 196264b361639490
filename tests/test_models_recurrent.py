"""ONNX recurrent layers (LSTM, GRU, RNN), which TVM's Relax ONNX frontend does not
convert, unrolled into standard ops (autosched.models.onnx_recurrent): built by TVM
(llvm) and checked against onnxruntime running the original file; what cannot be
unrolled named in one line (exit 2 on the CLI)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from autosched.errors import InvalidInputError
from autosched.models import load_model, zoo
from tests.test_models_frontend import assert_matches_reference, tvm_outputs

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
STEPS, BATCH, FEATURES, HIDDEN = 5, 3, 6, 7


class _Recurrent(torch.nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.layers = getattr(torch.nn, kind)(
            12, 16, num_layers=2, batch_first=True, bidirectional=True
        )
        self.head = torch.nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers(x)[0]
        return self.head(out[:, -1]) + self.head(out[:, 0])


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_exported_torch_recurrent_layers_match_onnxruntime(tmp_path, kind):
    """What torch.onnx.export writes for a two-layer bidirectional batch-first layer (an
    ONNX LSTM / GRU / RNN node per layer, GRU's linear_before_reset) builds and matches
    onnxruntime; before, the import stopped at "unsupported ONNX op LSTM"."""
    torch.manual_seed(0)
    path = zoo.export_onnx(_Recurrent(kind).eval(), (torch.randn(2, 9, 12),), tmp_path / "r.onnx")
    assert kind in {n.op_type for n in onnx.load(str(path)).graph.node}
    assert_matches_reference(load_model(str(path)))


def _recurrent_file(
    path: Path,
    op: str,
    *,
    direction: str = "forward",
    layout: int = 0,
    peepholes: bool = False,
    initial: bool = True,
    sequence_lens: list[int] | None = None,
    opset: int = 17,
    **attrs,
) -> Path:
    """One ONNX ``op`` node with random constant weights; X and the initial states are
    graph inputs."""
    rng = np.random.default_rng(1)
    dirs = 2 if direction == "bidirectional" else 1
    size = GATES[op] * HIDDEN

    def const(name: str, shape: tuple[int, ...], scale: float = 0.5) -> None:
        inits.append(
            numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)
        )

    inits: list = []
    const("W", (dirs, size, FEATURES))
    const("R", (dirs, size, HIDDEN))
    const("B", (dirs, 2 * size), 1.0)
    x_shape = [BATCH, STEPS, FEATURES] if layout else [STEPS, BATCH, FEATURES]
    state = [BATCH, dirs, HIDDEN] if layout else [dirs, BATCH, HIDDEN]
    graph_inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_shape)]
    inputs = ["X", "W", "R", "B", ""]
    if sequence_lens is not None:
        inputs[4] = "lens"
        inits.append(numpy_helper.from_array(np.array(sequence_lens, dtype=np.int32), "lens"))
    for name in ("h0", "c0") if op == "LSTM" else ("h0",):
        inputs.append(name if initial else "")
        if initial:
            graph_inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, state))
    if peepholes:
        inputs.append("P")
        const("P", (dirs, 3 * HIDDEN))
    outputs = ["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"]
    y_shape = [BATCH, STEPS, dirs, HIDDEN] if layout else [STEPS, dirs, BATCH, HIDDEN]
    node = helper.make_node(
        op, inputs, outputs, name="layer", hidden_size=HIDDEN, direction=direction, **attrs
    )
    if layout:
        node.attribute.append(helper.make_attribute("layout", 1))
    graph = helper.make_graph(
        [node],
        "recurrent",
        graph_inputs,
        [
            helper.make_tensor_value_info(o, TensorProto.FLOAT, shape)
            for o, shape in zip(outputs, [y_shape, state, state])
        ],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.save(model, str(path))
    return path


VARIANTS = {
    "lstm-reverse": ("LSTM", {"direction": "reverse"}),
    "lstm-bidirectional-peepholes": ("LSTM", {"direction": "bidirectional", "peepholes": True}),
    "lstm-clip-input-forget": ("LSTM", {"clip": 0.7, "input_forget": 1}),
    "lstm-no-states-full-lens": ("LSTM", {"initial": False, "sequence_lens": [STEPS] * BATCH}),
    "lstm-activations": (
        "LSTM",
        {
            "activations": ["HardSigmoid", "LeakyRelu", "Tanh"],
            "activation_alpha": [0.2, 0.1],
            "activation_beta": [0.5],
        },
    ),
    "gru-reset-after": ("GRU", {"linear_before_reset": 0}),
    "gru-bidirectional-clip": (
        "GRU",
        {"direction": "bidirectional", "linear_before_reset": 1, "clip": 1.5},
    ),
    "gru-scaled-tanh": (
        "GRU",
        {
            "activations": ["Sigmoid", "ScaledTanh"],
            "activation_alpha": [1.5],
            "activation_beta": [0.7],
        },
    ),
    "rnn-relu-opset11": ("RNN", {"activations": ["Relu"], "opset": 11}),
    "rnn-bidirectional-affine": (
        "RNN",
        {
            "direction": "bidirectional",
            "activations": ["Tanh", "Affine"],
            "activation_alpha": [0.3],
            "activation_beta": [0.4],
        },
    ),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_recurrent_node_attributes_match_onnxruntime(tmp_path, variant):
    """Every output (Y, Y_h, Y_c) of nodes using what exporters other than torch's
    write: reverse and bidirectional runs, peepholes, clip, input_forget, initial states
    as inputs or absent, GRU's reset before or after its recurrence, activations with
    alpha and beta (consumed in order by the functions that take them)."""
    op, attrs = VARIANTS[variant]
    model = load_model(str(_recurrent_file(tmp_path / "r.onnx", op, **attrs)))
    assert_matches_reference(model)


def test_batch_major_layout_is_the_sequence_major_one_transposed(tmp_path):
    """layout 1 ([batch, steps, ...]), which onnxruntime does not run: the same weights
    as a layout-0 node, outputs equal up to the transposes the specification defines."""
    for op in ("LSTM", "GRU"):
        kw = {"direction": "bidirectional"}
        batch_major = load_model(str(_recurrent_file(tmp_path / "b.onnx", op, layout=1, **kw)))
        seq_major = load_model(str(_recurrent_file(tmp_path / "s.onnx", op, **kw)))
        arrays = seq_major.example_inputs(np.random.default_rng(3))
        expected = seq_major.reference(arrays)  # onnxruntime
        got = tvm_outputs(
            batch_major,
            {name: np.ascontiguousarray(np.swapaxes(a, 0, 1)) for name, a in arrays.items()},
        )
        np.testing.assert_allclose(got[0], expected[0].transpose(2, 0, 1, 3), rtol=1e-4, atol=1e-5)
        for g, e in zip(got[1:], expected[1:]):
            np.testing.assert_allclose(g, e.transpose(1, 0, 2), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        (
            {"sequence_lens": [STEPS, 2, STEPS]},
            r"LSTM node 'layer' of .*r\.onnx: sequence_lens \[5, 2, 5\] \(sequences shorter "
            r"than the input\); accepted: none, or 5 for every sequence of the batch",
        ),
        (
            {"opset": 9},
            r"r\.onnx has recurrent layers at ONNX opset 9; accepted: opset 10 or later",
        ),
        (
            {"activations": ["Sigmoid", "Gelu", "Tanh"]},
            r"LSTM node 'layer' of .*: activation 'Gelu'; accepted: Sigmoid, Tanh, Relu",
        ),
    ],
)
def test_what_cannot_be_unrolled_is_named_in_one_line(tmp_path, attrs, message):
    path = _recurrent_file(tmp_path / "r.onnx", "LSTM", **attrs)
    with pytest.raises(InvalidInputError, match=message):
        load_model(str(path))


def test_weights_computed_in_the_graph_are_refused_on_the_cli(tmp_path):
    """A node whose W comes out of another op: exit 2, one line naming the node and W."""
    path = _recurrent_file(tmp_path / "r.onnx", "GRU")
    model = onnx.load(str(path))
    model.graph.node.insert(0, helper.make_node("Neg", ["W"], ["W_neg"], name="neg"))
    model.graph.node[1].input[1] = "W_neg"
    onnx.save(model, str(path))
    res = subprocess.run(
        [sys.executable, "-m", "autosched", "model", "tasks", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2, res.stderr[-2000:]
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, res.stderr
    assert "GRU node 'layer'" in lines[0] and "W 'W_neg' computed in the graph" in lines[0]
    assert "accepted: W as an initializer or a Constant node" in lines[0]


# -- a step's weights are warm -----------------------------------------------------------


def test_a_recurrent_step_is_timed_with_its_weights_warm_and_its_records_build(tmp_path, host):
    """An LSTM's step runs once per step on the same recurrence weights, which stay in
    the caches: its function is marked reused (part of its key) and timed warm where the
    weights fit the device's largest cache, cold where they do not; a transformer's
    functions (each layer's weights read once) are not marked. Tuned, its records are
    what the build applies, and the build matches onnxruntime."""
    import dataclasses

    import autosched.tvm
    from autosched.measure.build import build
    from autosched.measure.runner import TimingOptions
    from autosched.ops import workload_from_json
    from autosched.ops.fused import FusedFunc
    from autosched.records.sqlite import SQLiteDatabase
    from autosched.space.select import make_space
    from autosched.tuning.model import tune_tasks
    from autosched.tuning.runner import LocalRunner
    from autosched.tvm.tasks import extract_tasks

    module, example = zoo.tiny_lstm()
    model = load_model(str(zoo.export_onnx(module, example, tmp_path / "lstm.onnx")))
    tasks = extract_tasks(model.mod, limits=host.limits)
    steps = [t for t in tasks if t.family == "contraction" and t.workload.reused]
    assert len(steps) == 1 and steps[0].weight == 2 * (example[0].shape[1] - 1), tasks
    step = steps[0].workload
    assert workload_from_json(step.to_json()) == step
    assert FusedFunc(step.script).key != step.key  # unmarked, it is another workload
    space = make_space(step, target="llvm", limits=host.limits)
    assert host.limits.cache_bytes and not build(space, space.default()).flush
    small = dataclasses.replace(host.limits, cache_bytes=(1024,))
    assert step.flush_operands(small) and FusedFunc(step.script).flush_operands(host.limits)
    gpt2_tasks = extract_tasks(
        load_model(f"{zoo.__file__}:tiny_gpt2_block").mod, limits=host.limits
    )
    assert not any(t.workload.reused for t in gpt2_tasks)

    db = SQLiteDatabase(tmp_path / "lstm.db")
    tunable = [t for t in tasks if t.family is not None]
    runner = LocalRunner(host, "llvm", timing=TimingOptions(min_time_s=0.005), keep=len(tunable))
    try:
        tune_tasks(
            tunable, runner, db, name="lstm", target="llvm", trials=2 * len(tunable), batch=2
        )
    finally:
        runner.close()
    built = autosched.tvm.build(model.mod, "llvm", db=db, shipped=False)
    applied = {a.function: a.provenance for a in built.applied}
    assert applied[steps[0].name] == "exact", applied
    arrays = model.example_inputs(np.random.default_rng(0))
    (want,) = model.reference(arrays)
    np.testing.assert_allclose(built(*arrays.values()), want, rtol=1e-4, atol=1e-5)


# -- PyTorch's recurrent layers through torch.export -------------------------------------

TORCH_FACTORIES = """
import torch


class Recurrent(torch.nn.Module):
    def __init__(self, kind, **kw):
        super().__init__()
        self.layer = getattr(torch.nn, kind)(12, 16, **kw)

    def forward(self, x):
        out, state = self.layer(x)
        return (out, *state) if isinstance(state, tuple) else (out, state)


def make(kind, shape=(2, 5, 12), **kw):
    torch.manual_seed(0)
    return Recurrent(kind, **kw).eval(), (torch.randn(*shape),)


def lstm_bidirectional():
    return make("LSTM", num_layers=2, batch_first=True, bidirectional=True)


def lstm_projected():
    return make("LSTM", shape=(5, 2, 12), num_layers=2, proj_size=8)


def lstm_without_bias():
    return make("LSTM", bias=False, batch_first=True)


def gru_bidirectional():
    return make("GRU", num_layers=2, batch_first=True, bidirectional=True)


def gru_without_bias():
    return make("GRU", shape=(5, 2, 12), bias=False)


def rnn_relu():
    return make("RNN", nonlinearity="relu", num_layers=2, bidirectional=True)
"""


@pytest.mark.parametrize(
    "factory",
    [
        "lstm_bidirectional",
        "lstm_projected",
        "lstm_without_bias",
        "gru_bidirectional",
        "gru_without_bias",
        "rnn_relu",
    ],
)
def test_torch_recurrent_layers_match_eager(tmp_path, factory):
    """nn.LSTM / GRU / RNN through torch.export with autosched's decompositions
    (autosched.models.torch_recurrent): every output (the sequence, h_n, c_n) against
    torch eager, over layers, directions, batch_first, proj_size, no bias, relu."""
    source = tmp_path / "recurrent.py"
    source.write_text(TORCH_FACTORIES)
    assert_matches_reference(load_model(f"{source}:{factory}"))


def test_a_torch_lstm_steps_on_one_copy_of_its_weights(host):
    """torch.export's own LSTM decomposition transposed the recurrence weight at every
    step (a folded copy per step, none reused) and cut each step's input out with a
    call of its own; decomposed by autosched, the steps share one matmul task on one
    constant (so it is marked reused and timed warm), with three functions per step
    (the matmul, then the gates in two)."""
    from autosched.tvm.tasks import extract_tasks

    module, example = zoo.tiny_lstm()
    steps = example[0].shape[1]
    tasks = extract_tasks(load_model(f"{zoo.__file__}:tiny_lstm").mod, limits=host.limits)
    per_step = [t for t in tasks if t.weight == 2 * (steps - 1)]  # 2 layers, step 0 apart
    assert len(per_step) == 3, [(t.name, t.weight) for t in tasks]
    (matmul,) = [t for t in per_step if t.family == "contraction"]
    assert matmul.workload.reused
