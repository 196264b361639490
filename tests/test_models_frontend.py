"""Model frontends: ONNX files, file.py:factory modules and saved torch.export programs
imported into Relax, built untuned by TVM (llvm) and checked against onnxruntime / torch
eager; bad input named in one line; batch-norm folded into convolutions exactly."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import onnx  # the models extra, which scripts/test.sh installs
import pytest
import torch

from autosched.errors import InvalidInputError
from autosched.models import count_ops, load_model, parse_input_shape, zoo
from autosched.models.latency import max_error

ZOO = Path(zoo.__file__)


def tvm_outputs(model, arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The model's outputs from an untuned TVM build on the host CPU."""
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(tvm.compile(model.mod, target="llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(arrays[spec.name]) for spec in model.inputs])
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


def assert_matches_reference(model, *, seed: int = 0) -> None:
    arrays = model.example_inputs(np.random.default_rng(seed))
    expected = model.reference(arrays)
    got = tvm_outputs(model, arrays)
    assert len(got) == len(expected) >= 1
    for g, e in zip(got, expected):
        assert g.shape == e.shape
        assert np.abs(e).max() > 1e-3  # a real signal, not all zeros
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4 * float(np.abs(e).max()))


def batch_norm_arithmetic(model) -> int:
    """Calls left of what an unfolded inference batch-norm decomposes into."""
    return sum(
        count_ops(model.mod, op) for op in ("relax.nn.batch_norm", "relax.sqrt", "relax.divide")
    )


@pytest.fixture(scope="module")
def onnx_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("onnx")
    files = {}
    for name in ("tiny_resnet18", "tiny_bert_layer", "tiny_gpt2_block", "tiny_vit"):
        module, example = getattr(zoo, name)()
        files[name] = zoo.export_onnx(module, example, folder / f"{name}.onnx")
    return files


# -- imports that match their framework ------------------------------------------------


@pytest.mark.parametrize(
    "factory", ["tiny_resnet18", "tiny_bert_layer", "tiny_gpt2_block", "tiny_vit"]
)
def test_torch_factory_matches_torch_eager(factory):
    model = load_model(f"{ZOO}:{factory}")
    assert model.framework == "torch" and model.name == factory
    assert [s.role for s in model.inputs] == ["input"]
    assert_matches_reference(model)
    if factory == "tiny_resnet18":
        # Every batch-norm follows a convolution with nothing else reading it: all folded.
        assert batch_norm_arithmetic(model) == 0
        assert count_ops(model.mod, "relax.nn.conv2d") == 20


@pytest.mark.parametrize(
    "name", ["tiny_resnet18", "tiny_bert_layer", "tiny_gpt2_block", "tiny_vit"]
)
def test_onnx_file_matches_onnxruntime(onnx_files, name):
    model = load_model(str(onnx_files[name]))
    assert model.framework == "onnx" and model.name == name
    assert model.inputs[0].name == "input0"
    assert_matches_reference(model, seed=1)


def test_runtimes_are_the_models_frameworks_and_agree_with_its_reference(onnx_files, tmp_path):
    """What `model tune` times beside its builds: onnxruntime for every model, and torch
    eager for a PyTorch one (whose module onnxruntime runs exported to ONNX); a saved
    torch.export program cannot be exported offline and says so in one line."""
    module, example = zoo.tiny_gpt2_block()
    pt2 = tmp_path / "gpt2.pt2"
    torch.export.save(torch.export.export(module, example), str(pt2))
    cases = {
        f"{ZOO}:tiny_bert_layer": {"onnxruntime", "torch"},
        str(onnx_files["tiny_bert_layer"]): {"onnxruntime"},
        str(pt2): {"onnxruntime", "torch"},
    }
    for source, names in cases.items():
        model = load_model(source)
        arrays = model.example_inputs(np.random.default_rng(0))
        expected = model.reference(arrays)
        runtimes = model.runtimes(threads=1)
        assert set(runtimes) == names, source
        for name, runtime in runtimes.items():
            if source == str(pt2) and name == "onnxruntime":
                with pytest.raises(InvalidInputError, match="could not export .* accepted"):
                    runtime(arrays)
                continue
            assert max_error(list(runtime(arrays)), expected) < 1e-4, (source, name)


def test_saved_export_program_matches_torch_eager(tmp_path):
    module, example = zoo.tiny_gpt2_block()
    path = tmp_path / "gpt2.pt2"
    torch.export.save(torch.export.export(module, example), str(path))
    model = load_model(str(path))
    assert model.inputs[0].shape == (1, 16, 64)
    assert_matches_reference(model, seed=2)
    with pytest.raises(InvalidInputError, match=r"x=1x8x64 differs .* accepted: x=1x16x64"):
        load_model(str(path), inputs={"x": (1, 8, 64)})


def test_a_negative_index_reads_what_torch_reads(tmp_path):
    """``x[:, -1]`` (a recurrent layer's last step, a classifier's last token): TVM's
    torch frontend takes index -1 in a mode that does not wrap it, and the build read
    memory before the tensor; the import writes it as the extent minus one."""
    source = tmp_path / "last_step.py"
    source.write_text(
        textwrap.dedent(
            """
            import torch

            class LastStep(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.gru = torch.nn.GRU(12, 16, batch_first=True)
                    self.head = torch.nn.Linear(16, 4)

                def forward(self, x):
                    return self.head(self.gru(x)[0][:, -1]) + x[:, -2, :4]

            def make():
                torch.manual_seed(0)
                return LastStep().eval(), (torch.randn(2, 9, 12),)
            """
        )
    )
    assert_matches_reference(load_model(f"{source}:make"))


def test_constant_takes_lower_without_a_warning_per_lowering(onnx_files, capfd):
    """A ViT's class token and MultiheadAttention's packed query, key and value are takes
    at constant indices; in the ``fast`` mode the import gives them, TOPI printed "Fast
    mode segfaults when there are out-of-bounds indices" at every lowering (dozens of
    lines in a terminal for one model). In range, they lower in ``clip`` mode."""
    for source in (f"{ZOO}:tiny_vit", str(onnx_files["tiny_vit"])):
        model = load_model(source)
        assert count_ops(model.mod, "relax.take") >= 1, source
        assert_matches_reference(model)
        err = capfd.readouterr().err
        assert "Fast mode" not in err, (source, err[-500:])


# -- input shapes ---------------------------------------------------------------------


def _symbolic_onnx(path: Path) -> Path:
    """Y = relu(X @ W + b) with X's batch dimension symbolic."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["X", "W"], ["xw"], name="matmul"),
            helper.make_node("Add", ["xw", "b"], ["z"], name="bias"),
            helper.make_node("Relu", ["z"], ["Y"], name="relu"),
        ],
        "mlp",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[w, b],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_onnx_symbolic_input_needs_and_takes_a_shape(tmp_path):
    path = _symbolic_onnx(tmp_path / "mlp.onnx")
    with pytest.raises(
        InvalidInputError,
        match=r"input 'X' .* symbolic dimension 'batch'; give its shape with --input X=",
    ):
        load_model(str(path))
    model = load_model(str(path), inputs={"X": (3, 8)})
    assert model.inputs[0].shape == (3, 8)
    assert_matches_reference(model)
    with pytest.raises(InvalidInputError, match=r"--input names 'Z'.*accepted: X"):
        load_model(str(path), inputs={"Z": (3, 8)})


def test_factory_input_override_resizes_the_example():
    model = load_model(f"{ZOO}:tiny_resnet18", inputs={"x": (1, 3, 48, 48)})
    assert model.inputs[0].shape == (1, 3, 48, 48)
    assert_matches_reference(model)
    with pytest.raises(InvalidInputError, match="shape 1x3x32x32; accepted: 1x3x48x48"):
        model.reference({"x": np.zeros((1, 3, 32, 32), np.float32)})


def test_parse_input_shape():
    assert parse_input_shape("input=1x3x224x224") == ("input", (1, 3, 224, 224))
    assert parse_input_shape("ids = 1X128") == ("ids", (1, 128))
    assert parse_input_shape("x=1,3,8,8") == ("x", (1, 3, 8, 8))
    for bad in ("1x3x224x224", "x=", "x=1;3", "x=1x", "x=0x3", "=1x2"):
        with pytest.raises(InvalidInputError, match="--input"):
            parse_input_shape(bad)


# -- bad input ------------------------------------------------------------------------


def test_bad_sources_are_named(tmp_path):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x00not a protobuf\xff" * 10)
    bad_pt2 = tmp_path / "bad.pt2"
    bad_pt2.write_text("hello")
    cases = {
        str(tmp_path / "missing.onnx"): "does not exist",
        str(garbage): "is not an ONNX model",
        str(bad_pt2): "is not a saved torch.export program",
        str(tmp_path / "model.h5"): "is not a model; accepted: an ONNX file",
        f"{tmp_path / 'missing.py'}:make": "does not exist or is not a .py file",
        str(ZOO): "names no factory",
    }
    for source, message in cases.items():
        with pytest.raises(InvalidInputError, match=message) as info:
            load_model(source)
        assert "\n" not in str(info.value)


def test_bad_factories_are_named(tmp_path):
    source = tmp_path / "factories.py"
    source.write_text(
        textwrap.dedent(
            """
            import torch
            NOT_CALLABLE = 3
            def only_module():
                return torch.nn.ReLU()
            def not_tensors():
                return torch.nn.ReLU(), (1, 2)
            def raises():
                raise RuntimeError("no weights here")
            """
        )
    )
    cases = {
        "missing": r"has no factory 'missing'; accepted: the functions it defines \(not_tensors, only_module, raises\)",
        "NOT_CALLABLE": "is a int, not callable",
        "only_module": r"returned a ReLU; accepted: .*tuple of example tensors",
        "not_tensors": r"returned a tuple of \(ReLU, tuple\)",
        "raises": "raised RuntimeError: no weights here",
    }
    for factory, message in cases.items():
        with pytest.raises(InvalidInputError, match=message):
            load_model(f"{source}:{factory}")


def test_unsupported_onnx_op_names_op_and_node(tmp_path):
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["X"], ["r"], name="relu"),
            helper.make_node("Det", ["r"], ["Y"], name="determinant_7"),
        ],
        "det",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])],
    )
    path = tmp_path / "det.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    with pytest.raises(
        InvalidInputError,
        match=r"unsupported ONNX op Det at node 'determinant_7' .*accepted: the \d+ ops TVM's Relax ONNX frontend converts",
    ):
        load_model(str(path))


def test_unsupported_torch_op_names_op_and_node(tmp_path):
    source = tmp_path / "kth.py"
    source.write_text(
        textwrap.dedent(
            """
            import torch
            class Kth(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.proj = torch.nn.Linear(8, 8)
                def forward(self, x):
                    return torch.kthvalue(self.proj(x), 2, dim=-1).values
            def make():
                return Kth(), (torch.randn(2, 8),)
            """
        )
    )
    with pytest.raises(
        InvalidInputError,
        match=r"unsupported torch op kthvalue\.default at node 'kthvalue'.*accepted: the \d+ ATen ops",
    ):
        load_model(f"{source}:make")


REWRITTEN = """
import torch

class Ops(torch.nn.Module):
    # Each an op TVM 0.27's Relax torch frontend lacks after torch's core decompositions.
    def forward(self, x):
        y = x - torch.amax(x, -1, keepdim=True) + torch.logsumexp(x, -1, keepdim=True)
        y = y + torch.amin(x, (0, 1), keepdim=True) + torch.amin(x)
        y = y + torch.min(x, 1, keepdim=True).values + torch.min(x, 0).indices.float()
        var, mean = torch.var_mean(x, -1, keepdim=True)
        return y + var + torch.var_mean(x, 0, correction=0)[1] + torch.hypot(x, mean)

def ops():
    return Ops(), (torch.randn(4, 6),)

def plain_group_norm():  # no affine weight and bias: the frontend's converter fails
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.GroupNorm(2, 8, affine=False),
        torch.nn.InstanceNorm2d(8), torch.nn.GroupNorm(4, 8),
    ), (torch.randn(2, 3, 8, 8),)
"""


@pytest.mark.parametrize("factory", ["ops", "plain_group_norm"])
def test_ops_the_torch_frontend_lacks_are_rewritten_and_match_torch_eager(tmp_path, factory):
    """amax (and logsumexp), amin, min over a dim, var_mean, hypot and a group norm
    without affine parameters: TVM's frontend refuses or misconverts each as torch
    exports it; rewritten in ops it converts, the build matches torch eager."""
    source = tmp_path / "rewritten.py"
    source.write_text(REWRITTEN)
    model = load_model(f"{source}:{factory}")
    assert_matches_reference(model)
    assert_matches_reference(model, seed=1)


# -- batch-norm folding ---------------------------------------------------------------


def _conv_bn_onnx(path: Path, *, second_user: bool) -> Path:
    """Conv(+bias) -> BatchNormalization -> Relu; optionally the conv result also feeds Y2."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    c = 6

    def const(name: str, array: np.ndarray):
        return numpy_helper.from_array(array.astype(np.float32), name)

    inits = [
        const("W", rng.standard_normal((c, 3, 3, 3))),
        const("B", rng.standard_normal(c)),
        const("gamma", rng.uniform(0.5, 1.5, c)),
        const("beta", rng.standard_normal(c)),
        const("mean", rng.standard_normal(c)),
        const("var", rng.uniform(0.5, 2.0, c)),
    ]
    nodes = [
        helper.make_node("Conv", ["X", "W", "B"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node(
            "BatchNormalization",
            ["conv", "gamma", "beta", "mean", "var"],
            ["bn"],
            name="bn",
            epsilon=1e-3,
        ),
        helper.make_node("Relu", ["bn"], ["Y"], name="relu"),
    ]
    outputs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, c, 10, 10])]
    if second_user:
        nodes.append(helper.make_node("Sigmoid", ["conv"], ["Y2"], name="other_user"))
        outputs.append(helper.make_tensor_value_info("Y2", TensorProto.FLOAT, [1, c, 10, 10]))
    graph = helper.make_graph(
        nodes, "conv_bn", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 3, 10, 10])],
        outputs, initializer=inits,
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_batch_norm_folds_into_conv_exactly(tmp_path):
    model = load_model(str(_conv_bn_onnx(tmp_path / "conv_bn.onnx", second_user=False)))
    assert batch_norm_arithmetic(model) == 0
    assert count_ops(model.mod, "relax.nn.conv2d") == 1
    assert_matches_reference(model)


def test_batch_norm_stays_when_the_conv_has_another_user(tmp_path):
    model = load_model(str(_conv_bn_onnx(tmp_path / "shared.onnx", second_user=True)))
    assert batch_norm_arithmetic(model) > 0  # folding would change what Y2 sees
    assert count_ops(model.mod, "relax.nn.conv2d") == 1
    assert_matches_reference(model)


def test_fold_batch_norm_pass_on_a_torch_import():
    """The pass itself: the raw import has batch_norm calls, the folded one none."""
    from tvm.relax.frontend.torch import from_exported_program

    from autosched.models.fold_batch_norm import fold_batch_norm
    from autosched.models.model import prepare

    module, example = zoo.tiny_resnet18()
    raw = from_exported_program(torch.export.export(module, example))
    assert count_ops(raw, "relax.nn.batch_norm") == 20
    folded = fold_batch_norm(raw)
    # Still there (unused) until dead-code elimination, which prepare runs.
    assert count_ops(prepare(raw), "relax.nn.batch_norm") == 0
    assert count_ops(prepare(raw), "relax.sqrt") == 0
    assert count_ops(folded, "relax.nn.conv2d") == 40


def test_importing_the_package_stays_light():
    """torch, onnx and TVM load when a model does, not with ``import autosched.models``."""
    import subprocess
    import sys

    code = (
        "import sys, autosched, autosched.models; "
        "print(sorted(m for m in ('torch', 'onnx', 'onnxruntime', 'tvm') if m in sys.modules))"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert out.stdout.strip() == "[]", out.stdout
